"""The embedded backend: the workspace folder is the truth, locks are `filelock` files beside it."""

from __future__ import annotations

from pathlib import Path

from filelock import FileLock


class FilesStorage:
    """Markdown, JSONL and JSON files under the workspace; nothing to install, nothing to connect."""

    backend = "files"

    def __init__(self, root: Path):
        self.root = root

    def lock(self, path: Path, timeout: float = -1) -> FileLock:
        """A `filelock` lock file (reentrant within a thread, as FileLock is)."""
        return FileLock(str(path), timeout=timeout)

    def refresh(self) -> None:
        """The files are the truth: there is no copy to bring up to date."""

    def index_table(self, scope_path: Path) -> None:
        """The memory index's chunks: None, as the index keeps its own SQLite file under memory/index/."""
        return None

    def close(self) -> None:
        """Nothing is held open."""
