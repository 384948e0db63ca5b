"""One turn through the real AgentLoop: the tool loop, its cap, bad tool calls, sandbox escapes, retries
and a provider that is down. The fake server checks every request the way the real API would."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from picoclaw.agent.loop import AgentLoop, Reply
from picoclaw.agent.query_rewrite import REWRITE_INSTRUCTIONS
from picoclaw.memory.workspace import Workspace
from picoclaw.storage import StorageError
from tests.agent_helpers import (
    FAST_RETRY,
    SESSION,
    chat,
    contents,
    frozen,
    history,
    records_of,
    reopen,
    session_path,
    session_records,
    set_policy,
    with_agent,
)
from tests.fakes import FakeOpenAIServer, ToolCalls


def message_roles(workspace: Workspace) -> list[str]:
    return [r["message"]["role"] for r in session_records(workspace) if r["type"] == "message"]


# -- the tool loop ---------------------------------------------------------------------------------------


def test_tool_loop_runs_each_call_and_feeds_the_result_back(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    set_policy(workspace, learning_enabled=False)  # replies are scripted in order; a lesson review would take one
    fake_openai.reply_tool_calls([("memory_append", {"content": "Tea: 龙井 (Longjing), no sugar"})])
    fake_openai.reply_tool_calls([("memory_search", {"query": "龙井"}), ("list_dir", {"path": "memory"})])
    fake_openai.reply_text("Saved and checked: 龙井.")
    fake_openai.reply_text("You drink Longjing.")

    replies = chat(workspace, fake_openai, ["remember my tea: 龙井, no sugar", "what tea?"])

    assert replies == ["Saved and checked: 龙井.", "You drink Longjing."]
    first, second, third, fourth = fake_openai.chat_requests()
    assert [m["role"] for m in history(second)][-2:] == ["assistant", "tool"]
    assert history(second)[-1]["content"].startswith("saved to memory/MEMORY.md")
    search, listing = history(third)[-2:]
    assert search["content"].startswith("1 match for '龙井'") and "Tea: 龙井 (Longjing), no sugar" in search["content"]
    assert "MEMORY.md" in listing["content"]
    assert [tool["function"]["name"] for tool in first["tools"]] == [
        "memory_search", "memory_append", "read_file", "write_file", "edit_file", "append_file", "list_dir",
        "cron", "skill", "web_fetch"]
    # The whole turn is in the session file and goes back to the model next turn (the fake checks pairing).
    turn = ["user", "assistant", "tool", "assistant", "tool", "tool", "assistant"]
    assert message_roles(workspace) == turn + ["user", "assistant"]
    assert [m["role"] for m in history(fourth)] == turn + ["user"]


def test_each_model_call_of_a_turn_holds_the_channels_model_slot_and_its_tools_run_outside_it(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    """A webhook worker bounds its model calls so (max_parallel): held around each call, let go while a tool runs."""
    set_policy(workspace, learning_enabled=False)
    fake_openai.reply_tool_calls([("memory_append", {"content": "Tea: 龙井 (Longjing), no sugar"})])
    fake_openai.reply_text("Saved: 龙井.")
    memory = workspace.memory_dir / "MEMORY.md"
    seen: list[tuple[str, int, bool]] = []  # (enter/exit, requests the model had, whether the tea is remembered)

    @asynccontextmanager
    async def slot() -> AsyncIterator[None]:
        seen.append(("enter", len(fake_openai.chat_requests()), "龙井" in memory.read_text(encoding="utf-8")))
        yield
        seen.append(("exit", len(fake_openai.chat_requests()), "龙井" in memory.read_text(encoding="utf-8")))

    async def body(loop: AgentLoop) -> Reply:
        return await loop.handle(SESSION, "remember my tea: 龙井, no sugar", model_slot=slot)
    assert with_agent(workspace, fake_openai, body).text == "Saved: 龙井."
    # Two calls, each in a slot of its own; the tool wrote between them, in none.
    assert seen == [("enter", 0, False), ("exit", 1, False), ("enter", 1, True), ("exit", 2, True)]


@pytest.mark.parametrize(("first", "correction"), [
    ("Where do I keep my tea notes?", "No, they are in memory/, not notes/."),
    ("我的茶叶笔记放在哪里？", "不对，在 memory/ 里，不是 notes/。"),
])
def test_a_turns_query_rewrite_holds_the_model_slot_and_the_lesson_review_after_the_reply_does_not(
        first: str, correction: str, workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    set_policy(workspace, query_rewrite_enabled=True)
    fake_openai.reply_text("In notes/.")
    fake_openai.reply_text("tea notes location / 茶叶笔记的位置")  # the second turn's query rewrite
    fake_openai.reply_text("Noted: memory/.")
    fake_openai.reply_text("LESSON: Tea notes are kept in memory/, not notes/.")  # the correction's review
    held: list[tuple[int, int]] = []  # each slot's requests, as (first, last + 1) indices

    @asynccontextmanager
    async def slot() -> AsyncIterator[None]:
        start = len(fake_openai.chat_requests())
        yield
        held.append((start, len(fake_openai.chat_requests())))

    async def body(loop: AgentLoop) -> list[str]:
        replies = []
        for text in (first, correction):
            replies.append((await loop.handle(SESSION, text, model_slot=slot)).text)
            await loop.wait_background()
        return replies
    assert with_agent(workspace, fake_openai, body) == ["In notes/.", "Noted: memory/."]
    answer, rewrite, second, review = fake_openai.chat_requests()
    assert rewrite["messages"][0]["content"] == REWRITE_INSTRUCTIONS
    assert "LESSON" in json.dumps(review["messages"]) and fake_openai.pending() == 0
    # The answers and the rewrite each in a slot; the review, after the reply, in none.
    assert held == [(0, 1), (1, 2), (2, 3)]


def test_iteration_cap_stops_the_loop_and_the_session_stays_usable(home: Path, fake_openai: FakeOpenAIServer) -> None:
    workspace = reopen(home, max_tool_iterations=3)
    # Each step lists another folder: the same call twice in a row would not be run again (empty_reply.py).
    fake_openai.responder = lambda body: (ToolCalls([("list_dir", {"path": "." if len(body["messages"]) % 4 else
                                                                   "memory"})]) if len(body["messages"]) < 9
                                          else "好的")

    replies = chat(workspace, fake_openai, ["列出文件，一直列下去", "停下来吧"])

    assert replies[0].startswith("I stopped after 3 tool steps without finishing.")
    assert replies[1] == "好的"
    requests = fake_openai.chat_requests()
    assert len(requests) == 4  # three steps, then the next turn
    assert message_roles(workspace) == ["user"] + ["assistant", "tool"] * 3 + ["assistant", "user", "assistant"]
    assert contents(history(requests[3]))[-1] == "停下来吧"


MALFORMED: dict[str, tuple[str, str, str]] = {
    "truncated json": ("memory_append", '{"content": "oat milk', "error: the arguments are not valid JSON"),
    "not an object": ("memory_append", '["oat milk"]', "error: the arguments must be a JSON object"),
    "empty content": ("memory_append", '{"content": ""}', "error: invalid arguments for memory_append: content"),
    "unknown field": ("memory_search", '{"query": "咖啡", "top_k": 3}', "error: invalid arguments for memory_search"),
    "unknown tool": ("delete_everything", "{}", "error: unknown tool 'delete_everything'"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_bad_tool_call_goes_back_to_the_model_and_the_turn_goes_on(
        workspace: Workspace, fake_openai: FakeOpenAIServer, case: str) -> None:
    name, raw_arguments, expected = MALFORMED[case]
    memory_before = workspace.store.read_long_term()
    fake_openai.reply_tool_calls([(name, raw_arguments)])
    fake_openai.reply_text("抱歉，我重新试一下。Sorry, retrying.")

    replies = chat(workspace, fake_openai, ["记住：燕麦奶 / remember: oat milk"])
    assert replies == ["抱歉，我重新试一下。Sorry, retrying."]

    sent_back = history(fake_openai.chat_requests()[1])[-1]
    assert sent_back["role"] == "tool" and sent_back["content"].startswith(expected), sent_back
    assert "\n" not in sent_back["content"]
    assert workspace.store.read_long_term() == memory_before
    assert message_roles(workspace) == ["user", "assistant", "tool", "assistant"]


# -- the sandbox, through the loop -----------------------------------------------------------------------

SECRET = "TOP-SECRET-7c1f"


@pytest.fixture
def outside(workspace: Workspace, tmp_path: Path) -> Path:
    """A folder outside the workspace with a secret in it, and a symlink `link` to it from the workspace."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text(SECRET, encoding="utf-8")
    (folder / "秘密.txt").write_text(SECRET, encoding="utf-8")
    os.symlink(folder, workspace.root / "link")
    os.symlink(folder / "secret.txt", workspace.root / "secret-link.txt")
    return folder


ESCAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "dot-dot read": ("read_file", {"path": "../config.json"}),
    "dot-dot chinese": ("read_file", {"path": "../../outside/秘密.txt"}),
    "absolute read": ("read_file", {"path": "/etc/passwd"}),
    "symlinked folder": ("read_file", {"path": "link/secret.txt"}),
    "symlinked file": ("read_file", {"path": "secret-link.txt"}),
    "dot-dot write": ("write_file", {"path": "../escape.txt", "content": "pwned"}),
    "write through symlink": ("write_file", {"path": "link/new.txt", "content": "pwned"}),
    "append absolute": ("append_file", {"path": "/tmp/picoclaw-escape.txt", "content": "pwned"}),
    "edit through symlink": ("edit_file", {"path": "link/secret.txt", "old_text": SECRET, "new_text": "pwned"}),
    "list parent": ("list_dir", {"path": ".."}),
}


@pytest.mark.parametrize("case", ESCAPES)
def test_file_tool_escapes_are_refused_and_reported_to_the_model(
        workspace: Workspace, fake_openai: FakeOpenAIServer, outside: Path, case: str) -> None:
    name, arguments = ESCAPES[case]
    fake_openai.reply_tool_calls([(name, arguments)])
    fake_openai.reply_text("I cannot reach that file. 那个文件在工作区之外。")

    assert chat(workspace, fake_openai, ["read the file outside / 读工作区外的文件"]) == [
        "I cannot reach that file. 那个文件在工作区之外。"]

    result = history(fake_openai.chat_requests()[1])[-1]["content"]
    assert result.startswith("error: ") and "outside the workspace" in result, result
    sent = [m for body in fake_openai.chat_requests() for m in history(body) if m["role"] == "tool"]
    assert sent and all(SECRET not in m["content"] and "sk-agent-test" not in m["content"] for m in sent)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt", "秘密.txt"]
    assert (outside / "secret.txt").read_text(encoding="utf-8") == SECRET
    assert not (workspace.root.parent / "escape.txt").exists()
    assert not Path("/tmp/picoclaw-escape.txt").exists()


# -- retries and a provider that is down -----------------------------------------------------------------


@pytest.mark.parametrize(("status", "message"), [(500, "internal error"), (429, "Rate limit reached, 请稍后再试"),
                                                 (503, "overloaded")])
def test_retry_then_success(workspace: Workspace, fake_openai: FakeOpenAIServer, status: int, message: str) -> None:
    fake_openai.reply_error(status, message, headers=FAST_RETRY)
    fake_openai.reply_text("你好！Hello after a retry.")

    assert chat(workspace, fake_openai, ["你好"], max_retries=2) == ["你好！Hello after a retry."]

    first, second = fake_openai.chat_requests()
    assert first == second  # the same request, sent again
    assert message_roles(workspace) == ["user", "assistant"]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("failure", ["503 until out of retries", "connection refused"])
def test_provider_down_is_one_line_and_the_session_file_is_unchanged(
        workspace: Workspace, fake_openai: FakeOpenAIServer, failure: str) -> None:
    fake_openai.reply_text("first answer / 第一个回答")
    chat(workspace, fake_openai, ["hello / 你好"])
    before = session_path(workspace).read_bytes()
    api_base = None
    if failure == "connection refused":
        api_base = f"http://127.0.0.1:{closed_port()}/v1"
    else:
        if failure == "503 after a tool call":
            fake_openai.reply_tool_calls([("list_dir", {"path": "."})])
        for _ in range(3):
            fake_openai.reply_error(503, "The server is overloaded", headers=FAST_RETRY)

    [reply] = chat(workspace, fake_openai, ["还在吗？ still there?"], max_retries=2 if api_base is None else 0,
                   api_base=api_base)

    assert reply.startswith("Sorry, I could not get an answer from the model: ")
    assert "\n" not in reply
    expected = "could not connect" if api_base else "is unavailable (HTTP 503)"
    assert expected in reply
    assert session_path(workspace).read_bytes() == before
    assert fake_openai.pending() == 0


def test_a_turn_cut_short_after_a_tool_ran_keeps_the_tool_on_record(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_tool_calls([("memory_append", {"content": "Allergic to penicillin / 青霉素过敏"})])
    for _ in range(3):
        fake_openai.reply_error(503, "The server is overloaded", headers=FAST_RETRY)

    [reply] = chat(workspace, fake_openai, ["remember: I am allergic to penicillin / 我对青霉素过敏"], max_retries=2)

    assert reply.startswith("Sorry, I could not get an answer from the model: ") and "\n" not in reply
    assert workspace.store.read_long_term().count("青霉素过敏") == 1
    # The entry exists, so the session says so: the next turn (and the model) can see it was stored.
    records = records_of(workspace, "message")
    assert [r["message"]["role"] for r in records] == ["user", "assistant", "tool", "assistant"]
    assert records[2]["message"]["content"].startswith("saved to memory/MEMORY.md")
    assert records[3]["message"]["content"].startswith("(The answer was cut short: ")
    assert fake_openai.pending() == 0


@pytest.mark.parametrize("question", ["What is my dog called?", "我的狗叫什么名字？"])
def test_a_turn_whose_record_cannot_be_written_ends_in_one_line_not_a_traceback(
        workspace: Workspace, fake_openai: FakeOpenAIServer, question: str) -> None:
    def failing(*args: Any) -> None:
        raise StorageError("the sessions folder is read-only")

    async def body(loop: AgentLoop) -> Reply:
        loop.sessions.append_messages = failing  # type: ignore[method-assign]
        return await loop.handle(SESSION, question)

    fake_openai.reply_text("Bob.")
    with frozen():
        reply = with_agent(workspace, fake_openai, body)
    assert reply.text == "Sorry, I cannot reach my memory right now: the sessions folder is read-only"
    assert isinstance(reply.error, StorageError)
