"""PostgresStorage: the backend object mounted at a workspace root when storage.backend is "postgres"."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from pathlib import Path

from picoclaw.storage.postgres import jobs
from picoclaw.storage.postgres.connection import open_pool, unreachable
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

    def job_table(self, path: Path) -> jobs.PostgresJobTable:
        """The jobs rows of the scope whose jobs file is `path` (storage/postgres/jobs.py)."""
        return jobs.table_for(self.pool, self.dsn, self.root, path)

    def export_jobs(self, dest_root: Path) -> list[Path]:
        """Write cron/jobs.json (and users/<key>/cron/jobs.json) under `dest_root` as the files backend would."""
        return jobs.export_jobs(self.pool, self.dsn, dest_root)

    def import_jobs(self, src_root: Path, replace: bool) -> int:
        """Load a files workspace's jobs; StorageError if other jobs are here and not `replace`; idempotent."""
        return jobs.import_jobs(self.pool, self.dsn, src_root, replace)

    def job_counts(self) -> dict[str, int]:
        """Rows of the jobs table ("jobs") and those still to run ("jobs_to_run")."""
        return jobs.job_counts(self.pool, self.dsn)

    def refresh(self) -> None:
        """Bring this machine's copy of the documents up to date."""
        raise NotImplementedError  # filled in by the documents port

    def close(self) -> None:
        """Close the pool."""
        self.pool.close()
