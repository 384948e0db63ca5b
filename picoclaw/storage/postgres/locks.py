"""The lock of one scope's documents: a local file lock for this machine, an advisory lock for the others.

Every lock path under a scope maps to the scope's one lock: it is what a read-modify-write of the scope's
documents holds (storage/postgres/documents.py). Taking it reads nothing: every read asks the rows itself.
Reentrant within a thread; other threads of the process wait, as with FileLock. Every wait (for another
thread, the local file, the advisory lock) shares one bound and ends in LockWaitExpired. The advisory lock
is held on a lease (`Lease`): a holder that stops answering the server loses it.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from filelock import FileLock, Timeout

from picoclaw.storage.postgres.connection import lock_timeout, unreachable
from picoclaw.storage.waits import ANOTHER_PROCESS, LOCK_WAIT_SECONDS, check_bound, lock_wait_expired

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

log = logging.getLogger(__name__)

# pg_advisory_lock(class, key) class for document scopes ("docs" in ASCII); the key is hashtext(scope). Two
# scopes sharing a hash only take turns needlessly.
DOCUMENT_LOCK_CLASS = 0x646F6373

# Who holds the lock when each stage of the wait runs out: the stages are taken in this order.
OTHER_THREAD = "another task of this picoclaw process holds it"
OTHER_MACHINE = "a picoclaw process on another machine (or another workspace folder on this database) holds it"


# The server's idle timeouts that end the session of a holder gone quiet, and with it the advisory lock: between
# statements, and inside a transaction (a write frozen half-way).
LEASE_SETTINGS = ("idle_session_timeout", "idle_in_transaction_session_timeout")
# Both back to what RESET would give them, before the connection goes back to the pool.
END_LEASE = ("select set_config(name, reset_val, false) from pg_settings "
             "where name in ('idle_session_timeout', 'idle_in_transaction_session_timeout')")
# The advisory lock let go of and the lease ended in one statement, on the way back to the pool.
UNLOCK_AND_END_LEASE = ("select pg_advisory_unlock(%s, hashtext(%s)), " + ", ".join(
    f"set_config('{setting}', (select reset_val from pg_settings where name = '{setting}'), false)"
    for setting in LEASE_SETTINGS))


def _remaining(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.0)


def _ms(seconds: float) -> str:
    return f"{max(int(seconds * 1000), 1)}ms"


class Lease:
    """Keeps a held advisory lock's session alive: a trivial query on its connection every third of the lease,
    from a daemon thread. A process frozen (SIGSTOP) or cut off from the server stops it too; the server then
    ends the session after `seconds` idle (LEASE_SETTINGS), which frees the lock for the other machines, and
    the frozen process's next statement on that connection fails instead of writing."""

    def __init__(self, conn: psycopg.Connection, seconds: float):
        self.conn = conn
        self.seconds = seconds
        self._stopped = threading.Event()
        self._pinging = threading.Lock()  # held while a ping is under way: none starts after `stop` returned
        self._thread = threading.Thread(target=self._renew, name="picoclaw-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        import psycopg

        while not self._stopped.wait(self.seconds / 3):
            with self._pinging:
                if self._stopped.is_set():
                    return
                try:
                    self.conn.execute("select 1")
                except psycopg.OperationalError as exc:
                    # The session is gone (its lease ran out while this process was stopped, or the server went
                    # away): the holder's next statement fails with its own one line; this says why once.
                    log.warning("the memory lock's lease of %g s could not be renewed (this process was stopped "
                                "or cut off from PostgreSQL?): %s", self.seconds, " ".join(str(exc).split())[:200])
                    return
                except psycopg.Error:
                    pass  # the holder's own transaction failed meanwhile (it rolls back): the session lives on

    def stop(self) -> None:
        """No ping from now on (one under way is waited for: the connection is about to be used or given back)."""
        self._stopped.set()
        with self._pinging:
            pass


class ScopeLock:
    """The one cross-machine lock of scope `scope`; `lock_file` orders this machine's processes before they ask
    the server."""

    def __init__(self, pool: ConnectionPool, dsn: str, scope: str, lock_file: Path, root: Path | None = None, *,
                 lease: float = LOCK_WAIT_SECONDS):
        self.pool = pool
        self.dsn = dsn
        self.scope = scope
        self.lock_file = lock_file
        self.root = root  # the workspace root, for the lock's name in a failed wait
        self.lease = lease  # seconds a holder that stopped answering the server keeps the advisory lock
        self._lease: Lease | None = None
        self._file_lock = FileLock(str(lock_file))
        self._state = threading.Condition()
        self._owner: int | None = None
        self._depth = 0
        self._conn: psycopg.Connection | None = None

    def held(self) -> psycopg.Connection:
        """The connection that holds the advisory lock, for the writes made under it: once a holder's lease ran
        out (its session ended), they fail on it instead of landing after another machine's."""
        if self._owner != threading.get_ident() or self._conn is None:
            raise RuntimeError("this thread does not hold the lock")
        return self._conn

    def holds(self) -> bool:
        """Whether this thread holds the lock."""
        return self._owner == threading.get_ident()

    def acquire(self, name: Path, timeout: float) -> None:
        """Hold the lock within `timeout` seconds in all (else LockWaitExpired naming `name`)."""
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
            self.lock_file.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._file_lock.acquire(timeout=_remaining(deadline))
            except Timeout:
                raise lock_wait_expired(name, self.root, timeout, ANOTHER_PROCESS) from None
            try:
                self._conn = self._hold_advisory(name, _remaining(deadline), timeout)
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

    def _hold_advisory(self, name: Path, timeout: float, bound: float) -> psycopg.Connection:
        """A pool connection holding the scope's advisory lock (session level, so it outlives transactions),
        taken within `timeout` s (what is left of the whole wait, `bound`), on a lease of `self.lease` s."""
        import psycopg
        from psycopg_pool import PoolClosed, PoolTimeout

        try:
            conn = self.pool.getconn()
        except (PoolTimeout, PoolClosed) as exc:
            raise unreachable(self.dsn, exc) from None
        key = (DOCUMENT_LOCK_CLASS, self.scope)
        lease = _ms(self.lease)
        try:
            # The lease is set before the lock is taken: a process frozen right after taking it loses it too.
            # A free lock (the usual case) is taken in this one statement.
            row = conn.execute("select set_config(%s, %s, false), set_config(%s, %s, false), "
                               "pg_try_advisory_lock(%s, hashtext(%s))",
                               (LEASE_SETTINGS[0], lease, LEASE_SETTINGS[1], lease, *key)).fetchone()
            if (not row or not row[2]) and timeout == 0:
                raise lock_wait_expired(name, self.root, bound, OTHER_MACHINE)
            if not row or not row[2]:
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
            self._give_back(conn)
            if isinstance(exc, psycopg.Error):
                raise unreachable(self.dsn, exc) from None
            raise
        self._lease = Lease(conn, self.lease)
        return conn

    def _let_go(self) -> None:
        """Unlock the advisory lock and give its connection back (a broken one the pool drops), then the file."""
        import psycopg

        conn, self._conn = self._conn, None
        lease, self._lease = self._lease, None
        try:
            if lease is not None:
                lease.stop()
            if conn is not None:
                try:
                    conn.execute(UNLOCK_AND_END_LEASE, (DOCUMENT_LOCK_CLASS, self.scope))
                except psycopg.Error:
                    self._give_back(conn)  # a connection that is gone holds no lock any more
                else:
                    self.pool.putconn(conn)
        finally:
            self._file_lock.release()

    def _give_back(self, conn: psycopg.Connection) -> None:
        """`conn` back to the pool with its lease ended: idle in the pool, it must not be closed by the server."""
        import psycopg

        try:
            conn.execute(END_LEASE)
        except psycopg.Error:
            pass  # a broken connection: the pool drops it
        finally:
            self.pool.putconn(conn)

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
