"""Atomic replacement: a crash leaves the old file or the new one, never half (through links, see links.py)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from picoclaw.disk.links import write_target


def atomic_write(path: Path, data: str | bytes | list[bytes | bytearray], *, mode: int | None = None,
                 durable: bool = True) -> None:
    """Replace `path` with `data` so a crash leaves either the old file or the new one, never half.

    Temp file in the same folder, flush, fsync, `os.replace`, then fsync of the folder so the rename
    itself survives a power cut. A link is written through: the file it names is replaced, in its own
    folder (see `write_target`). `data` may come in pieces, written one after the other (a large buffer
    need not be copied into one). `durable` False skips the fsyncs, for derived files that are checked
    when read and rebuilt when wrong.
    """
    target = write_target(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    pieces = [data.encode("utf-8")] if isinstance(data, str) else data if isinstance(data, list) else [data]
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.writelines(pieces)
            tmp.flush()
            if durable:
                os.fsync(tmp.fileno())
        if mode is not None:
            os.chmod(tmp_name, mode)
        elif target.exists():
            os.chmod(tmp_name, target.stat().st_mode & 0o7777)
        else:
            os.chmod(tmp_name, 0o666 & ~current_umask())
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    if durable:
        fsync_dir(target.parent)


def fsync_dir(folder: Path) -> None:
    """Flush a folder's entries to disk (no-op where folders cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def current_umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
