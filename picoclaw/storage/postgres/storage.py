"""PostgresStorage: the backend of a workspace root when storage.backend is "postgres"."""

from __future__ import annotations

import logging
import tempfile
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from psycopg import sql

from picoclaw.disk.bounded_read import read_regular
from picoclaw.layout import USERS_DIR
from picoclaw.storage.errors import StorageError
from picoclaw.storage.files_documents import MEMORY_LOCK
from picoclaw.storage.postgres import documents, jobs
from picoclaw.storage.postgres.connection import open_pool, server_name, storage_errors, unreachable
from picoclaw.storage.postgres.documents import LOCAL_LOCK, LocalCopies, PostgresDocuments, adopt_folder, cache_root
from picoclaw.storage.postgres.inbox import PostgresInbox
from picoclaw.storage.postgres.index import PostgresIndexTable
from picoclaw.storage.postgres.locks import ScopeLock, ScopeLockHandle
from picoclaw.storage.postgres.schema import ensure_schema, schema_version
from picoclaw.storage.postgres.sessions import PostgresSessionLog, export_sessions, import_sessions, session_counts
from picoclaw.storage.postgres.telegram_replies import PostgresReplyLog
from picoclaw.storage.postgres.work import AdvisoryWorkLock, claim_interval
from picoclaw.storage.read_round import read_round
from picoclaw.storage.stored_files import scope_of, stored_files
from picoclaw.storage.waits import LOCK_WAIT_SECONDS

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

PING_WAIT = 0.5  # seconds `ping` waits for a pool connection before it asks the server on one of its own
CONNECT_CHECK_SECONDS = 2  # libpq's shortest connect_timeout: a server on a host that does not answer


class PostgresStorage:
    """Documents as rows with versions, sessions in `messages`, jobs claimed with SKIP LOCKED, pgvector."""

    backend = "postgres"

    def __init__(self, root: Path, dsn: str, pool_size: int = 10, *,
                 lock_wait: float = LOCK_WAIT_SECONDS):
        import psycopg

        self.root = root
        self.dsn = dsn
        self.lock_wait = lock_wait
        self._scopes: dict[str, ScopeLock] = {}
        self._documents: dict[str, PostgresDocuments] = {}
        self._scopes_guard = threading.Lock()
        self.pool = open_pool(dsn, pool_size, lock_wait)
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
                # The advisory lock's lease is the wait's bound: a holder that stops answering for as long as
                # the others wait loses it.
                found = ScopeLock(self.pool, self.dsn, scope, cache_root(self.root, scope) / LOCAL_LOCK, self.root,
                                  lease=self.lock_wait)
                self._scopes[scope] = found
            return found

    def lock(self, path: Path, timeout: float | None = None) -> ScopeLockHandle:
        """The lock of the scope `path` lies in (one for all its lock paths), held across machines, waited for
        `timeout` s (None: `lock_wait`)."""
        return ScopeLockHandle(self._scope_lock(path), path, self.lock_wait if timeout is None else timeout)

    def documents(self, scope: str) -> PostgresDocuments:
        """Scope `scope`'s documents as rows (one per scope and process, sharing the scope's lock and cache).

        The first time in a process, a scope the database holds nothing of takes the folder's documents as its
        first content (`adopt_folder`); from then on the folder is never read as memory.
        """
        with self._scopes_guard:
            found = self._documents.get(scope)
        if found is None:
            scope_root = self.root / USERS_DIR / scope if scope else self.root
            lock_path = scope_root / MEMORY_LOCK
            scope_lock = self._scope_lock(lock_path)
            with storage_errors(self.dsn, f"the memory documents of {scope_root}"), \
                    self.pool.connection() as conn:
                adopt_folder(conn, scope, scope_root)
            copies = LocalCopies(scope, cache_root(self.root, scope), shared=not scope)
            found = PostgresDocuments(self.pool, self.dsn, scope, scope_root, copies,
                                      lambda timeout: self.lock(lock_path, timeout), scope_lock.held,
                                      scope_lock.holds, lease=self.lock_wait)
            with self._scopes_guard:
                found = self._documents.setdefault(scope, found)
        return found

    def read_round(self) -> AbstractContextManager[object]:
        """Within it, each document is checked against its row once (storage/read_round.py)."""
        return read_round()

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

    def work_lock(self, name: str) -> AdvisoryWorkLock:
        """An advisory lock every worker on this database shares (storage/postgres/work.py)."""
        return AdvisoryWorkLock(self.dsn, name)

    def claim_interval(self, name: str, seconds: float) -> bool:
        """One caller per `seconds` across every worker, on the server's clock."""
        return claim_interval(self.pool, self.dsn, name, seconds)

    def telegram_inbox(self, bot: int) -> PostgresInbox:
        """The bot's rows of `telegram_inbox`, shared by every worker."""
        return PostgresInbox(self.pool, self.dsn, bot)

    def telegram_replies(self, bot: int) -> PostgresReplyLog:
        """The bot's rows of `telegram_replies`, shared by every worker."""
        return PostgresReplyLog(self.pool, self.dsn, bot)

    def ping(self) -> None:
        """One round trip to the server, within a second or two (StorageUnavailable when it cannot be reached),
        never the pool's 30 s wait for a connection: a health check must answer at once.

        Tried on a pool connection first. When none comes in time, either all are busy or the server dropped
        them (it restarted); a connection of its own tells which, and if the server answers, the pool lets go of
        the dead ones, so the calls after it connect again at once instead of finding them one by one.
        """
        import psycopg
        from psycopg_pool import PoolClosed, PoolTimeout

        try:
            with self.pool.connection(timeout=PING_WAIT) as conn:
                conn.execute("select 1")
            return
        except PoolClosed as exc:
            raise unreachable(self.dsn, exc) from None
        except (PoolTimeout, psycopg.OperationalError):
            pass
        try:
            with psycopg.connect(self.dsn, connect_timeout=CONNECT_CHECK_SECONDS) as conn:
                conn.execute("select 1")
        except psycopg.Error as exc:
            raise unreachable(self.dsn, exc) from None
        self.pool.check()

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

    def stored_layout(self) -> dict[str, bytes]:
        """Every stored row as the file the files backend would hold: name → bytes."""
        with tempfile.TemporaryDirectory(prefix="picoclaw-layout-") as folder:
            self.export_files(Path(folder))
            return {name: read_regular(path) for name, path in stored_files(Path(folder)).items()}

    def export_files(self, dest: Path) -> None:
        """Documents, transcripts and jobs, written into `dest` in the files layout."""
        self.export_documents(dest)
        self.export_sessions(dest)
        self.export_jobs(dest)

    def import_files(self, src: Path) -> None:
        """Replace documents, transcripts and jobs with those of the files workspace `src`."""
        self.import_documents(src, replace=True)
        self.import_sessions(src, replace=True)
        self.import_jobs(src, replace=True)

    def status(self) -> dict[str, object]:
        """Server and schema versions, pgvector's version and rows per table."""
        import psycopg

        try:
            with self.pool.connection() as conn:
                server = conn.execute("show server_version").fetchone()
                vector = conn.execute("select extversion from pg_extension where extname = 'vector'").fetchone()
                version = schema_version(conn)
                tables = [row[0] for row in conn.execute(
                    "select table_name from information_schema.tables where table_schema = current_schema() "
                    "and table_type = 'BASE TABLE' order by table_name")]
                rows = {}
                for table in tables:
                    count = conn.execute(sql.SQL("select count(*) from {}").format(sql.Identifier(table))).fetchone()
                    rows[table] = int(count[0]) if count else 0
        except psycopg.OperationalError as exc:
            raise unreachable(self.dsn, exc) from None
        return {"backend": self.backend, "server": server_name(self.dsn),
                "server version": server[0] if server else "?", "schema version": version,
                "pgvector version": vector[0] if vector else "not installed", "rows": rows}

    def index_table(self, scope_path: Path) -> PostgresIndexTable:
        """The memory index's chunks of the scope holding `scope_path` (rows keyed by that scope)."""
        return PostgresIndexTable(self.pool, self.dsn, scope_of(self.root, scope_path)[0])

    def close(self) -> None:
        """Close the pool."""
        self.pool.close()

