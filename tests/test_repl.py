"""`picoclaw chat` end to end: a real subprocess on stdin/stdout, talking HTTP to the fake model server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from tests.agent_helpers import said
from tests.fakes import FakeOpenAIServer

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-repl-test-0123456789"


def configure(home: Path, server: FakeOpenAIServer, **memory: Any) -> None:
    """Point the onboarded config at the fake server (and set policy keys in its memory block)."""
    path = home / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["providers"]["openai"] = {"api_key": KEY, "api_base": server.base_url}
    config["memory"].update(memory)
    path.write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")


def picoclaw(home: Path, *args: str, stdin: str = "", env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PICOCLAW_HOME": str(home), "PYTHONPATH": str(REPO), **(env or {})}
    environment.pop("OPENAI_API_KEY", None)
    return subprocess.run([sys.executable, "-m", "picoclaw", *args], input=stdin, env=environment,
                          capture_output=True, text=True, encoding="utf-8", timeout=60)


def session_records(home: Path, name: str = "cli%3Adefault.jsonl") -> list[dict[str, Any]]:
    path = home / "workspace" / "sessions" / name
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def test_conversation_stores_a_fact_and_a_restart_continues_it(home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai)
    fake_openai.reply_tool_calls([("memory_append", {"content": "Coffee: oat-milk latte / 咖啡：燕麦拿铁"})])
    fake_openai.reply_text("Noted, oat-milk latte.")
    fake_openai.reply_text("你喜欢燕麦拿铁。")

    first = picoclaw(home, "chat", stdin="remember: my coffee is an oat-milk latte\n\n我喜欢什么咖啡？\nexit\n")

    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == ['· memory_append {"content": "Coffee: oat-milk latte / 咖啡：燕麦拿铁"}',
                                         "Noted, oat-milk latte.", "你喜欢燕麦拿铁。"]
    memory = (home / "workspace" / "memory" / "MEMORY.md").read_text(encoding="utf-8")
    assert "Coffee: oat-milk latte / 咖啡：燕麦拿铁" in memory
    # The Chinese question found the stored block and sent it to the model.
    assert "燕麦拿铁" in fake_openai.chat_requests()[2]["messages"][-1]["content"]

    fake_openai.reply_text("We talked about your coffee.")
    second = picoclaw(home, "chat", "-m", "what did we talk about?")

    assert second.returncode == 0, second.stderr
    assert second.stdout == "We talked about your coffee.\n"
    resumed = [said(m) for m in fake_openai.chat_requests()[3]["messages"] if m["role"] == "user"]
    assert resumed == ["remember: my coffee is an oat-milk latte", "我喜欢什么咖啡？", "what did we talk about?"]


def test_one_shot_waits_for_the_summary_before_exiting(home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai, session_summary_message_threshold=4, session_summary_keep_count=2)
    for answer in ("one", "two"):
        fake_openai.reply_text(answer)
    assert picoclaw(home, "chat", "-m", "first").returncode == 0
    assert picoclaw(home, "chat", "-m", "second").returncode == 0
    fake_openai.reply_text("three")
    fake_openai.reply_text("## Goal\nTest summaries\n## Progress\nThree messages\n## Next steps\nNone\n"
                           "## Key context\n数字 1, 2, 3", delay=0.3)

    third = picoclaw(home, "chat", "-m", "third")

    assert third.returncode == 0, third.stderr
    assert third.stdout.splitlines() == ["three", "Memory threshold reached. Optimizing conversation history..."]
    compactions = [r for r in session_records(home) if r["type"] == "compaction"]
    assert len(compactions) == 1 and "数字 1, 2, 3" in compactions[0]["summary"]
    assert fake_openai.pending() == 0


def test_no_api_key_is_one_clear_line_and_no_request(home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai)
    config = json.loads((home / "config.json").read_text(encoding="utf-8"))
    config["providers"]["openai"]["api_key"] = ""
    (home / "config.json").write_text(json.dumps(config), encoding="utf-8")

    result = picoclaw(home, "chat", "-m", "hello")

    assert result.returncode == 1
    assert result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if "WARNING" not in line]
    assert errors == [errors[0]] and "has no API key" in errors[0] and "OPENAI_API_KEY" in errors[0]
    assert fake_openai.requests == []
    assert not (home / "workspace" / "sessions").exists()


def test_model_down_is_one_line_and_the_session_is_untouched(home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai)
    fake_openai.reply_text("hi")
    assert picoclaw(home, "chat", "-m", "hello").returncode == 0
    before = (home / "workspace" / "sessions" / "cli%3Adefault.jsonl").read_bytes()
    for _ in range(4):  # the first try and every retry
        fake_openai.reply_error(503, "overloaded", headers={"retry-after-ms": "1"})

    result = picoclaw(home, "chat", "-m", "are you there?")

    assert result.returncode == 1  # no answer: a script running `chat -m` must be able to tell
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "picoclaw: error: the model provider 'openai' is unavailable (HTTP 503): overloaded"]
    assert (home / "workspace" / "sessions" / "cli%3Adefault.jsonl").read_bytes() == before


def test_empty_message_is_a_usage_error(home: Path) -> None:
    result = picoclaw(home, "chat", "-m", "   ")
    assert result.returncode == 2
    assert result.stderr.strip() == "picoclaw: error: the message given with -m is empty"
