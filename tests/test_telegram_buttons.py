"""Buttons on Telegram, through the fake Bot API and the fake model: Approve runs an ask-first call,
Deny and a timeout (the clock run out by the test, never waited for) do not, another user's press, a stale one and
forged callback_data change nothing; ask_user's options arrive as buttons and a press is the user's next message.
Polling here; webhook workers (the press an update in the inbox, taken by any worker) at the end."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from picoclaw.app import App
from picoclaw.channels.telegram import TelegramChannel, Webhook, make_bot, webhook_secret
from picoclaw.channels.telegram.buttons import NOT_VALID, NOT_YOURS, STALE
from picoclaw.memory.workspace import Workspace
from picoclaw.storage import ASK_NOT_YOURS, ASK_STALE, ASK_TAKEN
from tests.agent_helpers import make_provider
from tests.fakes import FakeOpenAIServer
from tests.fakes.telegram_server import FakeTelegramServer, free_port
from tests.homes import edit_config
from tests.test_telegram import FRIEND, OWNER, STRANGER, Sleeps, configure, replied, until
from tests.test_telegram_webhook import backend_dsn, hook_settings, inbox_rows

T = TypeVar("T")
TIMEOUT = 120


class Clock:
    """The approval's timeout, run out when the test says so (`run_out`): nothing waits for real seconds."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self._out = asyncio.Event()  # bound to the loop that first waits on it

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        await self._out.wait()

    def run_out(self) -> None:
        """Every wait from now on ends at once (the bot's loop: the test's body runs on it)."""
        self._out.set()


def set_up(home: Path, telegram: FakeTelegramServer, model: FakeOpenAIServer, **tools: Any) -> Workspace:
    workspace = configure(home, telegram, model, allow_from=[OWNER, FRIEND])
    with edit_config(home) as config:
        config["tools"]["exec"] = {"enabled": True}
        config["tools"]["approval"] = {"timeout_seconds": TIMEOUT}
        config["tools"].update(tools)
    return App.open(workspace.home).workspace


def serve(workspace: Workspace, telegram: FakeTelegramServer, model: FakeOpenAIServer,
          body: Callable[[TelegramChannel], Awaitable[T]], clock: Clock) -> T:
    """The bot, polling, until `body` returns; its approvals time out when `clock` runs out."""
    async def main() -> T:
        settings = workspace.config.channels.telegram
        bot = make_bot(settings, workspace.config.telegram_token())
        app = App(workspace.config, workspace.home, make_provider=lambda _config: make_provider(workspace, model))
        async with app:
            channel = TelegramChannel(settings, bot, app.agent, replies=app.storage.telegram_replies,
                                      typing_interval=0.05, typing_delay=0, sleep=Sleeps(), approval_timer=clock)
            running = asyncio.create_task(channel.run(handle_signals=False, polling_timeout=1))
            await until(telegram, lambda: bool(telegram.calls("getUpdates")))
            try:
                return await body(channel)
            finally:
                await channel.stop()
                await running
    return asyncio.run(main())


def buttons_shown(telegram: FakeTelegramServer, chat_id: int, count: int = 1) -> Callable[[], bool]:
    return lambda: len(telegram.with_buttons(chat_id)) >= count


def answered(telegram: FakeTelegramServer, count: int) -> Callable[[], bool]:
    return lambda: len(telegram.callback_answers()) >= count


def last_tool_result(model: FakeOpenAIServer) -> str:
    return str([m for m in model.chat_requests()[-1]["messages"] if m["role"] == "tool"][-1]["content"])


COMMANDS = [("clean up please", "touch ran", "ran"), ("请清理一下", "touch 已运行", "已运行")]


@pytest.mark.parametrize(("asked", "command", "made"), COMMANDS)
def test_approve_runs_the_call_and_the_buttons_give_way_to_the_outcome(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, asked: str, command: str,
        made: str) -> None:
    workspace = set_up(home, fake_telegram, fake_openai)
    fake_openai.reply_tool_calls([("exec", {"command": command})])
    fake_openai.reply_text("Done. / 好了。")
    clock = Clock()

    async def body(channel: TelegramChannel) -> int:
        fake_telegram.send_text(OWNER, OWNER, asked)
        await until(fake_telegram, buttons_shown(fake_telegram, OWNER))
        [question] = fake_telegram.with_buttons(OWNER)
        assert not (workspace.root / made).exists()  # nothing runs before the press
        fake_telegram.press_button(OWNER, OWNER, question, "✅ Approve")
        await until(fake_telegram, lambda: "Done. / 好了。" in fake_telegram.sent_texts(OWNER))
        return question
    question = serve(workspace, fake_telegram, fake_openai, body, clock)

    assert (workspace.root / made).exists()
    assert last_tool_result(fake_openai).startswith("exit code 0")
    [sent] = [c for c in fake_telegram.calls("sendMessage") if c.params.get("_message_id") == question]
    assert "<b>exec</b>" in sent.params["text"] and f"<code>{command}</code>" in sent.params["text"]
    assert fake_telegram.shown(OWNER, question) == f"✅ Approved: <b>exec</b> <code>{command}</code>"
    assert fake_telegram.keyboard(OWNER, question) == []
    assert [text for _, text in fake_telegram.callback_answers()] == ["Approved"]
    assert clock.asked == [TIMEOUT]


@pytest.mark.parametrize(("asked", "command", "made"), COMMANDS)
def test_deny_runs_nothing_and_the_model_reads_the_refusal(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, asked: str, command: str,
        made: str) -> None:
    workspace = set_up(home, fake_telegram, fake_openai)
    fake_openai.reply_tool_calls([("exec", {"command": command})])
    fake_openai.reply_text("OK, not run. / 好的，没有运行。")

    async def body(channel: TelegramChannel) -> int:
        fake_telegram.send_text(OWNER, OWNER, asked)
        await until(fake_telegram, buttons_shown(fake_telegram, OWNER))
        [question] = fake_telegram.with_buttons(OWNER)
        fake_telegram.press_button(OWNER, OWNER, question, "✖ Deny")
        await until(fake_telegram, lambda: "OK, not run. / 好的，没有运行。" in fake_telegram.sent_texts(OWNER))
        return question
    question = serve(workspace, fake_telegram, fake_openai, body, Clock())

    assert not (workspace.root / made).exists()
    assert last_tool_result(fake_openai).startswith("not run: the user pressed Deny on this exec call")
    assert fake_telegram.shown(OWNER, question) == f"✖ Denied, not run: <b>exec</b> <code>{command}</code>"
    assert fake_telegram.keyboard(OWNER, question) == []


@pytest.mark.parametrize(("asked", "command", "made"), COMMANDS)
def test_a_timeout_runs_nothing_and_a_press_after_it_is_stale(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, asked: str, command: str,
        made: str) -> None:
    workspace = set_up(home, fake_telegram, fake_openai)
    fake_openai.reply_tool_calls([("exec", {"command": command})])
    fake_openai.reply_text("No answer, so I did not run it. / 没有回答，所以没有运行。")
    clock = Clock()

    async def body(channel: TelegramChannel) -> int:
        fake_telegram.send_text(OWNER, OWNER, asked)
        await until(fake_telegram, buttons_shown(fake_telegram, OWNER))
        [question] = fake_telegram.with_buttons(OWNER)
        data = fake_telegram.keyboard(OWNER, question)[0][0][1]  # Approve's
        clock.run_out()
        await until(fake_telegram, replied(fake_telegram, OWNER, 2))
        fake_telegram.press(OWNER, OWNER, question, data)  # too late: the buttons' data, pressed after the end
        await until(fake_telegram, answered(fake_telegram, 1))
        await asyncio.sleep(0.2)  # a call wrongly run would have started by now
        return question
    question = serve(workspace, fake_telegram, fake_openai, body, clock)

    assert not (workspace.root / made).exists()
    assert last_tool_result(fake_openai) == (f"not run: the user gave no answer within {TIMEOUT} s to the request "
                                             "to run this exec call.")
    assert fake_telegram.shown(OWNER, question) == (f"⌛ No answer within {TIMEOUT} s, not run: <b>exec</b> "
                                                    f"<code>{command}</code>")
    assert [text for _, text in fake_telegram.callback_answers()] == [STALE]
    assert len(fake_openai.chat_requests()) == 2  # the stale press started nothing


@pytest.mark.parametrize(("asked", "command", "made"), COMMANDS)
def test_another_users_press_and_forged_data_change_nothing(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, asked: str, command: str,
        made: str) -> None:
    workspace = set_up(home, fake_telegram, fake_openai)
    fake_openai.reply_tool_calls([("exec", {"command": command})])
    fake_openai.reply_text("Done once. / 只运行了一次。")

    async def body(channel: TelegramChannel) -> int:
        fake_telegram.send_text(OWNER, OWNER, asked)
        await until(fake_telegram, buttons_shown(fake_telegram, OWNER))
        [question] = fake_telegram.with_buttons(OWNER)
        token = fake_telegram.keyboard(OWNER, question)[0][0][1].split(":")[1]
        fake_telegram.press_button(OWNER, FRIEND, question, "✅ Approve")  # allowed, but not the one asked
        fake_telegram.press_button(OWNER, STRANGER, question, "✅ Approve")
        fake_telegram.press(OWNER, OWNER, question, "ok:0123456789abcdef:1")  # a token no one was given
        fake_telegram.press(OWNER, OWNER, question, f"ok:{token}:maybe")  # not a yes or a no
        fake_telegram.press(OWNER, OWNER, question, "rm -rf /")  # none of ours
        await until(fake_telegram, answered(fake_telegram, 5))
        assert not (workspace.root / made).exists() and fake_telegram.keyboard(OWNER, question) != []
        fake_telegram.press_button(OWNER, OWNER, question, "✖ Deny")
        fake_telegram.press_button(OWNER, OWNER, question, "✅ Approve")  # a second press: stale
        await until(fake_telegram, answered(fake_telegram, 7))
        await until(fake_telegram, lambda: "Done once. / 只运行了一次。" in fake_telegram.sent_texts(OWNER))
        return question
    serve(workspace, fake_telegram, fake_openai, body, Clock())

    assert not (workspace.root / made).exists()  # the owner's Deny was the one that counted
    assert [text for _, text in fake_telegram.callback_answers()] == [
        NOT_YOURS, NOT_YOURS, STALE, NOT_VALID, NOT_VALID, "Denied", STALE]
    assert len(fake_openai.chat_requests()) == 2


def test_the_question_goes_into_the_topic_of_the_turn(home: Path, fake_telegram: FakeTelegramServer,
                                                      fake_openai: FakeOpenAIServer) -> None:
    workspace = set_up(home, fake_telegram, fake_openai)
    fake_openai.reply_tool_calls([("exec", {"command": "touch 话题"})])
    fake_openai.reply_text("Done in topic 7.")
    group = -100777

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(group, OWNER, "@picoclaw_test_bot run it / 运行", topic=7)
        await until(fake_telegram, buttons_shown(fake_telegram, group))
        [question] = fake_telegram.with_buttons(group)
        fake_telegram.press_button(group, OWNER, question, "✅ Approve")
        await until(fake_telegram, lambda: "Done in topic 7." in fake_telegram.sent_texts(group))
    serve(workspace, fake_telegram, fake_openai, body, Clock())

    assert [topic for topic, _ in fake_telegram.sent_in(group)] == [7, 7]
    assert (workspace.root / "话题").exists()


# -- ask_user --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("question", "options", "picked"), [
    ("Which city?", ["Paris", "Rome", "Tokyo"], "Rome"),
    ("去哪个城市？", ["北京", "上海", "广州"], "上海"),
])
def test_ask_users_options_are_buttons_and_a_press_is_the_users_next_message(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, question: str,
        options: list[str], picked: str) -> None:
    workspace = set_up(home, fake_telegram, fake_openai, ask_user=True)
    fake_openai.reply_tool_calls([("ask_user", {"question": question, "options": options})])
    fake_openai.reply_text("👆")
    fake_openai.reply_text(f"{picked}: good choice. / 好选择。")

    async def body(channel: TelegramChannel) -> int:
        fake_telegram.send_text(OWNER, OWNER, "plan a trip / 计划旅行")
        await until(fake_telegram, buttons_shown(fake_telegram, OWNER))
        [asked] = fake_telegram.with_buttons(OWNER)
        assert [text for row in fake_telegram.keyboard(OWNER, asked) for text, _ in row] == options
        fake_telegram.press_button(OWNER, FRIEND, asked, picked)  # not the user asked: nothing
        await until(fake_telegram, answered(fake_telegram, 1))
        data = [d for row in fake_telegram.keyboard(OWNER, asked) for t, d in row if t == picked][0]
        fake_telegram.press(OWNER, OWNER, asked, data)
        await until(fake_telegram, lambda: f"{picked}: good choice. / 好选择。" in fake_telegram.sent_texts(OWNER))
        fake_telegram.press(OWNER, OWNER, asked, data)  # pressed again: the buttons are gone, nothing happens
        await until(fake_telegram, answered(fake_telegram, 3))
        await asyncio.sleep(0.2)
        return asked
    asked = serve(workspace, fake_telegram, fake_openai, body, Clock())

    assert fake_telegram.sent_texts(OWNER)[0] == question
    assert fake_telegram.shown(OWNER, asked) == f"{question}\n→ {picked}"
    assert fake_telegram.keyboard(OWNER, asked) == []
    answers = [text for _, text in fake_telegram.callback_answers()]
    assert answers[0] == NOT_YOURS and answers[1] is None and answers[2] in (STALE, NOT_VALID)
    requests = fake_openai.chat_requests()
    assert len(requests) == 3
    last_user = [m for m in requests[-1]["messages"] if m["role"] == "user"][-1]
    assert str(last_user["content"]).endswith(picked)


# -- webhook workers ----------------------------------------------------------------------------------


def serve_workers(workspace: Workspace, telegram: FakeTelegramServer, model: FakeOpenAIServer, ports: list[int],
                  body: Callable[[], Awaitable[T]], clock: Clock) -> T:
    """Webhook workers on `ports` in this process (each its own App, as separate processes would have), the fake
    Bot API delivering round-robin, until `body` returns."""
    async def main() -> T:
        settings = workspace.config.channels.telegram
        running, channels = [], []
        for number, port in enumerate(ports, 1):
            app = App(workspace.config, workspace.home, make_provider=lambda _config: make_provider(workspace, model))
            await app.__aenter__()
            hook = settings.webhook.model_copy(update={"listen": f"127.0.0.1:{port}"})
            bot = make_bot(settings, workspace.config.telegram_token())
            channel = TelegramChannel(settings, bot, app.agent, replies=app.storage.telegram_replies,
                                      typing_interval=0.05, typing_delay=0, sleep=Sleeps(), approval_timer=clock)
            webhook = Webhook(hook, app.storage, worker=f"w{number}", secret_token=webhook_secret(bot.token))
            running.append((app, asyncio.create_task(channel.run(handle_signals=False, webhook=webhook))))
            channels.append(channel)
            await until(telegram, lambda: len(telegram.calls("setWebhook")) >= number)
        telegram.deliver_to(ports)
        try:
            return await body()
        finally:
            for channel in channels:
                await channel.stop()
            for app, task in running:
                await task
                await app.__aexit__(None, None, None)
                app.close()
    return asyncio.run(main())


@pytest.mark.parametrize("backend", ["files", "postgres"])
@pytest.mark.parametrize(("asked", "command", "made"), COMMANDS)
def test_with_webhook_workers_a_press_reaches_the_waiting_turn_whichever_worker_takes_it(
        request: pytest.FixtureRequest, home: Path, fake_telegram: FakeTelegramServer,
        fake_openai: FakeOpenAIServer, backend: str, asked: str, command: str, made: str) -> None:
    dsn = backend_dsn(request, home, backend)
    # One turn at a time per worker: the turn waiting for the press takes no place meanwhile, so the press is
    # claimed even by its own worker (on files, the only one).
    ports = [free_port()] + ([free_port()] if backend == "postgres" else [])
    workspace = set_up(home, fake_telegram, fake_openai, **{})
    with edit_config(home) as config:
        config["channels"]["telegram"].update(hook_settings(ports[0], max_parallel=1))
    workspace = App.open(home).workspace
    fake_openai.reply_tool_calls([("exec", {"command": command})])
    fake_openai.reply_text("Done. / 好了。")

    async def body() -> None:
        fake_telegram.send_text(OWNER, OWNER, asked)
        await until(fake_telegram, buttons_shown(fake_telegram, OWNER))
        [question] = fake_telegram.with_buttons(OWNER)
        fake_telegram.press_button(OWNER, FRIEND, question, "✅ Approve")  # not the one asked
        await until(fake_telegram, answered(fake_telegram, 1))
        fake_telegram.press_button(OWNER, OWNER, question, "✅ Approve")
        await until(fake_telegram, lambda: "Done. / 好了。" in fake_telegram.sent_texts(OWNER))
    serve_workers(workspace, fake_telegram, fake_openai, ports, body, Clock())

    assert (workspace.root / made).exists()
    assert [text for _, text in fake_telegram.callback_answers()] == [NOT_YOURS, "Approved"]
    rows = inbox_rows(home, dsn, "chat, done_at is not null")
    assert rows == [(str(OWNER), True), (f"press:{OWNER}", True), (f"press:{OWNER}", True)]  # not behind the turn


@pytest.mark.parametrize("backend", ["files", "postgres"])
def test_the_inboxs_questions_take_one_answer_from_the_user_asked(request: pytest.FixtureRequest, home: Path,
                                                                   backend: str) -> None:
    backend_dsn(request, home, backend)
    app = App.open(home)
    try:
        inbox = app.storage.telegram_inbox(4242)
        inbox.open_ask("问题1", OWNER)
        assert inbox.ask_answer("问题1") is None
        assert inbox.answer_ask("问题1", FRIEND, "yes") == ASK_NOT_YOURS
        assert inbox.answer_ask("unknown", OWNER, "yes") == ASK_STALE
        assert inbox.answer_ask("问题1", OWNER, "no") == ASK_TAKEN
        assert inbox.answer_ask("问题1", OWNER, "yes") == ASK_STALE
        assert inbox.ask_answer("问题1") == "no" and inbox.close_ask("问题1") == "no"
        inbox.open_ask("q2", OWNER)
        assert inbox.close_ask("q2") is None
        assert inbox.answer_ask("q2", OWNER, "yes") == ASK_STALE
        assert app.storage.telegram_inbox(9999).ask_answer("问题1") is None  # another bot's questions are its own
        inbox.close()
    finally:
        app.close()
