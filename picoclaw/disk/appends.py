"""Appends that a crash cannot make unreadable: JSON lines after a torn line, and in-place appends with a journal."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from picoclaw.disk.atomic import atomic_write
from picoclaw.disk.links import write_target


def append_jsonl(path: Path, records: list[dict[str, Any]], *, durable: bool = True) -> None:
    """Append records as JSON lines in one write, flushed and fsynced (a crash may tear only the last line);
    `durable` False skips the fsync, for soft state that may lose its last lines to a power cut.

    When the file does not end with a newline (a crash tore the last append), the records start on a new
    line: glued to the torn line they would be unreadable too, and lost with it. The torn line is left
    as it is rather than cut off, since it may be a whole record missing only its newline; readers skip
    a line that does not parse.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    target = write_target(path)  # through a link; never into /dev/null or a FIFO
    payload = b"".join(orjson.dumps(record) + b"\n" for record in records)
    with open(target, "a+b") as fh:
        end = fh.seek(0, os.SEEK_END)
        if end > 0:
            fh.seek(end - 1)
            if fh.read(1) != b"\n":
                payload = b"\n" + payload
        fh.write(payload)  # append mode: written at the end, wherever the read left the position
        fh.flush()
        if durable:
            os.fsync(fh.fileno())


def append_bytes(real: Path, info: os.stat_result, payload: bytes) -> os.stat_result:
    """Add `payload` at the end of `real` (whose stat is `info`), fsynced; the file's stat after.

    A journal beside the file names the size before and the bytes being added, fsynced before the first
    byte is written: a writer killed half-way leaves it behind, and the memory store's repair
    (memory/in_place_append.py) cuts the file back. A write that fails (a full disk) cuts it back at once.
    """
    fd = os.open(real, os.O_WRONLY | os.O_APPEND)  # first: a file that cannot be written leaves no journal
    try:
        journal = journal_path(real)
        atomic_write(journal, orjson.dumps({"inode": info.st_ino, "size": info.st_size,
                                            "entry": payload.decode("utf-8")}))
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, info.st_size)  # should this fail too, the journal stays for the next writer
            os.fsync(fd)
            journal.unlink(missing_ok=True)
            raise
        journal.unlink(missing_ok=True)
        return os.fstat(fd)
    finally:
        os.close(fd)


def journal_path(real: Path) -> Path:
    """Where an append to `real` notes what it is about to do, beside the file (see `append_bytes`)."""
    return real.with_name(f".{real.name}.append")
