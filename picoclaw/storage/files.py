"""The embedded backend: the workspace folder is the truth, locks are `filelock` files beside it."""

from __future__ import annotations

from pathlib import Path

from filelock import FileLock

from picoclaw.storage.jobs import FilesJobTable


class FilesStorage:
    """Markdown, JSONL and JSON files under the workspace; nothing to install, nothing to connect."""

    backend = "files"

    def __init__(self, root: Path):
        self.root = root

    def lock(self, path: Path, timeout: float = -1) -> FileLock:
        """A `filelock` lock file (reentrant within a thread, as FileLock is)."""
        return FileLock(str(path), timeout=timeout)

    def job_table(self, path: Path) -> FilesJobTable:
        """The jobs file at `path` (cron/jobs.json) itself."""
        return FilesJobTable(path)

    def refresh(self) -> None:
        """The files are the truth: there is no copy to bring up to date."""

    def close(self) -> None:
        """Nothing is held open."""
