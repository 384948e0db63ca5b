"""The Telegram inbox on PostgreSQL, shared by every worker (the contract: storage/inbox.py).

Leases are measured on the server's clock, so workers whose clocks disagree still agree on when a claim ran
out. Claims of one bot are made one at a time under a transaction-level advisory lock: each sees the leases
the ones before it took, so no chat ever has two updates claimed at once. A lease that ran out while the server
was down is not taken over until a lease's length after it started again: its worker, alive but unable to
renew, gets that long to renew it or record the answer it sent, so the message is not answered twice.

Every worker LISTENs on the bot's channel; storing an update, giving one back, and finishing one whose chat has
more waiting NOTIFY it (delivered at commit), so an idle worker needs no polling and sees another's update at
once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from picoclaw.storage.inbox import ASK_NOT_YOURS, ASK_STALE, ASK_TAKEN, CLAIMABLE, CLOSED, DONE_KEEP, InboxUpdate
from picoclaw.storage.postgres.connection import CONNECT_TIMEOUT_SECONDS, statement, transaction

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

log = logging.getLogger(__name__)

# Seconds an inbox call waits for a pool connection: far above a busy pool's wait, and short enough that a
# webhook post during an outage is refused in time for Telegram's retry (the pool's default is 30 s).
POOL_WAIT = 3.0
LISTEN_RETRY = 1.0  # seconds between attempts to LISTEN again after the connection was lost
# Seconds without a notification after which the LISTEN connection is checked with a round trip: one that died
# without a word (a network cut) would otherwise wait for ever.
LISTEN_CHECK = 15.0

DDL = """
-- Telegram updates stored before the webhook answers 200, answered from here by any worker.
create table telegram_inbox (
    bot         bigint not null,          -- the bot's id (the public half of its token)
    update_id   bigint not null,
    chat        text not null,            -- updates of one chat are answered one at a time, in update_id order
    body        text not null,            -- the update's JSON as Telegram sent it
    received_at timestamptz not null default now(),
    worker      text,                     -- who holds (or last held) the claim
    lease_until timestamptz,              -- the claim runs out then; null: not claimed
    attempts    int not null default 0,
    replied_at  timestamptz,              -- the answer was sent
    done_at     timestamptz,
    primary key (bot, update_id)
);
create index telegram_inbox_open on telegram_inbox (bot, chat, update_id) where done_at is null;
create index telegram_inbox_done on telegram_inbox (bot, done_at) where done_at is not null;
"""

# The questions turns wait on (an approval's buttons), answered by whichever worker takes the press (schema step 5).
ASKS_DDL = """
create table telegram_asks (
    bot       bigint not null,
    token     text not null,               -- the random id in the question's buttons
    user_id   bigint not null,             -- the only user whose answer counts
    answer    text,                        -- null while it waits; '' once closed unanswered
    opened_at timestamptz not null default now(),
    primary key (bot, token)
);
"""

# pg_advisory_xact_lock(CLAIM_LOCK, hashtext(bot)): one bot's claims one at a time ("tgin" in ASCII).
CLAIM_LOCK = 0x7467696E

# When a claim may be taken over: when its lease runs out; but one that ran out before the server (re)started,
# a lease's length (%s, seconds) after the start, as its worker could not renew it while the server was down.
TAKEOVER_AT = ("case when lease_until < pg_postmaster_start_time() "
               "then pg_postmaster_start_time() + make_interval(secs => %s) else lease_until end")

CLAIM = f"""
    update telegram_inbox set worker = %s, lease_until = now() + make_interval(secs => %s),
        attempts = attempts + 1
    where bot = %s and update_id in ({CLAIMABLE.format(p="%s", now="now()")})
      -- Looked at again on the row itself: one that waited for a finish or renewal under way is re-checked
      -- here, where READ COMMITTED re-reads it, not in the subquery's older snapshot.
      and done_at is null and (lease_until is null or {TAKEOVER_AT} < now())
    returning update_id, chat, body, attempts, replied_at
"""


# Each one statement (atomic without BEGIN and COMMIT, one round trip). A stored update wakes the listening workers
# (pg_notify, sent at commit); a row comes back only when the update was new.
STORE = """
    with stored as (insert into telegram_inbox (bot, update_id, chat, body) values (%s, %s, %s, %s)
                    on conflict do nothing returning 1)
    select pg_notify(%s, '') from stored
"""
# A finished update wakes them when its chat has another waiting, which may be taken now, by any worker. The
# statement's snapshot is from before its own update, so the finished row itself is left out by its id.
FINISH = """
    with done as (update telegram_inbox set done_at = now(), lease_until = null
                  where bot = %(bot)s and update_id = %(update)s and worker = %(worker)s returning chat)
    select pg_notify(%(channel)s, '') from done where exists (
        select 1 from telegram_inbox waiting where waiting.bot = %(bot)s and waiting.chat = done.chat
        and waiting.update_id <> %(update)s and waiting.done_at is null)
"""


class PostgresInbox:
    """One bot's inbox in the `telegram_inbox` table."""

    def __init__(self, pool: ConnectionPool, dsn: str, bot: int):
        self.pool = pool
        self.dsn = dsn
        self.bot = bot
        self.channel = f"telegram_inbox_{bot}"  # what its workers LISTEN on

    def _transaction(self) -> AbstractContextManager[psycopg.Connection]:
        return transaction(self.pool, self.dsn, "inbox", wait=POOL_WAIT)

    def _statement(self) -> AbstractContextManager[psycopg.Connection]:
        return statement(self.pool, self.dsn, "inbox", wait=POOL_WAIT)

    def _notify(self, conn: psycopg.Connection) -> None:
        conn.execute("select pg_notify(%s, '')", (self.channel,))

    def store(self, update_id: int, chat: str, body: str) -> bool:
        with self._statement() as conn:
            return bool(conn.execute(STORE, (self.bot, update_id, chat, body, self.channel)).fetchall())

    def claim(self, worker: str, lease: float, limit: int) -> list[InboxUpdate]:
        with self._transaction() as conn:
            # One claim at a time per bot: under READ COMMITTED, two claims at once would each miss the lease
            # the other is taking in the same chat. A claim is one short statement, so the wait is too.
            conn.execute("select pg_advisory_xact_lock(%s, hashtext(%s))", (CLAIM_LOCK, str(self.bot)))
            rows = conn.execute(CLAIM, (worker, lease, self.bot, self.bot, limit, lease)).fetchall()
        return sorted((InboxUpdate(int(r[0]), r[1], r[2], int(r[3]), r[4] is not None) for r in rows),
                      key=lambda update: update.update_id)

    def renew(self, worker: str, update_ids: Sequence[int], lease: float) -> set[int]:
        if not update_ids:
            return set()
        with self._statement() as conn:
            rows = conn.execute("update telegram_inbox set lease_until = now() + make_interval(secs => %s) "
                                "where bot = %s and update_id = any(%s) and worker = %s and done_at is null "
                                "returning update_id", (lease, self.bot, list(update_ids), worker)).fetchall()
        return {int(row[0]) for row in rows}

    def mark_replied(self, update_id: int) -> None:
        with self._statement() as conn:
            conn.execute("update telegram_inbox set replied_at = now() where bot = %s and update_id = %s",
                         (self.bot, update_id))

    def finish(self, worker: str, update_id: int) -> None:
        with self._statement() as conn:
            conn.execute(FINISH, {"bot": self.bot, "update": update_id, "worker": worker, "channel": self.channel})

    def prune(self) -> int:
        with self._transaction() as conn:
            cursor = conn.execute("delete from telegram_inbox where bot = %s and done_at < now() - %s",
                                  (self.bot, DONE_KEEP))
            conn.execute("delete from telegram_asks where bot = %s and opened_at < now() - %s", (self.bot, DONE_KEEP))
            return cursor.rowcount

    def release(self, worker: str, update_ids: Sequence[int], *, attempted: bool = False) -> None:
        if not update_ids:
            return
        with self._transaction() as conn:
            cursor = conn.execute("update telegram_inbox set lease_until = null, worker = null, "
                                  "attempts = attempts - %s "
                                  "where bot = %s and update_id = any(%s) and worker = %s and done_at is null",
                                  (0 if attempted else 1, self.bot, list(update_ids), worker))
            if cursor.rowcount:
                self._notify(conn)

    def next_lease_end(self, lease: float) -> float | None:
        with self._statement() as conn:
            row = conn.execute(f"select extract(epoch from min({TAKEOVER_AT}) - now()) from telegram_inbox "
                               f"where bot = %s and done_at is null and {TAKEOVER_AT} >= now()",
                               (lease, self.bot, lease)).fetchone()
        return None if row is None or row[0] is None else max(0.0, float(row[0]))

    async def listen(self, wake: Callable[[], None]) -> None:
        """LISTEN on a connection of its own (not the pool's: it stays open) until cancelled. `wake` also runs
        after each (re)connection, for what was stored while it was not listening. A lost connection is tried
        again every LISTEN_RETRY seconds, quietly: an outage is reported by those who need the server."""
        import psycopg
        from psycopg import sql

        listen = sql.SQL("listen {}").format(sql.Identifier(self.channel))
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True,
                                                             connect_timeout=CONNECT_TIMEOUT_SECONDS)
                async with conn:
                    await conn.execute(listen)
                    wake()
                    while True:
                        async for _ in conn.notifies(timeout=LISTEN_CHECK):
                            wake()
                        await conn.execute("select 1")  # quiet for a while: is the connection still there?
            except psycopg.Error as exc:
                log.debug("telegram inbox: not listening (%s); again in %g s", exc, LISTEN_RETRY)
            await asyncio.sleep(LISTEN_RETRY)

    def counts(self) -> dict[str, int]:
        with self._statement() as conn:
            row = conn.execute(
                "select count(*) filter (where done_at is null and (lease_until is null or lease_until < now())), "
                "count(*) filter (where done_at is null and lease_until >= now()), "
                "count(*) filter (where done_at is not null) from telegram_inbox where bot = %s",
                (self.bot,)).fetchone()
        assert row is not None
        return {"open": int(row[0]), "claimed": int(row[1]), "done": int(row[2])}

    def open_ask(self, token: str, user_id: int) -> None:
        with self._statement() as conn:
            conn.execute("insert into telegram_asks (bot, token, user_id) values (%s, %s, %s)",
                         (self.bot, token, user_id))

    def answer_ask(self, token: str, user_id: int, answer: str) -> str:
        with self._transaction() as conn:
            # One statement: two presses at once (two workers) cannot both be taken.
            taken = conn.execute("update telegram_asks set answer = %s where bot = %s and token = %s "
                                 "and user_id = %s and answer is null returning token",
                                 (answer, self.bot, token, user_id)).fetchone()
            if taken is not None:
                return ASK_TAKEN
            row = conn.execute("select user_id, answer from telegram_asks where bot = %s and token = %s",
                               (self.bot, token)).fetchone()
        return ASK_NOT_YOURS if row is not None and row[1] is None else ASK_STALE

    def ask_answer(self, token: str) -> str | None:
        with self._statement() as conn:
            row = conn.execute("select answer from telegram_asks where bot = %s and token = %s",
                               (self.bot, token)).fetchone()
        return None if row is None else row[0]

    def close_ask(self, token: str) -> str | None:
        with self._transaction() as conn:
            conn.execute("update telegram_asks set answer = %s where bot = %s and token = %s and answer is null",
                         (CLOSED, self.bot, token))
            row = conn.execute("select answer from telegram_asks where bot = %s and token = %s",
                               (self.bot, token)).fetchone()
        return None if row is None or row[0] == CLOSED else str(row[0])

    def close(self) -> None:
        """The pool is the storage's: nothing of the inbox's own to close."""
