"""File helpers shared by every writer: atomic writes and collision-free timestamped names."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: str | bytes, *, mode: int | None = None) -> None:
    """Replace `path` with `data` so a crash leaves either the old file or the new one, never half.

    Temp file in the same folder, flush, fsync, `os.replace`, then fsync of the folder so the rename
    itself survives a power cut.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(payload)
            tmp.flush()
            os.fsync(tmp.fileno())
        if mode is not None:
            os.chmod(tmp_name, mode)
        elif path.exists():
            os.chmod(tmp_name, path.stat().st_mode & 0o7777)
        else:
            os.chmod(tmp_name, 0o666 & ~_umask())
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


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

    Unlike reserving the name and then writing, the file appears under its name only when complete:
    the data goes to a temp file (flush, fsync) that is then hard-linked to the name, which fails
    rather than overwrite. So a crash never leaves an empty or partial file under a stamped name.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=f".{stamp}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(payload)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.chmod(tmp_name, 0o644 & ~_umask())  # the mode reserve_stamped_path gives
        counter = _next_counter(folder, stamp, suffix)
        while True:
            candidate = folder / _stamped_name(stamp, counter, suffix)
            try:
                os.link(tmp_name, candidate)
            except FileExistsError:
                counter += 1
                continue
            except OSError:  # no hard links on this file system: reserve the name, then replace it
                candidate = reserve_stamped_path(folder, stamp, suffix)
                os.replace(tmp_name, candidate)
            break
    finally:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
    fsync_dir(folder)
    return candidate


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


_STAMPED = re.compile(r"^(\d{8}_\d{6})(?:_(\d+))?(.*)$")


def stamped_files(folder: Path, suffix: str) -> list[Path]:
    """Files made by `reserve_stamped_path` with this suffix, oldest first (by stamp, then counter)."""
    if not folder.is_dir():
        return []
    found: list[tuple[str, int, Path]] = []
    for entry in folder.iterdir():
        match = _STAMPED.match(entry.name)
        if match and match.group(3) == suffix and entry.is_file():
            found.append((match.group(1), int(match.group(2) or 0), entry))
    found.sort(key=lambda item: (item[0], item[1]))
    return [path for _, _, path in found]
