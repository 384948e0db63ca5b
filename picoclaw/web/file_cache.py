"""What a page computed from files, kept while none of those files changed: parsing a 10,000-entry MEMORY.md or a
2,000-message transcript again for every request would cost a page 50–100 ms.

A value is kept with the version of what it was computed from, which the caller says how to take: a file's
identity (`identity`: its size, modification time in nanoseconds and inode — a rewrite through a temporary file and
a rename changes the inode; an append, the size and the time), a transcript's marker, a document's revision. On
PostgreSQL a memory document's file is the one `Documents.local` gives (the cache of its row, brought up to date by
that call), never the workspace folder's. A value is only kept when the version was the same before and after it
was computed: a write meanwhile is never hidden behind the older result.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")
Identity = tuple[tuple[str, int, int, int], ...]


def identity(paths: Iterable[Path]) -> Identity:
    """Each path with its size, mtime_ns and inode; (-1, -1, -1) for one that does not exist."""
    found = []
    for path in paths:
        try:
            stat = path.stat()
            found.append((str(path), stat.st_size, stat.st_mtime_ns, stat.st_ino))
        except OSError:
            found.append((str(path), -1, -1, -1))
    return tuple(found)


def folder_files(*folders: Path) -> list[Path]:
    """Every file under `folders` (walked; a missing folder has none): for a value read from many files."""
    files: list[Path] = []
    for folder in folders:
        for root, _, names in os.walk(folder):
            files.extend(Path(root) / name for name in names)
    return sorted(files)


class FileCache(Generic[T]):
    """Values by a key of the caller's (a conversation's name …), each kept with the identity of the files it
    was computed from; at most `size` keys, the least recently used forgotten."""

    def __init__(self, size: int = 8):
        self.size = size
        self._kept: OrderedDict[Hashable, tuple[Hashable, T]] = OrderedDict()
        self._lock = threading.Lock()  # pages compute in worker threads

    def get(self, key: Hashable, version: Callable[[], Hashable], compute: Callable[[], T]) -> T:
        """The value for `key`: the kept one while `version()` is what it was, else `compute()` (kept if the
        version did not change while it ran)."""
        before = version()
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and kept[0] == before:
                self._kept.move_to_end(key)
                return kept[1]
        value = compute()
        if version() == before:
            with self._lock:
                self._kept[key] = (before, value)
                self._kept.move_to_end(key)
                while len(self._kept) > self.size:
                    self._kept.popitem(last=False)
        return value
