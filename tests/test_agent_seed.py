"""A new user's first sessions, step by step: a fact remembered and recalled by a new session, memory_search in
English and Chinese, policy changes applied on the next turn, summaries. Real AgentLoop, real provider, fake model."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from picoclaw.agent.loop import SUMMARY_NOTICE, AgentLoop
from picoclaw.memory.workspace import Workspace
from tests.agent_helpers import (
    SESSION,
    SUMMARY_EN,
    SUMMARY_ZH,
    TODAY,
    Notices,
    chat,
    contents,
    frozen,
    history,
    injected_blocks,
    is_flush_request,
    is_summary_request,
    memory_section,
    records_of,
    set_policy,
    summary_sent,
    today_note,
    turn_context,
    turn_requests,
    with_agent,
    write_memory,
)
from tests.fakes import FakeOpenAIServer, Text

DISTRACTORS = ["## 2025-03-01\nMy dog is called Bob. 我的狗叫 Bob。",
               "## 2025-03-02\nProject Alpha is due on March 15. 阿尔法项目三月十五日截止。"]

REMEMBER = {
    "english": ("remember: my coffee preference is an oat-milk latte",
                "The user's coffee preference: oat-milk latte, large", "what coffee do I like?"),
    "chinese": ("请记住：我的咖啡偏好是燕麦拿铁，大杯。", "用户的咖啡偏好：燕麦拿铁，大杯", "我喜欢什么咖啡？"),
}


@pytest.mark.parametrize("language", REMEMBER)
def test_remembered_fact_is_a_dated_entry_recalled_by_a_new_session(
        workspace: Workspace, fake_openai: FakeOpenAIServer, language: str) -> None:
    message, content, question = REMEMBER[language]
    write_memory(workspace, DISTRACTORS)
    fake_openai.reply_tool_calls([("memory_append", {"content": content, "slot": "long_term"})])
    fake_openai.reply_text("Noted. / 记住了。")
    fake_openai.reply_text("An oat-milk latte. / 燕麦拿铁。")

    with frozen():
        assert chat(workspace, fake_openai, [message], key="cli:first") == ["Noted. / 记住了。"]
        assert workspace.store.read_long_term().endswith(f"\n\n## {TODAY}\n{content}\n")
        # The tool result went back to the model, naming where the entry went.
        tool_result = history(fake_openai.chat_requests()[1])[-1]
        assert tool_result["role"] == "tool" and f"memory/MEMORY.md under '## {TODAY}'" in tool_result["content"]

        assert chat(workspace, fake_openai, [question], key="cli:second") == ["An oat-milk latte. / 燕麦拿铁。"]

    asked = fake_openai.chat_requests()[2]
    assert contents(history(asked)) == [question]  # a new session: no old messages
    # The question found the stored block and only that one (ranked, not the whole file).
    assert injected_blocks(turn_context(asked)) == [f"## {TODAY}\n{content}"]


def test_memory_search_tool_finds_the_stored_fact_in_english_and_chinese(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    write_memory(workspace, [*DISTRACTORS, "## 2025-03-03\nCoffee: oat-milk latte. 咖啡：燕麦拿铁。"])
    for query in ("coffee", "咖啡"):
        fake_openai.reply_tool_calls([("memory_search", {"query": query, "limit": 5})])
        fake_openai.reply_text(f"found {query}")

    replies = chat(workspace, fake_openai, ["use memory_search for coffee", "用 memory_search 查一下咖啡"])

    assert replies == ["found coffee", "found 咖啡"]
    for request in (fake_openai.chat_requests()[1], fake_openai.chat_requests()[3]):
        result = history(request)[-1]
        assert result["role"] == "tool"
        assert result["content"].startswith("1 match for")
        assert "memory/MEMORY.md:9-10" in result["content"] and "燕麦拿铁" in result["content"]


COFFEE_BLOCKS = [f"## 2025-02-0{n}\nCoffee note {n}: cafe number {n}. 咖啡笔记 {n}：第 {n} 家咖啡店。"
                 for n in range(1, 7)]


def test_retrieve_limit_and_recent_days_apply_on_the_next_turn(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    write_memory(workspace, COFFEE_BLOCKS)
    with frozen():
        now = datetime.now(workspace.tz)
        workspace.store.append_note("Yesterday: tried a flat white. 昨天：试了馥芮白。", at=now - timedelta(days=1))
        workspace.store.append_note("Today: bought beans. 今天：买了咖啡豆。", at=now)

        async def body(loop: AgentLoop) -> None:
            await loop.handle(SESSION, "coffee?")
            set_policy(workspace, retrieve_limit=3, recent_days=1)  # no restart: read at every turn
            # New conversations: in the first one, every block is already in the context and is not sent again.
            await loop.handle("cli:english", "coffee?")
            await loop.handle("cli:chinese", "咖啡？")

        with_agent(workspace, fake_openai, body)

    before, english, chinese = (turn_context(b) for b in fake_openai.chat_requests())
    assert len(injected_blocks(before)) == 6
    assert "flat white" in before and "bought beans" in before
    for context in (english, chinese):
        blocks = injected_blocks(context)
        assert len(blocks) == 3 and all(block in COFFEE_BLOCKS for block in blocks)
        assert "bought beans" in context and "flat white" not in context


SUMMARY_CASES = {
    "english": (["hi", "I want coffee", "make it large", "and oat milk"], SUMMARY_EN),
    "chinese": (["你好", "我想喝咖啡", "要大杯", "加燕麦奶"], SUMMARY_ZH),
}


@pytest.mark.parametrize("language", SUMMARY_CASES)
def test_threshold_five_summarises_and_the_chat_goes_on(
        workspace: Workspace, fake_openai: FakeOpenAIServer, language: str) -> None:
    texts, summary = SUMMARY_CASES[language]
    set_policy(workspace, session_summary_message_threshold=5)
    answers = iter(f"answer {n}" for n in range(1, 10))
    # The second summary says more than the first: a summary the same as the last is not noted again.
    summaries = iter([summary, f"{summary} {texts[-1]}"])
    fake_openai.responder = lambda body: (next(summaries) if is_summary_request(body)
                                          else "NONE" if is_flush_request(body) else next(answers))
    notices = Notices()

    with frozen():
        replies = chat(workspace, fake_openai, texts, notices=notices, continue_background=True)

    assert replies == ["answer 1", "answer 2", "answer 3", "answer 4"]
    kinds = ["summary" if is_summary_request(b) else "flush" if is_flush_request(b) else "turn"
             for b in fake_openai.chat_requests()]
    # 3 turns = 6 messages > 5: summary (after the memory flush of what it folds); it keeps 4, turn 4 makes
    # it 6 again: a second summary.
    assert kinds == ["turn", "turn", "turn", "flush", "summary", "turn", "flush", "summary"]
    assert notices.sent == [(SESSION, SUMMARY_NOTICE)] * 2
    first, second = records_of(workspace, "compaction")
    assert (first["through"], first["summary"], first["reason"]) == (2, summary, "summary")
    assert second["through"] == 4
    # The compacted messages stay in the file.
    assert [r["message"]["content"] for r in records_of(workspace, "message")][:2] == [texts[0], "answer 1"]
    note = today_note(workspace)
    assert note.count(f"Summary of session {SESSION}:") == 2 and "### Key context" in note
    # Turn 4 went on from the summary and the 4 kept messages.
    fourth = turn_requests(fake_openai)[3]
    assert summary_sent(fourth) == summary
    assert contents(history(fourth)) == [texts[1], "answer 2", texts[2], "answer 3", texts[3]]
    # The second summary is asked after turn 4's request, whose first user message carries the first summary.
    second_summary_request = fake_openai.chat_requests()[7]
    answered = {"role": "assistant", "content": "answer 4"}
    assert second_summary_request["messages"][:-1] == [*fourth["messages"], answered]
    assert "together with the summary of what came before it, in the <summary> block above" in str(
        second_summary_request["messages"][-1]["content"])


def test_summary_replaces_itself_not_the_memory(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    """The stored fact is still injected after a summary: summaries fold history, never memory."""
    write_memory(workspace, ["## 2025-03-03\nCoffee: oat-milk latte. 咖啡：燕麦拿铁。"])
    set_policy(workspace, session_summary_message_threshold=4, session_summary_keep_count=2)
    def responder(body: dict[str, Any]) -> Text | str:
        return Text(SUMMARY_EN) if is_summary_request(body) else "ok"
    fake_openai.responder = responder

    chat(workspace, fake_openai, ["hello", "hi again", "still here", "我喜欢什么咖啡？"])

    last = turn_requests(fake_openai)[-1]
    assert summary_sent(last) == SUMMARY_EN
    # The turn that carried the fact was folded into the summary, so the fact is sent again.
    assert "咖啡：燕麦拿铁" in memory_section(turn_context(last))
