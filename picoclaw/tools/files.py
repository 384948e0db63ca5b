"""File tools for the model: read, write, edit, append and list inside the workspace only.

Every path goes through the workspace's path rules (`sandbox.py`: sandboxed, sorted, refused where the
store, the policy, the jobs or another user own it). Memory files belong to MemoryStore, so writes to them
are routed through it instead of touching the file:

- `memory/MEMORY.md`: write_file and append_file add a `## YYYY-MM-DD` entry (appended, never an
  overwrite) by the path memory_append takes (tools/saved_facts.py): junk is refused with its reason, a fact the
  user never said is marked as the assistant's words, and the write gets its receipt; edit_file holds what it adds
  to the same rule (refused unless the user said it) and sends its receipt, then reads, replaces and calls
  `rewrite_long_term` under the memory lock (a backup is taken).
- `memory/YYYYMM/YYYYMMDD.md` (daily notes): write_file and append_file add a `## HH:MM` entry to that
  day's note via `append_note` (a daily note is never overwritten, so no earlier note is lost); edit_file
  rewrites it atomically under the memory lock.
"""

from __future__ import annotations

import asyncio
import os
from abc import abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from picoclaw import clock
from picoclaw.errors import MemoryStoreError
from picoclaw.memory import Workspace, demote_headings
from picoclaw.storage import StorageError, edit_file, local_file, local_folder, write_file
from picoclaw.tools.base import Tool, ToolError
from picoclaw.tools.sandbox import Target, WorkspaceFiles
from picoclaw.tools.saved_facts import check_edit, edited, save_fact

MAX_READ_CHARS = 50_000
MAX_READ_LINES = 100_000
MAX_WRITE_BYTES = 1_000_000
MAX_LIST_ENTRIES = 500


def check_size(content: str) -> None:
    """Refuse content larger than MAX_WRITE_BYTES (a runaway model must not fill the disk)."""
    size = len(content.encode("utf-8", errors="surrogatepass"))
    if size > MAX_WRITE_BYTES:
        raise ToolError(f"content too large: {size} bytes (at most {MAX_WRITE_BYTES})")


@contextmanager
def os_errors(action: str, shown: str) -> Iterator[None]:
    """Turn file-system and store failures into one-line ToolErrors the model can act on."""
    try:
        yield
    except ToolError:
        raise
    except (MemoryStoreError, StorageError) as exc:  # StorageError: a lock not free in time, a server gone
        raise ToolError(f"cannot {action} {shown}: {exc}") from exc
    except FileNotFoundError as exc:
        raise ToolError(f"no such file or folder: {shown}") from exc
    except IsADirectoryError as exc:
        raise ToolError(f"{shown} is a folder, not a file") from exc
    except NotADirectoryError as exc:
        raise ToolError(f"a part of {shown} is a file, not a folder") from exc
    except UnicodeError as exc:
        raise ToolError(f"{shown} is not a UTF-8 text file") from exc
    except OSError as exc:
        raise ToolError(f"cannot {action} {shown}: {exc.strerror or exc}") from exc


class WorkspaceTool(Tool):
    """A tool bound to one workspace (a per-user workspace gets its own instances)."""

    def __init__(self, workspace: Workspace, files: WorkspaceFiles | None = None):
        self.workspace = workspace
        self.files = files or WorkspaceFiles(workspace)

    async def run(self, args: Any) -> str:
        """Run `run_sync` in a worker thread: file I/O and the cross-process memory lock must not stall
        the event loop that serves every other session."""
        return await asyncio.to_thread(self.run_sync, args)

    @abstractmethod
    def run_sync(self, args: Any) -> str:
        """Do the work (blocking is fine here); raise ToolError when it cannot be done."""

    def _append_memory(self, target: Target, content: str, after: str = "") -> str:
        """Add `content` to MEMORY.md (as memory_append does) or a daily note through the store; the result text
        for the model, `after` added to it when something was written."""
        store = self.workspace.store
        if target.kind == "long_term":
            saved = save_fact(self.workspace, content, self.name)
            return saved.told(target.shown, lambda entry: f"appended a '{entry.heading}' entry to {target.shown}",
                              after)
        assert target.day is not None
        now = clock.now(store.tz)
        # The note's own day with the current time of day, so append_note writes to the file named.
        at = now.replace(year=target.day.year, month=target.day.month, day=target.day.day)
        store.append_note(content, at=at)
        return f"appended a '## {at.strftime('%H:%M')}' entry to the daily note {target.shown}{after}"


class ReadFile(WorkspaceTool):
    """read_file: a text file's lines, capped so one call cannot flood the context."""

    name = "read_file"
    description = f"Read a workspace file (cut at {MAX_READ_CHARS:,} characters; offset, limit: lines)."

    class Args(BaseModel):
        model_config = ConfigDict(extra="forbid")
        path: str = Field(description="e.g. memory/MEMORY.md")
        offset: int = Field(1, ge=1)
        limit: int = Field(MAX_READ_LINES, ge=1, le=MAX_READ_LINES)

    def run_sync(self, args: ReadFile.Args) -> str:
        target = self.files.target(args.path, writing=False)
        if target.path.is_dir():
            raise ToolError(f"{target.shown} is a folder; use list_dir")
        with os_errors("read", target.shown):
            return self._read(target, local_file(self.workspace.storage, target.path), args.offset, args.limit)

    @staticmethod
    def _read(target: Target, file: Path, offset: int, limit: int) -> str:
        chunks: list[str] = []
        size = 0
        last = offset - 1
        seen = 0
        note = ""
        # newline="" keeps the file's own line endings, so old_text copied from here matches edit_file.
        with open(file, encoding="utf-8", newline="") as handle:
            for number, line in enumerate(handle, start=1):
                seen = number
                if number < offset:
                    continue
                if number - offset >= limit:
                    note = f"[showing lines {offset}-{last}; more follows: read_file with offset={last + 1}]"
                    break
                if size + len(line) > MAX_READ_CHARS:
                    if not chunks:  # one huge line: show its start rather than nothing
                        chunks.append(line[:MAX_READ_CHARS])
                        note = (f"[line {number} is longer than {MAX_READ_CHARS:,} characters and was cut; "
                                f"the rest of the file starts at offset={number + 1}]")
                    else:
                        note = (f"[truncated at {MAX_READ_CHARS:,} characters: showing lines {offset}-{last}; "
                                f"continue with offset={last + 1}]")
                    break
                chunks.append(line)
                size += len(line)
                last = number
        if not chunks:
            if offset > 1:
                return f"{target.shown} has only {seen} lines; offset {offset} is past its end"
            return f"({target.shown} is empty)"
        text = "".join(chunks)
        if note:
            return f"{text.rstrip(chr(10))}\n{note}"
        if offset > 1:
            return f"{text.rstrip(chr(10))}\n[lines {offset}-{last}, end of file]"
        return text


class WriteFile(WorkspaceTool):
    """write_file: create or replace a file; memory files are appended to through the store instead."""

    name = "write_file"
    description = "Create or replace a workspace file (on a memory file: add a dated entry)."

    class Args(BaseModel):
        model_config = ConfigDict(extra="forbid")
        path: str
        content: str

    def run_sync(self, args: WriteFile.Args) -> str:
        check_size(args.content)
        target = self.files.target(args.path, writing=True)
        with os_errors("write", target.shown):
            if target.kind == "long_term":
                return self._write_long_term(target, args.content)
            if target.kind == "note":
                return self._append_memory(target, args.content, " (daily notes are never overwritten)")
            if target.path.is_dir():
                raise ToolError(f"{target.shown} is a folder, not a file")
            existed = target.path.exists()
            write_file(self.workspace.storage, target.path, args.content)
        return f"{'replaced' if existed else 'created'} {target.shown} ({len(args.content)} characters)"

    def _write_long_term(self, target: Target, content: str) -> str:
        # A model often reads MEMORY.md and writes it back whole with its addition; appending all of that
        # would duplicate the file, so only the part after the current text becomes the new entry.
        current = self.workspace.store.read_long_term().strip()
        new = content.strip()
        if current and new.startswith(current):
            new = new[len(current):]
            if not new.strip():
                return f"{target.shown} already holds this text; nothing was appended"
        return self._append_memory(target, new, " (MEMORY.md is never overwritten; use edit_file to change existing "
                                                "entries)")


class EditFile(WorkspaceTool):
    """edit_file: replace one exact, unique occurrence of a text."""

    name = "edit_file"
    description = "In a workspace file, replace old_text (exact, found once) with new_text."

    class Args(BaseModel):
        model_config = ConfigDict(extra="forbid")
        path: str
        old_text: str = Field(min_length=1)
        new_text: str

    def run_sync(self, args: EditFile.Args) -> str:
        check_size(args.new_text)
        target = self.files.target(args.path, writing=True)
        if target.path.is_dir():
            raise ToolError(f"{target.shown} is a folder, not a file")
        store = self.workspace.store
        note = ""
        with os_errors("edit", target.shown):
            if target.kind in ("long_term", "note"):
                new_text, demoted = _entry_safe(args.old_text, args.new_text)
                args = args.model_copy(update={"new_text": new_text})
                note = "" if not demoted else (
                    f"; {demoted} heading line(s) of new_text became '###' so they stay inside their entry "
                    "(use memory_append to add an entry)")
            if target.kind == "long_term":
                # Read and rewrite under one lock hold, so an entry appended meanwhile is not lost. (warn
                # False: the rewrite itself warns about bytes that were not UTF-8, naming the backup.)
                with store.locked():
                    current = store.read_long_term(warn=False)
                    updated = self._replace(target, current, args)
                    # The sentences the edit adds, whole, are held to memory_append's rule (tools/saved_facts.py).
                    edit = check_edit(current, updated)
                    if edit.refused is not None:
                        return edit.told()
                    store.rewrite_long_term(updated)
                edited(edit, self.name)
                return f"edited {target.shown} (the previous version was backed up){note}"
            if target.kind == "note":
                store.edit_note(target.path, lambda text: self._replace(target, text, args))
                return f"edited {target.shown}{note}"
            # Read and replaced by revision: another process's write meanwhile is refused, never overwritten.
            edit_file(self.workspace.storage, target.path,
                      lambda data: self._replace(target, _existing(data).decode("utf-8"), args).encode("utf-8"))
        return f"edited {target.shown}"

    @staticmethod
    def _replace(target: Target, text: str, args: EditFile.Args) -> str:
        count = text.count(args.old_text)
        if count == 0:
            raise ToolError(f"old_text was not found in {target.shown}; read_file it and copy the text exactly")
        if count > 1:
            raise ToolError(f"old_text occurs {count} times in {target.shown}; include more surrounding text "
                            "so it matches exactly once")
        updated = text.replace(args.old_text, args.new_text, 1)
        check_size(updated)
        return updated


def _entry_safe(old_text: str, new_text: str) -> tuple[str, int]:
    """new_text for an edit of MEMORY.md or a daily note, and how many of its heading lines were demoted.

    An edit may keep or correct the `## ` / `# ` heading lines it replaces (a model copies a date heading
    into old_text to make it unique), but may not add more: an extra one would be a fake entry. Extra
    lines are demoted by the store's rule (`demote_headings`), the way appended content is.
    """
    allowed = demote_headings(old_text)[1]
    kept: list[str] = []
    demoted = 0
    for line in new_text.splitlines(keepends=True):
        safe, changed = demote_headings(line)
        if changed and allowed > 0:
            allowed -= 1
            safe = line
        elif changed:
            demoted += 1
        kept.append(safe)
    return "".join(kept), demoted


class AppendFile(WorkspaceTool):
    """append_file: add text at the end of a file; memory files get a dated entry through the store."""

    name = "append_file"
    description = "Append to a workspace file (on a memory file: add a dated entry)."

    class Args(BaseModel):
        model_config = ConfigDict(extra="forbid")
        path: str
        content: str

    def run_sync(self, args: AppendFile.Args) -> str:
        check_size(args.content)
        target = self.files.target(args.path, writing=True)
        with os_errors("append to", target.shown):
            if target.kind in ("long_term", "note"):
                return self._append_memory(target, args.content)
            if target.path.is_dir():
                raise ToolError(f"{target.shown} is a folder, not a file")

            def appended(existing: bytes | None) -> bytes:
                updated = (existing or b"") + args.content.encode("utf-8")
                if len(updated) > MAX_WRITE_BYTES:
                    raise ToolError(f"{target.shown} would grow to {len(updated)} bytes (at most {MAX_WRITE_BYTES})")
                return updated

            edit_file(self.workspace.storage, target.path, appended)
        return f"appended {len(args.content)} characters to {target.shown}"


def _existing(data: bytes | None) -> bytes:
    """The bytes of a file that must exist (an edit's): a missing one is the usual "no such file"."""
    if data is None:
        raise FileNotFoundError
    return data


class ListDir(WorkspaceTool):
    """list_dir: a folder's entries, folders first."""

    name = "list_dir"
    description = "List a workspace folder."

    class Args(BaseModel):
        model_config = ConfigDict(extra="forbid")
        path: str = "."

    def run_sync(self, args: ListDir.Args) -> str:
        target = self.files.target(args.path, writing=False)
        with os_errors("list", target.shown):
            folder = local_folder(self.workspace.storage, target.path)
            if not folder.exists():
                raise ToolError(f"no such folder: {target.shown}")
            if not folder.is_dir():
                raise ToolError(f"{target.shown} is a file; use read_file")
            entries = sorted(os.scandir(folder),
                             key=lambda e: (not e.is_dir(follow_symlinks=False), e.name.casefold()))
            lines = [_describe(entry) for entry in entries[:MAX_LIST_ENTRIES]]
        if not lines:
            return f"{target.shown}/ is empty"
        if len(entries) > MAX_LIST_ENTRIES:
            lines.append(f"… and {len(entries) - MAX_LIST_ENTRIES} more entries")
        return f"{target.shown}/ ({len(entries)} entries)\n" + "\n".join(lines)


def _describe(entry: os.DirEntry[str]) -> str:
    # A symlink is shown as a link and not followed: its target may be outside the workspace.
    if entry.is_symlink():
        return f"{entry.name}@"
    if entry.is_dir(follow_symlinks=False):
        return f"{entry.name}/"
    try:
        return f"{entry.name} ({entry.stat(follow_symlinks=False).st_size} bytes)"
    except OSError:
        return entry.name
