"""Memory stats as a page: `picoclaw memory stats`' numbers, with charts of MEMORY.md's size over time (from its
backups), retrieval time per turn, the prompt-cache share and the model tokens spent per day (background and chat,
from the spend ledger, as `picoclaw usage` reports them), drawn as inline SVG (no script)."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from picoclaw.web.file_cache import FileCache, folder_files, identity
from picoclaw.web.render import APP_KEY, render

if TYPE_CHECKING:
    from picoclaw.app import App

# The page's numbers, measured once per version of the files they come from (web/file_cache.py).
STATS_KEY: web.AppKey[FileCache[dict[str, Any]]] = web.AppKey("picoclaw_stats")
WIDTH, HEIGHT = 600, 120
POINTS = 200  # the newest this many points a chart draws


@dataclass(frozen=True)
class Chart:
    """A polyline over WIDTH × HEIGHT and what its axis goes up to."""

    points: str
    top: float
    count: int
    first: str
    last: str


def chart(values: list[tuple[str, float]]) -> Chart | None:
    """The newest POINTS (label, value) pairs as an SVG polyline; None with fewer than two."""
    values = values[-POINTS:]
    if len(values) < 2:
        return None
    top = max(value for _, value in values) or 1.0
    step = WIDTH / (len(values) - 1)
    points = " ".join(f"{round(n * step, 1)},{round(HEIGHT - 5 - value / top * (HEIGHT - 10), 1)}"
                      for n, (_, value) in enumerate(values))
    return Chart(points, top, len(values), values[0][0], values[-1][0])


@dataclass(frozen=True)
class DayBar:
    """One day's stacked bar: background tokens below, chat tokens above (SVG units), and its values."""

    x: float
    width: float
    background_y: float
    background_height: float
    chat_y: float
    chat_height: float
    label: str


@dataclass(frozen=True)
class SpendChart:
    bars: list[DayBar]
    top: int
    first: str
    last: str
    today: str  # the `/status` line: today's tokens against each cap


def spend_chart(daily: list[tuple[date, int, int]], today: str) -> SpendChart:
    """Stacked bars of each day's (date, background tokens, chat tokens), scaled to the highest day."""
    top = max((background + chat for _, background, chat in daily), default=0) or 1
    step = WIDTH / max(len(daily), 1)
    bars = []
    for n, (day, background, chat) in enumerate(daily):
        low = background / top * (HEIGHT - 10)
        high = chat / top * (HEIGHT - 10)
        bars.append(DayBar(round(n * step + 1, 1), round(step - 2, 1), round(HEIGHT - low, 1), round(low, 1),
                           round(HEIGHT - low - high, 1), round(high, 1),
                           f"{day.isoformat()}: {background:,} background, {chat:,} chat"))
    first, last = (daily[0][0].isoformat(), daily[-1][0].isoformat()) if daily else ("", "")
    return SpendChart(bars, top, first, last, today)


def _spend(app: App) -> SpendChart | str:
    """The last 30 days' tokens per day, or why they cannot be shown (a damaged ledger, in one line)."""
    from picoclaw import clock
    from picoclaw.agent import spend_line, spend_report
    from picoclaw.errors import PicoclawError
    from picoclaw.memory import Day, SpendLedger

    ledger = SpendLedger(app.workspace.layout.shared_memory_dir, storage=app.storage)
    try:
        days = ledger.read()
    except PicoclawError as exc:
        return str(exc)
    today = clock.now(app.workspace.tz).date()
    report = spend_report(days, app.config.budget, today)
    return spend_chart(report.daily, spend_line(days.get(today.isoformat()) or Day(), app.config.budget))


def _stats(app: App) -> dict[str, Any]:
    from picoclaw.memory import TurnMetrics, memory_stats

    workspace = app.workspace
    store = workspace.store
    stats = memory_stats(workspace)
    sizes = [(name[:15], float(size)) for name, size in store.backup_sizes()]
    now = store.local(store.long_term_path)
    if now.exists():
        sizes.append(("now", float(now.stat().st_size)))
    turns = TurnMetrics(store.memory_dir, storage=store.storage).read().turns
    spend = _spend(app)
    return {"stats": stats, "size_chart": chart(sizes), "compression_backup": _before(stats.last_compression, store),
            "retrieval_chart": chart([(turn.time[:16], turn.retrieval_ms) for turn in turns]),
            "spend_chart": spend if isinstance(spend, SpendChart) else None,
            "spend_problem": spend if isinstance(spend, str) else None}


def _stats_version(app: App) -> Hashable:
    """What the stats are measured from, as it is now: on files, every file of the memory folders (documents,
    counters, ledgers, backups, the policy) and the transcripts (the prompt cache's share); on PostgreSQL a new
    object each time, so they are measured for every request (the rows are not files to look at)."""
    if app.storage.backend != "files":
        return object()
    workspace = app.workspace
    folders = {workspace.store.memory_dir, workspace.layout.shared_memory_dir, workspace.policy.memory_dir,
               workspace.layout.sessions_dir}
    return identity(folder_files(*sorted(folders)))


def _before(outcome: Any, store: Any) -> str | None:
    """The backup a compression that rewrote MEMORY.md took just before it (the newest one written by the time
    its outcome was), so the page can show before → after; None for a compression that wrote nothing."""
    if outcome is None or outcome.status != "compressed":
        return None
    try:
        when = datetime.fromisoformat(outcome.time).timestamp()
    except ValueError:
        return None
    # The outcome's time has whole seconds; the backup was taken within the same second or just before. Its
    # name says when (UTC, `clock.stamp`); one without the "Z" is an older version's, taken before any of these.
    taken = [path.name for path in store.backups() if _taken(path.name) <= when + 1]
    return taken[-1] if taken else None


def _taken(name: str) -> float:
    """When the backup called `name` was taken, as a POSIX time (0 for a name of an older version)."""
    try:
        return datetime.strptime(name[:16], "%Y%m%d_%H%M%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return 0.0


async def stats_page(request: web.Request) -> web.Response:
    """The numbers and the charts (measured again when what they come from changed, or the day did)."""
    app = request.app[APP_KEY]
    await app.write_waiting()  # the console chat's latest calls and turns count in the charts too
    found = await asyncio.to_thread(request.app[STATS_KEY].get, app.workspace.store.today(),
                                    lambda: _stats_version(app), lambda: _stats(app))
    return render(request, "stats.html", width=WIDTH, height=HEIGHT, **found)
