"""PostgresStorage: the backend object mounted at a workspace root when storage.backend is "postgres"."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from picoclaw.layout import MEMORY_DIR
from picoclaw.storage.errors import StorageError
from picoclaw.storage.postgres import documents
from picoclaw.storage.postgres.connection import open_pool, unreachable
from picoclaw.storage.postgres.documents import LOCAL_LOCK, ScopeCopy, scope_of
from picoclaw.storage.postgres.locks import ScopeLock, ScopeLockHandle
from picoclaw.storage.postgres.schema import ensure_schema

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

# How many earlier contents of a document are kept (memory.backup_keep's default, as the files' backups).
VERSIONS_KEEP = 50


class PostgresStorage:
    """Documents as rows with versions, sessions in `messages`, jobs claimed with SKIP LOCKED, pgvector."""

    backend = "postgres"

    def __init__(self, root: Path, dsn: str, pool_size: int = 10, *, versions_keep: int = VERSIONS_KEEP):
        import psycopg

        self.root = root
        self.dsn = dsn
        self.versions_keep = versions_keep
        self._scopes: dict[str, ScopeLock] = {}
        self._scopes_guard = threading.Lock()
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

    def _scope_lock(self, path: Path) -> ScopeLock:
        scope, scope_root = scope_of(self.root, path)
        with self._scopes_guard:
            found = self._scopes.get(scope)
            if found is None:
                found = ScopeLock(self.pool, self.dsn, ScopeCopy(scope, scope_root, self.versions_keep))
                self._scopes[scope] = found
            return found

    def lock(self, path: Path, timeout: float = -1) -> ScopeLockHandle:
        """The lock of the scope `path` lies in (one for all its lock paths), held across machines: the
        outermost acquire pulls the scope's documents into the folder, the outermost release pushes them."""
        return ScopeLockHandle(self._scope_lock(path), path, timeout)

    def refresh(self) -> None:
        """Bring the shared scope's copy up to date (and send what changed here): a brief hold of its lock.

        A per-user scope is brought up to date whenever its store takes its lock, as every write does.
        """
        with self.lock(self.root / MEMORY_DIR / LOCAL_LOCK):
            pass

    def export_documents(self, dest_root: Path) -> int:
        """Write every live document of every scope into the files layout under `dest_root` (scope "" at the
        root, scope k at users/k/); how many were written."""
        with self._connection() as conn:
            return documents.export_documents(conn, dest_root)

    def import_documents(self, src_root: Path, replace: bool = False) -> int:
        """Load the documents of the files workspace at `src_root`; a database already holding documents is
        refused (StorageError) unless `replace`. Idempotent. How many documents the workspace held."""
        found = documents.workspace_documents(src_root)
        with self._connection() as conn:
            if not documents.import_documents(conn, found, replace):
                raise StorageError("the database already holds memory documents: import with replace to "
                                   "overwrite them, or export them first")
        return len(found)

    def document_counts(self) -> dict[str, int]:
        """Rows per table of the memory documents (for `picoclaw storage status`)."""
        with self._connection() as conn:
            return documents.document_counts(conn)

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        """A pool connection for one call; a server gone (or a closed pool) is StorageUnavailable."""
        import psycopg
        from psycopg_pool import PoolClosed, PoolTimeout

        try:
            with self.pool.connection() as conn:
                yield conn
        except (PoolTimeout, PoolClosed, psycopg.OperationalError) as exc:
            raise unreachable(self.dsn, exc) from None

    def close(self) -> None:
        """Close the pool."""
        self.pool.close()

