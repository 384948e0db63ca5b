"""Where a write to a path lands: the path itself or the regular file it links to, through every link.

A file may be a symbolic link (a MEMORY.md kept in a synced folder or a notes vault and linked into the
workspace): every write goes through the link to the file it names, which is replaced in its own folder,
so the link stays a link. A link to anything but a regular file (a folder, a device such as /dev/null, a
FIFO), or to nothing, is refused with NotAFileError and never replaced.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from picoclaw.errors import PicoclawError


class NotAFileError(PicoclawError, OSError):
    """A write (or read) refused because its path is, or links to, something that is not a regular file, or a
    link that leads nowhere; nothing was done. An OSError too, so every handler of file errors reports it."""

    def __init__(self, path: Path, why: str, *, done: str = "written"):
        super().__init__(errno.EINVAL, f"{path} {why}; nothing was {done}", str(path))

    def __str__(self) -> str:
        return str(self.strerror)


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def write_target(path: Path) -> Path:
    """The file a write to `path` replaces: `path` itself, or the regular file it links to (through every link).

    NotAFileError when `path` is, or links to, something that is not a regular file, or is a link to nothing
    or a loop of links. A missing `path` is a new file: returned as it is.
    """
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path
    if not stat.S_ISLNK(info.st_mode):
        if not stat.S_ISREG(info.st_mode):
            raise NotAFileError(path, not_regular(path, info.st_mode))
        return path
    try:
        info = os.stat(path)
    except OSError as exc:
        raise broken_link(path, exc) from None
    if not stat.S_ISREG(info.st_mode):
        raise NotAFileError(path, not_regular(path, info.st_mode))
    return Path(os.path.realpath(path))


def not_regular(path: Path, mode: int) -> str:
    """Why `path`, which is (or links to) a file of this mode, is refused."""
    kind = f"{_kind(mode)}, not a regular file"
    return f"is a link to {os.readlink(path)}, which is {kind}" if os.path.islink(path) else f"is {kind}"


def broken_link(path: Path, exc: OSError, done: str = "written") -> OSError:
    """The error for `exc`, raised when following `path`: a NotAFileError when the link leads nowhere."""
    if not os.path.islink(path) or exc.errno not in (errno.ENOENT, errno.ELOOP):
        return exc
    why = "which does not exist" if exc.errno == errno.ENOENT else "which leads back to itself (a loop of links)"
    return NotAFileError(path, f"is a link to {os.readlink(path)}, {why}", done=done)
