"""The memory page: MEMORY.md's entries a page at a time, the turn's own search with scores, adding an entry."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from picoclaw.web.render import APP_KEY, page_number, render, see_other

PAGE_SIZE = 50  # entries a memory page shows: a 10,000-entry MEMORY.md stays quick to render
MAX_ENTRY = 20_000  # characters of one entry added from the console


@dataclass(frozen=True)
class MemoryEntryView:
    """An entry of MEMORY.md as the memory page shows it."""

    heading: str
    text: str
    line: int
    superseded: bool


def _entries(text: str) -> list[MemoryEntryView]:
    from picoclaw.memory import is_superseded, long_term_entries

    return [MemoryEntryView(entry.heading, entry.text.split("\n", 1)[1].rstrip("\n") if "\n" in entry.text else "",
                            entry.line, is_superseded(entry.text)) for entry in long_term_entries(text)]


async def memory_page(request: web.Request) -> web.Response:
    """MEMORY.md's entries, newest first, a page at a time; with `q`, what a turn's search finds for it."""
    app = request.app[APP_KEY]
    store = app.workspace.store
    query = request.query.get("q", "").strip()[:500]
    hits: list[Any] = []
    if query:
        searcher = app.workspace.searcher
        limit = app.workspace.policy.current().retrieve_limit
        hits = await asyncio.to_thread(searcher.search, query, limit, include_notes=True)
    text = await asyncio.to_thread(store.read_long_term)
    entries = _entries(text)[::-1]
    pages = max(1, -(-len(entries) // PAGE_SIZE))
    number = page_number(request, pages)
    shown = entries[(number - 1) * PAGE_SIZE:number * PAGE_SIZE]
    root = app.workspace.root
    results = [(hit.score, hit.block.path.relative_to(root).as_posix(), hit.block.start_line, hit.block.text)
               for hit in hits]
    return render(request, "memory.html", entries=shown, total=len(entries), page=number, pages=pages,
                  query=query, results=results, notice=request.query.get("notice", ""))


async def add_entry(request: web.Request) -> web.Response:
    """Append the form's text to MEMORY.md through the store (its lock, its backup rules)."""
    form = await request.post()
    content = str(form.get("content", "")).strip()
    if not content:
        return _back("empty_entry")
    if len(content) > MAX_ENTRY:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_ENTRY, actual_size=len(content))
    store = request.app[APP_KEY].workspace.store
    entry = await asyncio.to_thread(store.append_long_term, content)
    return _back("added" if entry.new else "already_there")


def _back(notice: str) -> web.Response:
    return see_other(f"/memory?notice={notice}")
