"""Background work done once whichever process (or worker machine) asks: a named lock taken without waiting,
and a named claim that succeeds once per interval.

A session's summary or reflection holds `Storage.work_lock(name)` while it runs: another worker that finds
it due meanwhile skips it. The heartbeat is `Storage.claim_interval("heartbeat", seconds)`: of all the workers
whose heartbeat falls due, one per interval beats. These are the files backend's (a lock file and a small
JSON file in a dot folder of the workspace); PostgreSQL's are in storage/postgres/work.py.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol

import orjson

from picoclaw import clock
from picoclaw.disk.atomic import atomic_write
from picoclaw.storage.waits import LOCK_WAIT_SECONDS, BoundedFileLock

WORK_DIR = ".picoclaw-work"  # under the workspace root; not stored content (storage/stored_files.py)
MARKS_FILE = "marks.json"


class WorkLock(Protocol):
    """A lock on one piece of background work, held across processes; never waited for."""

    def try_acquire(self) -> bool:
        """Take the lock if no one holds it; whether it was taken."""
        ...

    def release(self) -> None:
        """Let go of a lock `try_acquire` took."""
        ...


def work_name(name: str) -> str:
    """A file-name-safe form of a work name (session keys hold colons, per-user ones a user's id)."""
    return hashlib.sha256(name.encode("utf-8")).hexdigest()[:16]


class FileWorkLock:
    """The files backend's work lock: a lock file, not bound to a thread (taken and let go off the event loop,
    possibly by two different worker threads)."""

    def __init__(self, root: Path, name: str):
        folder = root / WORK_DIR
        folder.mkdir(parents=True, exist_ok=True)
        from filelock import FileLock  # here, as in storage/waits.py: a read-only command never loads filelock

        self._lock = FileLock(str(folder / f"{work_name(name)}.lock"), thread_local=False)

    def try_acquire(self) -> bool:
        from filelock import Timeout

        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            return False
        return True

    def release(self) -> None:
        self._lock.release()


def claim_interval_in_file(root: Path, name: str, seconds: float, *, lock_wait: float = LOCK_WAIT_SECONDS) -> bool:
    """True when `name` was last claimed at least `seconds` ago (or never), and it is claimed now."""
    folder = root / WORK_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MARKS_FILE
    with BoundedFileLock(folder / f"{MARKS_FILE}.lock", lock_wait, root):
        try:
            marks = orjson.loads(path.read_bytes())
            if not isinstance(marks, dict):
                marks = {}
        except (FileNotFoundError, orjson.JSONDecodeError):
            marks = {}  # derived bookkeeping: a damaged file only costs one extra claim
        now = clock.now()
        last = marks.get(name)
        try:
            if isinstance(last, str) and now - datetime.fromisoformat(last) < timedelta(seconds=seconds):
                return False
        except ValueError:
            pass
        marks[name] = now.isoformat()
        atomic_write(path, orjson.dumps(marks))
        return True
