"""Memory that only keeps what the user said: the memory flush, memory_append and summaries against a
real 1.5B model's poisoned session (tests/data/real-model/flush_poisoning.json), the same kinds of junk in Chinese
and in mixed text, grounded facts and updates that are written, summaries that claim an answer the user never saw,
and the receipts of what was written. Turns run through a real AgentLoop against the fake OpenAI server."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from picoclaw.agent.loop import AgentLoop
from picoclaw.cli import main
from picoclaw.curation import flush as flush_module
from picoclaw.curation.session_summary import CUT_SHORT, EMPTY_REPLY, UNSEEN, render_transcript, unseen_answer_claims
from picoclaw.memory import FlushCounts, FlushTally, MemoryWrite, WriteLog
from picoclaw.memory.grounding import ADVICE, QUESTION, REFUSAL, UNGROUNDED
from picoclaw.memory.workspace import Workspace
from picoclaw.storage import FilesStorage, Storage
from tests.agent_helpers import (
    SESSION,
    background_reading,
    frozen,
    is_continued,
    is_flush_request,
    is_lesson_request,
    is_summary_request,
    records_of,
    set_policy,
    today_note,
    with_agent,
)
from tests.fakes import FakeOpenAIServer, Text, ToolCalls
from tests.fakes.openai_server import Reply
from tests.test_repl import configure, picoclaw

DATA = Path(__file__).resolve().parent / "data" / "real-model" / "flush_poisoning.json"
POISONED = json.loads(DATA.read_text(encoding="utf-8"))
USER_ENTRY: str = POISONED["entry_the_user_gave"]
JUNK: list[str] = POISONED["memory_entries_in_order"][1:]
RECORDS: list[dict[str, Any]] = POISONED["repl_session_records"]
MESSAGES = [record["message"] for record in RECORDS if record["type"] == "message"]
RECORDED_SUMMARY: str = next(record["summary"] for record in RECORDS if record["type"] == "compaction")
SUMMARY = ("## Goal\nChat.\n## Constraints and preferences\nNone.\n## Progress\nTalked.\n## Key decisions\nNone.\n"
           "## Next steps\nNone.\n## Key context\nSee memory.")


@dataclass
class Receipts:
    """What the loop showed the user of its memory writes, as (session key, write)."""

    shown: list[tuple[str, MemoryWrite]] = field(default_factory=list)

    async def __call__(self, key: str, write: MemoryWrite) -> None:
        self.shown.append((key, write))

    @property
    def notices(self) -> list[str]:
        return [write.notice for _, write in self.shown]


def converse(workspace: Workspace, server: FakeOpenAIServer, texts: list[str], key: str = SESSION,
             receipts: Receipts | None = None, *, continue_background: bool = False) -> list[str]:
    """Send `texts` to one session, each turn's background work (summary, flush, receipts) awaited after it."""
    async def body(loop: AgentLoop) -> list[str]:
        replies = []
        for text in texts:
            replies.append((await loop.handle(key, text, remembered=receipts)).text)
            await loop.wait_background()
        return replies
    return with_agent(workspace, server, body, continue_background=continue_background)


def model(turns: list[Reply], flush: str | Callable[[str], str], summary: str = SUMMARY, again: str = ""
          ) -> Callable[[dict[str, Any]], Reply | str]:
    """A model answering turns from `turns` in order, the memory flush with `flush` (or `flush(conversation)`),
    summaries with `summary`, lesson reviews with NONE, and a turn asked again without tools after an empty answer
    (agent/empty_reply.py) with `again` (empty: the small model stays silent)."""
    queue = list(turns)

    def answer(body: dict[str, Any]) -> Reply | str:
        if is_flush_request(body):
            return flush(background_reading(body)) if callable(flush) else flush
        if is_summary_request(body):
            return summary
        if is_lesson_request(body):
            return "NONE"
        if "tools" not in body:
            return again
        return queue.pop(0) if queue else "ok"
    return answer


def entries(workspace: Workspace) -> list[str]:
    """MEMORY.md's entries, each its text under the `## ` heading."""
    text = workspace.store.read_long_term()
    return [block.split("\n", 1)[1].strip() for block in text.split("\n## ")[1:]]


def listed(items: list[str]) -> str:
    return "\n".join(f"- {item}" for item in items)


def seed(workspace: Workspace, server: FakeOpenAIServer, fact: str) -> None:
    """`fact` stored the way the session's first entry was: the user's own words, saved by memory_append."""
    server.responder = model([ToolCalls([("memory_append", {"content": fact})]), Text("Noted.")], "NONE")
    converse(workspace, server, [f"Please remember: {fact}"], key="cli:other")
    assert entries(workspace) == [fact]


# -- the real session --------------------------------------------------------------------------------------


def recorded_turns() -> tuple[list[str], list[Reply]]:
    """The REPL session's user messages, and the model's recorded replies (tool calls and texts) in order.

    The reply after a repeated tool call is left out: picoclaw no longer runs the repeat, and asks again without
    tools instead of asking for that reply (`model`'s `again` answers that)."""
    texts: list[str] = []
    replies: list[Reply] = []
    after_repeat = False
    for message in MESSAGES:
        if message["role"] == "user":
            texts.append(message["content"])
        elif message["role"] == "assistant" and after_repeat:
            after_repeat = False
        elif message["role"] == "assistant" and message.get("tool_calls"):
            call = ToolCalls([(call["function"]["name"], call["function"]["arguments"])
                              for call in message["tool_calls"]])
            after_repeat = bool(replies) and replies[-1] == call
            replies.append(call)
        elif message["role"] == "assistant":
            replies.append(Text(message["content"]))
    return texts, replies


def test_the_real_poisoned_flush_replayed_writes_none_of_its_junk(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    set_policy(workspace, session_summary_message_threshold=4, session_summary_keep_count=2)
    receipts = Receipts()
    with frozen():
        seed(workspace, fake_openai, USER_ENTRY)
        texts, replies = recorded_turns()
        # Every flush of the session answers with all eight of its entries; every summary with the real one.
        fake_openai.responder = model(replies, listed(JUNK), RECORDED_SUMMARY)
        converse(workspace, fake_openai, [*texts, "/new"], key="cli:repl", receipts=receipts)

    assert entries(workspace) == [USER_ENTRY]  # the real fact, once, and not one of the eight
    flushes = [body for body in fake_openai.chat_requests() if is_flush_request(body)]
    assert len(flushes) == 2  # before the summary and at /new (the turns that got no answer left no trace)
    # Nothing of the flush's was remembered, so none of it is shown as remembered. The user's own "answer me in
    # Chinese from now on" becomes a lesson in their words (the draft, NONE here, gave none): the turn before it
    # (a search, then no answer) is on record with its note, so the message corrects a reply. Scripted replies
    # under a frozen clock, background work awaited after each turn: this outcome, every run.
    assert [(write.source, write.by_user, write.text) for _, write in receipts.shown] == [
        ("lesson (correction)", True, 'The user asked: "answer me in Chinese from now on."')]
    counts = FlushCounts(workspace.store.memory_dir, storage=workspace.storage).read()
    assert counts is not None
    [day] = counts.values()
    assert day.runs == len(flushes) and day.proposed == len(JUNK) * len(flushes) and day.written == 0
    assert day.known == 2 * len(flushes)  # the two bold copies of the stored fact
    assert set(day.rejected) == {UNGROUNDED, ADVICE, QUESTION, REFUSAL}
    assert day.rejected[UNGROUNDED] == 3 * len(flushes)


def test_the_real_summary_claiming_an_unseen_answer_is_refused(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    set_policy(workspace, session_summary_message_threshold=4, session_summary_keep_count=2)
    with frozen():
        seed(workspace, fake_openai, USER_ENTRY)
        texts, replies = recorded_turns()
        fake_openai.responder = model(replies, "NONE", RECORDED_SUMMARY)
        converse(workspace, fake_openai, texts, key="cli:repl", continue_background=True)

    summaries = [body for body in fake_openai.chat_requests() if is_summary_request(body)]
    assert summaries  # asked for, and every one refused: no compaction, nothing in the daily note
    # Asked after the conversation (so a local server keeps it cached): the summariser sees the turn that got no
    # answer as such (no empty reply is stored), and is told what an unseen answer is.
    last = summaries[-1]
    assert is_continued(last) and UNSEEN in last["messages"][-1]["content"]
    assert any(CUT_SHORT in str(m["content"]) for m in last["messages"] if m["role"] == "assistant")
    assert not any(m["role"] == "assistant" and not m["content"] and not m.get("tool_calls") for m in last["messages"])
    assert records_of(workspace, "compaction", "cli:repl") == []
    assert "confirmed" not in today_note(workspace)


# -- the same kinds of junk in Chinese and in mixed text ------------------------------------------------------

ZH_STORED = "我对花生过敏，健身房柜子是317号，最喜欢的咖啡是燕麦拿铁。"
ZH_JUNK = ["**我对花生过敏**", "「健身房柜子是317号」", "我喜欢咖啡。", "我最喜欢的咖啡是美式咖啡。",
           "我最喜欢浓缩咖啡。", "建议睡前洗个热水澡，有助于睡眠。", "你最喜欢的咖啡是什么？",
           "抱歉，我无法回答这个问题。", "我是一个AI助手。"]
MIXED_STORED = "Allergic to peanuts 花生过敏; gym locker 317 柜子; coffee: oat-milk flat white 燕麦拿铁."
MIXED_JUNK = ["**Allergic to peanuts 花生过敏**", "My favorite 咖啡 is a black Americano 美式.",
              "Try 喝热牛奶 before bed to sleep better.", "我最喜欢的 coffee 是什么?",
              "Sorry, 我不能回答 that question.", "As an AI, I don't drink coffee."]


@pytest.mark.parametrize(("stored", "junk", "asked"), [
    (ZH_STORED, ZH_JUNK, ["我对什么过敏？健身房柜子是几号？", "我最喜欢的咖啡是什么？", "给我一个睡得更好的小建议。"]),
    (MIXED_STORED, MIXED_JUNK, ["What am I allergic to, 我的柜子几号?", "我最喜欢的 coffee 是什么?",
                                "One tip for sleeping better, 简短一点."]),
], ids=["chinese", "mixed"])
def test_junk_in_chinese_and_in_mixed_text_is_not_written(
        workspace: Workspace, fake_openai: FakeOpenAIServer, stored: str, junk: list[str], asked: list[str]) -> None:
    set_policy(workspace, session_summary_message_threshold=4, session_summary_keep_count=2)
    with frozen():
        seed(workspace, fake_openai, stored)
        # Every answer empty, as the small model's were, and a bare "好的" when asked again, so the
        # turns are kept; every flush proposes all the junk.
        fake_openai.responder = model([Text("")] * len(asked), listed(junk), again="好的。")
        converse(workspace, fake_openai, [*asked, "/new"], key="cli:repl")

    assert entries(workspace) == [stored]
    assert sum(is_flush_request(body) for body in fake_openai.chat_requests()) >= 2


# -- what is written -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("told", "proposed"), [
    ("By the way, my sister Anna lives in Lyon now.", "My sister Anna lives in Lyon."),
    ("顺便说一下，我女儿叫小雨，在上海读大学。", "用户的女儿叫小雨，在上海读大学。"),
    ("Note: my dentist is Dr. Okafor at 21 Baker Street, 我每半年去一次.", "Dentist: Dr. Okafor, 21 Baker Street."),
], ids=["english", "chinese", "mixed"])
def test_a_fact_the_user_stated_is_written_and_shown(
        workspace: Workspace, fake_openai: FakeOpenAIServer, told: str, proposed: str) -> None:
    set_policy(workspace, session_summary_message_threshold=4, session_summary_keep_count=2)
    receipts = Receipts()
    # The flush proposes the user's fact among junk; only the fact is written.
    fake_openai.responder = model([], lambda conversation: listed(
        [proposed, "I like coffee.", "Try going to bed earlier."] if told in conversation else []) or "NONE")
    with frozen():
        converse(workspace, fake_openai, [told, "ok", "/new"], receipts=receipts)

    assert entries(workspace) == [proposed]  # written once, in the model's words that say the user's
    assert receipts.notices == [f"remembered: {proposed}"]
    assert receipts.shown[0][0] == SESSION
    [logged] = WriteLog(workspace.store.memory_dir, storage=workspace.storage).recent()
    assert (logged.text, logged.source, logged.session, logged.by_user) == (proposed, "memory flush", SESSION, True)


@pytest.mark.parametrize(("told", "garble", "fact"), [
    ("My sister Lin lives in Hangzhou.", "Lin's sister is named Lin.", "Lin lives in Hangzhou."),
    ("我妹妹叫林林，她住在杭州。", "林林的妹妹叫林林。", "林林住在杭州。"),
    ("我妹妹叫Lin，她住在杭州。", "Lin的妹妹叫Lin。", "Lin住在杭州。"),
], ids=["english", "chinese", "mixed"])
def test_a_relation_made_up_of_the_users_words_is_not_written(
        workspace: Workspace, fake_openai: FakeOpenAIServer, told: str, garble: str, fact: str) -> None:
    # As a real 1.5B model did: every reply empty (a bare "好的。" when asked again), and the flush writes the user's
    # fact and a garble of it.
    set_policy(workspace, session_summary_message_threshold=4, session_summary_keep_count=2)
    fake_openai.responder = model([Text(""), Text("")], listed([fact, garble]), again="好的。")
    with frozen():
        converse(workspace, fake_openai, [told, "ok", "/new"])
    assert entries(workspace) == [fact]


@pytest.mark.parametrize(("old", "told", "update"), [
    ("My gym locker is number 217.", "They moved me: my gym locker is now number 305.",
     "My gym locker is now number 305."),
    ("我的狗叫豆豆。", "我的狗现在叫旺财了。", "我的狗现在叫旺财。"),
], ids=["english", "chinese"])
def test_a_grounded_update_supersedes_the_old_value_and_an_invented_one_does_not(
        workspace: Workspace, fake_openai: FakeOpenAIServer, old: str, told: str, update: str) -> None:
    set_policy(workspace, session_summary_message_threshold=4, session_summary_keep_count=2)
    with frozen("2025-03-01 02:00:00"):
        workspace.store.append_long_term(old)
    # First the user only asks: the flush's "update" is invented and is not written.
    fake_openai.responder = model([], listed([update]))
    with frozen():
        converse(workspace, fake_openai, ["Is that still right?", "我想确认一下。", "/new"])
    assert entries(workspace) == [old]
    # Then the user says it: the same update is written, and the older entry is marked, not deleted.
    with frozen():
        converse(workspace, fake_openai, [told, "ok", "/new"])
    text = workspace.store.read_long_term()
    assert entries(workspace)[-1] == update
    assert text.split(old, 1)[1].split("\n## ", 1)[0].strip().startswith("> superseded by the 2025-03-10 entry")


# -- memory_append ------------------------------------------------------------------------------------------


def test_memory_append_of_a_fact_the_user_never_gave_is_kept_marked_as_the_models(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    workspace.store.append_long_term("My gym locker is number 217.")
    receipts = Receipts()
    fake_openai.responder = model([ToolCalls([("memory_append", {"content": "My gym locker is number 305."})]),
                                   Text("Saved."),
                                   ToolCalls([("memory_append", {"content": "my gym locker is number 305"})]),
                                   Text("Already there.")], "NONE")
    with frozen():
        converse(workspace, fake_openai, ["hi", "and again"], receipts=receipts)

    model_entry = ("My gym locker is number 305.\nSource: the assistant, not the user's words; session "
                   f"{SESSION} (memory_append)")
    assert entries(workspace) == ["My gym locker is number 217.", model_entry]  # once, and 217 is not superseded
    assert receipts.notices == ["remembered (the assistant's words, not yours): My gym locker is number 305."]
    results = [m["content"] for body in fake_openai.chat_requests() for m in body["messages"] if m["role"] == "tool"]
    assert "marked as your words" in results[0] and results[-1].startswith("already stored: memory/MEMORY.md:")


def test_memory_append_of_what_the_user_said_is_theirs_and_junk_is_not_saved(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    receipts = Receipts()
    fake_openai.responder = model([
        ToolCalls([("memory_append", {"content": "我最喜欢的咖啡是什么？"}),
                   ("memory_append", {"content": "抱歉，我不能回答这个问题。"}),
                   ("memory_append", {"content": "My cat is called Mimi."})]),
        Text("Noted."),
        ToolCalls([("memory_append", {"content": "**My cat is called Mimi**"})]), Text("Yes.")], "NONE")
    with frozen():
        converse(workspace, fake_openai, ["remember: my cat is called Mimi", "you have it?"], receipts=receipts)

    assert entries(workspace) == ["My cat is called Mimi."]
    assert receipts.notices == ["remembered: My cat is called Mimi."]
    results = [m["content"] for body in fake_openai.chat_requests() for m in body["messages"] if m["role"] == "tool"]
    assert results[0].startswith("not saved: that is no fact about the user (question)")
    assert results[1].startswith("not saved: that is no fact about the user (apology or refusal)")
    assert results[-1].startswith("already stored: memory/MEMORY.md:")


# -- summaries ------------------------------------------------------------------------------------------------


def test_a_summary_claiming_an_answer_after_empty_replies_is_refused_and_an_honest_one_is_kept(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    set_policy(workspace, session_summary_message_threshold=4, session_summary_keep_count=2)
    claiming = SUMMARY.replace("## Progress\nTalked.", "## Progress\n助手确认了用户对花生过敏。")
    # Each turn a search, then nothing, also when asked again: the turn is kept (its search, with a note that no
    # answer came) and the user saw no answer (an empty reply itself is never stored).
    # A turn that fails starts no summary: the one after the fourth turn (answered, and kept out of the summary
    # by session_summary_keep_count) folds the three silent ones.
    silent = [ToolCalls([("memory_search", {"query": "过敏 allergy"})]), Text("")]
    fake_openai.responder = model([*silent * 3, Text("在的。")], "NONE", claiming)
    with frozen():
        converse(workspace, fake_openai, ["我对什么过敏？", "还有呢？", "说话呀", "在吗？"])
    assert any(is_summary_request(body) for body in fake_openai.chat_requests())
    assert records_of(workspace, "compaction") == []
    assert today_note(workspace) == ""

    fake_openai.responder = model([Text("你好。")], "NONE", SUMMARY)
    with frozen():
        converse(workspace, fake_openai, ["hello?"])
    [compaction] = records_of(workspace, "compaction")
    assert compaction["summary"] == SUMMARY and "Summary of session" in today_note(workspace)


def test_the_summariser_is_shown_empty_replies_and_claims_only_count_without_a_seen_answer() -> None:
    empty = [{"role": "user", "content": "What am I allergic to?"}, {"role": "assistant", "content": ""}]
    assert render_transcript(empty).endswith(f"Assistant: {EMPTY_REPLY}")
    claim = "## Key decisions\n- The assistant confirmed the user's allergies as peanuts."
    assert unseen_answer_claims(claim, empty) == ["The assistant confirmed the user's allergies as peanuts."]
    undelivered = [empty[0], {"role": "assistant", "content": "Peanuts.\n\n(not delivered: network down)"}]
    assert unseen_answer_claims(claim, undelivered) != []
    answered = [empty[0], {"role": "assistant", "content": "Peanuts."}]
    assert unseen_answer_claims(claim, answered) == []
    assert unseen_answer_claims(claim, empty, previous=claim) == []  # the earlier summary's claim, carried on
    assert unseen_answer_claims("## Progress\nThe assistant searched memory for allergies.", empty) == []


@pytest.mark.parametrize(("messages", "summary", "unseen"), [
    ([{"role": "user", "content": "What am I allergic to?"}, {"role": "assistant", "content": ""},
      {"role": "user", "content": "How do I order my coffee?"},
      {"role": "assistant", "content": "Oat-milk flat white."}],
     "## Progress\n- The assistant confirmed the user's allergies as peanuts. The assistant told the user their "
     "coffee order is an oat-milk flat white.",
     ["The assistant confirmed the user's allergies as peanuts."]),
    ([{"role": "user", "content": "我对什么过敏？"}, {"role": "assistant", "content": ""},
      {"role": "user", "content": "我的咖啡怎么点？"}, {"role": "assistant", "content": "燕麦奶拿铁，不加糖。"}],
     "## 进展\n- 助手确认了用户对花生过敏。助手告诉用户咖啡是燕麦奶拿铁。",
     ["助手确认了用户对花生过敏。"]),
], ids=["english", "chinese"])
def test_a_claim_about_a_turn_whose_reply_was_not_seen_counts_beside_one_that_was(
        messages: list[dict[str, str]], summary: str, unseen: list[str]) -> None:
    # One reply of the part was seen: a claim is the unseen turn's when it is closer to it than to the seen one.
    assert unseen_answer_claims(summary, messages) == unseen


# -- what is measured, on both storage backends ---------------------------------------------------------------


def test_memory_stats_counts_what_the_flush_proposed_wrote_knew_and_rejected(
        workspace: Workspace, fake_openai: FakeOpenAIServer, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    set_policy(workspace, session_summary_message_threshold=4, session_summary_keep_count=2)
    # The window is 30 days, today (2025-03-10) included: 2025-02-08 is outside it, 2025-02-09 inside.
    counts = FlushCounts(workspace.memory_dir, storage=workspace.storage)
    counts.add(date(2025, 2, 8), FlushTally(5, 9, 9, 0, {}))
    counts.add(date(2025, 2, 9), FlushTally(1, 1, 0, 0, {ADVICE: 1}))
    caplog.set_level("INFO", logger="picoclaw.curation.flush")
    fake_openai.responder = model([], lambda conversation: listed(
        ["My sister Anna lives in Lyon.", "**My sister Anna lives in Lyon**", "I like coffee.",
         "What is my favourite coffee?"]) if "Anna" in conversation else "NONE")
    with frozen():
        converse(workspace, fake_openai, ["My sister Anna lives in Lyon.", "ok", "/new"])
        assert main(["memory", "stats"]) == 0
        text = capsys.readouterr().out
        assert main(["memory", "stats", "--json"]) == 0
        stats = json.loads(capsys.readouterr().out)

    line = next(line for line in text.splitlines() if line.startswith("memory flush:"))
    assert line.endswith("5 facts proposed over 2 runs (last 30 days): 1 written, 1 already known, 3 rejected "
                         "(1 advice, 1 not in the user's words, 1 question)")
    assert stats["flush"] == {"runs": 2, "proposed": 5, "written": 1, "known": 1,
                              "rejected": {ADVICE: 1, QUESTION: 1, UNGROUNDED: 1}}
    # Each rejected fact is logged with its reason; none is shown as remembered.
    logged = [record.getMessage() for record in caplog.records if "not written" in record.getMessage()]
    assert any(f"({QUESTION}): 'What is my favourite coffee?'" in message for message in logged)
    assert any(f"({UNGROUNDED}): 'I like coffee.'" in message for message in logged)
    assert stats["flush_enabled"] is True


def _open(kind: str, root: Path, dsn: str) -> Storage:
    if kind == "postgres":
        from picoclaw.storage.postgres.storage import PostgresStorage

        return PostgresStorage(root, dsn, 3)
    return FilesStorage(root)


@pytest.mark.parametrize("kind", ["files", "postgres"])
def test_flush_counts_and_the_write_log_are_kept_by_either_backend(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    dsn = request.getfixturevalue("postgres_dsn") if kind == "postgres" else ""
    # On PostgreSQL a second machine (its own folder) reads what the first wrote; on files, the same folder.
    first, second = tmp_path / "machine1", (tmp_path / "machine2" if kind == "postgres" else tmp_path / "machine1")
    storages = [_open(kind, first, dsn)] + ([_open(kind, second, dsn)] if second != first else [])
    mine, theirs = storages[0], storages[-1]
    try:
        day = date(2025, 3, 10)
        FlushCounts(first / "memory", storage=mine).add(day, FlushTally(1, 3, 1, 1, {UNGROUNDED: 1}))
        FlushCounts(first / "memory", storage=mine).add(day, FlushTally(1, 2, 0, 0, {QUESTION: 1, UNGROUNDED: 1}))
        WriteLog(first / "memory", storage=mine).record(
            [MemoryWrite("MEMORY.md", "我女儿叫小雨。", "memory flush", "cli:a")])

        counts = FlushCounts(second / "memory", storage=theirs).read()
        assert counts == {"2025-03-10": FlushTally(2, 5, 1, 1, {UNGROUNDED: 2, QUESTION: 1})}
        [write] = WriteLog(second / "memory", storage=theirs).recent()
        assert (write.text, write.source, write.session) == ("我女儿叫小雨。", "memory flush", "cli:a")
    finally:
        for storage in storages:
            storage.close()


# -- the receipt in the terminal ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_repl_prints_each_receipt_above_the_prompt_and_memory_recent_lists_them(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai, session_summary_message_threshold=4, session_summary_keep_count=2)
    fake_openai.responder = model([Text("Nice!"), Text("ok"), Text("ok")], lambda conversation: listed(
        ["My sister Anna lives in Lyon.", "I like coffee."]) if "Anna" in conversation else "NONE")

    result = picoclaw(home, "chat", stdin="My sister Anna lives in Lyon.\nhow are you?\nfine\nexit\n")

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # Shown once, after the answer whose summary ran the flush; the coffee the user never mentioned, never.
    assert lines.count("✍ remembered: My sister Anna lives in Lyon.") == 1
    assert not any("coffee" in line for line in lines)
    listed_now = picoclaw(home, "chat", "-m", "/memory recent")
    assert listed_now.returncode == 0, listed_now.stderr
    heading, *recent = listed_now.stdout.splitlines()
    assert heading == "Written to memory lately (newest first):" and len(recent) == 1
    assert re.fullmatch(r"- \d{4}-\d\d-\d\d \d\d:\d\d  MEMORY\.md  memory flush, session cli:default: "
                        r"My sister Anna lives in Lyon\.", recent[0])


def test_memory_recent_with_nothing_written(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    assert converse(workspace, fake_openai, ["/memory recent"]) == [
        "Nothing has been written to memory without a command of yours yet."]


def test_the_flush_checks_its_facts_off_the_event_loop(
        workspace: Workspace, fake_openai: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checking a flush's facts against 2,000 entries takes a while: the channels' turns must not wait on it."""
    threads: list[threading.Thread] = []
    real = flush_module.check

    def check(*args: Any) -> Any:
        threads.append(threading.current_thread())
        return real(*args)

    monkeypatch.setattr(flush_module, "check", check)
    set_policy(workspace, session_summary_message_threshold=4, session_summary_keep_count=2)
    fake_openai.responder = model([], lambda conversation: listed(
        ["My sister Anna lives in Lyon.", "我住在杭州"]) if "Anna" in conversation else "NONE")
    with frozen():
        converse(workspace, fake_openai, ["My sister Anna lives in Lyon. 我住在杭州。", "ok", "/new"])
    assert threads and threading.main_thread() not in threads
    assert entries(workspace) == ["My sister Anna lives in Lyon.", "我住在杭州"]
