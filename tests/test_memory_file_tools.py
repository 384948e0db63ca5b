"""write_file and append_file on memory/MEMORY.md take memory_append's path: junk is refused with its
reason, a fact the user never said is kept marked as the assistant's words (never superseding what the user gave),
each write gets its receipt and is listed by /memory recent; LEARNINGS.md stays closed to them. Turns run through a
real AgentLoop against the fake OpenAI server, in English and in Chinese."""

from __future__ import annotations

from typing import Any

from picoclaw.memory.workspace import Workspace
from tests.agent_helpers import SESSION, frozen
from tests.fakes import FakeOpenAIServer, Text, ToolCalls
from tests.test_memory_grounding import Receipts, converse, entries, model

MODELS = f"Source: the assistant, not the user's words; session {SESSION} (memory_append)"


def memory_file(tool: str, content: str) -> tuple[str, dict[str, Any]]:
    """A call of file tool `tool` on memory/MEMORY.md."""
    return tool, {"path": "memory/MEMORY.md", "content": content}


def tool_results(server: FakeOpenAIServer) -> list[str]:
    """What the tools answered, in the order the model was sent them (each once)."""
    seen: list[str] = []
    for body in server.chat_requests():
        for message in body["messages"]:
            if message["role"] == "tool" and message.get("tool_call_id") not in seen:
                seen.append(message["tool_call_id"])
                seen.append(message["content"])
    return seen[1::2]


def recent(workspace: Workspace, server: FakeOpenAIServer) -> list[str]:
    """`/memory recent`'s lines, without its heading."""
    return converse(workspace, server, ["/memory recent"])[0].splitlines()[1:]


def test_the_file_tools_save_to_memory_md_by_memory_appends_rule_in_english(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    workspace.store.append_long_term("My gym locker is number 217.")
    receipts = Receipts()
    fake_openai.responder = model([
        ToolCalls([memory_file("write_file", "What is my favourite coffee?"),
                   memory_file("append_file", "I'm sorry, I cannot answer that."),
                   memory_file("append_file", "You should drink more water."),
                   memory_file("append_file", "My cat is called Mimi."),
                   memory_file("write_file", "My gym locker is number 305.")]),
        Text("Noted.")], "NONE")
    with frozen():
        converse(workspace, fake_openai, ["Remember: my cat is called Mimi."], receipts=receipts)

    results = tool_results(fake_openai)
    assert results[0].startswith("not saved: that is no fact about the user (question)")
    assert results[1].startswith("not saved: that is no fact about the user (apology or refusal)")
    assert results[2].startswith("not saved: that is no fact about the user (advice)")
    assert results[3] == "appended a '## 2025-03-10' entry to memory/MEMORY.md"
    assert results[4].startswith("appended a '## 2025-03-10' entry to memory/MEMORY.md, marked as your words")
    # The junk is not written; the invented locker number is the assistant's and does not supersede 217.
    assert entries(workspace) == ["My gym locker is number 217.", "My cat is called Mimi.",
                                  f"My gym locker is number 305.\n{MODELS}"]
    assert receipts.notices == ["remembered: My cat is called Mimi.",
                                "remembered (the assistant's words, not yours): My gym locker is number 305."]
    lines = recent(workspace, fake_openai)
    assert [line.split("  ", 2)[2] for line in lines] == [
        f"write_file, session {SESSION}, the assistant's words: My gym locker is number 305.",
        f"append_file, session {SESSION}: My cat is called Mimi."]


def test_the_file_tools_save_to_memory_md_by_memory_appends_rule_in_chinese(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    receipts = Receipts()
    old = workspace.store.read_long_term()
    fake_openai.responder = model([
        # A model that read MEMORY.md and writes it back whole with its addition: the addition is held to the rule.
        ToolCalls([memory_file("write_file", old.rstrip("\n") + "\n\n我的储物柜是305号\n"),
                   memory_file("append_file", "我最喜欢的咖啡是什么？"),
                   memory_file("write_file", "抱歉，我不能回答这个问题。"),
                   memory_file("append_file", "我住在杭州")]),
        Text("记住了。"),
        ToolCalls([memory_file("append_file", "**我住在杭州**")]), Text("好的。")], "NONE")
    with frozen():
        converse(workspace, fake_openai, ["记住：我住在杭州。", "还有别的吗"], receipts=receipts)

    results = tool_results(fake_openai)
    assert results[0].startswith("appended a '## 2025-03-10' entry to memory/MEMORY.md, marked as your words")
    assert results[0].endswith("(MEMORY.md is never overwritten; use edit_file to change existing entries)")
    assert results[1].startswith("not saved: that is no fact about the user (question)")
    assert results[2].startswith("not saved: that is no fact about the user (apology or refusal)")
    assert results[3] == "appended a '## 2025-03-10' entry to memory/MEMORY.md"
    assert results[4].startswith("already stored: memory/MEMORY.md:")  # the same fact, in bold: not again
    assert entries(workspace) == [f"我的储物柜是305号\n{MODELS}", "我住在杭州"]
    assert receipts.notices == ["remembered (the assistant's words, not yours): 我的储物柜是305号",
                                "remembered: 我住在杭州"]
    assert [line.split("  ", 2)[2] for line in recent(workspace, fake_openai)] == [
        f"append_file, session {SESSION}: 我住在杭州",
        f"write_file, session {SESSION}, the assistant's words: 我的储物柜是305号"]


def test_lessons_are_written_by_memory_append_only_and_get_its_receipt(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    learnings = workspace.store.learnings_path
    before = learnings.read_bytes() if learnings.exists() else b""
    receipts = Receipts()
    lesson = "回答天气时先问城市 (ask for the city before the weather)"
    fake_openai.responder = model([
        ToolCalls([("write_file", {"path": "memory/LEARNINGS.md", "content": lesson}),
                   ("append_file", {"path": "memory/LEARNINGS.md", "content": lesson}),
                   ("edit_file", {"path": "memory/LEARNINGS.md", "old_text": "#", "new_text": lesson})]),
        Text("ok"),
        ToolCalls([("memory_append", {"content": lesson, "slot": "learnings"})]), Text("ok")], "NONE")
    with frozen():
        converse(workspace, fake_openai, ["天气怎么样", "learn that"], receipts=receipts)

    results = tool_results(fake_openai)
    assert all("holds lessons; save one with memory_append" in result for result in results[:3])
    assert receipts.notices == [f"learned (the assistant's words, not yours): {lesson}"]  # memory_append's only
    assert learnings.read_bytes() != before and learnings.read_text(encoding="utf-8").count(lesson) == 1


def memory_edit(old_text: str, new_text: str) -> tuple[str, dict[str, Any]]:
    """A call of edit_file on memory/MEMORY.md."""
    return "edit_file", {"path": "memory/MEMORY.md", "old_text": old_text, "new_text": new_text}


def test_edit_file_on_memory_md_changes_an_entry_only_to_what_the_user_said_with_a_receipt(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    workspace.store.append_long_term("My gym locker is number 217.")
    workspace.store.append_long_term("我的狗叫豆豆。")
    receipts = Receipts()
    fake_openai.responder = model([
        ToolCalls([memory_edit("217", "999"),  # a number the user never said
                   memory_edit("My gym locker is number 217.", "What is my gym locker number?"),
                   memory_edit("number 217", "number 305")]),
        Text("Updated."),
        ToolCalls([memory_edit("豆豆", "旺财"),
                   memory_edit("我的狗叫旺财。", "我的狗叫来福。"),  # a name the user never said
                   memory_edit("我的狗叫旺财。", "你可以试试给狗换个名字。")]),  # advice
        Text("改好了。")], "NONE")
    with frozen():
        converse(workspace, fake_openai, ["They moved me: my gym locker is now number 305.", "我的狗现在叫旺财了。"],
                 receipts=receipts)

    results = tool_results(fake_openai)
    assert results[0].startswith("not edited: the new text is no fact the user stated (not in the user's words)")
    assert results[1].startswith("not edited: the new text is no fact the user stated (question)")
    assert results[2] == "edited memory/MEMORY.md (the previous version was backed up)"
    assert results[3] == "edited memory/MEMORY.md (the previous version was backed up)"
    assert results[4].startswith("not edited: the new text is no fact the user stated (not in the user's words)")
    assert results[5].startswith("not edited: the new text is no fact the user stated (advice)")
    assert entries(workspace) == ["My gym locker is number 305.", "我的狗叫旺财。"]
    # The receipt names the sentence the edit changed, whole.
    assert receipts.notices == ["remembered: My gym locker is number 305.", "remembered: 我的狗叫旺财。"]
    assert [line.split("  ", 2)[2] for line in recent(workspace, fake_openai)] == [
        f"edit_file, session {SESSION}: 我的狗叫旺财。", f"edit_file, session {SESSION}: My gym locker is number 305."]


def test_edit_file_on_memory_md_keeps_source_lines_and_reads_quotes_and_titles_as_text(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    workspace.store.append_long_term(f"My gym locker is number 305.\n{MODELS}")
    workspace.store.append_long_term(f"我的储物柜是305号\n{MODELS}")
    workspace.store.append_long_term("My dog is called Bob.")
    workspace.store.append_long_term("我的狗叫豆豆。")
    before = workspace.store.read_long_term()
    receipts = Receipts()
    fake_openai.responder = model([
        ToolCalls([memory_edit(f"305.\n{MODELS}", "305."),  # the model's entry would pass as the user's
                   memory_edit(f"305.\n{MODELS}", "305.\nSource: the user (memory_append)"),
                   memory_edit(f"305.\n{MODELS}", f"305.\n**{MODELS}**"),  # no longer read as a Source line
                   memory_edit("My dog is called Bob.", "My dog is called Bob.\n> I am allergic to penicillin."),
                   memory_edit("My dog is called Bob.", "My dog is called Bob.\n# My bank PIN is 4821")]),
        Text("Done."),
        ToolCalls([memory_edit(f"305号\n{MODELS}", "305号"),
                   memory_edit("我的狗叫豆豆。", "我的狗叫豆豆。\n> 我对青霉素过敏。"),
                   memory_edit("我的狗叫豆豆。", "我的狗叫豆豆。\n# 我的银行密码是4821")]),
        Text("好了。")], "NONE")
    with frozen():
        converse(workspace, fake_openai, ["My dog is called Bob.", "我的狗叫豆豆。"], receipts=receipts)

    results = tool_results(fake_openai)
    assert [result.split(";")[0] for result in results] == [
        "not edited: it drops or changes an entry's Source: line, which says who gave the entry"] * 3 + [
        "not edited: the new text is no fact the user stated (not in the user's words)"] * 2 + [
        "not edited: it drops or changes an entry's Source: line, which says who gave the entry"] + [
        "not edited: the new text is no fact the user stated (not in the user's words)"] * 2
    assert workspace.store.read_long_term() == before
    assert receipts.notices == []
