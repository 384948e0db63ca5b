"""The lock of one scope's documents: a local file lock for this machine, an advisory lock for the others.

Every lock path under a scope maps to the scope's one lock, since the folder's copy is shared by all of them.
The outermost acquire in a thread pulls the rows written since into the folder (writes themselves go through
the documents port, storage/postgres/documents.py, row first). Reentrant within a thread; other threads of the
process wait, as with FileLock. Every wait (for another thread, the local file, the advisory lock) shares one
bound and ends in LockWaitExpired.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from filelock import FileLock, Timeout

from picoclaw.layout import MEMORY_DIR
from picoclaw.storage.errors import StorageError
from picoclaw.storage.postgres.connection import lock_timeout, unreachable
from picoclaw.storage.postgres.documents import LOCAL_LOCK, ScopeCopy
from picoclaw.storage.waits import ANOTHER_PROCESS, check_bound, lock_wait_expired

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

# pg_advisory_lock(class, key) class for document scopes ("docs" in ASCII); the key is hashtext(scope). Two
# scopes sharing a hash only take turns needlessly.
DOCUMENT_LOCK_CLASS = 0x646F6373

# Who holds the lock when each stage of the wait runs out: the stages are taken in this order.
OTHER_THREAD = "another task of this picoclaw process holds it"
OTHER_MACHINE = "a picoclaw process on another machine (or another workspace folder on this database) holds it"


def _remaining(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.0)


class ScopeLock:
    """The one cross-machine lock of a scope, with its read copy (`copy`) brought up to date under it."""

    def __init__(self, pool: ConnectionPool, dsn: str, copy: ScopeCopy, root: Path | None = None):
        self.pool = pool
        self.dsn = dsn
        self.copy = copy
        self.root = root  # the workspace root, for the lock's name in a failed wait
        self._file_lock = FileLock(str(copy.root / MEMORY_DIR / LOCAL_LOCK))
        self._state = threading.Condition()
        self._owner: int | None = None
        self._depth = 0
        self._conn: psycopg.Connection | None = None

    def acquire(self, name: Path, timeout: float) -> None:
        """Hold the lock within `timeout` seconds in all (else LockWaitExpired naming `name`); pull first."""
        me = threading.get_ident()
        deadline = time.monotonic() + check_bound(timeout)
        with self._state:
            if self._owner == me:
                self._depth += 1
                return
            while self._owner is not None:
                left = _remaining(deadline)
                if (left == 0 or not self._state.wait(left)) and self._owner is not None:
                    raise lock_wait_expired(name, self.root, timeout, OTHER_THREAD)
            self._owner, self._depth = me, 1
        try:
            self.copy.root.joinpath(MEMORY_DIR).mkdir(parents=True, exist_ok=True)
            try:
                self._file_lock.acquire(timeout=_remaining(deadline))
            except Timeout:
                raise lock_wait_expired(name, self.root, timeout, ANOTHER_PROCESS) from None
            try:
                self._conn = self._hold_advisory(name, _remaining(deadline), timeout)
                self._guarded(self.copy.pull)
            except BaseException:
                self._let_go()
                raise
        except BaseException:
            self._leave()
            raise

    def release(self) -> None:
        """Let go once (the outermost release lets go of the advisory lock and the local file)."""
        with self._state:
            if self._owner != threading.get_ident():
                raise RuntimeError("this thread does not hold the lock")
            self._depth -= 1
            if self._depth:
                return
        try:
            self._let_go()
        finally:
            self._leave()

    def _guarded(self, work: Callable[[psycopg.Connection], None]) -> None:
        """Run `work` on the held connection; a server gone is StorageUnavailable, a refusal a StorageError."""
        import psycopg

        assert self._conn is not None
        try:
            work(self._conn)
        except psycopg.OperationalError as exc:
            raise unreachable(self.dsn, exc) from None
        except psycopg.Error as exc:
            raise StorageError(f"PostgreSQL refused the memory documents of {self.copy.root}: "
                               f"{' '.join(str(exc).split())[:300]}") from None

    def _hold_advisory(self, name: Path, timeout: float, bound: float) -> psycopg.Connection:
        """A pool connection holding the scope's advisory lock (session level, so it outlives transactions),
        taken within `timeout` s (what is left of the whole wait, `bound`)."""
        import psycopg
        from psycopg_pool import PoolClosed, PoolTimeout

        try:
            conn = self.pool.getconn()
        except (PoolTimeout, PoolClosed) as exc:
            raise unreachable(self.dsn, exc) from None
        key = (DOCUMENT_LOCK_CLASS, self.copy.scope)
        try:
            if timeout == 0:
                row = conn.execute("select pg_try_advisory_lock(%s, hashtext(%s))", key).fetchone()
                if not row or not row[0]:
                    raise lock_wait_expired(name, self.root, bound, OTHER_MACHINE)
            else:
                # lock_timeout bounds the wait; an advisory lock is a lock like any other to it. Set to what is
                # left of this wait, then back to the pool's own bound before the connection goes back.
                row = conn.execute("select current_setting('lock_timeout')").fetchone()
                conn.execute("select set_config('lock_timeout', %s, false)", (lock_timeout(timeout),))
                try:
                    conn.execute("select pg_advisory_lock(%s, hashtext(%s))", key)
                except psycopg.errors.LockNotAvailable:
                    raise lock_wait_expired(name, self.root, bound, OTHER_MACHINE) from None
                finally:
                    conn.execute("select set_config('lock_timeout', %s, false)", (row[0] if row else "0",))
        except BaseException as exc:
            self.pool.putconn(conn)
            if isinstance(exc, psycopg.Error):
                raise unreachable(self.dsn, exc) from None
            raise
        return conn

    def _let_go(self) -> None:
        """Unlock the advisory lock and give its connection back (a broken one the pool drops), then the file."""
        import psycopg

        conn, self._conn = self._conn, None
        try:
            if conn is not None:
                try:
                    conn.execute("select pg_advisory_unlock(%s, hashtext(%s))", (DOCUMENT_LOCK_CLASS, self.copy.scope))
                except psycopg.Error:
                    pass  # a connection that is gone holds no lock any more
                finally:
                    self.pool.putconn(conn)
        finally:
            self._file_lock.release()

    def _leave(self) -> None:
        with self._state:
            self._owner, self._depth = None, 0
            self._state.notify()


class ScopeLockHandle:
    """What `PostgresStorage.lock(path)` returns: a reusable context manager on the scope's lock, like a FileLock."""

    def __init__(self, lock: ScopeLock, path: Path, timeout: float):
        self.lock = lock
        self.lock_file = str(path)
        self.timeout = check_bound(timeout)

    def acquire(self, timeout: float | None = None) -> ScopeLockHandle:
        """Take the scope's lock within `timeout` s (default: this handle's bound), else LockWaitExpired."""
        self.lock.acquire(Path(self.lock_file), self.timeout if timeout is None else timeout)
        return self

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> ScopeLockHandle:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.release()
