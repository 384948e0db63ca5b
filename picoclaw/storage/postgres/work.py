"""Background work done once across workers, on PostgreSQL (the contract: storage/work.py).

A work lock is a session-level advisory lock on a connection of its own, held while the work runs (a summary
may take a minute of a CPU model); a worker that dies lets go of it with its connection. An interval claim is
one row per name in `work_marks`, moved on by a single conditional upsert on the server's clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from picoclaw.storage.postgres.connection import CONNECT_TIMEOUT_SECONDS, transaction, unreachable

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

DDL = """
-- Background work claimed once per interval across workers (the heartbeat): when each name was last claimed.
create table work_marks (name text primary key, claimed_at timestamptz not null);
"""

# pg_try_advisory_lock(WORK_LOCK, hashtext(name)) class for background work ("work" in ASCII).
WORK_LOCK = 0x776F726B


class AdvisoryWorkLock:
    """A named lock on one piece of background work, shared by every worker on the database.

    Held on a connection of its own, not one of the pool's: a summary may hold it for a minute, and turns,
    inbox claims and lease renewals must not wait for a pool connection meanwhile.
    """

    def __init__(self, dsn: str, name: str):
        self.dsn = dsn
        self.name = name
        self._conn: psycopg.Connection | None = None

    def try_acquire(self) -> bool:
        import psycopg

        try:
            conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS)
        except psycopg.Error as exc:
            raise unreachable(self.dsn, exc) from None
        try:
            row = conn.execute("select pg_try_advisory_lock(%s, hashtext(%s))", (WORK_LOCK, self.name)).fetchone()
        except psycopg.Error as exc:
            conn.close()
            raise unreachable(self.dsn, exc) from None
        if not row or not row[0]:
            conn.close()
            return False
        self._conn = conn
        return True

    def release(self) -> None:
        """Let go: closing the connection ends its session, and the lock with it."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def claim_interval(pool: ConnectionPool, dsn: str, name: str, seconds: float) -> bool:
    """True for the one caller that finds `name` last claimed at least `seconds` ago (or never)."""
    with transaction(pool, dsn, "work marks") as conn:
        row = conn.execute(
            "insert into work_marks (name, claimed_at) values (%s, now()) on conflict (name) do update "
            "set claimed_at = now() where work_marks.claimed_at <= now() - make_interval(secs => %s) "
            "returning 1", (name, seconds)).fetchone()
    return row is not None
