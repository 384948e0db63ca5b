"""A file's identity as it is now (mtime, size, inode), and values derived from files kept until it changes."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")

FileKey = tuple[int, int, int]  # (mtime_ns, size, inode): changes whenever the file is rewritten or replaced


def file_key(path: Path) -> FileKey | None:
    """The file's (mtime_ns, size, inode), or None when it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return stat_key(st)


def stat_key(st: os.stat_result) -> FileKey:
    """`file_key` of the file `st` was taken of."""
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

    def holds(self, path: Path, key: FileKey | None) -> bool:
        """Whether the value kept for `path` was loaded from a file whose `file_key` was `key`."""
        cached = self._entries.get(path)
        return cached is not None and cached[0] == key

    def held(self, path: Path) -> T | None:
        """The value kept for `path`, whether or not its file changed since (None: none is kept)."""
        cached = self._entries.get(path)
        return None if cached is None else cached[1]

    def get(self, path: Path, file: Path | None = None) -> T | None:
        """The value for `path`, read from `file` (default: `path`) and loaded again only if that file changed;
        None when it does not exist."""
        file = path if file is None else file
        return self.get_known(path, file, file_key(file))

    def get_known(self, path: Path, file: Path, key: FileKey | None, *,
                  loaded: Callable[[], object] | None = None) -> T | None:
        """`get` with `file`'s `file_key` just read by the caller, so that it is not read twice; `loaded` runs
        after each (re)load (the value stays under `key`: a file changed meanwhile is loaded again next time)."""
        cached = self._entries.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        if key is None:
            self._entries.pop(path, None)
            return None
        cached = (key, self._load(path, file))
        self._entries[path] = cached
        if loaded is not None:
            loaded()
        return cached[1]
