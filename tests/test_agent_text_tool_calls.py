"""Tool calls written as text, through a real AgentLoop turn: every reply of the real-model corpus as the
model's first answer (plain and streamed), the provider's `text_tool_calls: "off"`, and hostile replies.

What a reply must become follows the rule of picoclaw/tools/text_tool_calls.py, taken from the hand-written
table of tests/test_text_tool_calls.py (EXPECTED). A turn offers every tool, so the three corpus
replies that stay text there because their request offered none do become calls here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from picoclaw.agent.loop import AgentLoop
from picoclaw.memory.workspace import Workspace
from picoclaw.tools.registry import TOOL_CLASSES
from tests.agent_helpers import (
    SESSION,
    chat,
    frozen,
    history,
    records_of,
    session_path,
    today_note,
    with_agent,
    write_memory,
)
from tests.fakes import FakeOpenAIServer
from tests.test_text_tool_calls import EXPECTED, Call
from tests.test_text_tool_calls import Text as StaysText

CORPUS_PATH = Path(__file__).resolve().parent / "data" / "real-model" / "text_tool_calls.json"
CORPUS: list[dict[str, Any]] = json.loads(CORPUS_PATH.read_text(encoding="utf-8"))
TURN_TOOLS = [cls.name for cls in TOOL_CLASSES]  # what every turn offers

QUESTION = "记住我的行程，然后查一下 / remember my trip, then look it up"
MEMORY = ["## 2025-03-01\nMy dog is called Bob, a corgi. 我的狗叫 Bob。",
          "## 2025-03-02\n我女儿在杭州的学军小学读书。My daughter goes to school in Hangzhou.",
          "## 2025-03-03\nJapan trip: Kyoto 3 days, Osaka 2 days. 京都有三天，大阪两天。"]
SECOND = "好的，已经处理。Done: handled it."


def fenced_call(content: str) -> Call:
    """The call in a reply that opens with a ```json fence, read by hand (not by the parser under test)."""
    assert content.startswith("```json\n"), content
    call = json.loads(content.removeprefix("```json\n").split("\n```", 1)[0])
    return Call(call["name"], call["arguments"])


def expected_in_a_turn(index: int) -> Call | StaysText:
    """What corpus reply `index` must become in a turn, which offers every tool."""
    entry, (_, expected) = CORPUS[index], EXPECTED[index]
    if entry["tools_offered"]:
        # The same offer as a turn's, but for the tools added after the corpus was recorded.
        later = ("cron", "skill", "web_fetch")
        assert sorted(entry["tools_offered"]) == sorted(name for name in TURN_TOOLS if name not in later)
        return expected
    # Recorded from a request that offered no tools (a summary): text there, a call with the turn's offer.
    assert isinstance(expected, StaysText)
    return fenced_call(entry["assistant_message"]["content"])


def test_the_corpus_and_the_table_line_up() -> None:
    assert len(CORPUS) == len(EXPECTED) == 26
    in_a_turn = [expected_in_a_turn(index) for index in range(len(CORPUS))]
    calls = [index for index, expected in enumerate(in_a_turn) if isinstance(expected, Call)]
    assert len(calls) == 22  # the 19 of the table, and the three recorded without tools
    assert [index for index, entry in enumerate(CORPUS) if not entry["tools_offered"]] == [11, 13, 20]


def run_turn(workspace: Workspace, server: FakeOpenAIServer, *, streamed: bool, text_tool_calls: str = "auto",
             question: str = QUESTION) -> tuple[str, list[str], list[tuple[str, str]]]:
    """One turn; returns the reply, what reached `on_text` (streamed only) and what reached `on_tool`."""
    pieces: list[str] = []
    tools: list[tuple[str, str]] = []

    async def on_text(piece: str) -> None:
        pieces.append(piece)

    async def on_tool(name: str, arguments: str) -> None:
        tools.append((name, arguments))

    async def body(loop: AgentLoop) -> str:
        reply = await loop.handle(SESSION, question, on_text=on_text if streamed else None, on_tool=on_tool)
        assert reply.error is None, reply
        return reply.text

    with frozen():
        reply = with_agent(workspace, server, body, text_tool_calls=text_tool_calls)
    return reply, pieces, tools


def stored_roles(workspace: Workspace) -> list[str]:
    return [record["message"]["role"] for record in records_of(workspace, "message")]


# -- the corpus, reply by reply ------------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("index", range(len(CORPUS)), ids=[name for name, _ in EXPECTED])
def test_corpus_reply_through_a_turn(workspace: Workspace, fake_openai: FakeOpenAIServer, index: int,
                                     streamed: bool) -> None:
    content = CORPUS[index]["assistant_message"]["content"]
    expected = expected_in_a_turn(index)
    memory_before = write_memory(workspace, MEMORY)
    fake_openai.reply_text(content)
    fake_openai.reply_text(SECOND)

    reply, pieces, tools = run_turn(workspace, fake_openai, streamed=streamed)

    requests = fake_openai.chat_requests()
    assert all(body.get("stream", False) is streamed for body in requests)
    if isinstance(expected, StaysText):
        assert reply == content, expected.reason
        assert len(requests) == 1 and fake_openai.pending() == 1  # no call was run, so no second request
        assert tools == []
        if streamed:
            assert "".join(pieces) == content  # held back or not, all of it reaches the screen once
        assert workspace.store.read_long_term() == memory_before and today_note(workspace) == ""
        assert stored_roles(workspace) == ["user", "assistant"]
        assert records_of(workspace, "message")[1]["message"] == {"role": "assistant", "content": content}
        return

    assert reply == SECOND
    assert len(requests) == 2 and fake_openai.pending() == 0
    assistant, result = history(requests[1])[-2:]
    [call] = assistant["tool_calls"]
    assert call["function"]["name"] == expected.name
    assert json.loads(call["function"]["arguments"]) == expected.arguments
    assert assistant["content"] == expected.before  # "" or the lead-in line, never the call's JSON
    assert result == {"role": "tool", "tool_call_id": call["id"], "content": result["content"]}
    assert [(name, json.loads(arguments)) for name, arguments in tools] == [(expected.name, expected.arguments)]
    assert stored_roles(workspace) == ["user", "assistant", "tool", "assistant"]
    if streamed:
        # A reply that opens like a call is held back and dropped; one that opens with a lead-in line of
        # prose streams as it comes (streaming.py's rule), the call's text with it.
        shown_first = content if expected.before else ""
        assert "".join(pieces) == shown_first + SECOND

    if expected.name == "memory_append":
        fact = expected.arguments["content"]
        if expected.arguments.get("slot", "long_term") == "long_term":
            assert result["content"].startswith("saved to memory/MEMORY.md")
            assert fact in workspace.store.read_long_term() and fact not in memory_before
            assert today_note(workspace) == ""
        else:
            assert result["content"].startswith("saved to today's daily note")
            assert fact in today_note(workspace)
            assert workspace.store.read_long_term() == memory_before
    else:
        assert expected.name == "memory_search"
        # The real search ran on the real MEMORY.md, and its passages went back to the model.
        query = expected.arguments["query"].strip()
        assert re.match(rf"\d+ match(es)? for {re.escape(repr(query))}", result["content"]), result["content"]
        assert any(block.split("\n", 1)[1] in result["content"] for block in MEMORY)
        assert workspace.store.read_long_term() == memory_before and today_note(workspace) == ""


# -- hand-written replies ------------------------------------------------------------------------------------


def call_json(name: str, arguments: Any) -> str:
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def fence(body: str) -> str:
    return f"```json\n{body}\n```"


def test_a_chinese_lead_in_and_a_long_term_fact(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    content = "我来记下这件事。\n\n" + fence(call_json("memory_append", {"content": "我的狗叫 Bob，是柯基。"}))
    fake_openai.reply_text(content)
    fake_openai.reply_text("记住了：你的狗叫 Bob。")

    reply, pieces, tools = run_turn(workspace, fake_openai, streamed=True, question="记住：我的狗叫 Bob")

    assert reply == "记住了：你的狗叫 Bob。"
    assistant, result = history(fake_openai.chat_requests()[1])[-2:]
    assert assistant["content"] == "我来记下这件事。"
    assert assistant["tool_calls"][0]["function"]["arguments"] == '{"content": "我的狗叫 Bob，是柯基。"}'
    assert result["content"].startswith("saved to memory/MEMORY.md")
    assert "我的狗叫 Bob，是柯基。" in workspace.store.read_long_term()
    assert tools == [("memory_append", '{"content": "我的狗叫 Bob，是柯基。"}')]


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize(("fact", "answer"), [("My dog is called Bob, a corgi.", "Noted: your dog is Bob."),
                                              ("我的狗叫 Bob，是柯基。", "记住了：你的狗叫 Bob。")],
                         ids=["english", "chinese"])
def test_a_call_wrapped_in_response_tags_runs(workspace: Workspace, fake_openai: FakeOpenAIServer, streamed: bool,
                                              fact: str, answer: str) -> None:
    fake_openai.reply_text("<response>\n" + fence(call_json("memory_append", {"content": fact})) + "\n</response>")
    fake_openai.reply_text(answer)

    reply, pieces, tools = run_turn(workspace, fake_openai, streamed=streamed, question=f"remember / 记住：{fact}")

    assert reply == answer
    assert tools == [("memory_append", json.dumps({"content": fact}, ensure_ascii=False))]
    assert fact in workspace.store.read_long_term()
    assistant = history(fake_openai.chat_requests()[1])[-2]
    assert assistant["content"] == "" and assistant["tool_calls"][0]["function"]["name"] == "memory_append"
    if streamed:
        assert "".join(pieces) == answer  # the wrapped call was held back, never shown
    assert stored_roles(workspace) == ["user", "assistant", "tool", "assistant"]


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_off_keeps_a_fenced_call_as_text(workspace: Workspace, fake_openai: FakeOpenAIServer, streamed: bool) -> None:
    memory_before = workspace.store.read_long_term()
    content = fence(call_json("memory_append", {"content": "Coffee: oat-milk latte / 咖啡：燕麦拿铁"}))
    fake_openai.reply_text(content)
    fake_openai.reply_text(SECOND)

    reply, pieces, tools = run_turn(workspace, fake_openai, streamed=streamed, text_tool_calls="off")

    assert reply == content
    assert len(fake_openai.chat_requests()) == 1 and fake_openai.pending() == 1
    assert tools == []
    if streamed:
        assert len(pieces) > 1 and "".join(pieces) == content  # nothing held back: it streams as it comes
    assert workspace.store.read_long_term() == memory_before and today_note(workspace) == ""
    assert stored_roles(workspace) == ["user", "assistant"]


def workspace_files(workspace: Workspace) -> dict[Path, bytes]:
    """Every file of the workspace with its bytes (lock files left out)."""
    return {path: path.read_bytes() for path in workspace.root.rglob("*")
            if path.is_file() and not path.name.startswith(".")}


HOSTILE = {
    "unknown tool": fence(call_json("delete_everything", {"path": "memory"})),
    "unknown tool, tagged": "<tool_call>" + call_json("shell", {"command": "rm -rf ~"}) + "</tool_call>",
    "tool name in another case": fence(call_json("Memory_Append", {"content": "我的狗叫 Bob"})),
    "empty content": fence(call_json("memory_append", {"content": ""})),
    "slot that does not exist": fence(call_json("memory_append", {"content": "我的狗叫 Bob", "slot": "yesterday"})),
    "extra argument": fence(call_json("memory_append", {"content": "dog is Bob", "overwrite": True})),
    "write without content": fence(call_json("write_file", {"path": "memory/MEMORY.md"})),
    "arguments not JSON": '```json\n{"name": "memory_append", "arguments": {"content": "dog is Bob",}}\n```',
    "functions. without the required argument": "functions.memory_append:",
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_reply_that_is_not_a_valid_call_stays_text_and_nothing_is_written(
        workspace: Workspace, fake_openai: FakeOpenAIServer, case: str) -> None:
    files_before = workspace_files(workspace)
    memory_before = workspace.store.read_long_term()
    fake_openai.reply_text(HOSTILE[case])
    fake_openai.reply_text(SECOND)

    with frozen():
        [reply] = chat(workspace, fake_openai, ["记住：我的狗叫 Bob / remember my dog is Bob"])

    assert reply == HOSTILE[case]
    assert len(fake_openai.chat_requests()) == 1 and fake_openai.pending() == 1
    assert workspace.store.read_long_term() == memory_before and today_note(workspace) == ""
    files_after = workspace_files(workspace)
    assert session_path(workspace) in files_after  # the transcript, and nothing a call would have written
    assert {path: data for path, data in files_after.items() if path != session_path(workspace)} == files_before
    assert stored_roles(workspace) == ["user", "assistant"]


def test_a_valid_call_that_escapes_the_workspace_runs_and_is_refused(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    """Valid arguments make it a call; the sandbox, not the parser, stops it."""
    fake_openai.reply_text(fence(call_json("write_file", {"path": "../escape.txt", "content": "pwned 入侵"})))
    fake_openai.reply_text("I cannot write there. 我不能写到那里。")

    [reply] = chat(workspace, fake_openai, ["write a file outside / 往外面写文件"])

    assert reply == "I cannot write there. 我不能写到那里。"
    result = history(fake_openai.chat_requests()[1])[-1]
    assert result["role"] == "tool" and result["content"].startswith("error: ")
    assert "outside the workspace" in result["content"]
    assert not (workspace.root.parent / "escape.txt").exists()


NOT_CALLS = {
    "config in an answer": 'Here is the config:\n\n```json\n{"name": "server", "port": 8080}\n```\n\nRestart after.',
    "config alone in a fence": '```json\n{"name": "server", "port": 8080}\n```',
    "chinese config answer": ('配置如下：\n\n```json\n{"name": "服务器", "arguments": "--port 8080"}\n```\n\n'
                              "改完后重启。"),
    "a call explained in prose": ("The tool call looks like this:\n\n"
                                  + fence(call_json("memory_append", {"content": "dog is Bob"}))
                                  + "\n\nIt saves the fact to MEMORY.md."),
    "a chinese explanation of a call": ("调用方式如下：\n"
                                        + fence(call_json("memory_append", {"content": "我的狗叫 Bob"}))
                                        + "\n它会把事实存进 MEMORY.md。"),
}


@pytest.mark.parametrize("case", NOT_CALLS)
def test_a_normal_answer_with_json_stays_text(workspace: Workspace, fake_openai: FakeOpenAIServer, case: str) -> None:
    memory_before = workspace.store.read_long_term()
    fake_openai.reply_text(NOT_CALLS[case])
    fake_openai.reply_text(SECOND)

    reply, pieces, tools = run_turn(workspace, fake_openai, streamed=True)

    assert reply == NOT_CALLS[case]
    assert "".join(pieces) == NOT_CALLS[case]
    assert tools == [] and len(fake_openai.chat_requests()) == 1 and fake_openai.pending() == 1
    assert workspace.store.read_long_term() == memory_before and today_note(workspace) == ""
