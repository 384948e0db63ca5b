"""The Channel contract (picoclaw/channels/base.py), kept alike by the terminal and by Telegram.

One suite runs on both channels: a person's message becomes one turn of their session, `deliver` puts a
text in front of the person of a session, and `stop()` makes `run()` return. Telegram runs against the fake
Bot API, the terminal on lines the test types; the model is the fake OpenAI server throughout. Then
`run_turn` alone: one message is one `AgentLoop.handle` call, shown through the channel's hooks.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from picoclaw.agent.loop import AgentLoop
from picoclaw.app import App
from picoclaw.channels import Channel, Inbound, ReplChannel, TurnHooks, run_turn
from picoclaw.channels.repl import SCHEDULED_MARK
from picoclaw.channels.telegram import TelegramChannel, make_bot
from picoclaw.memory.workspace import Workspace
from tests.agent_helpers import contents, make_provider, said, session_records, with_agent
from tests.fakes import FakeOpenAIServer
from tests.fakes.telegram_server import FakeTelegramServer
from tests.test_telegram import OWNER, configure
from tests.waiting import wait_until

DELIVERED = ["drink water at 3 pm", "下午三点喝水", "记得给妈妈打电话 / call mom"]


class TypedLines:
    """The terminal's lines, typed by the test; a read waits for the next one (the input never ends)."""

    def __init__(self) -> None:
        self.typed: asyncio.Queue[str] = asyncio.Queue()
        self.waiting = False

    async def read(self, prompt: str) -> str:
        self.waiting = True
        try:
            return await self.typed.get()
        finally:
            self.waiting = False


@dataclass
class Served:
    """A channel while its `run()` serves: what a person says to it, and what they see of it."""

    channel: Channel
    session_key: str  # the conversation of the person the test plays
    say: Callable[[str], None]
    answers: Callable[[], list[str]]  # the answers the person saw, in order
    delivered: Callable[[], list[str]]  # the delivered texts they saw, as the channel shows them


@asynccontextmanager
async def terminal(app: App) -> AsyncIterator[Served]:
    lines, out = TypedLines(), io.StringIO()
    channel = ReplChannel(app.agent(), "测试", out=out, err=io.StringIO(), lines=lines)
    running = asyncio.create_task(channel.run())
    await wait_until(lambda: lines.waiting, what="the terminal to wait for a line")

    def shown() -> list[str]:
        return out.getvalue().splitlines()
    yield Served(channel, "cli:测试", lines.typed.put_nowait,
                 lambda: [line for line in shown() if not line.startswith(SCHEDULED_MARK)],
                 lambda: [line.removeprefix(SCHEDULED_MARK) for line in shown() if line.startswith(SCHEDULED_MARK)])
    await channel.stop()
    assert await asyncio.wait_for(running, 60) == 0  # the bound only stops a hang: stop() must end run()


@asynccontextmanager
async def telegram(app: App, server: FakeTelegramServer) -> AsyncIterator[Served]:
    settings = app.config.channels.telegram
    channel = TelegramChannel(settings, make_bot(settings, app.config.telegram_token()), app.agent,
                              replies=app.storage.telegram_replies,
                              typing_interval=0.05, typing_delay=0)
    running = asyncio.create_task(channel.run(handle_signals=False, polling_timeout=1))
    await asyncio.to_thread(server.wait_until, lambda: bool(server.calls("getUpdates")))

    def say(text: str) -> None:
        server.send_text(OWNER, OWNER, text)

    def seen() -> list[str]:  # answers and delivered texts alike: messages in the chat
        return server.sent_texts(OWNER)
    yield Served(channel, f"telegram:{OWNER}", say, seen, seen)
    await channel.stop()
    assert await asyncio.wait_for(running, 60) is None  # likewise


Body = Callable[[Served], Awaitable[None]]


@pytest.fixture(params=["terminal", "telegram"])
def serve(request: pytest.FixtureRequest, home: Path, fake_openai: FakeOpenAIServer,
          fake_telegram: FakeTelegramServer) -> Callable[[Body], None]:
    """Run a test body against the channel of the parameter while it serves."""
    workspace = configure(home, fake_telegram, fake_openai)

    def run(body: Body) -> None:
        async def main() -> None:
            app = App(workspace.config, workspace.home,
                      make_provider=lambda _config: make_provider(workspace, fake_openai))
            async with app:
                opened = terminal(app) if request.param == "terminal" else telegram(app, fake_telegram)
                async with opened as served:
                    await body(served)
        asyncio.run(main())
    return run


def test_a_message_becomes_one_turn_of_the_persons_session(serve: Callable[[Body], None],
                                                           home: Path, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_text("你好！Hello.")
    key: list[str] = []

    async def body(served: Served) -> None:
        key.append(served.session_key)
        served.say("你好 hello")
        await wait_until(lambda: served.answers() == ["你好！Hello."], timeout=30, what="the answer")
    serve(body)

    [request] = fake_openai.chat_requests()
    assert said(request["messages"][-1]) == "你好 hello"
    workspace = App.open(home).workspace
    assert contents([r["message"] for r in session_records(workspace, key[0])]) == ["你好 hello", "你好！Hello."]


def test_deliver_puts_the_text_before_the_person_and_stop_ends_run(
        serve: Callable[[Body], None], fake_openai: FakeOpenAIServer) -> None:
    async def body(served: Served) -> None:
        for text in DELIVERED:
            await served.channel.deliver(served.session_key, text)
        assert served.delivered() == DELIVERED
    serve(body)  # leaving it stops the channel, and checks that run() returned
    assert fake_openai.chat_requests() == []  # delivering is no turn: the model is not asked


# -- run_turn ---------------------------------------------------------------------------------------------


def test_a_message_is_one_handle_call_shown_through_the_hooks(workspace: Workspace,
                                                             fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_tool_calls([("memory_append", {"content": "Tea: 龙井 / Longjing"})])
    fake_openai.reply_text("记住了。Noted.")
    fake_openai.reply_text("Whole, not streamed. 整段回答。")
    texts: list[str] = []
    tools: list[tuple[str, str]] = []

    async def on_text(delta: str) -> None:
        texts.append(delta)

    async def on_tool(name: str, arguments: str) -> None:
        tools.append((name, arguments))

    async def body(agent: AgentLoop) -> tuple[str, str]:
        streamed = await run_turn(agent, Inbound("terminal", "cli:hooks", "remember my tea: 龙井"),
                                  TurnHooks(on_text=on_text, on_tool=on_tool))
        quiet = await run_turn(agent, Inbound("1001", "telegram:1001", "and now? 现在呢？", reply_to=7))
        return streamed.text, quiet.text
    assert with_agent(workspace, fake_openai, body) == ("记住了。Noted.", "Whole, not streamed. 整段回答。")

    assert "".join(texts) == "记住了。Noted."
    assert [(name, json.loads(arguments)) for name, arguments in tools] == [
        ("memory_append", {"content": "Tea: 龙井 / Longjing"})]
    first, second, third = fake_openai.chat_requests()
    assert first.get("stream") is True and second.get("stream") is True
    assert not third.get("stream")  # no on_text: the answer comes whole
    assert said(third["messages"][-1]) == "and now? 现在呢？"
    assert contents([r["message"] for r in session_records(workspace, "telegram:1001")]) == [
        "and now? 现在呢？", "Whole, not streamed. 整段回答。"]
