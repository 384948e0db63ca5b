"""Query rewriting (picoclaw/agent/query_rewrite.py): the switch, the one short request before a turn, the
query memory is searched with, and every fallback, with the real small-model outputs of
tests/data/real_query_rewrites.json where they show the case."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from picoclaw.agent.loop import AgentLoop
from picoclaw.agent.query_rewrite import (
    MAX_TOKENS,
    REWRITE_INSTRUCTIONS,
    QueryRewriter,
    accept_rewrite,
    clean_rewrite,
    earlier_turns,
    refusal_reason,
    rewrite_request,
    search_query,
)
from picoclaw.memory.workspace import Workspace
from tests.agent_helpers import (
    SESSION,
    chat,
    contents,
    history,
    injected_blocks,
    records_of,
    set_policy,
    turn_context,
    with_agent,
    write_memory,
)
from tests.fakes import FakeOpenAIServer, Text

CAPTURED = json.loads((Path(__file__).parent / "data/real_query_rewrites.json").read_text(encoding="utf-8"))
REAL = {item["id"]: item for item in CAPTURED["items"]}  # Qwen2.5-Coder-1.5B's replies to this prompt

MEMORY = {
    "en": ["## 2025-03-01\nAnna works as a nurse in Lyon.", "## 2025-03-02\nTom flies planes for Lufthansa."],
    "zh": ["## 2025-03-01\n小白是一只三岁的猫。", "## 2025-03-02\n大黄是邻居家的狗。"],
}
# (first message, its answer, the follow-up, the model's rewrite of it, the block the rewrite finds)
TURNS = {
    "en": ("Who phoned me yesterday?", "Anna phoned you.", "And what about her?", "And what about Anna?",
           "## 2025-03-01\nAnna works as a nurse in Lyon."),
    "zh": ("猜猜我最喜欢谁", "小白吧。", "它呢？", "小白呢？", "## 2025-03-01\n小白是一只三岁的猫。"),
}


def is_rewrite_request(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == REWRITE_INSTRUCTIONS


def main_requests(server: FakeOpenAIServer) -> list[dict[str, Any]]:
    return [body for body in server.chat_requests() if not is_rewrite_request(body)]


def answer_with(rewrite: Text | str) -> Any:
    """A responder: `rewrite` for a rewrite request, "ok" for everything else."""
    return lambda body: rewrite if is_rewrite_request(body) else "ok"


# -- through a turn ----------------------------------------------------------------------------------


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_switched_off_no_extra_request_and_the_message_is_searched(
        lang: str, workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    write_memory(workspace, MEMORY[lang])
    first, answer, follow_up, rewrite, _ = TURNS[lang]
    fake_openai.responder = answer_with(rewrite)
    fake_openai.reply_text(answer)

    replies = chat(workspace, fake_openai, [first, follow_up])

    assert replies == [answer, "ok"]
    requests = fake_openai.chat_requests()
    assert len(requests) == 2 and not any(is_rewrite_request(body) for body in requests)
    assert injected_blocks(turn_context(requests[1])) == []  # the pronoun alone finds nothing


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_switched_on_one_short_request_before_the_turn_and_its_query_is_searched(
        lang: str, workspace: Workspace, fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    write_memory(workspace, MEMORY[lang])
    set_policy(workspace, query_rewrite_enabled=True)
    first, answer, follow_up, rewrite, found = TURNS[lang]
    fake_openai.responder = answer_with(Text(rewrite, usage={"prompt_tokens": 180, "completion_tokens": 7}))
    fake_openai.reply_text(answer)

    with caplog.at_level(logging.INFO, logger="picoclaw.agent.query_rewrite"):
        replies = chat(workspace, fake_openai, [first, follow_up])

    assert replies == [answer, "ok"]
    turn1, ask, turn2 = fake_openai.chat_requests()  # no rewrite for a first message: nothing to resolve
    assert is_rewrite_request(ask) and not is_rewrite_request(turn1) and not is_rewrite_request(turn2)
    assert ask["max_tokens"] == MAX_TOKENS and "tools" not in ask and not ask.get("stream")
    assert ask["messages"] == rewrite_request(follow_up, [{"role": "user", "content": first},
                                                          {"role": "assistant", "content": answer}])
    assert injected_blocks(turn_context(turn2)) == [found]
    # The rewrite is no part of the conversation: neither sent as history nor stored.
    assert contents(history(turn2)) == [first, answer, follow_up]
    stored = [record["message"]["content"] for record in records_of(workspace, "message")]
    assert [text.split("</context>\n\n")[-1] for text in stored] == [first, answer, follow_up, "ok"]
    assert "query rewrite: 180 prompt + 7 completion tokens" in caplog.text


@pytest.mark.parametrize(("real", "block", "reason"), [
    ("en-conv-30-q11-follow-up", "## 2023-08-01\nA rose tattoo, done last month!", "an answer"),
    ("zh-conv-26-q4-follow-up", "## 2023-05-08\n身份：跨性别女性。", "made up"),
])
def test_a_real_unusable_rewrite_falls_back_to_the_message(
        real: str, block: str, reason: str, workspace: Workspace, fake_openai: FakeOpenAIServer,
        caplog: pytest.LogCaptureFixture) -> None:
    record = REAL[real]
    write_memory(workspace, [block])
    set_policy(workspace, query_rewrite_enabled=True)
    (first, answer), message = (m["content"] for m in record["earlier"]), record["message"]
    fake_openai.responder = answer_with(record["reply"])
    fake_openai.reply_text(answer)

    with caplog.at_level(logging.INFO, logger="picoclaw.agent.query_rewrite"):
        replies = chat(workspace, fake_openai, [first, message])

    assert replies == [answer, "ok"]
    turn1, ask, turn2 = fake_openai.chat_requests()
    assert ask["messages"] == record["request"]  # the prompt the real model answered
    assert injected_blocks(turn_context(turn1)) == []
    assert injected_blocks(turn_context(turn2)) == [block]  # found by the message's own words
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and f"({reason})" in refusals[0]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_tool_call_written_as_the_rewrite_falls_back_to_the_message(
        lang: str, workspace: Workspace, fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    write_memory(workspace, MEMORY[lang])
    set_policy(workspace, query_rewrite_enabled=True)
    first, answer, follow_up, _, _ = TURNS[lang]
    fake_openai.responder = answer_with('{"name": "memory_search", "arguments": {"query": "x"}}')
    fake_openai.reply_text(answer)

    with caplog.at_level(logging.INFO, logger="picoclaw.agent.query_rewrite"):
        replies = chat(workspace, fake_openai, [first, follow_up])

    assert replies == [answer, "ok"]
    assert len(fake_openai.chat_requests()) == 3
    assert injected_blocks(turn_context(main_requests(fake_openai)[1])) == []
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and "a tool call as text" in refusals[0].getMessage()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_model_error_falls_back_and_the_turn_is_answered(
        lang: str, workspace: Workspace, fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    write_memory(workspace, MEMORY[lang])
    set_policy(workspace, query_rewrite_enabled=True)
    first, answer, follow_up, _, _ = TURNS[lang]
    fake_openai.reply_text(answer)
    fake_openai.reply_error(503, "the model is loading")
    fake_openai.reply_text("still here")

    with caplog.at_level(logging.INFO, logger="picoclaw.agent.query_rewrite"):
        replies = chat(workspace, fake_openai, [first, follow_up])

    assert replies == [answer, "still here"]
    assert is_rewrite_request(fake_openai.chat_requests()[1])
    assert injected_blocks(turn_context(fake_openai.chat_requests()[2])) == []
    logged = [r.getMessage() for r in caplog.records if r.name == "picoclaw.agent.query_rewrite"]
    assert len(logged) == 1 and logged[0].startswith("query rewrite: model call failed: ")
    assert "HTTP 503" in logged[0] and logged[0].endswith("; searching with the message")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_rewrite_that_takes_too_long_is_given_up_and_the_turn_is_answered(
        lang: str, workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    write_memory(workspace, MEMORY[lang])
    set_policy(workspace, query_rewrite_enabled=True)
    first, answer, follow_up, rewrite, _ = TURNS[lang]
    release = threading.Event()  # the rewrite is answered only after the turn: the timeout must have fired
    fake_openai.responder = answer_with(Text(rewrite, until=release))
    fake_openai.reply_text(answer)

    async def body(loop: AgentLoop) -> list[str]:
        loop.rewriter = QueryRewriter(loop.provider, timeout=0.05)
        try:
            return [(await loop.handle(SESSION, text)).text for text in (first, follow_up)]
        finally:
            release.set()

    assert with_agent(workspace, fake_openai, body) == [answer, "ok"]
    turn2 = main_requests(fake_openai)[1]
    assert injected_blocks(turn_context(turn2)) == []
    assert contents(history(turn2)) == [first, answer, follow_up]


# -- the validator, with the small model's real outputs -----------------------------------------------


@pytest.mark.parametrize(("real", "reason"), [
    ("en-conv-30-q11-follow-up", "an answer"),  # "She got her tattoo in September, 2022."
    ("en-conv-26-q4-follow-up", "made up"),  # "What is her identity?" → "Who is Caroline?"
    ("zh-conv-26-q4-follow-up", "made up"),  # "她的身份是什么？" → "她是谁？"
    ("en-conv-43-q7-follow-up", "made up"),  # "Which geographical locations …" → "What places has he been to?"
])
def test_real_unusable_rewrites_are_refused(real: str, reason: str) -> None:
    record = REAL[real]
    assert refusal_reason(record["message"], record["reply"], earlier_turns(record["earlier"])) == reason


@pytest.mark.parametrize(("real", "query"), [
    ("en-conv-26-q3-follow-up", "What did Caroline research?"),
    ("zh-conv-26-q5-follow-up", "梅拉妮何时参加了一场慈善赛跑？"),
    # A message with nothing to search for: the rewrite's words come from the earlier turns.
    ("en-conv-26-q5-elliptic", "When did Melanie run a charity race?"),
    ("zh-conv-26-q6-elliptic", "梅兰妮计划什么时候去露营？"),
])
def test_real_usable_rewrites_are_accepted(real: str, query: str) -> None:
    record = REAL[real]
    earlier = earlier_turns(record["earlier"])
    assert refusal_reason(record["message"], record["reply"], earlier) is None
    assert accept_rewrite(record["message"], record["reply"], earlier) == query


def test_clean_rewrite_takes_off_labels_quotes_and_fences() -> None:
    assert clean_rewrite('Query: "Where does Anna live?"') == "Where does Anna live?"
    assert clean_rewrite("```\n小白几岁了？\n```") == "小白几岁了？"
    assert clean_rewrite("查询：小白几岁了？\n") == "小白几岁了？"
    assert clean_rewrite("「小白几岁了？」") == "小白几岁了？"
    assert clean_rewrite("**Search query:** Anna's sister Lyon") == "Anna's sister Lyon"
    assert clean_rewrite(None) == clean_rewrite("  \n ") == ""


@pytest.mark.parametrize(("message", "text", "reason"), [
    ("Where does she live?", "", "empty"),
    ("她住在哪里？", "```\n```", "empty"),
    ("Where does she live?", "Where does Anna live? " + "Anna " * 40, "too long"),
    ("她住在哪里？", "安娜住在哪里？" + "她的姐姐" * 30, "too long"),
    ("Where does she live?", "I'm sorry, I can't help with that.", "a refusal"),
    ("她住在哪里？", "抱歉，我无法回答这个问题。", "a refusal"),
    ("Where does she live?", '<tool_call>{"name": "memory_search", "arguments": {}}</tool_call>',
     "a tool call as text"),
    ("她住在哪里？", 'functions.memory_search: {"query": "安娜"}', "a tool call as text"),
    ("她住在哪里？", "Where does Anna live?", "another language"),
    ("Where does she live?", "安娜住在哪里？", "another language"),
    ("Where does she live?", "She lives in Lyon.", "an answer"),
    ("她住在哪里？", "她在里昂工作。", "an answer"),
    ("Where does she live?", "Anna lives in Lyon", "made up"),
    ("她住在哪里？", "安娜在里昂", "made up"),
    ("Does she have a sister?", "Yes, Anna has a sister.", "an answer"),
    ("她有姐姐吗？", "是的，安娜有一个姐姐。", "an answer"),
])
def test_unusable_rewrites_are_refused(message: str, text: str, reason: str) -> None:
    assert refusal_reason(message, text) == reason
    assert accept_rewrite(message, text) is None


@pytest.mark.parametrize(("message", "text", "query"), [
    ("Where does she live?", "Where does Anna live?", "Where does Anna live?"),
    ("她住在哪里？", "安娜住在哪里？", "安娜住在哪里？"),
    ("And what about her?", '"What about Anna?"', "What about Anna?"),
    ("它呢？", "查询：小白呢？", "小白呢？"),
    ("Based on his collections, which shop would he enjoy?", "Based on Tim's collections, which shop would Tim enjoy?",
     "Based on Tim's collections, which shop would Tim enjoy?"),
    ("根据他的收藏，他会喜欢逛哪家店？", "根据蒂姆的收藏，蒂姆会喜欢逛哪家店？",
     "根据蒂姆的收藏，蒂姆会喜欢逛哪家店？"),
])
def test_usable_rewrites_are_accepted_cleaned(message: str, text: str, query: str) -> None:
    assert refusal_reason(message, text) is None
    assert accept_rewrite(message, text) == query


def test_the_search_query_holds_the_message_and_its_rewrite() -> None:
    assert search_query("Where does she live?", "Where does Anna live?") == (
        "Where does she live?\nWhere does Anna live?")
    assert search_query("她住在哪里？", "安娜住在哪里？") == "她住在哪里？\n安娜住在哪里？"
    assert search_query("Where does Anna live?", "where does anna live?") == "Where does Anna live?"


def test_earlier_turns_keep_the_last_said_messages_shortened() -> None:
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "一"}, {"role": "assistant", "content": "二"},
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
                                                            "function": {"name": "list_dir", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "MEMORY.md"},
        {"role": "assistant", "content": "x " * 400}, {"role": "user", "content": "三"}]
    earlier = earlier_turns(history)
    assert [m["role"] for m in earlier] == ["assistant", "user", "assistant", "user"]
    assert earlier[0]["content"] == "二" and earlier[3]["content"] == "三"
    assert earlier[2]["content"].endswith(" …") and len(earlier[2]["content"]) < 320
