"""Cutting a history without breaking it: the tool-pair rule in summaries, in forceCompression and in the
history sent to the model. The fake server rejects an orphaned tool result like the real API does."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from picoclaw.agent.history import keep_last, safe_start, turns
from picoclaw.agent.loop import TRIMMED_NOTICE, AgentLoop
from picoclaw.app import App
from picoclaw.memory.workspace import Workspace
from picoclaw.providers.base import ProviderError
from tests.agent_helpers import (
    SESSION,
    SUMMARY_EN,
    chat,
    contents,
    history,
    is_summary_request,
    make_provider,
    records_of,
    reopen,
    session_path,
    set_policy,
    turn_requests,
    with_agent,
)
from tests.fakes import FakeOpenAIServer, Text

CONTEXT_TOO_LONG = ("This model's maximum context length is 128000 tokens. However, your messages resulted in "
                    "131072 tokens. Please reduce the length of the messages.")

U: dict[str, Any] = {"role": "user", "content": "u"}
A: dict[str, Any] = {"role": "assistant", "content": "a"}
CALL: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}
TOOL: dict[str, Any] = {"role": "tool", "tool_call_id": "c1", "content": "r"}


@pytest.mark.parametrize(("messages", "start", "expected"), [
    ([U, CALL, TOOL, TOOL, A], 2, 4),
    ([U, CALL, TOOL, A], 1, 1),
    ([TOOL, TOOL], 0, 2),
    ([U, A], 5, 2),
    ([U, A], -3, 0),
])
def test_safe_start_moves_past_orphaned_tool_results(messages: list[dict[str, Any]], start: int, expected: int) -> None:
    assert safe_start(messages, start) == expected


def test_keep_last_and_turns() -> None:
    messages = [U, CALL, TOOL, TOOL, A, U, A]
    assert keep_last(messages, 4) == 4  # would start at the second TOOL
    assert keep_last(messages, 0) == len(messages)
    assert keep_last(messages, 100) == 0
    assert turns(messages) == [(0, 5), (5, 7)]
    assert turns([TOOL, A, U, A]) == [(0, 2), (2, 4)]


def two_turns_with_tools(workspace: Workspace, server: FakeOpenAIServer) -> None:
    """Session = [user, assistant(2 calls), tool, tool, assistant, user, assistant]: its middle is a tool result."""
    server.reply_tool_calls([("list_dir", {"path": "."}), ("memory_search", {"query": "咖啡"})])
    server.reply_text("first turn done / 第一轮完成")
    server.reply_text("second turn done / 第二轮完成")
    chat(workspace, server, ["list and search / 列出并搜索", "and now? / 然后呢？"])


def test_summary_keeps_a_tail_that_does_not_start_with_a_tool_result(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    # 9 messages, keep 2 → the tail would start at turn 2's tool result: it is folded in with its call.
    set_policy(workspace, session_summary_message_threshold=5, session_summary_keep_count=2)
    fake_openai.reply_tool_calls([("list_dir", {"path": "."}), ("list_dir", {"path": "memory"})])
    fake_openai.reply_text("one")
    fake_openai.reply_tool_calls([("memory_search", {"query": "latte 拿铁"})])
    fake_openai.reply_text("two")
    fake_openai.responder = lambda body: Text(SUMMARY_EN) if is_summary_request(body) else Text("three")

    assert chat(workspace, fake_openai, ["first", "second", "third 第三"], continue_background=True) == [
        "one", "two", "three"]

    [compaction] = records_of(workspace, "compaction")[:1]
    assert compaction["through"] == 8  # the tool result (id 8) went with its call (id 7)
    summary_request = next(b for b in fake_openai.chat_requests() if is_summary_request(b))
    # Asked after turn 3's request (agent/cache_prefix.py): the call and its result are there as sent, and the part
    # to fold is said to end with that result.
    sent = summary_request["messages"]
    assert any(call["function"]["name"] == "memory_search" for m in sent for call in m.get("tool_calls") or [])
    assert "the result of memory_search" in sent[-1]["content"]  # named, never quoted
    assert "the last message above comes after it" in sent[-1]["content"]  # "two"
    third = turn_requests(fake_openai)[-1]
    assert [m["role"] for m in history(third)] == ["assistant", "user"]
    assert contents(history(third)) == ["two", "third 第三"]


@pytest.mark.parametrize("mid_tool_loop", [False, True], ids=["first call", "after a tool call"])
def test_context_too_long_drops_the_oldest_half_tells_once_and_retries_once(
        workspace: Workspace, fake_openai: FakeOpenAIServer, mid_tool_loop: bool) -> None:
    two_turns_with_tools(workspace, fake_openai)
    if mid_tool_loop:
        fake_openai.reply_tool_calls([("list_dir", {"path": "memory"})])
    fake_openai.reply_error(400, CONTEXT_TOO_LONG, code="context_length_exceeded")
    fake_openai.reply_text("短一点的回答 / a shorter answer")
    fake_openai.reply_text("still fine / 仍然正常")
    sent_before = len(fake_openai.chat_requests())

    replies = chat(workspace, fake_openai, ["third question / 第三个问题", "fourth / 第四"])

    assert replies == [f"{TRIMMED_NOTICE}\n\n短一点的回答 / a shorter answer", "still fine / 仍然正常"]
    [compaction] = records_of(workspace, "compaction")
    # Half of 7 is 3, a tool result: the cut moves on to the next turn's start (the user message at 5), so the call,
    # both results and the answer go together and the history never starts with a reply.
    assert (compaction["through"], compaction["summary"], compaction["reason"]) == (5, None, "context_too_long")
    *turn, fourth = fake_openai.chat_requests()[sent_before:]
    failed, retried = turn[-2:]
    assert len(history(retried)) == len(history(failed)) - 5
    first, answer = history(retried)[:2]
    assert first["content"].endswith("and now? / 然后呢？") and answer["content"] == "second turn done / 第二轮完成"
    if mid_tool_loop:  # this turn's own call and result are sent again after the trimmed history
        assert [m["role"] for m in history(retried)][-3:] == ["user", "assistant", "tool"]
    assert TRIMMED_NOTICE not in str(fourth)
    assert history(fourth)[0]["content"].endswith("and now? / 然后呢？")


def test_context_too_long_twice_is_one_clear_line(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    two_turns_with_tools(workspace, fake_openai)
    for _ in range(2):
        fake_openai.reply_error(400, CONTEXT_TOO_LONG, code="context_length_exceeded")
    sent_before = len(fake_openai.chat_requests())

    [reply] = chat(workspace, fake_openai, ["第三个问题"])

    assert reply.startswith("Sorry, I could not get an answer from the model: the conversation is too long")
    assert "\n" not in reply
    assert len(fake_openai.chat_requests()) - sent_before == 2  # retried once, not more
    assert [r["message"]["content"] for r in records_of(workspace, "message")][-1] == "second turn done / 第二轮完成"


def test_context_too_long_is_retried_even_when_one_tool_step_is_allowed(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    two_turns_with_tools(App.open(home).workspace, fake_openai)
    workspace = reopen(home, max_tool_iterations=1)
    fake_openai.reply_error(400, CONTEXT_TOO_LONG, code="context_length_exceeded")
    fake_openai.reply_text("answer after trimming / 裁剪后的回答")

    assert chat(workspace, fake_openai, ["third"]) == [f"{TRIMMED_NOTICE}\n\nanswer after trimming / 裁剪后的回答"]


def test_context_too_long_with_nothing_to_drop_is_not_retried(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_error(400, CONTEXT_TOO_LONG, code="context_length_exceeded")
    fake_openai.reply_text("never sent")

    [reply] = chat(workspace, fake_openai, ["一条很长很长的消息 " * 50])

    assert reply.startswith("Sorry, I could not get an answer from the model: the conversation is too long")
    assert len(fake_openai.chat_requests()) == 1  # the same request again could only fail again
    assert not session_path(workspace).exists()


def test_history_cut_between_a_call_and_its_result_is_repaired_before_sending(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    """A compaction record pointing between a call and its result (hand edit, older version) must not
    reach the model as an orphaned tool result; the fake server proves such a request would fail."""
    two_turns_with_tools(workspace, fake_openai)
    with open(session_path(workspace), "ab") as fh:
        fh.write(orjson.dumps({"type": "compaction", "through": 2, "summary": None, "reason": "hand edit"}) + b"\n")
    records = [r["message"] for r in records_of(workspace, "message")]
    broken = [{"role": "system", "content": "s"}, *records[2:]]

    async def send_broken() -> str:
        async with make_provider(workspace, fake_openai) as provider:
            with pytest.raises(ProviderError) as caught:
                await provider.chat(broken)
            return str(caught.value)
    assert "messages with role 'tool' must be a response" in asyncio.run(send_broken())

    fake_openai.reply_text("repaired / 已修复")
    assert chat(workspace, fake_openai, ["继续"]) == ["repaired / 已修复"]
    sent = history(fake_openai.chat_requests()[-1])
    assert sent[0]["role"] == "assistant" and sent[0]["content"] == "first turn done / 第一轮完成"


def test_force_compress_directly_never_orphans(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    two_turns_with_tools(workspace, fake_openai)

    async def body(loop: AgentLoop) -> list[str]:
        session = await loop.session(SESSION)
        dropped = [await loop.force_compress(session)]
        dropped.append(await loop.force_compress(session))
        return [str(n) for n in dropped] + [m["role"] for m in session.active_messages()]

    # 7 → cut at 5, the next turn's start (not the tool result at 3, nor the reply at 4); then 2 (one turn) → all
    # of it: a history never starts with a reply or a tool result.
    assert with_agent(workspace, fake_openai, body) == ["5", "2"]
