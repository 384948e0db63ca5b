"""File helpers shared by every reader and writer: atomic writes, stamped names, change-aware caches, JSONL
appends, bounded reads.

A file may be a symbolic link (a MEMORY.md kept in a synced folder or a notes vault and linked into the
workspace): every write goes through the link to the file it names, which is replaced in its own folder,
so the link stays a link. A link to anything but a regular file (a folder, a device such as /dev/null, a
FIFO), or to nothing, is refused with NotAFileError and never replaced.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Generic, TypeVar

import orjson

from picoclaw.errors import PicoclawError

T = TypeVar("T")


class NotAFileError(PicoclawError, OSError):
    """A write (or read) refused because its path is, or links to, something that is not a regular file, or a
    link that leads nowhere; nothing was done. An OSError too, so every handler of file errors reports it."""

    def __init__(self, path: Path, why: str, *, done: str = "written"):
        super().__init__(errno.EINVAL, f"{path} {why}; nothing was {done}", str(path))

    def __str__(self) -> str:
        return str(self.strerror)


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
            raise NotAFileError(path, _not_regular(path, info.st_mode))
        return path
    try:
        info = os.stat(path)
    except OSError as exc:
        raise _broken_link(path, exc) from None
    if not stat.S_ISREG(info.st_mode):
        raise NotAFileError(path, _not_regular(path, info.st_mode))
    return Path(os.path.realpath(path))


def _not_regular(path: Path, mode: int) -> str:
    """Why `path`, which is (or links to) a file of this mode, is refused."""
    kind = f"{_kind(mode)}, not a regular file"
    return f"is a link to {os.readlink(path)}, which is {kind}" if os.path.islink(path) else f"is {kind}"


def _broken_link(path: Path, exc: OSError, done: str = "written") -> OSError:
    """The error for `exc`, raised when following `path`: a NotAFileError when the link leads nowhere."""
    if not os.path.islink(path) or exc.errno not in (errno.ENOENT, errno.ELOOP):
        return exc
    why = "which does not exist" if exc.errno == errno.ENOENT else "which leads back to itself (a loop of links)"
    return NotAFileError(path, f"is a link to {os.readlink(path)}, {why}", done=done)


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
            os.chmod(tmp_name, 0o666 & ~_umask())
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    if durable:
        fsync_dir(target.parent)


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
        raise _broken_link(Path(path), exc, done="read") from None
    try:
        info = os.fstat(fd)
        if not (stat.S_ISREG(info.st_mode) or devices and (stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode))):
            raise NotAFileError(Path(path), _not_regular(Path(path), info.st_mode), done="read")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as handle:
        yield handle, info


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


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def reserve_stamped_path(folder: Path, stamp: str, suffix: str) -> Path:
    """Create and return an empty, never-before-used file `<stamp><suffix>` in `folder`.

    A second name within the same second gets a counter: `<stamp>_1<suffix>`, `<stamp>_2<suffix>` …
    Creation uses O_EXCL, so two processes can never be handed the same name.
    """
    folder.mkdir(parents=True, exist_ok=True)
    counter = _next_counter(folder, stamp, suffix)
    while True:
        candidate = folder / _stamped_name(stamp, counter, suffix)
        try:
            fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            counter += 1
            continue
        os.close(fd)
        return candidate


def write_stamped(folder: Path, stamp: str, suffix: str, data: str | bytes) -> Path:
    """Write `data` to a new, never-before-used file named as by `reserve_stamped_path`; returns it.

    Unlike reserving the name and then writing, the file appears under its name only when complete
    (see `write_new`), so a crash never leaves an empty or partial file under a stamped name.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with _complete_temp(folder, f".{stamp}.", data) as tmp_name:
        counter = _next_counter(folder, stamp, suffix)
        while not _publish(tmp_name, folder / _stamped_name(stamp, counter, suffix)):
            counter += 1
    fsync_dir(folder)
    return folder / _stamped_name(stamp, counter, suffix)


def write_new(path: Path, data: str | bytes) -> bool:
    """Create `path` holding `data` unless it exists (then nothing is written and False returned).

    The data goes to a temp file (flush, fsync) that is then hard-linked to the name, which fails rather
    than overwrite: no lock is needed, and a crash leaves no file or the whole one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _complete_temp(path.parent, f".{path.name}.", data) as tmp_name:
        created = _publish(tmp_name, path)
    if created:
        fsync_dir(path.parent)
    return created


@contextmanager
def _complete_temp(folder: Path, prefix: str, data: str | bytes) -> Iterator[str]:
    """A flushed, fsynced temp file in `folder` holding `data`, removed afterwards (its links stay)."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(payload)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.chmod(tmp_name, 0o644 & ~_umask())  # the mode reserve_stamped_path gives
        yield tmp_name
    finally:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass


def _publish(tmp_name: str, target: Path) -> bool:
    """Give the complete temp file the name `target` unless that name is taken; False if it is."""
    try:
        os.link(tmp_name, target)
    except FileExistsError:
        return False
    except OSError:  # no hard links on this file system: claim the name, then move the data in
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        os.close(fd)
        os.replace(tmp_name, target)
    return True


def _stamped_name(stamp: str, counter: int, suffix: str) -> str:
    return f"{stamp}{suffix}" if counter == 0 else f"{stamp}_{counter}{suffix}"


def _next_counter(folder: Path, stamp: str, suffix: str) -> int:
    """One past the highest counter in use for `stamp`. A lower name freed by pruning is not reused:
    it would sort as the oldest file of that second and be the next one pruned."""
    highest = -1
    with os.scandir(folder) as entries:
        for entry in entries:
            match = _STAMPED.match(entry.name)
            if match and match.group(1) == stamp and match.group(3) == suffix:
                highest = max(highest, int(match.group(2) or 0))
    return highest + 1


# The stamp, with the "Z" of UTC names (clock.stamp); older versions wrote local time without it.
_STAMPED = re.compile(r"^(\d{8}_\d{6}Z?)(?:_(\d+))?(.*)$")
_UTC_MARK = "Z"


def stamped_files(folder: Path, suffix: str) -> list[Path]:
    """Files made by `reserve_stamped_path` with this suffix, oldest first; pruning deletes from the front.

    Ordered by time, never by a local-time name. UTC-marked names (`…Z`, see `clock.stamp`) sort by stamp,
    then numeric counter: fixed-width UTC text sorts in time order, and a name keeps its place when the
    folder is copied without its modification times. Names without the mark were written by older
    versions in the local time of the day, which may have changed since (a new timezone, a repeated
    daylight-saving hour), so they sort by modification time instead (then stamp and counter, for ties),
    and all before the UTC-marked ones: this version writes only UTC names, so every unmarked file is
    older than every marked one, and a file just written (the newest UTC stamp) is never put in front
    of an old one to be pruned, whatever its name or mtime claims.
    """
    if not folder.is_dir():
        return []
    found: list[tuple[tuple[bool, int, str, int], Path]] = []
    for entry in folder.iterdir():
        match = _STAMPED.match(entry.name)
        if not match or match.group(3) != suffix:
            continue
        stamp, counter = match.group(1), int(match.group(2) or 0)
        try:
            info = entry.stat()
        except FileNotFoundError:  # pruned by another process meanwhile
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        utc = stamp.endswith(_UTC_MARK)
        found.append(((utc, 0 if utc else info.st_mtime_ns, stamp, counter), entry))
    found.sort(key=lambda item: item[0])
    return [path for _, path in found]


# -- reading what changed, appending records ---------------------------------------------------------

FileKey = tuple[int, int, int]  # (mtime_ns, size, inode): changes whenever the file is rewritten or replaced


def file_key(path: Path) -> FileKey | None:
    """The file's (mtime_ns, size, inode), or None when it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class FileCache(Generic[T]):
    """Values derived from files (parsed, indexed …), each rebuilt only when its file's `file_key` changes.

    A value is kept by the path it is known by and loaded as `load(path, file)` from the file that holds it
    now, which may be another (a document's `local` file on PostgreSQL: see storage/documents.py).
    """

    def __init__(self, load: Callable[[Path, Path], T]):
        self._load = load
        self._entries: dict[Path, tuple[FileKey, T]] = {}

    def __contains__(self, path: object) -> bool:
        return path in self._entries

    def discard(self, path: Path) -> None:
        """Forget the value of `path`."""
        self._entries.pop(path, None)

    def get(self, path: Path, file: Path | None = None) -> T | None:
        """The value for `path`, read from `file` (default: `path`) and loaded again only if that file changed;
        None when it does not exist."""
        file = path if file is None else file
        key = file_key(file)
        if key is None:
            self._entries.pop(path, None)
            return None
        cached = self._entries.get(path)
        if cached is None or cached[0] != key:
            cached = (key, self._load(path, file))
            self._entries[path] = cached
        return cached[1]


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


# -- appending in place, crash-safe ------------------------------------------------------------------

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
