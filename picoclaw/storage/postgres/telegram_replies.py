"""The bot's sent replies on PostgreSQL, shared by every webhook worker (the contract: storage/telegram_replies.py)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from picoclaw.storage.postgres.connection import statement
from picoclaw.storage.telegram_replies import PRUNE_EVERY, REPLY_KEEP, SentReply

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

POOL_WAIT = 3.0  # seconds: a reaction or a reply's note is not worth a longer wait for a pool connection

DDL = """
-- The messages each bot sent as a turn's reply: a reaction on one is feedback on that turn.
create table telegram_replies (
    bot        bigint not null,
    chat       bigint not null,
    message_id bigint not null,
    session    text not null,
    turn       bigint,                   -- the stored id of the turn's user message; null: no turn (a command)
    sent_at    timestamptz not null default now(),
    primary key (bot, chat, message_id)
);
create index telegram_replies_sent on telegram_replies (bot, sent_at);
"""


class PostgresReplyLog:
    """One bot's rows of `telegram_replies`."""

    def __init__(self, pool: ConnectionPool, dsn: str, bot: int):
        self.pool = pool
        self.dsn = dsn
        self.bot = bot
        self._since_prune = 0

    def _statement(self) -> AbstractContextManager[psycopg.Connection]:
        return statement(self.pool, self.dsn, "reply log", wait=POOL_WAIT)

    def remember(self, chat: int, message_id: int, reply: SentReply) -> None:
        with self._statement() as conn:
            conn.execute("insert into telegram_replies (bot, chat, message_id, session, turn) "
                         "values (%s, %s, %s, %s, %s) on conflict (bot, chat, message_id) do update "
                         "set session = excluded.session, turn = excluded.turn, sent_at = now()",
                         (self.bot, chat, message_id, reply.session, reply.turn))
        self._since_prune += 1
        if self._since_prune >= PRUNE_EVERY:
            self._since_prune = 0
            with self._statement() as conn:
                conn.execute("delete from telegram_replies where bot = %s and sent_at < now() - %s",
                             (self.bot, REPLY_KEEP))

    def find(self, chat: int, message_id: int) -> SentReply | None:
        with self._statement() as conn:
            row = conn.execute("select session, turn from telegram_replies where bot = %s and chat = %s and "
                               "message_id = %s and sent_at >= now() - %s",
                               (self.bot, chat, message_id, REPLY_KEEP)).fetchone()
        return None if row is None else SentReply(str(row[0]), None if row[1] is None else int(row[1]))

    def close(self) -> None:
        """The pool is the storage's: nothing of its own to close."""
