"""PostgresStorage: the backend object mounted at a workspace root when storage.backend is "postgres"."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from pathlib import Path

from picoclaw.storage.postgres.connection import open_pool, unreachable
from picoclaw.storage.postgres.index import PostgresIndexTable, scope_of
from picoclaw.storage.postgres.schema import ensure_schema

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

    def refresh(self) -> None:
        """Bring this machine's copy of the documents up to date."""
        raise NotImplementedError  # filled in by the documents port

    def index_table(self, scope_path: Path) -> PostgresIndexTable:
        """The memory index's chunks of the scope holding `scope_path` (rows keyed by that scope)."""
        return PostgresIndexTable(self.pool, scope_of(self.root, scope_path))

    def close(self) -> None:
        """Close the pool."""
        self.pool.close()
