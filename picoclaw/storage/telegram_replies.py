"""The bot's sent replies, by (chat, message id): which session and turn each answered, so a reaction on one counts
as feedback on that turn whichever process sent it, and after a restart.

`SqliteReplyLog` is the files backend's (a SQLite file in the workspace's work folder); PostgreSQL has its own
(storage/postgres/telegram_replies.py), shared by every webhook worker. A reply is kept REPLY_KEEP: feedback comes
soon after a reply, and a reaction on an older one is ignored, as on a message the bot never sent. This is soft
state: losing it loses a reaction's link to its turn, nothing more.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Protocol

from picoclaw import clock
from picoclaw.storage.errors import StorageError

REPLY_KEEP = timedelta(days=30)
PRUNE_EVERY = 1_000  # replies remembered between two prunes of the ones older than REPLY_KEEP


@dataclass(frozen=True)
class SentReply:
    """A message the bot sent as (part of) a turn's reply: the session, and the stored id of the turn's user
    message (None: a reply with no turn of its own, such as a command's answer)."""

    session: str
    turn: int | None


class ReplyLog(Protocol):
    """The sent replies of one bot (the module docstring says what for)."""

    def remember(self, chat: int, message_id: int, reply: SentReply) -> None:
        """Keep that message `message_id` of `chat` is `reply`."""
        ...

    def find(self, chat: int, message_id: int) -> SentReply | None:
        """The reply that message is, or None (not the bot's reply, or older than REPLY_KEEP)."""
        ...

    def close(self) -> None:
        ...


SQLITE_DDL = """
create table if not exists telegram_replies (
    bot integer not null, chat integer not null, message_id integer not null, session text not null,
    turn integer, sent_at real not null, primary key (bot, chat, message_id));
create index if not exists telegram_replies_sent on telegram_replies (bot, sent_at);
"""


class SqliteReplyLog:
    """The reply log of the files backend: a SQLite file in the work folder."""

    def __init__(self, path: Path, bot: int):
        self.path = path
        self.bot = bot
        self._guard = threading.Lock()  # one connection, shared by the threads of asyncio.to_thread
        self._since_prune = 0
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._conn.execute("pragma journal_mode = wal")
            self._conn.execute("pragma synchronous = normal")  # soft state: a power cut may lose the newest
            self._conn.executescript(SQLITE_DDL)
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open the Telegram reply log {path}: {exc}") from None

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        with self._guard:
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise StorageError(f"the Telegram reply log {self.path} failed: {exc}") from None

    def remember(self, chat: int, message_id: int, reply: SentReply) -> None:
        now = clock.now().timestamp()
        with self._connection() as conn:
            conn.execute("insert or replace into telegram_replies values (?, ?, ?, ?, ?, ?)",
                         (self.bot, chat, message_id, reply.session, reply.turn, now))
            self._since_prune += 1
            if self._since_prune >= PRUNE_EVERY:
                self._since_prune = 0
                conn.execute("delete from telegram_replies where bot = ? and sent_at < ?",
                             (self.bot, now - REPLY_KEEP.total_seconds()))

    def find(self, chat: int, message_id: int) -> SentReply | None:
        oldest = clock.now().timestamp() - REPLY_KEEP.total_seconds()
        with self._connection() as conn:
            row = conn.execute("select session, turn from telegram_replies where bot = ? and chat = ? and "
                               "message_id = ? and sent_at >= ?", (self.bot, chat, message_id, oldest)).fetchone()
        return None if row is None else SentReply(str(row[0]), None if row[1] is None else int(row[1]))

    def close(self) -> None:
        with self._guard:
            self._conn.close()
