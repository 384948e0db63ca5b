"""Reaching the server: the DSN, a pool, and errors that name host and port but never the password."""

from __future__ import annotations

import logging
import math
import select
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING

from picoclaw.storage.errors import StorageError, StorageUnavailable
from picoclaw.storage.waits import LOCK_WAIT_SECONDS, LockWaitExpired

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

log = logging.getLogger(__name__)

# How long opening the pool waits for a first connection before saying the server cannot be reached.
CONNECT_TIMEOUT_SECONDS = 10
# How long the pool keeps trying (backing off 1, 2 … s) to replace a connection it lost, before it gives up and
# connects again only when asked. Short: after its default of 5 minutes of doubling pauses, a server back from
# a 20 s outage waited up to 16 s more for the pool's next attempt.
RECONNECT_SECONDS = 3.0
# A connection not taken for longer is asked about when handed out even if its socket is quiet: a server gone
# without a word (a failover to another host) leaves nothing to read until the next statement fails on it. A busy
# process takes its connections back within milliseconds, and asks nothing.
QUIET_CHECK_SECONDS = 1.0
_taken: weakref.WeakKeyDictionary[psycopg.Connection, float] = weakref.WeakKeyDictionary()  # when made or handed out


class _LostConnectionNoise(logging.Filter):
    """While a server is down, psycopg_pool warns at every failed connection attempt and every dead connection
    it drops (dozens a second), and psycopg at every pipeline or transaction it could not close on a lost
    connection ("error ignored …"). Each call that fails says so in its own one line (a webhook worker once per
    outage): these repeat it, so they are dropped; the pool's errors pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "psycopg":
            return not str(record.msg).startswith("error ignored")
        return record.levelno >= logging.ERROR


_NOISE = _LostConnectionNoise()


def server_name(dsn: str) -> str:
    """Where `dsn` points, as "host:port" (a socket folder counts as the host); never user or password."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - a DSN that does not parse names no server at all
        return "an unreadable DSN"
    host = str(parts.get("host") or parts.get("hostaddr") or "localhost")
    return f"{host}:{parts.get('port') or 5432}"


def without_password(text: str, dsn: str) -> str:
    """`text` with the DSN's password (if any) masked: driver messages may quote the connection string."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        password = conninfo_to_dict(dsn).get("password")
    except Exception:  # noqa: BLE001
        password = None
    text = text.replace(dsn, "<dsn>")
    return text.replace(str(password), "***") if password else text


def require_driver() -> None:
    """psycopg and psycopg_pool, or one line saying how to install them."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        raise StorageError('storage.backend "postgres" needs the postgres extra: '
                           "pip install 'picoclaw[postgres]'") from None


LOCK_NOT_AVAILABLE = "55P03"  # SQLSTATE of a statement cancelled by lock_timeout


def unreachable(dsn: str, exc: BaseException) -> StorageUnavailable:
    """The one-line error for a server that cannot be reached or went away (or a lock wait past its bound)."""
    reason = " ".join(without_password(str(exc), dsn).split()) or type(exc).__name__
    if getattr(exc, "sqlstate", None) == LOCK_NOT_AVAILABLE:
        # lock_timeout (every pool connection has storage.lock_wait_seconds) is an OperationalError to psycopg,
        # but the server is there: say what was waited for, not that it cannot be reached.
        return LockWaitExpired(f"a lock in PostgreSQL at {server_name(dsn)} was not free within "
                               f"storage.lock_wait_seconds: another picoclaw process holds it ({reason[:200]})")
    return StorageUnavailable(f"PostgreSQL at {server_name(dsn)} cannot be reached: {reason[:300]}")


def lock_timeout(seconds: float) -> str:
    """PostgreSQL's lock_timeout for a wait of `seconds` (at least 1 ms: 0 would mean no bound)."""
    return f"{max(int(seconds * 1000), 1)}ms"


def _bound_lock_waits(setting: str, conn: psycopg.Connection) -> None:
    """Every pool connection's lock waits (advisory and row locks) end after `setting`, never hang."""
    conn.execute("select set_config('lock_timeout', %s, false)", (setting,))
    _taken[conn] = time.monotonic()


def _check(conn: psycopg.Connection) -> None:
    """The pool's check of a connection it hands out: a round trip only if the idle connection's socket has
    something to read, as it has once the server closed it (a restart, a terminated backend), or if it was last
    taken over QUIET_CHECK_SECONDS ago."""
    from psycopg_pool import ConnectionPool

    now = time.monotonic()
    quiet_long = now - _taken.get(conn, -math.inf) > QUIET_CHECK_SECONDS
    _taken[conn] = now
    if conn.closed or quiet_long or _spoke(conn.fileno()):
        ConnectionPool.check_connection(conn)


def _spoke(fd: int) -> bool:
    """Whether the socket `fd` can be read without waiting (data, an error or the peer's close)."""
    if not hasattr(select, "poll"):  # Windows: no poll, and select's limits; always ask
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def open_pool(dsn: str, size: int, lock_wait: float = LOCK_WAIT_SECONDS) -> ConnectionPool:
    """A connection pool of up to `size` connections, its first connection made (or StorageUnavailable); each
    connection waits at most `lock_wait` s for any lock."""
    require_driver()
    import psycopg
    from psycopg_pool import ConnectionPool, PoolTimeout

    if not dsn:
        raise StorageError('storage.backend is "postgres" but no DSN is set: write storage.postgres.dsn in '
                           "config.json or set PICOCLAW_POSTGRES_DSN")
    # min_size 1: one connection is made at once, so a wrong DSN fails here and not in the middle of a turn.
    # check: a connection the server closed while it sat idle (a restart, a failover) is replaced when handed
    # out, instead of failing the lock or turn that took it; `_check` spares the round trip for a connection taken
    # within the last second whose socket is quiet (a worker takes a dozen connections an answer).
    for name in ("psycopg.pool", "psycopg"):
        logging.getLogger(name).addFilter(_NOISE)  # once: a filter already there is not added again
    pool = ConnectionPool(dsn, min_size=1, max_size=max(size, 2), open=False, name="picoclaw",
                          check=_check, reconnect_timeout=RECONNECT_SECONDS,
                          configure=partial(_bound_lock_waits, lock_timeout(lock_wait)),
                          kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_SECONDS})
    try:
        pool.open(wait=False)
        _first_connection(pool, dsn)
    except (PoolTimeout, psycopg.Error) as exc:
        pool.close()
        raise unreachable(dsn, exc) from None
    except BaseException:
        pool.close()
        raise
    return pool


def _first_connection(pool: ConnectionPool, dsn: str) -> None:
    """Until `pool` holds its first connection, for at most CONNECT_TIMEOUT_SECONDS (then PoolTimeout). At the pool's
    first failed attempt one direct attempt is made, which gives the server's reason (psycopg.Error): a server that
    refuses (down, a wrong password) is said at once, not after the pool's retries; one that lets it in leaves the
    pool to go on trying."""
    import psycopg
    from psycopg_pool import PoolTimeout

    deadline = time.monotonic() + CONNECT_TIMEOUT_SECONDS
    pause, asked = 0.001, False  # a connection on this machine takes milliseconds: looked at soon, then less often
    while not (stats := pool.get_stats()).get("pool_available", 0):
        if not asked and stats.get("connections_errors", 0):
            asked = True
            psycopg.connect(dsn, connect_timeout=CONNECT_TIMEOUT_SECONDS).close()
        left = deadline - time.monotonic()
        if left <= 0:
            # The pool's timeout says nothing of why: one more direct attempt gives the server's reason, if any.
            psycopg.connect(dsn, connect_timeout=CONNECT_TIMEOUT_SECONDS).close()
            raise PoolTimeout(f"no connection within {CONNECT_TIMEOUT_SECONDS} s")
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.05)


@contextmanager
def storage_errors(dsn: str, what: str) -> Iterator[None]:
    """Driver errors as one line: a server gone (or a lock wait past its bound) is StorageUnavailable, anything
    else a StorageError saying PostgreSQL refused `what` ("a sessions change")."""
    import psycopg

    try:
        yield
    except psycopg.OperationalError as exc:
        raise unreachable(dsn, exc) from None
    except psycopg.Error as exc:
        reason = " ".join(without_password(str(exc), dsn).split()) or type(exc).__name__
        raise StorageError(f"PostgreSQL refused {what}: {reason[:300]}") from None


@contextmanager
def transaction(pool: ConnectionPool, dsn: str, what: str, wait: float | None = None) -> Iterator[psycopg.Connection]:
    """A pool connection in a transaction; a lost server is StorageUnavailable, any other failure a StorageError
    naming `what` (the jobs, the inbox) and saying nothing was changed. `wait`: the most seconds to wait for a
    connection (default: the pool's 30)."""
    with _pooled(pool, dsn, what, wait) as conn, conn.transaction():
        yield conn


@contextmanager
def statement(pool: ConnectionPool, dsn: str, what: str, wait: float | None = None) -> Iterator[psycopg.Connection]:
    """A pool connection for one statement, which is atomic by itself: no BEGIN and COMMIT, two round trips
    fewer than `transaction`. Errors as there."""
    with _pooled(pool, dsn, what, wait) as conn:
        yield conn


@contextmanager
def _pooled(pool: ConnectionPool, dsn: str, what: str, wait: float | None) -> Iterator[psycopg.Connection]:
    import psycopg
    from psycopg_pool import PoolClosed, PoolTimeout

    try:
        with pool.connection(timeout=wait) as conn:
            yield conn
    except (psycopg.OperationalError, PoolTimeout, PoolClosed) as exc:
        raise unreachable(dsn, exc) from None
    except psycopg.Error as exc:
        reason = " ".join(without_password(str(exc), dsn).split())[:300]
        raise StorageError(f"PostgreSQL {what}: {reason}; nothing was changed") from None
