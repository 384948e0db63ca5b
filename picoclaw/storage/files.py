"""The embedded backend: the workspace folder is the truth, locks are `filelock` files beside it."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from picoclaw.disk.atomic import atomic_write
from picoclaw.disk.bounded_read import read_regular
from picoclaw.layout import USERS_DIR
from picoclaw.storage.errors import StorageUnavailable
from picoclaw.storage.files_documents import FilesDocuments
from picoclaw.storage.inbox import SqliteInbox
from picoclaw.storage.jobs import FilesJobTable
from picoclaw.storage.sessions import FilesSessionLog
from picoclaw.storage.stored_files import stored_files
from picoclaw.storage.telegram_replies import SqliteReplyLog
from picoclaw.storage.waits import LOCK_WAIT_SECONDS, BoundedFileLock
from picoclaw.storage.work import WORK_DIR, FileWorkLock, claim_interval_in_file

INBOX_FILE = "telegram-inbox.sqlite3"  # in WORK_DIR: local state, not stored content
REPLIES_FILE = "telegram-replies.sqlite3"  # in WORK_DIR too


class FilesStorage:
    """Markdown, JSONL and JSON files under the workspace; nothing to install, nothing to connect."""

    backend = "files"

    def __init__(self, root: Path, lock_wait: float = LOCK_WAIT_SECONDS):
        self.root = root
        self.lock_wait = lock_wait
        self._documents: dict[str, FilesDocuments] = {}

    def documents(self, scope: str) -> FilesDocuments:
        """Scope `scope`'s documents: the files under the workspace folder (or users/<scope>/)."""
        found = self._documents.get(scope)
        if found is None:
            root = self.root / USERS_DIR / scope if scope else self.root
            found = self._documents.setdefault(scope, FilesDocuments(scope, root, lock_wait=self.lock_wait,
                                                                     workspace=self.root, shared=not scope))
        return found

    def read_round(self) -> AbstractContextManager[object]:
        """Nothing to keep: every read of a file is current."""
        return nullcontext()

    def lock(self, path: Path, timeout: float | None = None) -> BoundedFileLock:
        """A `filelock` lock file (reentrant within a thread), waited for `timeout` s (None: `lock_wait`)."""
        return BoundedFileLock(path, self.lock_wait if timeout is None else timeout, self.root)

    def session_log(self, folder: Path, lock_path: Path | None = None) -> FilesSessionLog:
        """JSONL files in `folder`, appended under the lock file `lock_path`."""
        return FilesSessionLog(folder, lock_path, lock_wait=self.lock_wait, root=self.root)

    def job_table(self, path: Path) -> FilesJobTable:
        """The jobs file at `path` (cron/jobs.json) itself."""
        return FilesJobTable(path, lock_wait=self.lock_wait, root=self.root)

    def work_lock(self, name: str) -> FileWorkLock:
        """A lock file in the workspace's work folder."""
        return FileWorkLock(self.root, name)

    def claim_interval(self, name: str, seconds: float) -> bool:
        """The last claim of each name kept in the work folder's marks file."""
        return claim_interval_in_file(self.root, name, seconds, lock_wait=self.lock_wait)

    def telegram_inbox(self, bot: int) -> SqliteInbox:
        """A SQLite file in the work folder: for the one worker a files workspace allows."""
        return SqliteInbox(self.root / WORK_DIR / INBOX_FILE, bot)

    def telegram_replies(self, bot: int) -> SqliteReplyLog:
        """A SQLite file in the work folder."""
        return SqliteReplyLog(self.root / WORK_DIR / REPLIES_FILE, bot)

    def ping(self) -> None:
        """The workspace folder is there and writable."""
        if not self.root.is_dir() or not os.access(self.root, os.W_OK):
            raise StorageUnavailable(f"the workspace {self.root} is missing or not writable")

    def stored_layout(self) -> dict[str, bytes]:
        """The stored files under the workspace folder."""
        return {name: read_regular(path) for name, path in stored_files(self.root).items()}

    def export_files(self, dest: Path) -> None:
        """Copy every stored file, byte for byte (each write atomic)."""
        for name, path in stored_files(self.root).items():
            atomic_write(dest / name, read_regular(path))

    def import_files(self, src: Path) -> None:
        """Write `src`'s stored files over the workspace's, and remove the stored files `src` does not have."""
        incoming = stored_files(src)
        for name, path in incoming.items():
            atomic_write(self.root / name, read_regular(path))
        for name, path in stored_files(self.root).items():
            if name not in incoming:
                path.unlink(missing_ok=True)

    def status(self) -> dict[str, object]:
        """Files need no server: the folder and how many stored files it holds."""
        return {"backend": self.backend, "workspace": str(self.root), "stored files": len(stored_files(self.root))}

    def index_table(self, scope_path: Path) -> None:
        """The memory index's chunks: None, as the index keeps its own SQLite file under memory/index/."""
        return None

    def close(self) -> None:
        """Nothing is held open."""
