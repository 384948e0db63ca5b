"""A small local model must never break a conversation (issue 24): what llama.cpp's server refuses is never
stored or sent, and what a small model answers badly still ends in a working session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from picoclaw.memory.workspace import Workspace
from tests.agent_helpers import SESSION, chat, contents, frozen, history, records_of, session_path
from tests.fakes import FakeOpenAIServer
from tests.test_repl import configure, picoclaw


def null_answer() -> dict[str, Any]:
    """A completion whose message has no text and no tool calls: `content: null`."""
    return {"id": "chatcmpl-null", "object": "chat.completion", "created": 0, "model": "qwen",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": None},
                         "finish_reason": "stop"}]}


def test_an_answer_without_text_is_stored_as_empty_text_and_the_next_turn_works(workspace: Workspace) -> None:
    with FakeOpenAIServer(strict_content=True) as server, frozen():
        server.reply_raw(null_answer())
        server.reply_text("旺财 is your dog's name.")
        replies = chat(workspace, server, ["我的狗叫什么？ What is my dog called?", "again, please / 再说一次"])

    assert replies == ["(the model returned an empty answer)", "旺财 is your dog's name."]
    stored = [r["message"] for r in records_of(workspace, "message")]
    assert stored[1] == {"role": "assistant", "content": ""}
    sent = history(server.chat_requests()[-1])
    assert [m["content"] for m in sent if m["role"] == "assistant"] == [""]


def test_a_null_content_kept_by_an_older_version_is_sent_as_empty_text(workspace: Workspace) -> None:
    records = [{"type": "message", "id": 1, "message": {"role": "user", "content": "remember 龙井"}},
               {"type": "message", "id": 2, "message": {"role": "assistant", "content": None}}]
    path = session_path(workspace)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))

    with FakeOpenAIServer(strict_content=True) as server, frozen():
        server.reply_text("好的 / fine")
        assert chat(workspace, server, ["still there? 还在吗？"], SESSION) == ["好的 / fine"]

    assert contents(history(server.chat_requests()[0])) == ["remember 龙井", "", "still there? 还在吗？"]
    assert all(m["content"] is not None for m in server.chat_requests()[0]["messages"])


def test_the_offline_token_estimate_is_not_a_warning_on_every_command(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    # The test run has no tiktoken encoding (an empty TIKTOKEN_CACHE_DIR, no network): counts are estimated.
    configure(home, fake_openai)
    memory = home / "workspace" / "memory" / "MEMORY.md"
    memory.write_text("# Long-term memory\n\n## 2025-03-01\n我的狗叫旺财 / my dog is Wangcai\n", encoding="utf-8")
    fake_openai.reply_text("旺财！Wangcai!")
    fake_openai.reply_text("旺财 / Wangcai")

    # Two sessions, so that both turns inject (and count) the memory block.
    quiet = picoclaw(home, "chat", "--session", "one", "-m", "我的狗叫什么？ what is my dog called?")
    verbose = picoclaw(home, "-v", "chat", "--session", "two", "-m", "my dog's name again? 狗叫什么")

    assert quiet.returncode == verbose.returncode == 0, quiet.stderr + verbose.stderr
    assert quiet.stdout == "旺财！Wangcai!\n"
    assert all("旺财" in body["messages"][-1]["content"] for body in fake_openai.chat_requests())  # counted, sent
    assert "tiktoken" not in quiet.stderr
    assert "token counts are estimated" in verbose.stderr
