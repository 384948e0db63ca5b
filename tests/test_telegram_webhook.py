"""Webhook mode on one worker (the files backend, and PostgreSQL where it differs): what is refused at the door
(a slow or cut-off body too, an id that does not fit), what is stored once and what of a stranger is not, what
the inbox keeps across a restart, a turn that cannot reach the storage, an idle worker's cost, and the one line
that refuses a second worker. Real aiogram and aiohttp against the fake Bot API, which POSTs updates to the
worker as Telegram does."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import psycopg
import pytest

from picoclaw.app import App
from picoclaw.channels.telegram import (
    APOLOGY,
    MEMORY_BUSY,
    TelegramChannel,
    Webhook,
    make_bot,
    not_authorised,
    webhook_secret,
)
from picoclaw.channels.telegram import channel as channel_module
from picoclaw.channels.telegram import webhook as webhook_module
from picoclaw.channels.telegram.storage_watch import StorageWatch
from picoclaw.cli import main
from picoclaw.config import WebhookConfig, turns_held
from picoclaw.memory.store import MemoryStore
from picoclaw.memory.workspace import Workspace
from picoclaw.storage import LockWaitExpired, StorageUnavailable
from picoclaw.storage.inbox import SqliteInbox
from picoclaw.storage.telegram_replies import SentReply, SqliteReplyLog
from tests.agent_helpers import make_provider
from tests.fakes import FakeOpenAIServer, Text
from tests.fakes.telegram_server import BOT_USERNAME, TOKEN, FakeTelegramServer, free_port
from tests.homes import edit_config
from tests.test_telegram import OWNER, STRANGER, configure, echo, picoclaw_telegram, replied, serve, until
from tests.test_telegram_reliability import finished
from tests.waiting import wait_until

T = TypeVar("T")
URL = "https://bot.example.com/tg"
INBOX = Path(".picoclaw-work") / "telegram-inbox.sqlite3"
# Seconds: a killed worker's updates are taken over this soon. Renewed every third of it, so a busy machine's
# stall of a few seconds does not lose a live worker's claims.
LEASE = 10


def fail_turns(monkeypatch: pytest.MonkeyPatch, failures: list[Exception]) -> None:
    """The channel's turns raise `failures`, one a turn, before they run as usual."""
    run_turn = channel_module.run_turn

    async def flaky_turn(*args: Any) -> Any:
        if failures:
            raise failures.pop()
        return await run_turn(*args)
    monkeypatch.setattr(channel_module, "run_turn", flaky_turn)


def hook_settings(port: int, **settings: Any) -> dict[str, Any]:
    return {"webhook": {"url": URL, "listen": f"127.0.0.1:{port}", "lease_seconds": LEASE, **settings}}


def serve_webhook(workspace: Workspace, telegram: FakeTelegramServer, model: FakeOpenAIServer,
                  body: Callable[[TelegramChannel, Webhook], Awaitable[T]], **timings: float) -> T:
    """Run one webhook worker in this process until `body` returns, then stop it as SIGTERM does; `timings` go to
    the Webhook (body_timeout, idle_timeout, fallback_poll)."""
    async def run() -> T:
        settings = workspace.config.channels.telegram
        bot = make_bot(settings, workspace.config.telegram_token())
        app = App(workspace.config, workspace.home, make_provider=lambda _config: make_provider(workspace, model))
        async with app:
            channel = TelegramChannel(settings, bot, app.agent, replies=app.storage.telegram_replies,
                                      transcriber=app.transcriber(), typing_interval=0.05, typing_delay=0)
            webhook = Webhook(settings.webhook, app.storage, worker="w1", secret_token=webhook_secret(bot.token),
                              **timings)
            running = asyncio.create_task(channel.run(handle_signals=False, webhook=webhook))
            await until(telegram, lambda: telegram.webhook is not None)  # the port opened before it was set
            try:
                return await body(channel, webhook)
            finally:
                await channel.stop()
                await running
    return asyncio.run(run())


async def post(port: int, body: bytes | dict[str, Any], headers: dict[str, str] | None = None) -> int:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as session, session.post(
            f"http://127.0.0.1:{port}/tg", data=data, headers=headers or {}) as response:
        return response.status


def update(update_id: int, chat_id: int, text: str) -> dict[str, Any]:
    user = {"id": chat_id, "is_bot": False, "first_name": "u"}
    return {"update_id": update_id, "message": {"message_id": update_id, "date": 1_700_000_000,
                                                "chat": {"id": chat_id, "type": "private"}, "from": user,
                                                "text": text}}


def inbox_rows(home: Path, dsn: str | None = None, columns: str = "update_id, chat, attempts, "
               "replied_at is not null, done_at is not null") -> list[tuple[Any, ...]]:
    """The inbox's rows (on PostgreSQL when `dsn` is given), in update order."""
    query = f"select {columns} from telegram_inbox order by update_id"
    if dsn is not None:
        with psycopg.connect(dsn) as pg:
            return [tuple(row) for row in pg.execute(query.encode()).fetchall()]  # our own query, not input
    path = home / "workspace" / INBOX
    if not path.exists():
        return []
    with sqlite3.connect(path) as conn:
        return conn.execute(query).fetchall()


def on_postgres(home: Path, dsn: str) -> None:
    """The home's storage on PostgreSQL (before `configure`, which keeps it)."""
    with edit_config(home) as config:
        config["storage"] = {"backend": "postgres", "postgres": {"dsn": dsn, "pool_size": 4}}


def backend_dsn(request: pytest.FixtureRequest, home: Path, backend: str) -> str | None:
    """For a test parametrized over both backends: PostgreSQL's DSN (the home set up for it), or None: files."""
    if backend == "files":
        return None
    dsn = str(request.getfixturevalue("postgres_dsn"))
    on_postgres(home, dsn)
    return dsn


async def inbox_done(webhook: Webhook, count: int) -> None:
    """Until `count` updates are done (each finished by the worker, its answer sent or not needed)."""
    inbox = webhook.inbox
    assert inbox is not None
    await wait_until(lambda: inbox.counts()["done"] >= count, what=f"{count} updates done")


# -- at the door --------------------------------------------------------------------------------------------------


def test_setwebhook_carries_the_url_and_a_secret_and_healthz_answers(home: Path, fake_telegram: FakeTelegramServer,
                                                                    fake_openai: FakeOpenAIServer) -> None:
    port = free_port()
    workspace = configure(home, fake_telegram, fake_openai, allow_from=[OWNER], **hook_settings(port))

    async def body(channel: TelegramChannel, webhook: Webhook) -> tuple[int, str]:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/healthz") as response:
            return response.status, await response.text()
    assert serve_webhook(workspace, fake_telegram, fake_openai, body) == (200, "ok w1\n")
    assert fake_telegram.webhook is None or fake_telegram.webhook["url"] == URL
    [call] = fake_telegram.calls("setWebhook")
    assert call.params["url"] == URL and call.params["secret_token"] == webhook_secret(TOKEN)
    # What the routers handle, nothing more: messages, reactions as feedback and button presses.
    assert sorted(call.params["allowed_updates"]) == ["callback_query", "message", "message_reaction"]
    assert TOKEN.split(":")[1] not in call.params["secret_token"] and len(call.params["secret_token"]) == 64
    assert fake_telegram.calls("deleteWebhook") == []  # a webhook worker does not drop its own webhook


@pytest.mark.parametrize(("headers", "body", "status"), [
    ({}, update(1, OWNER, "no secret / 没有密钥"), 401),
    ({"X-Telegram-Bot-Api-Secret-Token": "wrong"}, update(1, OWNER, "wrong secret / 错误密钥"), 401),
    ({"X-Telegram-Bot-Api-Secret-Token": "s\u00e9cret"}, update(1, OWNER, "not ASCII / 非 ASCII"), 401),
    (None, b"<html>not json</html>", 400),
    (None, b"[1, 2, 3]", 400),
    (None, {"update_id": 7}, 400),  # no event at all
    (None, {"update_id": "seven", "message": {}}, 400),
    (None, {"update_id": 8, "message": {"text": "no chat / 没有聊天"}}, 400),
    (None, b'{"update_id": 9, "message": {"text": "' + b"x" * (1 << 20) + b'"}}', 413),
])
def test_a_request_without_the_secret_or_not_an_update_is_refused_and_nothing_is_stored(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer,
        caplog: pytest.LogCaptureFixture, headers: dict[str, str] | None, body: Any, status: int) -> None:
    port = free_port()
    workspace = configure(home, fake_telegram, fake_openai, **hook_settings(port))
    secret = {"X-Telegram-Bot-Api-Secret-Token": webhook_secret(TOKEN)}

    async def run(channel: TelegramChannel, webhook: Webhook) -> int:
        return await post(port, body, secret if headers is None else headers)
    assert serve_webhook(workspace, fake_telegram, fake_openai, run) == status
    assert inbox_rows(home) == [] and fake_telegram.sent_texts() == [] and fake_openai.chat_requests() == []
    assert not (home / "workspace" / "sessions").exists() or not any((home / "workspace" / "sessions").iterdir())
    logged = [r.getMessage() for r in caplog.records if r.name.endswith("webhook")]
    assert len(logged) == 1 and logged[0].startswith("telegram webhook: refused a request from 127.0.0.1"), logged
    assert webhook_secret(TOKEN) not in caplog.text


def a_message(update_id: int, chat: dict[str, Any], user: dict[str, Any], text: str) -> dict[str, Any]:
    return {"update_id": update_id, "message": {"message_id": update_id, "date": 1_700_000_000, "chat": chat,
                                                "from": {"is_bot": False, **user}, "text": text}}


@pytest.mark.parametrize("backend", ["files", "postgres"])
def test_nothing_a_stranger_writes_reaches_the_inbox_only_the_refusal_does(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, request: pytest.FixtureRequest,
        backend: str) -> None:
    dsn = backend_dsn(request, home, backend)
    port = free_port()
    workspace = configure(home, fake_telegram, fake_openai, **hook_settings(port))
    fake_openai.responder = echo
    secret = {"X-Telegram-Bot-Api-Secret-Token": webhook_secret(TOKEN)}
    group, member = -100777, 7777
    stranger = {"id": STRANGER, "first_name": "王秘密", "last_name": "Secretson", "username": "secret_wang"}
    their_group = {"id": group, "type": "supergroup", "title": "家庭秘密 family secrets"}
    updates = [
        a_message(1, {"id": STRANGER, "type": "private", "first_name": "王秘密"}, stranger, "我的银行卡密码是 4729"),
        a_message(2, {"id": STRANGER, "type": "private"}, stranger, "my card PIN is 4729"),
        a_message(3, their_group, {"id": member, "first_name": "Li Mi"}, f"@{BOT_USERNAME} 记住 hunter2 please"),
        a_message(4, their_group, {"id": member, "first_name": "Li Mi"}, "not for the bot: hunter2 / 不是给机器人的"),
        update(5, OWNER, "the owner's own / 主人的话"),
    ]

    async def run(channel: TelegramChannel, webhook: Webhook) -> list[int]:
        statuses = [await post(port, body, secret) for body in updates]
        await inbox_done(webhook, 4)  # 4, a message not for the bot, was not even stored
        return statuses
    assert serve_webhook(workspace, fake_telegram, fake_openai, run) == [200] * 5
    # Each stranger told their id once, in the chat they wrote in; the owner answered.
    assert fake_telegram.sent_texts(STRANGER) == [not_authorised(STRANGER)]
    assert fake_telegram.sent_texts(group) == [not_authorised(member)]
    assert fake_telegram.sent_texts(OWNER) == ["echo: the owner's own / 主人的话"]
    rows = inbox_rows(home, dsn, "update_id, chat, body")
    assert [row[:2] for row in rows] == [(1, str(STRANGER)), (2, str(STRANGER)), (3, str(group)), (5, str(OWNER))]
    kept = " ".join(row[2] for row in rows[:3])
    for secret_word in ("4729", "hunter2", "王秘密", "Secretson", "secret_wang", "Li Mi", "家庭秘密", "family"):
        assert secret_word not in kept, secret_word
    assert json.loads(rows[2][2]) == {"update_id": 3, "refusal": {"chat_id": group, "user_id": member}}
    assert json.loads(rows[4 - 1][2])["message"]["text"] == "the owner's own / 主人的话"  # an allowed user's, as sent
    assert all("4729" not in json.dumps(r) and "hunter2" not in json.dumps(r) for r in fake_openai.chat_requests())


@pytest.mark.parametrize("backend", ["files", "postgres"])
def test_an_id_that_does_not_fit_64_bits_is_a_400_not_a_503_retried_for_ever(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, request: pytest.FixtureRequest,
        caplog: pytest.LogCaptureFixture, backend: str) -> None:
    dsn = backend_dsn(request, home, backend)
    port = free_port()
    workspace = configure(home, fake_telegram, fake_openai, **hook_settings(port))
    fake_openai.responder = echo
    secret = {"X-Telegram-Bot-Api-Secret-Token": webhook_secret(TOKEN)}
    largest = 2**63 - 1
    bodies = [update(2**63 + 5, OWNER, "too big / 太大"), update(-1, OWNER, "negative / 负数"),
              update(-(2**63) - 5, OWNER, "far too small / 太小"),
              a_message(9, {"id": 2**63, "type": "private"}, {"id": OWNER, "first_name": "u"}, "chat id / 聊天"),
              update(largest, OWNER, "the largest that fits / 最大的")]

    async def run(channel: TelegramChannel, webhook: Webhook) -> list[int]:
        statuses = [await post(port, body, secret) for body in bodies]
        await inbox_done(webhook, 1)
        return statuses
    assert serve_webhook(workspace, fake_telegram, fake_openai, run) == [400, 400, 400, 400, 200]
    assert inbox_rows(home, dsn) == [(largest, str(OWNER), 1, 1, 1)]
    assert fake_telegram.sent_texts(OWNER) == ["echo: the largest that fits / 最大的"]
    refused = [r.getMessage() for r in caplog.records if "refused a request" in r.getMessage()]
    assert len(refused) == 4 and all(r.exc_info is None for r in caplog.records), refused


def test_a_body_that_drips_in_or_never_ends_is_cut_off_and_an_aborted_one_is_one_log_line(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer,
        caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    workspace = configure(home, fake_telegram, fake_openai, **hook_settings(port))
    fake_openai.responder = echo
    head = (f"POST /tg HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"X-Telegram-Bot-Api-Secret-Token: {webhook_secret(TOKEN)}\r\nContent-Length: 200\r\n\r\n").encode()

    async def dripping(start: bytes, byte: bytes) -> bytes:
        """Send `start`, then `byte` every half second, until the worker closes the connection (a hang fails):
        what it answered meanwhile (a byte dropped in after the close is answered with a reset, which may
        take an answer not read yet with it)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(start)

        async def drip() -> None:
            while not writer.is_closing():
                await asyncio.sleep(0.5)
                writer.write(byte)
        dripper = asyncio.create_task(drip())
        answer = b""
        try:
            while chunk := await asyncio.wait_for(reader.read(1024), 60):
                answer += chunk
        except ConnectionResetError:
            pass
        finally:
            dripper.cancel()
            writer.close()
        return answer

    async def sent(data: bytes, *, hang_up: bool) -> bytes:
        """Send `data` (and hang up at once): what the worker answered before it closed the connection."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        await writer.drain()
        if hang_up:
            writer.close()
        try:
            return await asyncio.wait_for(reader.read(), 60)
        finally:
            writer.close()

    async def run(channel: TelegramChannel, webhook: Webhook) -> tuple[list[bytes], bytes, bytes, int]:
        bodies = [asyncio.create_task(dripping(head + b"{", b" ")) for _ in range(20)]
        headers = asyncio.create_task(dripping(b"POST /tg HTTP/1.1\r\nHost: 1", b"1"))  # headers that never end
        await sent(head + b'{"update_id": 1', hang_up=True)  # a body cut off
        garbage = await sent(b"POST /tg HTTP/1.1\r\nA {bad} header\r\n\r\n", hang_up=False)
        status = await post(port, update(2, OWNER, "still served / 照常服务"),
                            {"X-Telegram-Bot-Api-Secret-Token": webhook_secret(TOKEN)})
        return list(await asyncio.gather(*bodies)), await headers, garbage, status
    cut_bodies, cut_headers, garbage, status = serve_webhook(workspace, fake_telegram, fake_openai, run,
                                                             body_timeout=1.0, idle_timeout=2.0)
    assert status == 200 and fake_telegram.sent_texts(OWNER) == ["echo: still served / 照常服务"]
    # Each closed by the worker: with a 408 (the log below says each was one), and no request began for the last.
    assert all(answer.startswith(b"HTTP/1.1 408 ") or answer == b"" for answer in cut_bodies), cut_bodies
    assert cut_headers == b""
    assert garbage.startswith(b"HTTP/1.0 400 ")
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("picoclaw.channels.telegram.webhook")]
    assert len([line for line in logged if "its body did not arrive within 1 s" in line]) == 20
    assert len([line for line in logged if "ended before its body did" in line]) == 1, logged
    assert len([line for line in logged if "not HTTP" in line]) == 1, logged
    assert all(r.exc_info is None for r in caplog.records), [r.getMessage() for r in caplog.records if r.exc_info]
    assert all("\n" not in line for line in logged)


@pytest.mark.slow
def test_a_flood_of_one_update_is_stored_once_and_answered_once(home: Path, fake_telegram: FakeTelegramServer,
                                                                fake_openai: FakeOpenAIServer) -> None:
    port = free_port()
    workspace = configure(home, fake_telegram, fake_openai, **hook_settings(port))
    fake_openai.responder = echo
    secret = {"X-Telegram-Bot-Api-Secret-Token": webhook_secret(TOKEN)}

    async def run(channel: TelegramChannel, webhook: Webhook) -> list[int]:
        once = update(41, OWNER, "只一次 only once")
        statuses = await asyncio.gather(*(post(port, once, secret) for _ in range(30)))
        await until(fake_telegram, lambda: len(fake_telegram.sent_texts(OWNER)) >= 1)
        statuses.append(await post(port, once, secret))  # Telegram's retry, after the answer
        assert webhook.inbox is not None
        await until(fake_telegram, lambda: webhook.inbox is not None and webhook.inbox.counts()["done"] == 1)
        return statuses
    assert serve_webhook(workspace, fake_telegram, fake_openai, run) == [200] * 31
    assert fake_telegram.sent_texts(OWNER) == ["echo: 只一次 only once"] and len(fake_openai.chat_requests()) == 1
    assert inbox_rows(home) == [(41, str(OWNER), 1, 1, 1)]


def test_updates_posted_by_telegram_are_answered_in_each_chats_order(home: Path, fake_telegram: FakeTelegramServer,
                                                                      fake_openai: FakeOpenAIServer) -> None:
    port = free_port()
    chats = [OWNER, 2001, 2002]
    workspace = configure(home, fake_telegram, fake_openai, allow_from=chats, **hook_settings(port))
    fake_openai.responder = echo

    async def run(channel: TelegramChannel, webhook: Webhook) -> None:
        fake_telegram.deliver_to([port])
        for n in range(4):
            for chat in chats:
                fake_telegram.send_text(chat, chat, f"{chat} 第{n}条 message {n}")
        await until(fake_telegram, lambda: all(len(fake_telegram.sent_texts(c)) == 4 for c in chats))
    serve_webhook(workspace, fake_telegram, fake_openai, run)
    for chat in chats:
        assert fake_telegram.sent_texts(chat) == [f"echo: {chat} 第{n}条 message {n}" for n in range(4)]
    assert [row[2:] for row in inbox_rows(home)] == [(1, 1, 1)] * 12


def test_a_stop_finishes_the_turn_under_way_before_the_worker_ends(home: Path, fake_telegram: FakeTelegramServer,
                                                                   fake_openai: FakeOpenAIServer) -> None:
    port = free_port()
    workspace = configure(home, fake_telegram, fake_openai, **hook_settings(port))
    fake_openai.responder = lambda body: Text(echo(body), delay=1.0)

    async def run(channel: TelegramChannel, webhook: Webhook) -> None:
        fake_telegram.deliver_to([port])
        fake_telegram.send_text(OWNER, OWNER, "answer before you go / 走之前回答")
        await until(fake_telegram, lambda: len(fake_openai.chat_requests()) == 1)
        # serve_webhook now stops the worker as SIGTERM does, with the model still thinking.
    serve_webhook(workspace, fake_telegram, fake_openai, run)
    assert fake_telegram.sent_texts(OWNER) == ["echo: answer before you go / 走之前回答"]
    assert [row[2:] for row in inbox_rows(home)] == [(1, 1, 1)]  # answered, recorded, done: not given back


@pytest.mark.parametrize("backend", ["files", "postgres"])
def test_an_idle_worker_leaves_the_inbox_alone(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest, backend: str) -> None:
    backend_dsn(request, home, backend)
    port = free_port()
    workspace = configure(home, fake_telegram, fake_openai, **hook_settings(port))
    fake_openai.responder = echo
    looks: list[float] = []
    from picoclaw.storage.postgres.inbox import PostgresInbox

    inbox_class: Any = SqliteInbox if backend == "files" else PostgresInbox  # PostgreSQL: woken by LISTEN/NOTIFY
    claim = inbox_class.claim

    def counted(inbox: Any, worker: str, lease: float, limit: int) -> Any:
        looks.append(limit)
        return claim(inbox, worker, lease, limit)
    monkeypatch.setattr(inbox_class, "claim", counted)

    async def run(channel: TelegramChannel, webhook: Webhook) -> int:
        fake_telegram.deliver_to([port])
        fake_telegram.send_text(OWNER, OWNER, "then nothing more / 然后就没有了")
        await until(fake_telegram, replied(fake_telegram, OWNER))
        await inbox_done(webhook, 1)
        before = len(looks)
        await asyncio.sleep(2)  # idle: nothing is stored, no lease runs out
        return len(looks) - before
    # At most the look after the last turn ended; polling every half second made four.
    assert serve_webhook(workspace, fake_telegram, fake_openai, run) <= 1


@pytest.mark.parametrize("failing", ["the turn", "a memory read"])
def test_a_turn_that_cannot_reach_the_storage_sends_no_apology_and_is_answered_at_the_next_attempt(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, failing: str) -> None:
    port = free_port()
    workspace = configure(home, fake_telegram, fake_openai, **hook_settings(port))
    fake_openai.responder = echo
    down = StorageUnavailable("PostgreSQL at db.example:5432 cannot be reached: server closed the connection")
    failures = [down]
    if failing == "the turn":
        fail_turns(monkeypatch, failures)
    else:  # the agent answers "Sorry, I cannot reach my memory right now" itself
        local = MemoryStore.local

        def flaky_read(self: MemoryStore, path: Path) -> Path:  # every read of a memory document asks it
            if failures:
                raise failures.pop()
            return local(self, path)
        monkeypatch.setattr(MemoryStore, "local", flaky_read)

    async def run(channel: TelegramChannel, webhook: Webhook) -> None:
        fake_telegram.deliver_to([port])
        fake_telegram.send_text(OWNER, OWNER, "answer me once / 只回答一次")
        await until(fake_telegram, replied(fake_telegram, OWNER))
        await inbox_done(webhook, 1)
    serve_webhook(workspace, fake_telegram, fake_openai, run)
    assert fake_telegram.sent_texts(OWNER) == ["echo: answer me once / 只回答一次"]  # no apology before it
    assert APOLOGY not in fake_telegram.sent_texts() and not failures
    assert inbox_rows(home) == [(1, str(OWNER), 2, 1, 1)]  # given back, answered at the second attempt
    assert all(r.exc_info is None for r in caplog.records)


def test_a_voice_note_whose_turn_cannot_reach_the_storage_is_not_heard_twice(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    configure(home, fake_telegram, fake_openai, **hook_settings(port))
    with edit_config(home) as config:
        config["transcription"] = {"provider": "openai", "model": "whisper-1"}
        config["providers"]["openai"]["max_retries"] = 0
    workspace = App.open(home).workspace
    fake_openai.reply_transcript("remember my locker is 317 / 我的柜子是317号")
    failures = [StorageUnavailable("PostgreSQL at db.example:5432 cannot be reached: server closed the connection")]
    fail_turns(monkeypatch, failures)

    async def run(channel: TelegramChannel, webhook: Webhook) -> None:
        fake_telegram.deliver_to([port])
        fake_telegram.send_voice(OWNER, OWNER, b"OggS" + bytes(64))
        await until(fake_telegram, replied(fake_telegram, OWNER, 2))
        await inbox_done(webhook, 1)
    serve_webhook(workspace, fake_telegram, fake_openai, run)
    # The transcript went out before the turn: the update is answered here, not given back to be heard again.
    echo_line, answer = fake_telegram.sent_texts(OWNER)
    assert "🎤 remember my locker is 317" in echo_line and answer == APOLOGY
    assert len(fake_openai.transcription_requests()) == 1
    assert inbox_rows(home) == [(1, str(OWNER), 1, 1, 1)]


def test_a_turn_whose_lock_wait_ran_out_is_answered_in_one_line_and_healthz_is_503_until_a_turn_gets_storage(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    workspace = configure(home, fake_telegram, fake_openai, **hook_settings(port))
    fake_openai.responder = echo
    stuck = LockWaitExpired("waited 3 s for the memory lock (memory/.memory.lock): another picoclaw process holds it")
    failures = [stuck]
    local = MemoryStore.local

    def held_read(self: MemoryStore, path: Path) -> Path:  # the server answers, but the memory lock's holder is stuck
        if failures:
            raise failures.pop()
        return local(self, path)
    monkeypatch.setattr(MemoryStore, "local", held_read)

    async def health() -> tuple[int, str]:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/healthz") as response:
            return response.status, await response.text()

    async def run(channel: TelegramChannel, webhook: Webhook) -> list[tuple[int, str]]:
        fake_telegram.deliver_to([port])
        seen = [await health()]
        fake_telegram.send_text(OWNER, OWNER, "stuck / 卡住了")
        await until(fake_telegram, replied(fake_telegram, OWNER))
        await inbox_done(webhook, 1)
        seen.append(await health())
        fake_telegram.send_text(OWNER, OWNER, "again / 再来")
        await until(fake_telegram, replied(fake_telegram, OWNER, 2))
        await inbox_done(webhook, 2)
        seen.append(await health())
        return seen
    seen = serve_webhook(workspace, fake_telegram, fake_openai, run)
    # One line for the stuck turn, counted as answered (not given back to wait as long again); then as usual.
    assert fake_telegram.sent_texts(OWNER) == [MEMORY_BUSY, "echo: again / 再来"]
    assert inbox_rows(home) == [(1, str(OWNER), 1, 1, 1), (2, str(OWNER), 1, 1, 1)]
    assert seen == [(200, "ok w1\n"), (503, f"turns cannot get storage: {stuck}\n"), (200, "ok w1\n")]
    assert all(r.exc_info is None for r in caplog.records)


def answer_one(workspace: Workspace, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, port: int,
               text: str) -> None:
    """Serve a webhook worker on `port` until the owner's one message `text` is answered and finished."""
    async def run(channel: TelegramChannel, webhook: Webhook) -> None:
        fake_telegram.deliver_to([port])
        fake_telegram.send_text(OWNER, OWNER, text)
        await inbox_done(webhook, 1)
    serve_webhook(workspace, fake_telegram, fake_openai, run)


def test_a_reply_whose_record_fails_is_recorded_at_a_retry(home: Path, fake_telegram: FakeTelegramServer,
                                                           fake_openai: FakeOpenAIServer,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    workspace = configure(home, fake_telegram, fake_openai, **hook_settings(port))
    fake_openai.responder = echo
    failures = [StorageUnavailable("PostgreSQL at db.example:5432 cannot be reached: the database system is "
                                   "shutting down")]
    mark_replied = SqliteInbox.mark_replied

    def flaky(inbox: SqliteInbox, update_id: int) -> None:
        if failures:
            raise failures.pop()
        mark_replied(inbox, update_id)
    monkeypatch.setattr(SqliteInbox, "mark_replied", flaky)

    answer_one(workspace, fake_telegram, fake_openai, port, "record my answer / 记下回答")
    assert fake_telegram.sent_texts(OWNER) == ["echo: record my answer / 记下回答"] and not failures
    # Recorded: had this worker died before finishing, the worker taking over would not have answered again.
    assert inbox_rows(home) == [(1, str(OWNER), 1, 1, 1)]
    assert "reply sent but not recorded" not in caplog.text


def test_answered_updates_still_finishing_are_bounded_by_max_parallel(tmp_path: Path) -> None:
    """What answered updates have left (a preview deleted behind Telegram's back-off …) takes no room, but at most
    max_parallel of them wait at once: the worker claims nothing more until one ends."""
    events: list[str] = []

    async def run() -> None:
        inbox = SqliteInbox(tmp_path / "inbox.sqlite3", 123456)
        for update_id in (1, 2, 3):
            assert inbox.store(update_id, str(40 + update_id), json.dumps({"update_id": update_id}))
        finishing = {n: asyncio.Event() for n in (1, 2, 3)}

        async def feed(update: dict[str, Any]) -> None:
            n = update["update_id"]
            turn = webhook_module.inbox_turn.get()
            assert turn is not None
            events.append(f"fed {n}")
            await turn.replied()
            events.append(f"replied {n}")
            await finishing[n].wait()
        worker = webhook_module.InboxWorker(inbox, feed, worker="w1", lease=30, parallel=1,
                                            watch=StorageWatch(lambda: None))
        running = asyncio.create_task(worker.run())
        await wait_until(lambda: "replied 2" in events, what="update 2 answered while update 1 finishes")
        events.append("1 finishes")
        finishing[1].set()
        await wait_until(lambda: "replied 3" in events, what="update 3 answered")
        finishing[2].set()
        finishing[3].set()
        await worker.drain(30)
        await running
        inbox.close()
    asyncio.run(run())
    assert events == ["fed 1", "replied 1", "fed 2", "replied 2", "1 finishes", "fed 3", "replied 3"]


def test_max_parallel_bounds_the_model_calls_while_a_quarter_more_turns_are_held(tmp_path: Path) -> None:
    """Four slots for five turns: the fifth reads and builds while the four wait on the model, and takes the first
    slot let go; its model call never makes a fifth at once."""
    events: list[str] = []

    async def run() -> None:
        inbox = SqliteInbox(tmp_path / "inbox.sqlite3", 123456)
        for update_id in range(1, 7):
            assert inbox.store(update_id, str(40 + update_id), json.dumps({"update_id": update_id}))
        answered = {n: asyncio.Event() for n in range(1, 7)}

        async def feed(update: dict[str, Any]) -> None:
            n = update["update_id"]
            turn = webhook_module.inbox_turn.get()
            assert turn is not None
            events.append(f"fed {n}")
            async with turn.model_slot():  # what the agent holds around each model call
                events.append(f"slot {n}")
                await answered[n].wait()
            await turn.replied()
        worker = webhook_module.InboxWorker(inbox, feed, worker="w1", lease=30, parallel=4,
                                            watch=StorageWatch(lambda: None))
        assert worker.turns == turns_held(4) == 5
        running = asyncio.create_task(worker.run())
        await wait_until(lambda: "fed 5" in events, what="a fifth turn taken")
        # A free slot is taken without a pause: the fifth turn would be in one by now.
        assert sorted(e for e in events if e.startswith("slot")) == ["slot 1", "slot 2", "slot 3", "slot 4"]
        assert "fed 6" not in events
        answered[1].set()
        await wait_until(lambda: "slot 5" in events and "fed 6" in events, what="update 1's slot to update 5")
        assert "slot 6" not in events
        for n in range(2, 7):
            answered[n].set()
        await wait_until(lambda: inbox.counts()["done"] == 6, what="all answered")
        await worker.drain(30)
        await running
        inbox.close()
    asyncio.run(run())
    assert events.index("slot 5") > events.index("fed 5") and len(events) == 12


def test_a_worker_with_max_parallel_four_asks_the_model_four_at_a_time(home: Path, fake_telegram: FakeTelegramServer,
                                                                    fake_openai: FakeOpenAIServer) -> None:
    """Five chats at once: five turns run, four model calls; the fifth is asked once a slot is let go."""
    port = free_port()
    chats = [2000 + n for n in range(5)]
    workspace = configure(home, fake_telegram, fake_openai, allow_from=chats, **hook_settings(port, max_parallel=4))
    answering = threading.Event()
    fake_openai.responder = lambda body: Text(echo(body), until=answering)

    def typing_in(chat: int) -> int:
        return sum(int(c.params["chat_id"]) == chat for c in fake_telegram.calls("sendChatAction"))

    async def body(channel: TelegramChannel, webhook: Webhook) -> int:
        fake_telegram.deliver_to([port])
        for n, chat in enumerate(chats):
            fake_telegram.send_text(chat, chat, f"chat {n} / 第{n}个")
        # Every chat's turn has run a while ("typing…" shown and refreshed every 0.05 s): four calls wait.
        await until(fake_telegram, lambda: len(fake_openai.chat_requests()) >= 4
                    and all(typing_in(chat) >= 3 for chat in chats))
        asked = len(fake_openai.chat_requests())
        answering.set()
        await inbox_done(webhook, 5)
        return asked
    assert serve_webhook(workspace, fake_telegram, fake_openai, body) == 4
    assert [fake_telegram.sent_texts(chat) for chat in chats] == [[f"echo: chat {n} / 第{n}个"] for n in range(5)]


def test_a_reply_is_recorded_as_sent_before_it_is_noted_for_feedback(home: Path, fake_telegram: FakeTelegramServer,
                                                                    fake_openai: FakeOpenAIServer,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that dies between the two has answered: no other worker answers the update again."""
    port = free_port()
    workspace = configure(home, fake_telegram, fake_openai, **hook_settings(port))
    fake_openai.responder = echo
    seen: list[list[tuple[Any, ...]]] = []
    remember = SqliteReplyLog.remember

    def looking(log: SqliteReplyLog, chat: int, message_id: int, reply: SentReply) -> None:
        seen.append(inbox_rows(home, columns="update_id, replied_at is not null"))
        remember(log, chat, message_id, reply)
    monkeypatch.setattr(SqliteReplyLog, "remember", looking)

    answer_one(workspace, fake_telegram, fake_openai, port, "note my answer / 记下我的回答")
    assert fake_telegram.sent_texts(OWNER) == ["echo: note my answer / 记下我的回答"]
    assert seen == [[(1, 1)]]


@pytest.mark.slow
def test_a_worker_paused_past_its_lease_sends_nothing_for_an_update_another_took_over(tmp_path: Path) -> None:
    async def run() -> tuple[list[bool], list[str]]:
        inbox = SqliteInbox(tmp_path / "inbox.sqlite3", 123456)
        assert inbox.store(1, "42", '{"update_id": 1}')
        checks: list[bool] = []
        sent: list[str] = []

        ended = asyncio.Event()

        async def feed(update: dict[str, Any]) -> None:  # what the channel does around a reply
            turn = webhook_module.inbox_turn.get()
            assert turn is not None
            try:
                checks.append(await turn.still_ours())  # renewed on time: known without asking
                with sqlite3.connect(tmp_path / "inbox.sqlite3") as db:  # another worker takes the update over
                    db.execute("update telegram_inbox set worker = 'w2', lease_until = ? where update_id = 1",
                               (time.time() + 60,))
                time.sleep(2)  # and this one stalls past half its 3 s lease (a SIGSTOP, a stalled machine)
                checks.append(await turn.still_ours())
                if checks[-1]:
                    sent.append("the answer, a second time")
            finally:  # also when its renewal learnt it first and stopped the turn
                ended.set()
        worker = webhook_module.InboxWorker(inbox, feed, worker="w1", lease=3, parallel=1,
                                            watch=StorageWatch(lambda: None))
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(ended.wait(), 60)
        await worker.drain(30)
        await running
        inbox.close()
        return checks, sent
    checks, sent = asyncio.run(run())
    assert sent == [] and checks[0] is True  # its renewal may have learnt it first and stopped the turn


def test_an_update_whose_reply_went_out_leaves_its_room_to_another_chat_while_it_finishes(tmp_path: Path) -> None:
    """max_parallel counts the updates being answered: one whose reply went out, with only its bookkeeping left,
    makes room for another chat's update at once; its own chat's next update still waits for it to finish."""
    events: list[str] = []

    async def run() -> None:
        inbox = SqliteInbox(tmp_path / "inbox.sqlite3", 123456)
        for update_id, chat in ((1, "42"), (2, "42"), (3, "43")):
            assert inbox.store(update_id, chat, json.dumps({"update_id": update_id}))
        finishing = {1: asyncio.Event(), 3: asyncio.Event()}
        replying = asyncio.Event()

        async def feed(update: dict[str, Any]) -> None:
            n = update["update_id"]
            turn = webhook_module.inbox_turn.get()
            assert turn is not None
            events.append(f"fed {n}")
            if n == 3:
                await replying.wait()  # a turn under way: its room is taken until its reply goes out
            await turn.replied()
            events.append(f"replied {n}")
            if n in finishing:
                await finishing[n].wait()  # what a turn does after its reply (a preview deleted …)
        worker = webhook_module.InboxWorker(inbox, feed, worker="w1", lease=30, parallel=1,
                                            watch=StorageWatch(lambda: None))
        running = asyncio.create_task(worker.run())
        await wait_until(lambda: "fed 3" in events, what="update 3 taken while update 1 still finishes")
        finishing[1].set()
        await wait_until(lambda: inbox.counts()["done"] == 1, what="update 1 finished")
        replying.set()
        await wait_until(lambda: "replied 2" in events, what="update 2 answered")
        finishing[3].set()
        await worker.drain(30)
        await running
        inbox.close()
    asyncio.run(run())
    assert events == ["fed 1", "replied 1", "fed 3", "replied 3", "fed 2", "replied 2"]


@pytest.mark.slow
def test_an_update_finished_while_its_lease_is_renewed_is_not_reported_lost(tmp_path: Path,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    renewed = threading.Event()

    class SlowToReturn(SqliteInbox):
        """Its finish commits, then returns only once a renewal has run: the renewal no longer finds the update."""

        def finish(self, worker: str, update_id: int) -> None:
            super().finish(worker, update_id)
            renewed.clear()
            assert renewed.wait(60)

        def renew(self, worker: str, update_ids: Sequence[int], lease: float) -> set[int]:
            try:
                return super().renew(worker, update_ids, lease)
            finally:
                renewed.set()

    async def run() -> None:
        inbox = SlowToReturn(tmp_path / "inbox.sqlite3", 123456)
        assert inbox.store(1, "42", '{"update_id": 1}')
        fed = asyncio.Event()

        async def feed(update: dict[str, Any]) -> None:
            fed.set()
        worker = webhook_module.InboxWorker(inbox, feed, worker="w1", lease=3, parallel=1,
                                            watch=StorageWatch(lambda: None))
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(fed.wait(), 60)
        await wait_until(lambda: inbox.counts()["done"] == 1, what="the update finished")
        await worker.drain(30)
        await running
        inbox.close()
    asyncio.run(run())
    assert "lost the claim" not in caplog.text


def test_polling_takes_down_a_webhook_left_by_webhook_mode(home: Path, fake_telegram: FakeTelegramServer,
                                                           fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_telegram.webhook = {"url": URL}  # set by a webhook worker earlier: getUpdates gets 409 while it is
    fake_openai.responder = echo

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "polling again / 又轮询了")
        await until(fake_telegram, replied(fake_telegram, OWNER))
    serve(workspace, fake_telegram, fake_openai, body)
    assert fake_telegram.webhook is None and len(fake_telegram.calls("deleteWebhook")) == 1
    assert fake_telegram.sent_texts(OWNER) == ["echo: polling again / 又轮询了"]


# -- the command ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_one_worker_on_files_keeps_its_inbox_across_a_kill_and_a_second_is_refused(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer) -> None:
    port = free_port()
    configure(home, fake_telegram, fake_openai, **hook_settings(port, lease_seconds=3))  # one worker at a time
    fake_openai.responder = lambda body: echo(body) if "slow" not in echo(body) else _held(fake_openai, body)
    first = picoclaw_telegram(home, "--webhook", URL, "--listen", f"127.0.0.1:{port}", "--worker", "solo")
    try:
        fake_telegram.wait_until(lambda: fake_telegram.webhook is not None, timeout=180)
        second = finished(picoclaw_telegram(home, "--webhook", URL, "--listen", f"127.0.0.1:{free_port()}"))
        assert second[0] == 1 and second[2] == (
            f"picoclaw: error: another picoclaw already serves this bot (pid {first.pid}?) on this workspace; "
            "several workers need storage.backend: postgres (the files backend serves one)\n")
        fake_telegram.deliver_to([port])
        fake_telegram.send_text(OWNER, OWNER, "/status")
        fake_telegram.wait_until(lambda: len(fake_telegram.sent_texts(OWNER)) == 1, timeout=180)
        assert "worker: solo" in fake_telegram.sent_texts(OWNER)[0]
        # Three stored, the first held in the model: the worker dies with all three unanswered.
        for n in range(3):
            fake_telegram.send_text(OWNER, OWNER, f"slow 慢 {n}")
        fake_telegram.wait_until(lambda: fake_telegram.delivered() == 4 and len(fake_openai.chat_requests()) == 1,
                                 timeout=180)
        first.kill()
        first.wait(60)
    finally:
        first.kill()
    assert len(fake_telegram.sent_texts(OWNER)) == 1
    fake_openai.responder = echo
    again = picoclaw_telegram(home, "--webhook", URL, "--listen", f"127.0.0.1:{port}")
    try:
        fake_telegram.wait_until(lambda: len(fake_telegram.sent_texts(OWNER)) == 4, timeout=180)
        again.send_signal(signal.SIGTERM)
        code, _, err = finished(again)
        assert code == 0, err
    finally:
        again.kill()
    assert fake_telegram.sent_texts(OWNER)[1:] == [f"echo: slow 慢 {n}" for n in range(3)]
    assert [row[2:] for row in inbox_rows(home)] == [(1, 1, 1), (2, 1, 1), (1, 1, 1), (1, 1, 1)]


def _held(model: FakeOpenAIServer, body: dict[str, Any]) -> Any:
    return Text("never seen / 没人看见", delay=120)


def test_webhook_options_are_checked_before_anything_starts(home: Path, fake_telegram: FakeTelegramServer,
                                                            fake_openai: FakeOpenAIServer,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    configure(home, fake_telegram, fake_openai)
    assert main(["telegram", "--webhook", "http://bot.example.com/tg"]) == 2
    assert "channels.telegram.webhook.url" in capsys.readouterr().err
    assert main(["telegram", "--webhook", URL, "--listen", "8080"]) == 2
    assert "host:port" in capsys.readouterr().err
    assert fake_telegram.calls() == []
    assert WebhookConfig(url=URL).route() == "/tg" and WebhookConfig(url=URL, path="/hook").route() == "/hook"
