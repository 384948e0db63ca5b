"""The reply log (storage/telegram_replies.py) on both backends: a reply sent is found by its chat and message id,
by this bot only, until REPLY_KEEP has passed; a log that cannot be opened is one line, and the bot serves on."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from freezegun import freeze_time

from picoclaw import clock
from picoclaw.channels.telegram import TelegramChannel
from picoclaw.storage import FilesStorage, ReplyLog, SentReply, Storage, StorageError
from picoclaw.storage.postgres.storage import PostgresStorage
from picoclaw.storage.telegram_replies import REPLY_KEEP, SqliteReplyLog
from tests.fakes import FakeOpenAIServer
from tests.fakes.telegram_server import FakeTelegramServer
from tests.test_telegram import OWNER, configure, echo, replied, serve, until

BOT, OTHER_BOT = 123456, 654321
CHAT = -1001234567890  # a supergroup's id: more than 32 bits


@pytest.fixture(params=["files", "postgres"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    if request.param == "files":
        yield FilesStorage(tmp_path)
        return
    opened = PostgresStorage(tmp_path, request.getfixturevalue("postgres_dsn"))
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def log(storage: Storage) -> Iterator[ReplyLog]:
    opened = storage.telegram_replies(BOT)
    try:
        yield opened
    finally:
        opened.close()


@pytest.mark.parametrize("session", ["telegram:-1001234567890:t7", "telegram:42:张三"])
def test_a_reply_is_found_by_its_message_for_its_bot_only(storage: Storage, log: ReplyLog, session: str) -> None:
    log.remember(CHAT, 7, SentReply(session, 31))
    log.remember(CHAT, 8, SentReply(session, None))  # a command's answer: no turn
    assert log.find(CHAT, 7) == SentReply(session, 31)
    assert log.find(CHAT, 8) == SentReply(session, None)
    assert log.find(CHAT, 9) is None
    assert log.find(OWNER, 7) is None
    other = storage.telegram_replies(OTHER_BOT)
    try:
        assert other.find(CHAT, 7) is None
    finally:
        other.close()
    log.remember(CHAT, 7, SentReply(session, 32))  # the same message noted again: the newest note counts
    assert log.find(CHAT, 7) == SentReply(session, 32)


def test_a_reply_older_than_reply_keep_is_not_found(storage: Storage, log: ReplyLog) -> None:
    log.remember(CHAT, 7, SentReply("telegram:42", 3))
    if isinstance(log, SqliteReplyLog):
        with freeze_time(clock.now() + REPLY_KEEP + timedelta(minutes=1)):
            assert log.find(CHAT, 7) is None
        return
    assert isinstance(storage, PostgresStorage)
    with psycopg.connect(storage.dsn) as conn:  # the server's clock decides on PostgreSQL: the row made older
        conn.execute("update telegram_replies set sent_at = now() - %s", (REPLY_KEEP + timedelta(minutes=1),))
    assert log.find(CHAT, 7) is None


def test_a_log_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    taken = tmp_path / "replies.sqlite3"
    taken.mkdir()  # a folder where the file should be
    with pytest.raises(StorageError) as caught:
        SqliteReplyLog(taken, BOT)
    assert str(caught.value).startswith(f"cannot open the Telegram reply log {taken}")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("question", ["still there?", "还在吗？"])
def test_without_a_reply_log_the_bot_answers_and_reactions_are_not_counted(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, question: str,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_openai.responder = echo

    def refused(self: FilesStorage, bot: int) -> ReplyLog:
        raise StorageError("cannot open the Telegram reply log: disk full")
    monkeypatch.setattr(FilesStorage, "telegram_replies", refused)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, question)
        await until(fake_telegram, replied(fake_telegram, OWNER))
        fake_telegram.send_reaction(OWNER, OWNER, 2, ["👎"])
        fake_telegram.send_text(OWNER, OWNER, question)
        await until(fake_telegram, replied(fake_telegram, OWNER, 2))
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.sent_texts(OWNER) == [f"echo: {question}"] * 2
    assert not (workspace.memory_dir / ".feedback.jsonl").exists()
    assert "reactions on replies are not counted as feedback" in caplog.text
