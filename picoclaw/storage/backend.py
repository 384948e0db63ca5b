"""The storage contract: what memory, sessions and jobs ask of the backend that keeps their bytes.

Two backends implement it: `files` (storage/files.py, the default) and `postgres`
(storage/postgres/). Memory reads and writes its documents through `documents(scope)` (storage/documents.py):
each write is durable when it returns, and each read asks the backend's truth (files: the file; PostgreSQL:
the row), whatever lock is held or not; within a turn's `read_round`, once per document.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from picoclaw.storage.documents import Documents
    from picoclaw.storage.inbox import Inbox
    from picoclaw.storage.sessions import SessionLog
    from picoclaw.storage.telegram_replies import ReplyLog
    from picoclaw.storage.work import WorkLock

from picoclaw.storage.jobs import JobTable


class Storage(Protocol):
    """One backend of one workspace root, handed to every store of that workspace (nothing looks it up by path)."""

    backend: str  # "files" or "postgres"
    root: Path
    lock_wait: float  # seconds any lock of this storage waits by default (storage.lock_wait_seconds)

    def lock(self, path: Path, timeout: float | None = None) -> AbstractContextManager[object]:
        """A lock named by the lock file `path`, held across processes (and machines, on PostgreSQL).

        Reentrant within a thread; waits `timeout` seconds (None: `lock_wait`), then LockWaitExpired
        (a StorageUnavailable naming the lock), never for ever.
        """
        ...

    def documents(self, scope: str) -> Documents:
        """The memory documents of scope `scope` ("" shared, else a user key): the port memory writes through."""
        ...

    def read_round(self) -> AbstractContextManager[object]:
        """A block whose reads check each memory document once (storage/read_round.py): a turn's. Files: a file
        read is always current, so nothing is kept."""
        ...

    def session_log(self, folder: Path, lock_path: Path | None = None) -> SessionLog:
        """The transcripts of sessions folder `folder` (its scope: `users/<key>/sessions` → key, else "").

        `lock_path` names the files backend's lock file (default: a dot file beside the folder).
        """
        ...

    def job_table(self, path: Path) -> JobTable:
        """The scheduled jobs kept for the jobs file `path` (cron/jobs.json under the root)."""
        ...

    def work_lock(self, name: str) -> WorkLock:
        """The lock on background work `name` (a session's summary), held across processes and machines."""
        ...

    def claim_interval(self, name: str, seconds: float) -> bool:
        """True for one caller, across processes and machines, per `seconds` (the heartbeat's turn)."""
        ...

    def telegram_inbox(self, bot: int) -> Inbox:
        """The inbox of the Telegram bot with id `bot` (storage/inbox.py)."""
        ...

    def telegram_replies(self, bot: int) -> ReplyLog:
        """The replies the Telegram bot with id `bot` sent, by message (storage/telegram_replies.py)."""
        ...

    def ping(self) -> None:
        """Check the storage can be reached (StorageUnavailable, or StorageError, if not), within a second or
        two: a webhook worker's health check and its watch over an outage ask it."""
        ...

    def stored_layout(self) -> dict[str, bytes]:
        """Every stored file in the files layout (storage/stored_files.py): name → bytes."""
        ...

    def export_files(self, dest: Path) -> None:
        """Write every stored file into the empty folder `dest`, in the files layout, byte for byte."""
        ...

    def import_files(self, src: Path) -> None:
        """Replace everything stored with the stored files of the files workspace `src`."""
        ...

    def status(self) -> dict[str, object]:
        """A health check: backend, and for a server its versions and rows per table."""
        ...

    def index_table(self, scope_path: Path) -> Any:
        """The memory index's chunk table for the scope holding `scope_path`; None: the index's own SQLite file."""
        ...

    def close(self) -> None:
        """Let go of the connections it holds (files: nothing)."""
        ...
