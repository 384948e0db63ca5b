"""Webhook mode on one worker (the files backend): what is refused at the door, what is stored once, what the
inbox keeps across a restart, and the one line that refuses a second worker. Real aiogram and aiohttp against
the fake Bot API, which POSTs updates to the worker as Telegram does."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest

from picoclaw.app import App
from picoclaw.channels.telegram import TelegramChannel, Webhook, make_bot, webhook_secret
from picoclaw.cli import main
from picoclaw.config import WebhookConfig
from picoclaw.memory.workspace import Workspace
from tests.agent_helpers import make_provider
from tests.fakes import FakeOpenAIServer, Text
from tests.fakes.telegram_server import TOKEN, FakeTelegramServer, free_port
from tests.test_telegram import OWNER, configure, echo, picoclaw_telegram, replied, serve, until
from tests.test_telegram_reliability import finished

T = TypeVar("T")
URL = "https://bot.example.com/tg"
INBOX = Path(".picoclaw-work") / "telegram-inbox.sqlite3"
# Seconds: a killed worker's updates are taken over this soon. Renewed every third of it, so a busy machine's
# stall of a few seconds does not lose a live worker's claims.
LEASE = 10


def hook_settings(port: int, **settings: Any) -> dict[str, Any]:
    return {"webhook": {"url": URL, "listen": f"127.0.0.1:{port}", "lease_seconds": LEASE, **settings}}


def serve_webhook(workspace: Workspace, telegram: FakeTelegramServer, model: FakeOpenAIServer,
                  body: Callable[[TelegramChannel, Webhook], Awaitable[T]]) -> T:
    """Run one webhook worker in this process until `body` returns, then stop it as SIGTERM does."""
    async def run() -> T:
        settings = workspace.config.channels.telegram
        bot = make_bot(settings, workspace.config.telegram_token())
        app = App(workspace.config, workspace.home, make_provider=lambda _config: make_provider(workspace, model))
        async with app:
            channel = TelegramChannel(settings, bot, app.agent, typing_interval=0.05)
            webhook = Webhook(settings.webhook, app.storage, worker="w1", secret_token=webhook_secret(bot.token))
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


def inbox_rows(home: Path) -> list[tuple[Any, ...]]:
    path = home / "workspace" / INBOX
    if not path.exists():
        return []
    with sqlite3.connect(path) as conn:
        return conn.execute("select update_id, chat, attempts, replied_at is not null, done_at is not null "
                            "from telegram_inbox order by update_id").fetchall()


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
    assert call.params["allowed_updates"] == ["message"]  # what the routers handle, nothing more
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
