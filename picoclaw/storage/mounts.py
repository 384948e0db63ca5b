"""Which backend holds a path: the storage mounted at the workspace root above it, else the files backend.

The composition root mounts the configured storage once; memory, sessions and jobs then ask for their locks
and tables by path, so nothing above the storage layer knows which backend runs, and a store made on a
bare folder (tests, `picoclaw onboard` before any config) keeps working on files.
"""

from __future__ import annotations

import os
import threading
from contextlib import AbstractContextManager
from pathlib import Path

from picoclaw.storage.backend import Storage
from picoclaw.storage.files import FilesStorage

_mounted: dict[Path, Storage] = {}
_guard = threading.Lock()


def _absolute(path: Path) -> Path:
    return Path(os.path.abspath(path))


def mount(storage: Storage) -> None:
    """Serve every path under `storage.root` from `storage` (one mount per root; a second replaces it)."""
    with _guard:
        _mounted[_absolute(storage.root)] = storage


def unmount(storage: Storage) -> None:
    """Stop serving `storage.root` from `storage` (the files backend serves it again)."""
    with _guard:
        root = _absolute(storage.root)
        if _mounted.get(root) is storage:
            del _mounted[root]


def storage_for(path: Path) -> Storage:
    """The storage mounted at the nearest root above `path` (or at it), else the files backend."""
    absolute = _absolute(path)
    with _guard:
        if _mounted:
            for folder in (absolute, *absolute.parents):
                found = _mounted.get(folder)
                if found is not None:
                    return found
    return FilesStorage(absolute.parent)


def cross_process_lock(path: Path, timeout: float = -1) -> AbstractContextManager[object]:
    """The one way picoclaw takes a lock shared between processes: the lock named by file `path`."""
    return storage_for(path).lock(path, timeout)
