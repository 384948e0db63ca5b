"""Files named by the time they were made (`<stamp><suffix>`, a counter within one second): backups, archives.

A name is never handed out twice, a file appears under its name only when complete, and listing orders them
by time, oldest first, for pruning.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from picoclaw.disk.atomic import current_umask, fsync_dir


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
        os.chmod(tmp_name, 0o644 & ~current_umask())  # the mode reserve_stamped_path gives
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
