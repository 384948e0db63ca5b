"""What goes into MEMORY.md: facts kept though the model never calls a tool (the memory flush), and nothing
stored twice."""

from __future__ import annotations

from typing import Any

import pytest

from picoclaw.curation.flush import parse_facts
from picoclaw.memory import supersede
from picoclaw.memory.entries import fingerprint
from picoclaw.memory.supersede import Statement
from picoclaw.memory.workspace import Workspace
from tests.agent_helpers import (
    FAST_RETRY,
    background_reading,
    chat,
    frozen,
    history,
    is_flush_request,
    is_summary_request,
    said,
    set_policy,
)
from tests.fakes import FakeOpenAIServer, Text

FACTS = ["My daughter Lily studies in Shanghai.", "我对青霉素过敏。", "My work phone is +86 138 0013 8000.",
         "我的健身房柜子是 217 号。", "My cat is called Mimi."]
CHATTER = ["how are you?", "今天天气怎么样？", "tell me a joke", "谢谢！", "ok, bye for now"]
SUMMARY = ("## Goal\nChat.\n## Constraints and preferences\nNone.\n## Progress\nTalked.\n## Key decisions\nNone.\n"
           "## Next steps\nNone.\n## Key context\nSee memory.")


def forgetful_model(body: dict[str, Any]) -> str:
    """A model that never calls a tool and claims to remember; asked to flush, it lists the facts it read."""
    if is_summary_request(body):
        return SUMMARY
    if is_flush_request(body):
        conversation = background_reading(body)
        found = [fact for fact in FACTS if fact in conversation]
        return "Here is what to keep:\n" + "\n".join(f"- {fact}" for fact in found) if found else "NONE"
    return "I have stored that in your long-term memory. 好的，我已经记住了。"


def memory_entries(workspace: Workspace) -> list[str]:
    text = workspace.store.read_long_term()
    return [block.split("\n", 1)[1].strip() for block in text.split("\n## ")[1:]]


def test_facts_told_to_a_model_that_never_saves_them_reach_memory_once(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    set_policy(workspace, session_summary_message_threshold=6, session_summary_keep_count=2)
    fake_openai.responder = forgetful_model
    texts = [text for pair in zip(FACTS, CHATTER) for text in pair]  # ten turns, a fact every other one

    with frozen():
        chat(workspace, fake_openai, texts)
        chat(workspace, fake_openai, ["/new"])  # what the last summary kept is flushed when it is set aside

    entries = memory_entries(workspace)
    assert sorted(entries) == sorted(FACTS)  # all five, each once
    # Flushed before each summary and at /new; the model never called memory_append.
    assert sum(is_flush_request(body) for body in fake_openai.chat_requests()) >= 3


def test_the_flush_can_be_turned_off(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    set_policy(workspace, session_summary_message_threshold=4, session_summary_keep_count=2,
               memory_flush_enabled=False)
    fake_openai.responder = forgetful_model

    chat(workspace, fake_openai, FACTS[:3])

    assert not any(is_flush_request(body) for body in fake_openai.chat_requests())
    assert memory_entries(workspace) == []


@pytest.mark.parametrize("answer", [
    "I'm sorry, I can't help with that.",
    "NONE",
    "",
    '{"facts": ["my cat is Mimi"]}',
    "Sure! The user likes coffee.\nThey also mentioned a cat.\n- maybe Mimi\nThat is all I can say here.",
    "- \n- 123\n- ---",
])
def test_a_flush_answer_that_is_not_a_list_of_facts_writes_nothing(
        workspace: Workspace, fake_openai: FakeOpenAIServer, answer: str) -> None:
    before = workspace.store.long_term_path.read_bytes()
    set_policy(workspace, session_summary_message_threshold=4, session_summary_keep_count=2)
    fake_openai.responder = lambda body: (SUMMARY if is_summary_request(body) else answer if is_flush_request(body)
                                          else "ok")

    chat(workspace, fake_openai, ["My cat is called Mimi.", "我的猫叫咪咪。", "hello"])

    assert any(is_flush_request(body) for body in fake_openai.chat_requests())
    assert workspace.store.long_term_path.read_bytes() == before


def test_parse_facts_reads_lists_in_both_languages() -> None:
    assert parse_facts("Facts:\n- My cat is Mimi.\n* 我对青霉素过敏。\n1. Locker 217") == [
        "My cat is Mimi.", "我对青霉素过敏。", "Locker 217"]
    assert parse_facts("none.") == []


def test_parse_facts_drops_emphasis_around_a_whole_fact() -> None:
    # Qwen2.5-Coder-1.5B's flush answer, as a real session stored it in MEMORY.md.
    assert parse_facts("- **My sister Lin lives in Hangzhou**\n- __我妹妹住在杭州。__\n- *Locker 317*") == [
        "My sister Lin lives in Hangzhou", "我妹妹住在杭州。", "Locker 317"]
    # Emphasis inside a fact is the user's own: kept.
    assert parse_facts("- My **new** locker is 317") == ["My **new** locker is 317"]


# -- no duplicates -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("first", "again"), [
    ("My dog is called Bob.", "my dog is called bob"),
    ("我的猫叫咪咪，三岁。", "我的猫叫咪咪, 三岁"),
    ("Locker 217, gym B", "ＬＯＣＫＥＲ ２１７ gym b"),  # full-width forms
])
def test_the_same_memory_append_twice_leaves_one_entry(
        workspace: Workspace, fake_openai: FakeOpenAIServer, first: str, again: str) -> None:
    fake_openai.reply_tool_calls([("memory_append", {"content": first})])
    fake_openai.reply_text("saved")
    fake_openai.reply_tool_calls([("memory_append", {"content": again})])
    fake_openai.reply_text("already there")

    # The user gives the fact (a fact they never gave is saved too, marked as the model's: test_grounding.py).
    chat(workspace, fake_openai, [f"remember this: {first}", "remember this again"])

    assert memory_entries(workspace) == [first]
    second_result = history(fake_openai.chat_requests()[3])[-1]
    assert second_result["role"] == "tool" and second_result["content"].startswith("already stored: memory/MEMORY.md:")
    assert fingerprint(first) == fingerprint(again)


def test_a_retried_failed_turn_leaves_one_entry(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    fact = "Allergic to penicillin / 青霉素过敏"
    fake_openai.reply_tool_calls([("memory_append", {"content": fact})])
    fake_openai.reply_error(503, "overloaded", headers=FAST_RETRY)  # the answer after the tool fails
    fake_openai.reply_tool_calls([("memory_append", {"content": fact})])  # the user sends it again
    fake_openai.reply_text(Text("Noted. 记住了。").text)

    first, second = chat(workspace, fake_openai, ["remember: penicillin allergy / 我对青霉素过敏"] * 2)

    assert first.startswith("Sorry, I could not get an answer") and second == "Noted. 记住了。"
    assert memory_entries(workspace) == [fact]
    # The second turn's request showed the first turn's tool call and its result.
    retried = fake_openai.chat_requests()[2]
    assert any(m.get("tool_calls") for m in history(retried))
    assert said(history(retried)[-1]).startswith("remember: penicillin")


# -- updates -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("old", "update"), [
    ("My dog is called Bob.", "My dog is now called Max."),
    ("我的狗叫豆豆。", "我的狗现在叫旺财。"),
    ("My gym locker is number 217.", "My gym locker is number 305."),
    # Japanese and Korean count by the character, as Chinese does: "62キロ" and "217번" are a number and
    # its unit, so the same fact with a new number is an update.
    ("体重は62キロです。", "体重は58キロです。"),
    ("헬스장 사물함은 217번입니다.", "헬스장 사물함은 305번입니다."),
    # An update need only restate what the older entry's first clause is about, not its every detail.
    ("My sister Claire lives in Lyon; she works at a bakery in the old town.",
     "My sister Claire moved to Toronto in August."),
    ("我姐姐住在成都，在一家银行上班。", "姐姐八月份搬去深圳住了，在一家医院工作。"),
    # 新 says "new" as the English word does.
    ("My manager is Sarah Lee; our one-to-ones are on Mondays.", "Sarah Lee left the company, my new manager is Raj."),
    ("我的领导是张经理，每周一开一对一。", "张经理离职了，新领导是刘总监。"),
])
def test_an_update_keeps_the_older_entry_and_marks_it_superseded(
        workspace: Workspace, old: str, update: str) -> None:
    store = workspace.store
    with frozen("2025-03-01 02:00:00"):
        store.append_long_term(old)
        store.append_long_term("My cat is called Mimi. 我的猫叫咪咪。")
    with frozen("2025-03-12 02:00:00"):
        entry = store.append_long_term(update)

    text = store.read_long_term()
    assert entry.new and text.endswith(f"## 2025-03-12\n{update}\n")
    older = text.split(old, 1)[1].split("\n## ", 1)[0]
    assert older.strip() == f"> superseded by the 2025-03-12 entry: {update}"  # nothing deleted, marked
    assert "Mimi" in text and text.count("> superseded") == 1  # the unrelated entry is left alone
    assert len(store.backups()) >= 1  # the marked file was backed up first, like any change


@pytest.mark.parametrize(("old", "unrelated"), [
    # Says "moved" and shares words with the older entry, but not what its first clause is about.
    ("My sister Claire lives in Lyon; she works at a bakery in the old town.",
     "My brother Tom moved to Berlin and works at a bakery too."),
    ("我姐姐住在成都，在一家银行上班。", "哥哥搬到杭州了，也在一家银行上班。"),
    # One word (in Chinese, two characters: 医生) of a longer subject is not enough.
    ("My dentist is Dr. Kim, check-up every six months.", "Registered with a new GP: Dr. Okafor."),
    ("牙医是陈医生，每半年检查一次。", "家庭医生改为协和医院的李医生了。"),
    # "news" and 新闻 are not "new": nothing here says it is an update.
    ("My manager is Sarah Lee.", "Sarah Lee was in the news today, my manager."),
    ("我的领导是张经理。", "张经理在新闻里出现了，他是我的领导。"),
])
def test_an_update_of_something_else_does_not_mark_an_entry_it_shares_words_with(
        workspace: Workspace, old: str, unrelated: str) -> None:
    store = workspace.store
    store.append_long_term(old)
    store.append_long_term(unrelated)
    assert "superseded" not in store.read_long_term()


@pytest.mark.parametrize("template", ["Project {n}: the review with Dana is on Thursday at the office.",
                                      "项目{n}：和王芳的评审在周四，在办公室。"])
def test_an_append_reads_each_older_entry_once_not_at_every_append(
        workspace: Workspace, monkeypatch: pytest.MonkeyPatch, template: str) -> None:
    """Look-alike entries (they share their terms, so the update rule compares every pair): the rule reads an
    older entry's words once, not again at every later append, nor the new entry once per older one."""
    read: list[str] = []
    of = Statement.of.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(Statement, "of", classmethod(lambda cls, text: read.append(text) or of(cls, text)))
    supersede._statement.cache_clear()
    store = workspace.store
    for n in range(40):
        store.append_long_term(template.format(n=n))
    assert len(read) == len(set(read)) == 40  # each text once: the new entry's when it was new
    # The same verdicts: the same words with another number update the entry before (once marked, it is skipped).
    assert store.read_long_term().count("> superseded by") == 39


def test_what_is_not_an_update_marks_nothing(workspace: Workspace) -> None:
    store = workspace.store
    store.append_long_term("My dog is called Bob.")
    for text in ("My dog likes the park.", "I now live in Berlin.", "我现在住在杭州。",
                 "My sister Anna lives in Munich."):
        store.append_long_term(text)
    assert "superseded" not in store.read_long_term()
