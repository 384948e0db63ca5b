"""Memory stats as a page: `picoclaw memory stats`' numbers, with charts of MEMORY.md's size over time (from its
backups), retrieval time per turn and the prompt-cache share, drawn as inline SVG (no script)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from picoclaw.web.file_cache import FileCache, folder_files
from picoclaw.web.render import APP_KEY, refresh, render

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


def _stats(app: App) -> dict[str, Any]:
    from picoclaw.memory import TurnMetrics, memory_stats

    workspace = app.workspace
    store = workspace.store
    stats = memory_stats(workspace)
    sizes = [(path.name[:15], float(path.stat().st_size)) for path in store.backups()]
    if store.long_term_path.exists():
        sizes.append(("now", float(store.long_term_path.stat().st_size)))
    turns = TurnMetrics(store.memory_dir, storage=store.storage).read().turns
    return {"stats": stats, "size_chart": chart(sizes), "compression_backup": _before(stats.last_compression, store),
            "retrieval_chart": chart([(turn.time[:16], turn.retrieval_ms) for turn in turns])}


def _stats_files(app: App) -> list[Path]:
    """Every file the stats are measured from: the memory folders (documents, counters, ledgers, backups, the
    policy) and the transcripts (the prompt cache's share)."""
    workspace = app.workspace
    folders = {workspace.store.memory_dir, workspace.layout.shared_memory_dir, workspace.policy.memory_dir,
               workspace.layout.sessions_dir}
    return folder_files(*sorted(folders))


def _before(outcome: Any, store: Any) -> str | None:
    """The backup a compression that rewrote MEMORY.md took just before it (the newest one written by the time
    its outcome was), so the page can show before → after; None for a compression that wrote nothing."""
    if outcome is None or outcome.status != "compressed":
        return None
    try:
        when = datetime.fromisoformat(outcome.time).timestamp()
    except ValueError:
        return None
    # The outcome's time has whole seconds; the backup was written within the same second or just before.
    taken = [path for path in store.backups() if path.stat().st_mtime <= when + 1]
    return taken[-1].name if taken else None


async def stats_page(request: web.Request) -> web.Response:
    """The numbers and the charts (measured again when a file they come from changed, or the day did)."""
    await refresh(request)
    app = request.app[APP_KEY]
    found = await asyncio.to_thread(request.app[STATS_KEY].get, app.workspace.store.today(),
                                    lambda: _stats_files(app), lambda: _stats(app))
    return render(request, "stats.html", width=WIDTH, height=HEIGHT, **found)
