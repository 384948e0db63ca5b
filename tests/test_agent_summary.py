"""Session summaries: refused when bad, never losing messages that arrive meanwhile, triggered by the
provider's own token count when it sends one."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from picoclaw.agent.loop import SUMMARY_NOTICE, AgentLoop
from picoclaw.curation.session_summary import SECTIONS, accept_summary
from picoclaw.memory.workspace import Workspace
from tests.agent_helpers import (
    SESSION,
    SUMMARY_EN,
    SUMMARY_ZH,
    Notices,
    chat,
    contents,
    frozen,
    history,
    is_flush_request,
    is_summary_request,
    records_of,
    reopen,
    said,
    session_path,
    set_policy,
    summary_sent,
    today_note,
    turn_requests,
    with_agent,
)
from tests.fakes import Error, FakeOpenAIServer, Text
from tests.waiting import wait_until

ZH_HEADINGS = ("## 🎯 目标\n学中文。\n## ⚙️ 约束和偏好\n每天十分钟。\n## 📈 进展\n学了 42 个字。\n"
               "## 🔑 关键决策\n用 Anki。\n## ➡️ 下一步\n复习声调。\n## 📌 关键上下文\n卡组在 ~/anki/中文.apkg。")
EN_STYLED = ("## 1. Goal:\nShip v2.\n## **Constraints and preferences**\nNo new deps.\n## 3. Progress\nAPI done.\n"
             "## Key decisions\nUse JWT.\n## Next steps\nDocs.\n## Key context\nsrc/auth.ts")


@pytest.mark.parametrize("text", [SUMMARY_EN, SUMMARY_ZH, ZH_HEADINGS, EN_STYLED, f"```markdown\n{SUMMARY_EN}\n```"],
                         ids=["english", "chinese body", "chinese headings", "styled headings", "fenced"])
def test_summaries_with_the_sections_are_accepted(text: str) -> None:
    accepted = accept_summary(text)
    assert accepted is not None and "```" not in accepted


REFUSED = {
    "empty": Text(""),
    "blank": Text("  \n "),
    "prose": Text("Sure! The user likes coffee and wants it large. 用户喜欢咖啡。"),
    "two sections": Text("## Goal\nCoffee.\n## 目标\n咖啡。\n## Progress\nnone"),
    "provider error": Error(503, "overloaded"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_bad_summary_is_refused_and_the_history_kept(workspace: Workspace, fake_openai: FakeOpenAIServer,
                                                      case: str) -> None:
    set_policy(workspace, session_summary_message_threshold=5)
    summary_reply = REFUSED[case]
    fake_openai.responder = lambda body: summary_reply if is_summary_request(body) else Text("好")
    texts = ["one 一", "two 二", "three 三", "four 四"]

    with frozen():
        assert chat(workspace, fake_openai, texts) == ["好"] * 4

    assert records_of(workspace, "compaction") == []
    assert "Summary of session" not in today_note(workspace)
    last = turn_requests(fake_openai)[-1]
    assert summary_sent(last) == ""
    assert contents(history(last)) == ["one 一", "好", "two 二", "好", "three 三", "好", "four 四"]
    # Tried after turn 3; turn 4 is within the back-off (4 more messages) after a failure, so no second try.
    assert sum(is_summary_request(b) for b in fake_openai.chat_requests()) == 1


def test_messages_arriving_while_a_summary_is_written_are_kept(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    set_policy(workspace, session_summary_message_threshold=5)
    written = threading.Event()  # the summary is answered only once turn 4 is done, however long that takes

    def model(body: dict[str, Any]) -> Text:
        if is_summary_request(body):
            return Text(SUMMARY_ZH, until=written)
        return Text(f"re: {said(body['messages'][-1])}")
    fake_openai.responder = model
    notices = Notices()

    async def body(loop: AgentLoop) -> tuple[str, list[dict[str, Any]]]:
        for text in ["一", "二", "三"]:
            await loop.handle(SESSION, text, notify=notices)
        await wait_until(lambda: any(is_summary_request(b) for b in fake_openai.chat_requests()),
                         what="turn 3's summary request to reach the model")  # it is now being written
        # Answered without waiting for the summary:
        reply = (await loop.handle(SESSION, "four 第四", notify=notices)).text
        compactions_meanwhile = records_of(workspace, "compaction")
        written.set()
        await loop.wait_background()
        await loop.handle(SESSION, "five 第五", notify=notices)
        return reply, compactions_meanwhile

    reply, meanwhile = with_agent(workspace, fake_openai, body)

    assert reply == "re: four 第四" and meanwhile == []
    [compaction] = records_of(workspace, "compaction")[:1]
    assert compaction["through"] == 2  # what the summary covered when it started; "four" came later
    fifth = turn_requests(fake_openai)[4]
    assert contents(history(fifth)) == ["二", "re: 二", "三", "re: 三", "four 第四", "re: four 第四", "five 第五"]
    assert summary_sent(fifth) == SUMMARY_ZH
    # Turn 4's background check found the summary already running: no second notice, no second call.
    assert notices.sent[:1] == [(SESSION, SUMMARY_NOTICE)]
    summaries = [b for b in fake_openai.chat_requests() if is_summary_request(b)]
    assert len(notices.sent) == len(summaries)


def test_new_while_a_summary_is_written_leaves_the_new_session_alone(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    set_policy(workspace, session_summary_message_threshold=5)
    written = threading.Event()  # the summary is answered only after /new and the next turn
    fake_openai.responder = lambda body: Text(SUMMARY_EN, until=written) if is_summary_request(body) else Text("ok")

    async def body(loop: AgentLoop) -> None:
        for text in ["one", "two", "three"]:
            await loop.handle(SESSION, text)
        await wait_until(lambda: any(is_summary_request(b) for b in fake_openai.chat_requests()),
                         what="turn 3's summary request to reach the model")
        await loop.handle(SESSION, "/new")
        await loop.handle(SESSION, "fresh start 重新开始")
        written.set()

    with_agent(workspace, fake_openai, body)
    assert records_of(workspace, "compaction") == []

    chat(workspace, fake_openai, ["and now? 然后呢？"])  # a restart reads the file again
    assert contents(history(fake_openai.chat_requests()[-1])) == ["fresh start 重新开始", "ok", "and now? 然后呢？"]


def long_chinese(n: int) -> str:
    return "".join(chr(0x4E00 + (n * 397 + i * 31) % 20000) for i in range(300))


TOKEN_CASES = {
    # (user texts, prompt_tokens the provider reports per turn (None: it sends no usage), summary expected)
    "provider count over the limit": (["hi", "ok", "go on"], [40, 60, 500], True),
    "provider count under, local count over": ([long_chinese(n) for n in range(3)], [30, 40, 50], False),
    "no provider count, local count over": ([long_chinese(n) for n in range(3)], [None, None, None], True),
    "no provider count, local count under": (["hi", "ok", "go on"], [None, None, None], False),
}


@pytest.mark.parametrize("case", TOKEN_CASES)
def test_token_trigger_prefers_the_provider_count(home: Path, fake_openai: FakeOpenAIServer, case: str) -> None:
    texts, reported, expected = TOKEN_CASES[case]
    workspace = reopen(home, context_window=4096)  # 10 % of it: 409 tokens (and room for the tools)
    set_policy(workspace, session_summary_token_percent=10)
    usages = iter(reported)

    def model(body: dict[str, Any]) -> Text:
        if is_summary_request(body):
            return Text(SUMMARY_ZH)
        tokens = next(usages)
        return Text("嗯", usage={"prompt_tokens": tokens, "completion_tokens": 1} if tokens is not None else False)
    fake_openai.responder = model

    chat(workspace, fake_openai, texts)

    assert any(is_summary_request(b) for b in fake_openai.chat_requests()) is expected
    stored = [r.get("prompt_tokens") for r in records_of(workspace, "message") if r["message"]["role"] == "assistant"]
    assert stored == reported[: len(stored)]


def test_summary_goes_to_the_session_file_and_todays_note(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = lambda body: SUMMARY_ZH if is_summary_request(body) else "好的"
    chat(workspace, fake_openai, ["我想喝咖啡", "要燕麦奶", "大杯"])
    before = session_path(workspace).read_bytes()

    with frozen():
        [reply] = chat(workspace, fake_openai, ["/compact"])

    assert reply.startswith("Compact complete: 2 messages compacted.\n\n## Goal\n为用户确定常点的咖啡。")
    after = session_path(workspace).read_bytes()
    assert after.startswith(before)  # appended, nothing rewritten
    [compaction] = records_of(workspace, "compaction")
    assert compaction["summary"] == SUMMARY_ZH and compaction["through"] == 2
    note = today_note(workspace)
    assert f"Summary of session {SESSION}:" in note and "### Key context\n预算 30 元；工单 CAF-42。" in note
    assert all(f"## {s}" in compaction["summary"] for s in SECTIONS)


def test_a_model_that_never_writes_a_summary_is_asked_again_only_after_a_growing_wait(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    # The rule: after a refused or failed summary, the next attempt waits until `wait` more messages have
    # arrived; `wait` starts at session_summary_keep_count (4) and doubles after each failure. Threshold 5:
    # attempts after messages 6, 10, 18 and 34 of the 40, so at most 4 requests (and notices), not 18.
    set_policy(workspace, session_summary_message_threshold=5)
    fake_openai.responder = lambda body: "no / 不" if is_summary_request(body) else f"re: {said(body['messages'][-1])}"
    notices = Notices()
    texts = [f"message {n} 第{n}条" for n in range(1, 21)]

    with frozen():
        replies = chat(workspace, fake_openai, texts, notices=notices)

    assert replies == [f"re: {text}" for text in texts]  # the conversation goes on
    summaries = [b for b in fake_openai.chat_requests() if is_summary_request(b)]
    assert len(summaries) == 4
    assert notices.sent == [(SESSION, SUMMARY_NOTICE)] * 4  # no notice for a turn that does not try
    assert records_of(workspace, "compaction") == []
    assert len(contents(history(turn_requests(fake_openai)[-1]))) == 39


def _styled(summary: str) -> str:
    """`summary` as a small model gives it back: its lines bold, other case, extra spaces."""
    return "\n".join(f"**{line.upper()}**  " if line and not line.startswith("#") else line
                     for line in summary.splitlines())


@pytest.mark.parametrize("summary", [SUMMARY_EN, SUMMARY_ZH], ids=["english", "chinese"])
def test_a_summary_repeating_the_previous_one_is_not_appended_to_the_note_again(
        workspace: Workspace, fake_openai: FakeOpenAIServer, summary: str, caplog: pytest.LogCaptureFixture) -> None:
    # A real 1.5B model gave back the previous summary word for word three compactions in a row. The compaction
    # goes on (the history shrinks, so the model is not asked again every turn); the note keeps it once.
    set_policy(workspace, session_summary_message_threshold=4, session_summary_keep_count=2)
    newer = summary.replace("## Key context\n", "## Key context\nLater: a second shop. 第二家店。\n")
    answers = [summary, summary, _styled(summary), newer]
    fake_openai.responder = lambda body: (answers.pop(0) if is_summary_request(body)
                                          else "NONE" if is_flush_request(body) else "ok / 好")
    with frozen(), caplog.at_level("INFO", logger="picoclaw.agent.loop"):
        chat(workspace, fake_openai, [f"turn {n} 第{n}轮" for n in range(1, 10)])

    assert answers == []
    assert len(records_of(workspace, "compaction")) == 4  # each summary asked for once, and used
    assert sum(is_summary_request(body) for body in fake_openai.chat_requests()) == 4
    note = today_note(workspace)
    assert note.count(f"Summary of session {SESSION}:") == 2  # the first summary once, then the newer one
    assert note.count("第二家店") == 1
    repeated = [r for r in caplog.records if "repeats the previous one" in r.getMessage()]
    assert len(repeated) == 2


def test_only_the_same_sessions_previous_summary_counts_as_repeated(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    set_policy(workspace, session_summary_message_threshold=4, session_summary_keep_count=2)
    answers = [SUMMARY_ZH, SUMMARY_ZH]  # one summary for each of two sessions: each is its session's first
    fake_openai.responder = lambda body: (answers.pop(0) if is_summary_request(body)
                                          else "NONE" if is_flush_request(body) else "ok / 好")
    with frozen():
        workspace.store.append_note(f"Summary of session {SESSION}:\n{SUMMARY_ZH}")  # a note, not the session's
        chat(workspace, fake_openai, [f"turn {n} 第{n}轮" for n in range(1, 4)])
        chat(workspace, fake_openai, [f"turn {n} 第{n}轮" for n in range(1, 4)], key="cli:other")

    assert answers == []
    note = today_note(workspace)
    assert note.count(f"Summary of session {SESSION}:") == 2 and note.count("Summary of session cli:other:") == 1


@pytest.mark.parametrize("text", ["hello there", "你好呀"])
def test_the_summary_is_claimed_before_its_notice_so_a_turn_meanwhile_waits_for_it(
        workspace: Workspace, fake_openai: FakeOpenAIServer, text: str) -> None:
    # The background summary sent its notice (and took its cross-process lock) before claiming the session: a turn
    # arriving in that gap found no summary under way and wrote its own in the turn (two notices, two calls).
    set_policy(workspace, session_summary_message_threshold=5)
    fake_openai.responder = lambda body: SUMMARY_EN if is_summary_request(body) else "ok"
    claimed_at_notice: list[bool] = []

    async def body(loop: AgentLoop) -> None:
        async def notify(key: str, notice: str) -> None:
            if notice == SUMMARY_NOTICE:
                claimed_at_notice.append(key in loop._summarizing)

        for n in range(4):
            await loop.handle(SESSION, f"{text} {n}", notify=notify)
            await loop.wait_background()

    with_agent(workspace, fake_openai, body)
    assert claimed_at_notice and all(claimed_at_notice), claimed_at_notice
