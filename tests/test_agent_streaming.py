"""Streaming through a real AgentLoop turn: `handle(on_text=…, on_tool=…)` against the fake server's SSE.

Text reaches `on_text` in pieces as the server writes it; each tool call reaches `on_tool` before it runs;
a tool call the model wrote as text is held back (streaming.py) and never shown, while plain prose flows at once.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from picoclaw.agent.loop import AgentLoop
from picoclaw.memory.workspace import Workspace
from tests.agent_helpers import SESSION, frozen, history, records_of, session_path, set_policy, with_agent
from tests.fakes import FakeOpenAIServer, Text, ToolCalls
from tests.waiting import wait_until

Event = tuple[str, Any]


class Sinks:
    """`on_text` and `on_tool` for one turn, recording what they got in order."""

    def __init__(self, workspace: Workspace | None = None, watch: str | None = None) -> None:
        self.events: list[Event] = []
        self.workspace = workspace
        self.watch = watch  # a fact whose presence in MEMORY.md each on_tool call notes

    async def on_text(self, piece: str) -> None:
        self.events.append(("text", piece))

    async def on_tool(self, name: str, arguments: str) -> None:
        saved = None
        if self.workspace is not None and self.watch is not None:
            saved = self.watch in self.workspace.store.read_long_term()
        self.events.append(("tool", (name, json.loads(arguments), saved)))

    @property
    def pieces(self) -> list[str]:
        return [piece for kind, piece in self.events if kind == "text"]

    @property
    def tools(self) -> list[Any]:
        return [call for kind, call in self.events if kind == "tool"]


def streamed_turn(workspace: Workspace, server: FakeOpenAIServer, text: str, sinks: Sinks) -> str:
    async def body(loop: AgentLoop) -> str:
        reply = await loop.handle(SESSION, text, on_text=sinks.on_text, on_tool=sinks.on_tool)
        assert reply.error is None, reply
        return reply.text

    with frozen():
        return with_agent(workspace, server, body)


ANSWERS = {
    "en": "Your dog is called Bob; he is a corgi and he likes long walks on the beach.",
    "zh": "你的狗叫 Bob，是一只柯基，它喜欢在海边散步。明天记得带它去公园。",
}


@pytest.mark.parametrize("language", ANSWERS)
def test_text_arrives_in_pieces_that_join_to_the_reply(workspace: Workspace, fake_openai: FakeOpenAIServer,
                                                       language: str) -> None:
    fake_openai.reply_text(ANSWERS[language])
    sinks = Sinks()

    reply = streamed_turn(workspace, fake_openai, "我的狗叫什么？ / what is my dog called?", sinks)

    assert reply == ANSWERS[language]
    assert len(sinks.pieces) > 3 and "".join(sinks.pieces) == ANSWERS[language]
    assert sinks.tools == []
    [request] = fake_openai.chat_requests()
    assert request["stream"] is True and request["stream_options"] == {"include_usage": True}
    assert records_of(workspace, "message")[-1]["message"] == {"role": "assistant", "content": ANSWERS[language]}


def test_each_tool_call_is_reported_before_it_runs_and_the_final_answer_streams(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    set_policy(workspace, learning_enabled=False)  # the last request must be the turn's, not a lesson review
    fact = "Tea: 龙井 (Longjing), no sugar / 不加糖"
    fake_openai.enqueue(ToolCalls([("memory_append", {"content": fact}), ("memory_search", {"query": "龙井"})]))
    fake_openai.enqueue(ToolCalls([("list_dir", {"path": "memory"})]))
    fake_openai.reply_text("已记下：龙井，不加糖。Saved: Longjing, no sugar.")
    sinks = Sinks(workspace, watch=fact)

    reply = streamed_turn(workspace, fake_openai, "记住我的茶：龙井，不加糖", sinks)

    assert reply == "已记下：龙井，不加糖。Saved: Longjing, no sugar."
    # One on_tool per call, in order; the fact was not in MEMORY.md when memory_append was announced, and
    # was by the time the next call was: each is announced before it runs, not after.
    assert sinks.tools == [("memory_append", {"content": fact}, False), ("memory_search", {"query": "龙井"}, True),
                           ("list_dir", {"path": "memory"}, True)]
    kinds = [kind for kind, _ in sinks.events]
    assert kinds[:3] == ["tool"] * 3 and set(kinds[3:]) == {"text"} and len(kinds) > 4
    assert "".join(sinks.pieces) == reply
    assert fact in workspace.store.read_long_term()
    assert [m["role"] for m in history(fake_openai.chat_requests()[-1])][-2:] == ["assistant", "tool"]


CALLS_AS_TEXT = {
    "fenced": "```json\n" + json.dumps({"name": "memory_append", "arguments": {"content": "我的狗叫 Bob"}},
                                       ensure_ascii=False, indent=2) + "\n```",
    "tool_call tag": '<tool_call>\n{"name": "memory_append", "arguments": {"content": "我的狗叫 Bob"}}\n</tool_call>',
    "bare object": '{"name": "memory_append", "arguments": {"content": "我的狗叫 Bob"}}',
    "functions.": 'functions.memory_append: {"content": "我的狗叫 Bob"}',
    "fenced, invented answer after": ("```json\n" + json.dumps({"name": "memory_append", "arguments": {
        "content": "我的狗叫 Bob"}}, ensure_ascii=False) + "\n```\n\nThe assistant has stored it. 已保存。"),
}


@pytest.mark.parametrize("form", CALLS_AS_TEXT)
def test_a_call_written_as_text_is_not_streamed(workspace: Workspace, fake_openai: FakeOpenAIServer,
                                                form: str) -> None:
    fake_openai.reply_text(CALLS_AS_TEXT[form])
    fake_openai.reply_text("记住了：你的狗叫 Bob。Noted.")
    sinks = Sinks(workspace, watch="我的狗叫 Bob")

    reply = streamed_turn(workspace, fake_openai, "记住：我的狗叫 Bob", sinks)

    assert reply == "记住了：你的狗叫 Bob。Noted."
    assert "".join(sinks.pieces) == reply  # nothing of the call's text reached the screen
    assert sinks.tools == [("memory_append", {"content": "我的狗叫 Bob"}, False)]
    assert [kind for kind, _ in sinks.events][0] == "tool"
    assert "我的狗叫 Bob" in workspace.store.read_long_term()


@pytest.mark.parametrize("language", ["en", "zh"])
def test_prose_streams_at_once_while_the_reply_is_still_being_written(
        workspace: Workspace, fake_openai: FakeOpenAIServer, language: str) -> None:
    """The server sends the first piece, then stalls: the piece must be on screen during the stall.

    The stall is long (the turn would take minutes); the test cancels the turn once it has seen the
    piece, which also shows that a cancelled turn stores nothing.
    """
    answer = ANSWERS[language]
    fake_openai.enqueue(Text(answer, chunk_delay=60))
    sinks = Sinks()

    async def body(loop: AgentLoop) -> tuple[list[str], bool]:
        turn = asyncio.ensure_future(loop.handle(SESSION, "tell me about my dog / 说说我的狗", on_text=sinks.on_text))
        await wait_until(lambda: sinks.pieces, timeout=10, what="the first streamed piece")
        seen, finished = list(sinks.pieces), turn.done()
        turn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await turn
        return seen, finished

    with frozen():
        seen, finished = with_agent(workspace, fake_openai, body)

    assert not finished
    assert seen == [answer[:3]]  # the fake's first piece, passed on as it came
    assert len(fake_openai.chat_requests()) == 1
    assert not session_path(workspace).exists()  # the cancelled turn left nothing behind
