"""The Telegram channel when things go wrong around it: a proxy page quoting the token, a second poller of the
same bot, Telegram's 409 Conflict, a reply the user blocked. Real aiogram and openai clients against the fakes."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from picoclaw.app import App
from picoclaw.channels.telegram import TelegramChannel, make_bot, telegram_parts
from picoclaw.cli import main
from picoclaw.curation.session_summary import UNSEEN
from picoclaw.errors import PicoclawError
from picoclaw.memory.workspace import Workspace
from tests.agent_helpers import (
    SUMMARY_EN,
    is_flush_request,
    is_summary_request,
    make_provider,
    session_records,
    set_policy,
    turn_requests,
)
from tests.fakes import FakeOpenAIServer
from tests.fakes.telegram_server import FakeTelegramServer
from tests.test_telegram import OWNER, configure, echo, picoclaw_telegram, replied, serve, tree, until

# The shape of a real token: a public bot id, a colon, 35 secret characters.
TOKEN = "7234567890:AAHq3ZkT9vWxR2mYpL8nB4cJ6dF0gS1hKeU"
SECRET = TOKEN.split(":", 1)[1]
BLOCKED = "Forbidden: bot was blocked by the user"
CONFLICT = "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
# A reverse proxy's page for a timed-out upstream, quoting the request path: an 80-character excerpt cuts
# the token, 27 (English) or 31 (Chinese) of its 35 secret characters before the cut.
PAGES = {
    "english": ("<html><body><h1>502 Bad Gateway</h1>"
                "<p>Upstream timeout for /bot{token}/{method}</p><hr><center>nginx</center></body></html>"),
    "chinese": ("<html><head><title>502 网关错误</title></head><body><h1>502 网关错误</h1>"
                "<p>上游服务器响应超时，请求路径：/bot{token}/{method}</p><hr><center>nginx</center></body></html>"),
}


def leaked(text: str, run: int = 4) -> list[str]:
    """Every run of `run` characters of the token's secret half that appears in `text`."""
    return [SECRET[i:i + run] for i in range(len(SECRET) - run + 1) if SECRET[i:i + run] in text]


@pytest.fixture
def telegram() -> Any:
    """The fake Bot API knowing the long token (the shared fixture's token is a short test one)."""
    with FakeTelegramServer(token=TOKEN) as server:
        yield server


def finished(process: subprocess.Popen[str], timeout: float = 180) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of a process expected to end on its own (killed if it does not). The bound
    only stops a hang: importing aiogram alone took 20 s on a busy 2-core machine."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"the process did not end within {timeout} s; its log:\n{err[-3000:]}")
    return process.returncode, out, err


# -- a proxy's page that quotes the token -------------------------------------------------------------------


@pytest.mark.parametrize("language", PAGES)
def test_a_proxy_page_quoting_the_token_at_start_up_shows_none_of_it(home: Path, telegram: FakeTelegramServer,
                                                                      fake_openai: FakeOpenAIServer,
                                                                      capsys: pytest.CaptureFixture[str],
                                                                      language: str) -> None:
    configure(home, telegram, fake_openai, token=TOKEN)
    telegram.fail_next_with_page("getMe", 502, PAGES[language].format(token=TOKEN, method="getMe"))
    code = main(["telegram"])
    out, err = capsys.readouterr()
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith("picoclaw: error: cannot start the Telegram bot: ") and "/bot***/getMe" in err, err
    assert leaked(err + out) == [], err


@pytest.mark.parametrize("language", PAGES)
def test_a_proxy_page_quoting_the_token_when_sending_is_logged_and_stored_without_it(
        home: Path, telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer,
        caplog: pytest.LogCaptureFixture, language: str) -> None:
    workspace = configure(home, telegram, fake_openai, token=TOKEN)
    fake_openai.responder = echo
    telegram.fail_next_with_page("sendMessage", 502, PAGES[language].format(token=TOKEN, method="sendMessage"))

    async def body(channel: TelegramChannel) -> None:
        telegram.send_text(OWNER, OWNER, "hello / 你好")
        telegram.send_text(OWNER, OWNER, "again / 再来")  # answered once the first turn is done with
        await until(telegram, replied(telegram, OWNER))
    serve(workspace, telegram, fake_openai, body)

    logged = "\n".join(r.getMessage() for r in caplog.records) + caplog.text
    assert "could not send a reply: not a Bot API answer: 502" in logged and leaked(logged) == []
    stored = (workspace.root / "sessions" / "telegram%3A1001.jsonl").read_text(encoding="utf-8")
    assert "not a Bot API answer" in stored and leaked(stored) == []  # the reply is marked undelivered


# -- one poller per bot -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_poller_of_the_same_bot_is_refused_in_one_line(home: Path, telegram: FakeTelegramServer,
                                                                 fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, telegram, fake_openai, token=TOKEN)
    first = picoclaw_telegram(home)
    try:
        telegram.wait_until(lambda: bool(telegram.calls("getUpdates")), timeout=180)
        calls, before = len(telegram.calls()), tree(home)
        code, out, err = finished(picoclaw_telegram(home))
        assert code == 1 and err.count("\n") == 1, err
        assert err == (f"picoclaw: error: another picoclaw is already polling this bot (pid {first.pid}?) on this "
                       "workspace; stop it first: two would answer every message twice\n")
        # The second never spoke to Telegram (its first word would be getMe); the first polls on meanwhile.
        assert {c.method for c in telegram.calls()[calls:]} <= {"getUpdates"}
        assert tree(home) == before  # nothing written, the lock file's pid included
        # The first serves on, alone.
        fake_openai.reply_text("only once / 只答一次")
        telegram.send_text(OWNER, OWNER, "hello / 你好")
        telegram.wait_until(replied(telegram, OWNER), timeout=180)
        first.send_signal(signal.SIGTERM)
        assert finished(first)[0] == 0
    finally:
        first.kill()
    assert telegram.sent_texts(OWNER) == ["only once / 只答一次"] and len(fake_openai.chat_requests()) == 1

    # The lock is named by a hash of the token, never the token; once its holder is gone it is free.
    [lock] = [p for p in workspace.root.rglob(".telegram-*.lock")]
    assert len(lock.name) == len(".telegram-.lock") + 16 and leaked(lock.name) == [] and "7234567890" not in lock.name
    assert lock.read_text(encoding="utf-8").strip() == str(first.pid)
    with FileLock(str(lock)).acquire(blocking=False):
        pass


def test_two_workspaces_may_each_run_a_bot_of_their_own(home: Path, tmp_path: Path) -> None:
    # The lock is per token and workspace: another bot, or the same bot for another workspace, is not held up.
    from picoclaw.channels.telegram import polling_lock
    from picoclaw.layout import WorkspaceLayout

    one = WorkspaceLayout(home, tmp_path / "one", tmp_path / "one")
    two = WorkspaceLayout(home, tmp_path / "two", tmp_path / "two")
    with polling_lock(one.telegram_lock_path(TOKEN)), polling_lock(one.telegram_lock_path("1:other-bot-token")), \
            polling_lock(two.telegram_lock_path(TOKEN)):
        assert one.telegram_lock_path(TOKEN) != one.telegram_lock_path("1:other-bot-token")


@pytest.mark.slow
def test_telegrams_409_conflict_stops_polling_with_one_clear_line(home: Path, telegram: FakeTelegramServer,
                                                                  fake_openai: FakeOpenAIServer) -> None:
    configure(home, telegram, fake_openai, token=TOKEN)
    telegram.fail_next("getUpdates", 409, CONFLICT, times=1000)  # for as long as the other poller runs
    code, out, err = finished(picoclaw_telegram(home))
    lines = err.splitlines()
    assert code == 1 and lines[-1] == (
        f"picoclaw: error: {telegram.origin} answered 409 Conflict while polling: another program is polling this "
        "bot token, or a webhook is set for it; stop the other bot (or delete the webhook), then start again "
        f"(Telegram said: {CONFLICT})"), err
    # Said once, not an error every few seconds for ever: polling stopped at the first conflict.
    assert len(telegram.calls("getUpdates")) == 1
    assert "Failed to fetch updates" not in err and "ERROR" not in err and "Traceback" not in err, err
    assert leaked(err + out) == []


def test_a_409_for_a_webhook_ends_the_run_with_its_reason_and_no_error_logged(
        home: Path, telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer,
        caplog: pytest.LogCaptureFixture) -> None:
    workspace = configure(home, telegram, fake_openai, token=TOKEN)
    webhook = ("Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the "
               "webhook first")
    telegram.fail_next("getUpdates", 409, webhook, times=1000)  # a webhook set after the bot started

    async def run() -> None:
        settings = workspace.config.channels.telegram
        app = App(workspace.config, workspace.home, make_provider=lambda _config: make_provider(workspace, fake_openai))
        async with app:
            channel = TelegramChannel(settings, make_bot(settings, TOKEN), app.agent,
                                      replies=app.storage.telegram_replies)
            await asyncio.wait_for(channel.run(handle_signals=False, polling_timeout=1), timeout=120)
    with caplog.at_level(logging.DEBUG), pytest.raises(PicoclawError) as caught:
        asyncio.run(run())

    assert "answered 409 Conflict while polling" in str(caught.value) and webhook in str(caught.value)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert len(telegram.calls("getUpdates")) == 1


# -- a reply that never arrived -------------------------------------------------------------------------


NOT_DELIVERED = f"(not delivered: sending failed ({BLOCKED}); the user has not seen this reply)"


@pytest.mark.parametrize("answer", ["Your flight leaves at **9:40** from gate B12.",
                                    "你的航班 **9:40** 从 B12 登机口出发。"], ids=["english", "chinese"])
def test_a_reply_the_user_blocked_is_stored_as_not_delivered(home: Path, telegram: FakeTelegramServer,
                                                             fake_openai: FakeOpenAIServer, answer: str) -> None:
    workspace = configure(home, telegram, fake_openai, token=TOKEN)
    fake_openai.reply_text(answer)
    fake_openai.reply_text("Welcome back! / 欢迎回来！")
    fake_openai.reply_text("ok")
    telegram.fail_next("sendMessage", 403, BLOCKED)

    async def body(channel: TelegramChannel) -> None:
        telegram.send_text(OWNER, OWNER, "when is my flight? / 我的航班几点？")
        telegram.send_text(OWNER, OWNER, "hello again / 又见面了")  # after unblocking the bot
        await until(telegram, replied(telegram, OWNER))
        telegram.send_text(OWNER, OWNER, "thanks / 谢谢")
        await until(telegram, replied(telegram, OWNER, 2))
    serve(workspace, telegram, fake_openai, body)

    assert telegram.sent_texts(OWNER) == ["Welcome back! / 欢迎回来！", "ok"]
    records = session_records(workspace, f"telegram:{OWNER}")
    # The reply's line stays as it was written; a record of its own, right after it, marks it.
    [reply] = [r for r in records if r["type"] == "message" and r["message"].get("content") == answer]
    [mark] = [r for r in records if r["type"] == "undelivered"]
    assert mark["id"] == reply["id"]
    assert mark["reason"] == f"sending failed ({BLOCKED}); the user has not seen this reply"
    assert records.index(mark) == records.index(reply) + 1

    # The next turn shows the model that its reply was not read; the turn after sends that history again,
    # byte for byte (the providers' prompt caches match it).
    first, second, third = turn_requests(fake_openai)
    assert first["messages"][-1]["content"].endswith("when is my flight? / 我的航班几点？")
    assert second["messages"][-2] == {"role": "assistant", "content": f"{answer}\n\n{NOT_DELIVERED}"}
    assert third["messages"][:len(second["messages"])] == second["messages"]

    # Read back from the file by a fresh process, the same.
    again = Workspace.from_config(workspace.config, home, workspace.storage).sessions().load(f"telegram:{OWNER}")
    assert again.active_messages()[1] == {"role": "assistant", "content": f"{answer}\n\n{NOT_DELIVERED}"}


@pytest.mark.parametrize("language", ["english", "chinese"])
def test_a_summary_is_told_which_reply_the_user_never_saw(home: Path, telegram: FakeTelegramServer,
                                                          fake_openai: FakeOpenAIServer, language: str) -> None:
    workspace = configure(home, telegram, fake_openai, token=TOKEN)
    set_policy(workspace, session_summary_keep_count=1)
    fake_openai.responder = lambda body: (SUMMARY_EN if is_summary_request(body) else "NONE" if is_flush_request(body)
                                          else echo(body))
    first, second = ("book a table for two", "and a taxi") if language == "english" else ("订两人桌", "再叫辆出租车")
    telegram.fail_next("sendMessage", 403, BLOCKED)

    async def body(channel: TelegramChannel) -> None:
        telegram.send_text(OWNER, OWNER, first)
        telegram.send_text(OWNER, OWNER, second)
        await until(telegram, replied(telegram, OWNER))
        telegram.send_text(OWNER, OWNER, "/compact")
        await until(telegram, replied(telegram, OWNER, 2))
    serve(workspace, telegram, fake_openai, body)

    # Both are asked after the second turn's request (agent/cache_prefix.py), which sent the reply with its mark;
    # the summariser is told what the mark means.
    undelivered = {"role": "assistant", "content": f"echo: {first}\n\n{NOT_DELIVERED}"}
    [summary] = [b for b in fake_openai.chat_requests() if is_summary_request(b)]
    assert undelivered in summary["messages"] and UNSEEN in summary["messages"][-1]["content"]
    [flush] = [b for b in fake_openai.chat_requests() if is_flush_request(b)]
    assert undelivered in flush["messages"]  # nor does the memory flush take it as read


def test_a_reply_refused_in_part_says_how_much_arrived(home: Path, telegram: FakeTelegramServer,
                                                       fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, telegram, fake_openai, token=TOKEN)
    answer = "\n\n".join([f"Paragraph {n}: " + "word " * 400 for n in range(3)] + ["第四段：" + "字" * 2000])
    parts = len(telegram_parts(answer))
    fake_openai.reply_text(answer)
    fake_openai.reply_text("ok")
    telegram.fail_next("sendMessage", 403, BLOCKED, times=parts - 1, after=1)  # blocked after the first part

    async def body(channel: TelegramChannel) -> None:
        telegram.send_text(OWNER, OWNER, "a long answer please / 请详细回答")
        telegram.send_text(OWNER, OWNER, "still there?")  # answered after the first turn, mark and all
        await until(telegram, replied(telegram, OWNER, 2))
    serve(workspace, telegram, fake_openai, body)

    assert parts >= 2 and telegram.sent_texts(OWNER)[1] == "ok"
    [mark] = [r for r in session_records(workspace, f"telegram:{OWNER}") if r["type"] == "undelivered"]
    assert mark["reason"] == f"only 1 of {parts} parts reached the user; sending the rest failed ({BLOCKED})"
    history = fake_openai.chat_requests()[1]["messages"]
    assert history[-2] == {"role": "assistant", "content": f"{answer}\n\n(not delivered: {mark['reason']})"}
