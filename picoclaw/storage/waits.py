"""Bounded lock waits: every storage lock gives up after its bound with one line naming what it waited for."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from picoclaw.storage.errors import StorageUnavailable

if TYPE_CHECKING:
    from filelock import FileLock

# storage.lock_wait_seconds' default (picoclaw/config.py, kept equal by a test): what a backend built without a
# config (tests, tools) waits. This module must not import the config, which imports half of picoclaw.
LOCK_WAIT_SECONDS = 30.0

ANOTHER_PROCESS = "another picoclaw process holds it"

_MAKING = threading.Lock()  # two threads' first acquire of one BoundedFileLock must share one FileLock


class LockWaitExpired(StorageUnavailable):
    """A lock was not free within its bound: a holder is frozen, cut off or just slow; nothing was written."""


def lock_label(path: Path, root: Path | None) -> str:
    """`the memory lock (memory/.memory.lock)`: the lock named by its file, the path relative to `root`."""
    name = path.name.removeprefix(".").removesuffix(".lock").replace("_", " ") or path.name
    shown = path
    if root is not None and Path(os.path.abspath(path)).is_relative_to(os.path.abspath(root)):
        shown = Path(os.path.relpath(os.path.abspath(path), os.path.abspath(root)))
    return f"the {name} lock ({shown})"


def lock_wait_expired(path: Path, root: Path | None, seconds: float, holder: str = ANOTHER_PROCESS) -> LockWaitExpired:
    """The one-line error for a wait on the lock file `path` that ended after `seconds`."""
    return LockWaitExpired(f"waited {seconds:g} s for {lock_label(path, root)}: {holder}")


def check_bound(timeout: float) -> float:
    """`timeout` itself; a negative one (filelock's "for ever") is refused, as no storage wait may be endless."""
    if timeout < 0:
        raise ValueError(f"a storage lock wait needs a bound in seconds, not {timeout}")
    return timeout


class BoundedFileLock:
    """A `filelock` lock file (reentrant within a thread) whose wait ends after `timeout` s in LockWaitExpired."""

    def __init__(self, path: Path, timeout: float, root: Path | None = None):
        self.lock_file = str(path)
        self.timeout = check_bound(timeout)
        self.root = root  # the workspace root, for the lock's name in a failed wait
        # Made at the first acquire: importing filelock costs a read-only command (`memory search`) a twentieth
        # of its start, and reading takes no lock.
        self._lock: FileLock | None = None
        self._made_in = 0  # the process that made `_lock`: filelock refuses one inherited across a fork

    @property
    def is_locked(self) -> bool:
        return self._lock is not None and self._lock.is_locked

    def _file_lock(self) -> FileLock:
        with _MAKING:
            if self._lock is None or self._made_in != os.getpid():
                from filelock import FileLock

                self._lock, self._made_in = FileLock(self.lock_file), os.getpid()
            return self._lock

    def acquire(self, timeout: float | None = None) -> BoundedFileLock:
        """Take the lock within `timeout` s (default: this lock's bound), else LockWaitExpired."""
        wait = self.timeout if timeout is None else check_bound(timeout)
        lock = self._file_lock()
        from filelock import Timeout

        try:
            lock.acquire(timeout=wait)
        except Timeout:
            # One line naming the lock, never filelock's traceback: the caller shows it to the user as it is.
            raise lock_wait_expired(Path(self.lock_file), self.root, wait) from None
        return self

    def release(self) -> None:
        if self._lock is not None:  # never acquired: nothing to release
            self._lock.release()

    def __enter__(self) -> BoundedFileLock:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.release()
