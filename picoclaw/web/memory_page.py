"""The memory page: MEMORY.md's entries a page at a time, the turn's own search with scores, adding an entry."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from aiohttp import web

from picoclaw.web.file_cache import FileCache, identity
from picoclaw.web.labels import LABELS
from picoclaw.web.render import APP_KEY, in_workspace, language, page_number, render, see_other

if TYPE_CHECKING:
    from picoclaw.memory import LongTermEntry

# MEMORY.md's entries, newest first, parsed once per version of the file (web/file_cache.py).
ENTRIES_KEY: web.AppKey[FileCache[list[LongTermEntry]]] = web.AppKey("picoclaw_entries")
PAGE_SIZE = 50  # entries a memory page shows: a 10,000-entry MEMORY.md stays quick to render
MAX_ENTRY = 20_000  # characters of one entry added from the console


@dataclass(frozen=True)
class MemoryEntryView:
    """An entry of MEMORY.md as the memory page shows it."""

    heading: str
    text: str
    line: int
    superseded: bool
    version: str  # entry_version of the entry as shown: an edit against it is refused once it changed
    full: str  # the entry as in the file, heading included: what its injections are counted by


@dataclass(frozen=True)
class EditConflict:
    """A save or delete refused because its entry changed: what the user typed, kept for the editor, and the
    entry as it is now (None: it is gone)."""

    typed: str
    delete: bool
    current: MemoryEntryView | None


def _view(entry: LongTermEntry) -> MemoryEntryView:
    from picoclaw.memory import entry_version, is_superseded

    body = entry.text.split("\n", 1)[1].rstrip("\n") if "\n" in entry.text else ""
    return MemoryEntryView(entry.heading, body, entry.line, is_superseded(entry.text), entry_version(entry.text),
                           entry.text)


def _newer(view: MemoryEntryView, entries: list[LongTermEntry]) -> str | None:
    """Where the entry that superseded `view` is (`/memory?page=N#line-L`), found by the words its mark quotes
    ("> superseded by the 2026-11-26 entry: <its first 80 characters>"); None when it is gone or edited."""
    from picoclaw.memory import SUPERSEDED

    mark = next((line for line in view.text.splitlines() if line.startswith(SUPERSEDED)), "")
    quoted = mark.partition(" entry: ")[2].removesuffix("…").strip()
    if not quoted:
        return None
    for number, entry in enumerate(entries):  # newest first, as the pages list them
        body = entry.text.split("\n", 1)[1] if "\n" in entry.text else ""
        if entry.line != view.line and " ".join(body.split()).startswith(quoted):
            return f"/memory?page={number // PAGE_SIZE + 1}#line-{entry.line}"
    return None


async def memory_page(request: web.Request, *, error: str = "", status: int = 200,
                      conflict: EditConflict | None = None) -> web.Response:
    """MEMORY.md's entries, newest first, a page at a time, each with how often a prompt carried it; with `q`,
    what a turn's search finds for it."""
    from picoclaw.memory import entry_injections, long_term_entries

    app = request.app[APP_KEY]
    store = app.workspace.store
    query = request.query.get("q", "").strip()[:500]
    hits: list[Any] = []
    if query:
        searcher = app.workspace.searcher
        limit = app.workspace.policy.current().retrieve_limit
        hits = await asyncio.to_thread(searcher.search, query, limit, include_notes=True)
    entries = await asyncio.to_thread(request.app[ENTRIES_KEY].get, "MEMORY.md",
                                      lambda: identity([store.local(store.long_term_path)]),
                                      lambda: list(long_term_entries(store.read_long_term()))[::-1])
    pages = max(1, -(-len(entries) // PAGE_SIZE))
    number = page_number(request, pages)
    shown = [_view(entry) for entry in entries[(number - 1) * PAGE_SIZE:number * PAGE_SIZE]]  # only these
    newer = {view.line: _newer(view, entries) for view in shown if view.superseded}
    injected = await asyncio.to_thread(entry_injections, store, [entry.full for entry in shown])
    root = app.workspace.root
    best = max((hit.score for hit in hits), default=0.0) or 1.0  # scores relative to the best, as the why page's
    results = [(hit.score / best, hit.score, hit.block.path.relative_to(root).as_posix(), hit.block.start_line,
                hit.block.text) for hit in hits]
    return render(request, "memory.html", status=status, entries=shown, injected=injected, newer=newer,
                  total=len(entries),
                  page=number, pages=pages, query=query, results=results, notice=request.query.get("notice", ""),
                  error=error, conflict=conflict, undo=_undo(request))


def _undo(request: web.Request) -> dict[str, str] | None:
    """The undo form's fields after a delete (from the address it was sent back to), or None."""
    query = request.query
    if query.get("notice") != "deleted" or not query.get("undo"):
        return None
    return {"backup": query.get("undo", ""), "line": query.get("line", ""), "version": query.get("version", "")}


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


async def edit_entry(request: web.Request) -> web.Response:
    """Save or delete one entry, found by its fingerprint wherever it is now (web/entry_edits.py): refused, with
    nothing written and the typed text kept in the editor beside the entry as it is now, only when that entry
    itself changed since the page showed it. A delete's notice offers to undo it."""
    from picoclaw.errors import MemoryStoreError
    from picoclaw.web.entry_edits import Conflict, replace_entry

    form = await request.post()
    try:
        line = int(str(form.get("line", "")))
    except ValueError:
        raise web.HTTPBadRequest(text="No entry named: the form's line number is missing.\n") from None
    version = str(form.get("version", ""))
    delete = form.get("action") == "delete"
    typed = str(form.get("content", ""))
    original = str(form.get("original", ""))[:MAX_ENTRY * 2]
    if len(typed) > MAX_ENTRY:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_ENTRY, actual_size=len(typed))
    store = request.app[APP_KEY].workspace.store
    try:
        done = await asyncio.to_thread(replace_entry, store, line, version, None if delete else typed, original)
    except MemoryStoreError as exc:
        return await memory_page(request, error=str(exc), status=400)
    if isinstance(done, Conflict):
        said = LABELS[language(request)]["entry_changed"]  # the page's language, the workspace's own name
        kept = EditConflict(typed, delete, _view(done.current) if done.current is not None else None)
        return await memory_page(request, error=said.format(line=line, file=in_workspace(
            request, str(store.long_term_path))), status=409, conflict=kept)
    if delete:
        return see_other("/memory?" + urlencode({"notice": "deleted", "undo": done.backup, "line": done.line,
                                                 "version": version}))
    return _back("saved")


async def undo_delete(request: web.Request) -> web.Response:
    """Put a deleted entry back from the backup its delete took, at its place (web/entry_edits.py)."""
    from picoclaw.errors import MemoryStoreError
    from picoclaw.web.entry_edits import undo_delete as undo

    form = await request.post()
    backup, version = str(form.get("backup", "")), str(form.get("version", ""))
    try:
        line = int(str(form.get("line", "")))
    except ValueError:
        raise web.HTTPBadRequest(text="No entry named: the form's line number is missing.\n") from None
    store = request.app[APP_KEY].workspace.store
    if backup not in {path.name for path in await asyncio.to_thread(store.backups)}:
        raise web.HTTPNotFound(text="No such backup; nothing was changed.\n")
    try:
        restored = await asyncio.to_thread(undo, store, backup, line, version)
    except MemoryStoreError as exc:
        return await memory_page(request, error=str(exc), status=409)
    return _back("undone" if restored else "already_there")


def _back(notice: str) -> web.Response:
    return see_other(f"/memory?notice={notice}")


async def backups_page(request: web.Request) -> web.Response:
    """MEMORY.md's backups, newest first; with `name`, that backup's differences from the current file."""
    store = request.app[APP_KEY].workspace.store
    backups = [path.name for path in reversed(await asyncio.to_thread(store.backups))]
    name = request.query.get("name", "")
    diff: list[str] = []
    if name:
        if name not in backups:  # only names the store lists: no path from the request reaches the disk
            raise web.HTTPNotFound(text="No such backup.\n")
        old = (await asyncio.to_thread(store.read_backup, name)).decode("utf-8", "replace").splitlines()
        new = (await asyncio.to_thread(store.read_long_term)).splitlines()
        diff = await asyncio.to_thread(_diff, old, new, f"backups/{name}")
    return render(request, "backups.html", backups=backups, name=name, diff=diff,
                  notice=request.query.get("notice", ""))


def _diff(old: list[str], new: list[str], old_name: str, context: int = 2, most: int = 2000) -> list[str]:
    """A unified diff of two versions of MEMORY.md, at most `most` lines.

    The lines both share at the start and the end are set aside first (all but the context kept): a backup
    differs from the file by a few entries, and difflib over 30,000 lines took 100 ms where this takes 5.
    """
    import difflib

    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    start = max(0, head - context)
    keep = max(0, tail - context)
    middle_old, middle_new = old[start:len(old) - keep], new[start:len(new) - keep]
    lines = list(difflib.unified_diff(middle_old, middle_new, old_name, "MEMORY.md", lineterm="", n=context))
    if lines:  # the hunk headers count from the first line kept: shift them back to the file's numbers
        lines = [_shifted(line, start) if line.startswith("@@") else line for line in lines]
    return lines[:most]


def _shifted(header: str, offset: int) -> str:
    import re

    def shift(match: re.Match[str]) -> str:
        return f"{match.group(1)}{int(match.group(2)) + offset}"

    return re.sub(r"([-+])(\d+)", shift, header, count=2)


async def restore_backup(request: web.Request) -> web.Response:
    """Make a backup the current MEMORY.md through the store (which backs up the current one first)."""
    from picoclaw.errors import MemoryStoreError

    name = str((await request.post()).get("name", ""))
    store = request.app[APP_KEY].workspace.store
    try:
        await asyncio.to_thread(store.restore_backup, name)
    except MemoryStoreError:
        raise web.HTTPNotFound(text="No such backup; nothing was changed.\n") from None
    return see_other("/memory/backups?notice=restored")


async def notes_page(request: web.Request) -> web.Response:
    """The daily notes by day, newest first; with `day` (YYYYMMDD), that day's note."""
    store = request.app[APP_KEY].workspace.store
    files = {path.stem: path for path in reversed(await asyncio.to_thread(store.note_files))}
    day = request.query.get("day", "") or next(iter(files), "")
    text = ""
    if day:
        if day not in files:  # only days the store lists: no path from the request reaches the disk
            raise web.HTTPNotFound(text="No note for that day.\n")
        text = await asyncio.to_thread(store.read_note, files[day])
    return render(request, "notes.html", days=list(files), day=day, text=text)


async def lessons_page(request: web.Request) -> web.Response:
    """LEARNINGS.md's lessons, newest first, each with its source, and whether it stands in every prompt."""
    from picoclaw.memory import entry_injections, long_term_entries, stands

    store = request.app[APP_KEY].workspace.store
    text = await asyncio.to_thread(store.read_learnings)
    entries = list(long_term_entries(text))[::-1]
    injected = await asyncio.to_thread(entry_injections, store, [entry.text for entry in entries], lessons=True)
    lessons = [(entry.heading, entry.text.split("\n", 1)[1].rstrip("\n") if "\n" in entry.text else "",
                stands(entry.text), injected[n] if injected else None) for n, entry in enumerate(entries)]
    return render(request, "lessons.html", lessons=lessons)

