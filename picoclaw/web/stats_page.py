"""Memory stats as a page: `picoclaw memory stats`' numbers, with charts of MEMORY.md's size over time (from its
backups), retrieval time per turn and the prompt-cache share, drawn as inline SVG (no script)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from picoclaw.web.render import APP_KEY, render

if TYPE_CHECKING:
    from picoclaw.app import App

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
    sizes = [(name[:15], float(size)) for name, size in store.backup_sizes()]
    now = store.local(store.long_term_path)
    if now.exists():
        sizes.append(("now", float(now.stat().st_size)))
    turns = TurnMetrics(store.memory_dir, storage=store.storage).read().turns
    return {"stats": stats, "size_chart": chart(sizes), "compression_backup": _before(stats.last_compression, store),
            "retrieval_chart": chart([(turn.time[:16], turn.retrieval_ms) for turn in turns])}


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
    """The numbers and the charts."""
    found = await asyncio.to_thread(_stats, request.app[APP_KEY])
    return render(request, "stats.html", width=WIDTH, height=HEIGHT, **found)
