"""Appending an entry to MEMORY.md in place, never by copying the file, and undoing one a crash cut off.

The entry's bytes are added at the end and fsynced, with a journal naming the old size written first, so an
append cut off by a crash is removed by the next reader or writer (the file is the old one or the new one,
never half). An entry already stored is found in the entry table (memory/entry_table.py), and an update is
looked for among the newest entries only, so an append costs the same at 50 MB as at 1 MB. Everything here
runs with the store's lock held (MemoryStore.locked).
"""

from __future__ import annotations

import codecs
import logging
import os
from pathlib import Path
from typing import BinaryIO

import orjson

from picoclaw.disk.appends import journal_path
from picoclaw.disk.links import write_target
from picoclaw.memory.entries import LongTermEntry, entry_fingerprint, long_term_entries, updated_by
from picoclaw.memory.entry_table import BLOCK, ENTRIES_FILE, current_entry_table, fingerprint_hash, save_entry_table
from picoclaw.storage import Documents

log = logging.getLogger(__name__)


def append_in_place(local: Path, name: str, heading: str, body: str, window: int,
                    documents: Documents) -> LongTermEntry | None:
    """Append the entry at the end of a clean MEMORY.md (document `name`, whose file on this machine is `local`:
    `Documents.local`) without copying it, or find it already stored (`new` False); None when the file needs
    the text path of `MemoryStore.append_long_term`: no file or a blank one, one that is not clean, or an entry
    among the newest `window` that the new one updates."""
    memory_dir = local.parent  # where the entry table is kept, beside the file it is derived from
    real = write_target(local)
    try:
        handle = open(real, "rb")
    except FileNotFoundError:
        return None
    with handle:
        info = os.fstat(handle.fileno())
        table = current_entry_table(memory_dir, handle, info)
        if table is None or (table.count == 0 and _blank(handle)):
            return None
        wanted = entry_fingerprint(body)
        for index in table.find(fingerprint_hash(wanted)) if wanted else ():
            _, start, line = table.record(index)
            handle.seek(start)
            text = handle.read(table.end_of(index) - start).decode("utf-8").rstrip("\n") + "\n"
            if entry_fingerprint(text.split("\n", 1)[1]) == wanted:
                return LongTermEntry(text.split("\n", 1)[0].rstrip(), text, line, new=False)
        handle.seek(table.record(max(table.count - window, 0))[1] if table.count else info.st_size)
        if updated_by(body, long_term_entries(handle.read().decode("utf-8"))):
            return None
        handle.seek(max(info.st_size - 3, 0))
        tail = handle.read()
        trailing = len(tail) - len(tail.rstrip(b"\n"))
        if trailing > 2:  # the text path trims the extra blank lines at the end
            return None
        text = f"{heading}\n{body}\n"
        payload = b"\n" * (2 - trailing) + text.encode("utf-8")
        documents.append(name, payload)
        after = os.stat(real)
        line = table.lines + 2 - trailing + 1
        table.appended(handle, info.st_size, wanted, info.st_size + 2 - trailing, line, payload, after)
    save_entry_table(memory_dir, table)
    return LongTermEntry(heading, text, line)


def repair_append(long_term_path: Path) -> None:
    """Undo an append that a crash cut off: the file is cut back to its size before it, so it holds the
    old entries (never half a new one). Only when the bytes after that size are the append's own (or the
    zeros a power cut can leave); a file changed otherwise since is left as it is."""
    try:
        real = write_target(long_term_path)
    except OSError:
        return
    journal = journal_path(real)
    try:
        intent = orjson.loads(journal.read_bytes())
        inode, size, entry = intent["inode"], intent["size"], intent["entry"].encode("utf-8")
    except FileNotFoundError:
        return
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, OSError):
        journal.unlink(missing_ok=True)
        return
    try:
        with open(real, "rb") as handle:
            info = os.fstat(handle.fileno())
            handle.seek(size)
            tail = handle.read(len(entry) + 1)
        if info.st_ino == inode and size <= info.st_size and tail and tail != entry \
                and len(tail) <= len(entry) and all(a in (b, 0) for a, b in zip(tail, entry)):
            with open(real, "r+b") as handle:
                handle.truncate(size)
                os.fsync(handle.fileno())
            (long_term_path.parent / ENTRIES_FILE).unlink(missing_ok=True)
            log.warning("%s: an append was cut off (the writer stopped half-way); its %d partial bytes were "
                        "removed, the file is as it was before it", real, len(tail))
    except FileNotFoundError:
        pass
    except OSError as exc:  # say, the file is read-only now: readers go on, the next writer tries again
        log.warning("%s: an append was cut off and could not be undone yet (%s)", real, exc.strerror or exc)
        return
    journal.unlink(missing_ok=True)


def _blank(handle: BinaryIO) -> bool:
    """Whether the file holds nothing but white space (an entry then replaces it, see entries.joined)."""
    handle.seek(0)
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    while chunk := handle.read(BLOCK):
        if decoder.decode(chunk).strip():
            return False
    return not decoder.decode(b"", final=True).strip()
