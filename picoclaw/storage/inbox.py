"""The Telegram inbox: updates stored before Telegram is told "200 OK", then answered from here by any worker.

One row per (bot, update_id): Telegram's retries and a load balancer's duplicates are stored once. A worker
claims the oldest open update of each chat whose earlier updates are all done, with a lease it renews while
the turn runs; a worker that dies loses its claims when their leases run out, and another takes them over.
`replied` records that the answer was sent, so a taken-over update is not answered a second time.

The inbox also keeps the questions a turn waits on (an approval's Approve / Deny, channels/telegram/buttons.py):
`open_ask` when the buttons are shown, `answer_ask` by whichever worker took the press (only the user asked, and
only once), `ask_answer` read by the worker whose turn waits, `close_ask` when its time is up (a press after it is
stale). So a press answered by any worker reaches the turn, wherever it runs.

What is stored of an update is decided before `store` (the webhook's door): an allowed user's update as sent,
a stranger's only what the refusal needs.

`SqliteInbox` is the files backend's (one worker, a file beside the workspace); PostgreSQL has its own
(storage/postgres/inbox.py) with the same contract, shared by every worker, whose `listen` wakes every worker
as soon as another stored an update (LISTEN/NOTIFY).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Protocol

from picoclaw import clock
from picoclaw.storage.errors import StorageError

# How long a finished update's row is kept: Telegram keeps an unconfirmed update for 24 hours, so a retry
# that comes later than this cannot happen; the row's only use after it is answered is to recognise one.
DONE_KEEP = timedelta(hours=48)


@dataclass(frozen=True)
class InboxUpdate:
    """One claimed update: its raw JSON as Telegram sent it, and what earlier attempts did with it."""

    update_id: int
    chat: str  # what orders it: the chat's id, or "update:<id>" for an update that belongs to no chat
    body: str
    attempts: int  # claims so far, this one included
    replied: bool  # an earlier attempt sent the answer (its worker died before calling it done)


class Inbox(Protocol):
    """The inbox of one bot (storage/inbox.py's module docstring says how it is used)."""

    def store(self, update_id: int, chat: str, body: str) -> bool:
        """Keep an update (once: False when it was already here)."""
        ...

    def claim(self, worker: str, lease: float, limit: int) -> list[InboxUpdate]:
        """At most `limit` updates for `worker` to answer, each the oldest open one of its chat, leased for
        `lease` seconds."""
        ...

    def renew(self, worker: str, update_ids: Sequence[int], lease: float) -> set[int]:
        """Extend the leases `worker` still holds among `update_ids`; the ids it still holds."""
        ...

    def mark_replied(self, update_id: int) -> None:
        """The answer to the update was sent."""
        ...

    def finish(self, worker: str, update_id: int) -> None:
        """`worker` is done with the update: the chat's next one may be claimed. Nothing when the claim is no
        longer `worker`'s (its lease ran out and another worker took the update over)."""
        ...

    def prune(self) -> int:
        """Delete the rows finished longer than DONE_KEEP ago; how many."""
        ...

    def release(self, worker: str, update_ids: Sequence[int], *, attempted: bool = False) -> None:
        """Give back claims not finished, for another worker to take at once. A worker stopping: not counted
        as an attempt; `attempted` (a turn that failed on the storage): counted, so one that always fails ends."""
        ...

    def next_lease_end(self, lease: float) -> float | None:
        """Seconds until the first live claim may be taken over (`lease`: the claims' length, which a restart of
        the database server starts again); None: no claim is live."""
        ...

    async def listen(self, wake: Callable[[], None]) -> None:
        """Call `wake` whenever another worker stored or gave back an update, until cancelled; returns at once
        where no other worker can (SQLite: this worker's own stores wake it)."""
        ...

    def counts(self) -> dict[str, int]:
        """Rows by state: open (not claimed or lease run out), claimed, done."""
        ...

    def open_ask(self, token: str, user_id: int) -> None:
        """A question waits for `user_id`'s answer under `token` (a random id shown in its buttons)."""
        ...

    def answer_ask(self, token: str, user_id: int, answer: str) -> str:
        """Answer the question `token` for `user_id`: ASK_TAKEN when this answer counts, ASK_NOT_YOURS when the
        question is another user's (nothing changes), ASK_STALE when it is unknown, answered or closed."""
        ...

    def ask_answer(self, token: str) -> str | None:
        """The answer the question `token` got (CLOSED once closed unanswered), or None while it waits."""
        ...

    def close_ask(self, token: str) -> str | None:
        """Stop waiting for the question `token`: its answer if one came first, else None (a later press is stale)."""
        ...

    def close(self) -> None:
        """Let go of the connection (PostgreSQL's pool belongs to the storage)."""
        ...


# The claim, in SQL both SQLite and PostgreSQL read: an open update whose lease (if any) ran out, with no
# earlier update of its chat still open, and no other update of its chat under a live lease (one stored late,
# after a later one of the chat was claimed, waits for it). Claims are made one at a time (SQLite's write
# lock, PostgreSQL's advisory lock), so each sees the leases the ones before it took.
CLAIMABLE = """
    select i.update_id from telegram_inbox i
    where i.bot = {p} and i.done_at is null and (i.lease_until is null or i.lease_until < {now})
      and not exists (select 1 from telegram_inbox e where e.bot = i.bot and e.chat = i.chat
                      and e.done_at is null and e.update_id < i.update_id)
      and not exists (select 1 from telegram_inbox l where l.bot = i.bot and l.chat = i.chat
                      and l.done_at is null and l.lease_until >= {now} and l.update_id <> i.update_id)
    order by i.update_id limit {p}
"""

ASK_TAKEN, ASK_NOT_YOURS, ASK_STALE = "taken", "not yours", "stale"  # what answer_ask says of an answer
CLOSED = ""  # the answer of a question closed before anyone answered it

SQLITE_DDL = """
create table if not exists telegram_inbox (
    bot integer not null, update_id integer not null, chat text not null, body text not null,
    received_at real not null, worker text, lease_until real, attempts integer not null default 0,
    replied_at real, done_at real, primary key (bot, update_id));
create index if not exists telegram_inbox_open on telegram_inbox (bot, chat, update_id) where done_at is null;
create table if not exists telegram_asks (
    bot integer not null, token text not null, user_id integer not null, answer text, opened_at real not null,
    primary key (bot, token));
"""


class SqliteInbox:
    """The inbox of the files backend: a SQLite file beside the workspace, for the one worker it allows."""

    def __init__(self, path: Path, bot: int):
        self.path = path
        self.bot = bot
        self._guard = threading.Lock()  # one connection, shared by the worker threads of asyncio.to_thread
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._conn.execute("pragma journal_mode = wal")
            self._conn.execute("pragma synchronous = full")  # stored means on disk before the 200 goes out
            self._conn.executescript(SQLITE_DDL)
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open the Telegram inbox {path}: {exc}") from None

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._guard:
            try:
                self._conn.execute("begin immediate")
                try:
                    yield self._conn
                    self._conn.execute("commit")
                finally:
                    if self._conn.in_transaction:  # what failed, the commit included, is undone
                        self._conn.execute("rollback")
            except sqlite3.Error as exc:
                raise StorageError(f"the Telegram inbox {self.path} failed: {exc}") from None

    @staticmethod
    def _now() -> float:
        return clock.now().timestamp()

    def store(self, update_id: int, chat: str, body: str) -> bool:
        with self._transaction() as conn:
            cursor = conn.execute("insert into telegram_inbox (bot, update_id, chat, body, received_at) "
                                  "values (?, ?, ?, ?, ?) on conflict do nothing",
                                  (self.bot, update_id, chat, body, self._now()))
            return cursor.rowcount == 1

    def claim(self, worker: str, lease: float, limit: int) -> list[InboxUpdate]:
        now = self._now()
        with self._transaction() as conn:
            ids = [row[0] for row in conn.execute(CLAIMABLE.format(p="?", now="?"), (self.bot, now, now, limit))]
            claimed = []
            for update_id in ids:
                row = conn.execute("update telegram_inbox set worker = ?, lease_until = ?, attempts = attempts + 1 "
                                   "where bot = ? and update_id = ? "
                                   "returning update_id, chat, body, attempts, replied_at",
                                   (worker, now + lease, self.bot, update_id)).fetchone()
                claimed.append(InboxUpdate(int(row[0]), row[1], row[2], int(row[3]), row[4] is not None))
            return claimed

    def renew(self, worker: str, update_ids: Sequence[int], lease: float) -> set[int]:
        until = self._now() + lease
        held = set()
        with self._transaction() as conn:
            for update_id in update_ids:
                cursor = conn.execute("update telegram_inbox set lease_until = ? where bot = ? and update_id = ? "
                                      "and worker = ? and done_at is null", (until, self.bot, update_id, worker))
                if cursor.rowcount:
                    held.add(update_id)
        return held

    def mark_replied(self, update_id: int) -> None:
        with self._transaction() as conn:
            conn.execute("update telegram_inbox set replied_at = ? where bot = ? and update_id = ?",
                         (self._now(), self.bot, update_id))

    def finish(self, worker: str, update_id: int) -> None:
        with self._transaction() as conn:
            conn.execute("update telegram_inbox set done_at = ?, lease_until = null where bot = ? and update_id = ? "
                         "and worker = ?", (self._now(), self.bot, update_id, worker))

    def prune(self) -> int:
        with self._transaction() as conn:
            cursor = conn.execute("delete from telegram_inbox where bot = ? and done_at < ?",
                                  (self.bot, self._now() - DONE_KEEP.total_seconds()))
            conn.execute("delete from telegram_asks where bot = ? and opened_at < ?",
                         (self.bot, self._now() - DONE_KEEP.total_seconds()))
            return cursor.rowcount

    def release(self, worker: str, update_ids: Sequence[int], *, attempted: bool = False) -> None:
        with self._transaction() as conn:
            for update_id in update_ids:
                conn.execute("update telegram_inbox set lease_until = null, worker = null, attempts = attempts - ? "
                             "where bot = ? and update_id = ? and worker = ? and done_at is null",
                             (0 if attempted else 1, self.bot, update_id, worker))

    def next_lease_end(self, lease: float) -> float | None:
        now = self._now()
        with self._transaction() as conn:
            row = conn.execute("select min(lease_until) from telegram_inbox where bot = ? and done_at is null "
                               "and lease_until >= ?", (self.bot, now)).fetchone()
        return None if row is None or row[0] is None else max(0.0, float(row[0]) - now)

    async def listen(self, wake: Callable[[], None]) -> None:
        """Nothing to listen to: the one worker of a files workspace stores every update itself."""

    def counts(self) -> dict[str, int]:
        now = self._now()
        with self._transaction() as conn:
            row = conn.execute(
                "select count(*) filter (where done_at is null and (lease_until is null or lease_until < ?)), "
                "count(*) filter (where done_at is null and lease_until >= ?), "
                "count(*) filter (where done_at is not null) from telegram_inbox where bot = ?",
                (now, now, self.bot)).fetchone()
        return {"open": int(row[0]), "claimed": int(row[1]), "done": int(row[2])}

    def open_ask(self, token: str, user_id: int) -> None:
        with self._transaction() as conn:
            conn.execute("insert into telegram_asks (bot, token, user_id, opened_at) values (?, ?, ?, ?)",
                         (self.bot, token, user_id, self._now()))

    def answer_ask(self, token: str, user_id: int, answer: str) -> str:
        with self._transaction() as conn:
            row = conn.execute("select user_id, answer from telegram_asks where bot = ? and token = ?",
                               (self.bot, token)).fetchone()
            if row is None or row[1] is not None:
                return ASK_STALE
            if int(row[0]) != user_id:
                return ASK_NOT_YOURS
            conn.execute("update telegram_asks set answer = ? where bot = ? and token = ?", (answer, self.bot, token))
            return ASK_TAKEN

    def ask_answer(self, token: str) -> str | None:
        with self._transaction() as conn:
            row = conn.execute("select answer from telegram_asks where bot = ? and token = ?",
                               (self.bot, token)).fetchone()
        return None if row is None else row[0]

    def close_ask(self, token: str) -> str | None:
        with self._transaction() as conn:
            conn.execute("update telegram_asks set answer = ? where bot = ? and token = ? and answer is null",
                         (CLOSED, self.bot, token))
            row = conn.execute("select answer from telegram_asks where bot = ? and token = ?",
                               (self.bot, token)).fetchone()
        return None if row is None or row[0] == CLOSED else str(row[0])

    def close(self) -> None:
        with self._guard:
            self._conn.close()
