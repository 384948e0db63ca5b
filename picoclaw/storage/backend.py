"""The storage contract: what memory, sessions and jobs ask of the backend that keeps their bytes.

Two backends implement it (DESIGN §1.1): `files` (storage/files.py, the default) and `postgres`
(storage/postgres/). The memory layer keeps working on the workspace folder in both; on PostgreSQL that folder
is this machine's copy of the rows, brought up to date under every lock and on `refresh`, and written back
when the lock is let go.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from picoclaw.storage.jobs import JobTable


class Storage(Protocol):
    """One backend, mounted at a workspace root (storage/mounts.py finds it from any path inside)."""

    backend: str  # "files" or "postgres"
    root: Path

    def lock(self, path: Path, timeout: float = -1) -> AbstractContextManager[object]:
        """A lock named by the lock file `path`, held across processes (and machines, on PostgreSQL).

        Reentrant within a thread; `timeout` seconds (-1: wait for ever) then `filelock.Timeout`.
        """
        ...

    def job_table(self, path: Path) -> JobTable:
        """The scheduled jobs kept for the jobs file `path` (cron/jobs.json under the root)."""
        ...

    def refresh(self) -> None:
        """Bring this machine's copy of the documents up to date (files: nothing to do)."""
        ...

    def close(self) -> None:
        """Let go of connections and the mount."""
        ...
