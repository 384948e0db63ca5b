"""Reads that cannot hang or fill memory: at most a limit of bytes, and never from a FIFO or a device."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from picoclaw.disk.links import NotAFileError, broken_link, not_regular
from picoclaw.errors import PicoclawError


class FileTooLargeError(PicoclawError, OSError):
    """A bounded read refused a file larger than its limit (or endless, like /dev/zero)."""

    def __init__(self, path: Path, limit: int):
        super().__init__(errno.EFBIG, f"larger than {format_size(limit)}; is it the right file?", str(path))
        self.limit = limit

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def format_size(size: int) -> str:
    """`size` bytes for a message: "1 MiB", "512 KiB", "300 bytes"."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} bytes"


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of `path`, refused with FileTooLargeError when there are more than `limit` of them.

    At most `limit` + 1 bytes are ever read, so a link to /dev/zero or a runaway file fails at once instead
    of filling memory; a FIFO is opened without waiting for a writer, and refused (NotAFileError).
    """
    with _open_for_reading(path, devices=True) as (handle, info):
        if stat.S_ISREG(info.st_mode) and info.st_size > limit:
            raise FileTooLargeError(Path(path), limit)
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise FileTooLargeError(Path(path), limit)
    return data


def read_regular(path: Path) -> bytes:
    """The bytes of the regular file `path` (through links); NotAFileError for a device, a FIFO (opened
    without waiting for a writer) or a socket, which a memory file linked to one must not hang or fill."""
    with _open_for_reading(path, devices=False) as (handle, _):
        return handle.read()


@contextmanager
def _open_for_reading(path: Path, *, devices: bool) -> Iterator[tuple[Any, os.stat_result]]:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise broken_link(Path(path), exc, done="read") from None
    try:
        info = os.fstat(fd)
        if not (stat.S_ISREG(info.st_mode) or devices and (stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode))):
            raise NotAFileError(Path(path), not_regular(Path(path), info.st_mode), done="read")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as handle:
        yield handle, info
