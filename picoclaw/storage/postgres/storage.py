"""PostgresStorage: the backend object mounted at a workspace root when storage.backend is "postgres"."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from pathlib import Path

from picoclaw.storage.postgres.connection import open_pool, unreachable
from picoclaw.storage.postgres.schema import ensure_schema
from picoclaw.storage.postgres.sessions import PostgresSessionLog, export_sessions, import_sessions, session_counts

log = logging.getLogger(__name__)


class PostgresStorage:
    """Documents as rows with versions, sessions in `messages`, jobs claimed with SKIP LOCKED, pgvector."""

    backend = "postgres"

    def __init__(self, root: Path, dsn: str, pool_size: int = 10):
        import psycopg

        self.root = root
        self.dsn = dsn
        self.pool = open_pool(dsn, pool_size)
        try:
            with self.pool.connection() as conn:
                ensure_schema(conn)
        except psycopg.OperationalError as exc:
            self.pool.close()
            raise unreachable(dsn, exc) from None
        except BaseException:
            self.pool.close()
            raise

    def lock(self, path: Path, timeout: float = -1) -> AbstractContextManager[object]:
        """The lock named by `path`, held across machines (storage/postgres/documents.py)."""
        raise NotImplementedError  # filled in by the documents port

    def session_log(self, folder: Path, lock_path: Path | None = None) -> PostgresSessionLog:
        """The transcripts of sessions folder `folder` as rows (`lock_path`, a lock file, is for files only)."""
        return PostgresSessionLog(self.pool, self.dsn, self.root, folder)

    def export_sessions(self, dest_root: Path) -> int:
        """Write `sessions/` and `users/<key>/sessions/` under `dest_root` byte for byte as files would; how many."""
        return export_sessions(self.pool, self.dsn, dest_root)

    def import_sessions(self, src_root: Path, replace: bool) -> int:
        """Load the transcripts of a files workspace (StorageError on a non-empty target unless `replace`)."""
        return import_sessions(self.pool, self.dsn, src_root, replace)

    def session_counts(self) -> dict[str, int]:
        """Rows per sessions table (`sessions`, `messages`)."""
        return session_counts(self.pool, self.dsn)

    def refresh(self) -> None:
        """Bring this machine's copy of the documents up to date."""
        raise NotImplementedError  # filled in by the documents port

    def close(self) -> None:
        """Close the pool."""
        self.pool.close()
