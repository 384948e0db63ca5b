"""Stores on a bare folder, as tests build them: the files backend passed explicitly, as App passes its own."""

from __future__ import annotations

from datetime import tzinfo
from pathlib import Path

from picoclaw.memory.store import UPDATE_WINDOW, MemoryStore
from picoclaw.storage import LOCK_WAIT_SECONDS, FilesStorage


def memory_store(memory_dir: Path, tz: tzinfo, *, backup_keep: int = 50, lock_wait: float = LOCK_WAIT_SECONDS,
                 update_window: int = UPDATE_WINDOW) -> MemoryStore:
    """A MemoryStore of `memory_dir` kept by the files backend of the folder above it (its workspace root)."""
    storage = FilesStorage(Path(memory_dir).parent, lock_wait=lock_wait)
    return MemoryStore(memory_dir, tz, backup_keep=backup_keep, storage=storage, update_window=update_window)


def stored_document(kind: str, root: Path, dsn: str, name: str) -> str | None:
    """The truth of document `name` of the shared scope on backend `kind`, as a fresh reader sees it."""
    if kind == "files":
        path = root / name
        return path.read_text(encoding="utf-8") if path.exists() else None
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute("select content from documents where scope = '' and name = %s", (name,)).fetchone()
    return bytes(row[0]).decode("utf-8") if row and row[0] is not None else None
