"""Slash commands: answered by the loop itself, never by the model, and /new really starts afresh."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from picoclaw.agent.loop import AgentLoop
from picoclaw.agent.slash_commands import HELP, Command, parse_command
from picoclaw.app import App
from picoclaw.channels.telegram import COMMANDS
from picoclaw.memory.workspace import Workspace
from picoclaw.policy_schema import POLICY_KEYS
from tests.agent_helpers import (
    SESSION,
    chat,
    contents,
    frozen,
    records_of,
    session_path,
    set_policy,
    turn_requests,
    with_agent,
    write_memory,
)
from tests.fakes import FakeOpenAIServer, Text
from tests.homes import edit_config


def test_commands_never_reach_the_model(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    replies = chat(workspace, fake_openai, ["/help", "/start", "/policy", "/memory", "/nonsense"])

    assert replies[0] == HELP and replies[1] == HELP
    assert replies[4] == "Unknown command /nonsense; see /help."
    assert fake_openai.chat_requests() == []
    assert not session_path(workspace).exists()  # a command is not a conversation message


def test_help_and_the_telegram_menu_list_the_same_commands() -> None:
    helped = [line.split()[0] for line in HELP.splitlines() if line.startswith("/")]
    # The same commands in the same order, each once in the menu (`/memory recent` is a form of /memory).
    assert [f"/{command.command}" for command in COMMANDS] == list(dict.fromkeys(helped))
    # Within what setMyCommands accepts: a name of 1-32 lowercase letters, digits, _; a description of 1-256.
    assert all(re.fullmatch("[a-z0-9_]{1,32}", command.command) and 0 < len(command.description) <= 256
               for command in COMMANDS)


@pytest.mark.parametrize("argument", ["bank card", "银行卡"], ids=["en", "zh"])
def test_every_command_of_the_menu_is_answered_without_the_model(workspace: Workspace, fake_openai: FakeOpenAIServer,
                                                                 argument: str) -> None:
    # As a group sends them: the bot's name after the command, and words after that.
    replies = chat(workspace, fake_openai, [f"/{command.command}@picoclaw_bot {argument}" for command in COMMANDS])
    assert len(replies) == len(COMMANDS) and not any(reply.startswith("Unknown command") for reply in replies)
    assert replies[-1] == HELP
    assert fake_openai.chat_requests() == []


def test_policy_shows_every_key_with_its_source(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    set_policy(workspace, retrieve_limit=7)

    [reply] = chat(workspace, fake_openai, ["/policy"])

    lines = reply.splitlines()
    assert len(lines) == len(POLICY_KEYS)
    assert "retrieve_limit = 7 (overrides)" in lines
    assert any(line.startswith("recent_days = ") and line.endswith("(config)") for line in lines)


def test_memory_shows_the_blocks_a_query_would_inject(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    write_memory(workspace, ["## 2025-03-01\nMy coffee preference is an oat-milk latte.",
                             "## 2025-03-02\n我的宠物狗叫 Bob，是一只柯基。",
                             "## 2025-03-03\nThe server runs on port 8443."])

    english, chinese, missing = chat(workspace, fake_openai, ["/memory coffee latte", "/memory 我的狗叫什么",
                                                              "/memory zebra"])

    assert english.startswith("Memory for 'coffee latte':")
    assert "oat-milk latte" in english and "柯基" not in english and "port 8443" not in english
    assert "memory/MEMORY.md:3-4" in english and "score " in english
    assert "宠物狗叫 Bob" in chinese and "oat-milk" not in chinese
    assert missing == ("No block matches 'zebra', so no memory would be injected "
                       "(memory_fallback_blocks > 0 would add the newest few).")
    assert fake_openai.chat_requests() == []
    # A preview is not a use: the blocks shown gain nothing in ranking (memory/.access_counts.json).
    assert not (workspace.memory_dir / ".access_counts.json").exists()


def test_memory_on_an_empty_memory_says_so(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    workspace.store.long_term_path.write_text("", encoding="utf-8")

    [reply] = chat(workspace, fake_openai, ["/memory anything"])

    assert reply == "No memory would be injected (MEMORY.md and recent notes are empty)."


def test_new_archives_the_session_and_the_next_turn_starts_empty(workspace: Workspace,
                                                                 fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = lambda body: f"reply {len(body['messages'])}"
    with frozen():
        chat(workspace, fake_openai, ["my name is Ada", "我住在杭州"])
        old = session_path(workspace).read_bytes()

        [started] = chat(workspace, fake_openai, ["/new"])
        chat(workspace, fake_openai, ["hello again"])

    assert started.startswith("Started a new conversation. The previous one is archived as ")
    archives = [p for p in session_path(workspace).parent.rglob("*") if p.is_file() and p != session_path(workspace)]
    assert [p.read_bytes() for p in archives] == [old]  # the old conversation is kept whole
    last = turn_requests(fake_openai)[-1]["messages"]
    assert contents(last[1:]) == ["hello again"]  # nothing of the old session is sent


def test_new_on_a_fresh_session_archives_nothing(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    [reply] = chat(workspace, fake_openai, ["/new"], key=SESSION)

    assert reply == "Started a new conversation."
    sessions = session_path(workspace).parent
    assert not sessions.exists() or [p for p in sessions.rglob("*") if p.is_file()] == []


# -- /status ---------------------------------------------------------------------------------------------


def status_lines(workspace: Workspace, fake_openai: FakeOpenAIServer) -> list[str]:
    """/status's reply, checked to have been answered without the model."""
    before = len(fake_openai.chat_requests())
    [reply] = chat(workspace, fake_openai, ["/status"])
    assert len(fake_openai.chat_requests()) == before  # answered by the loop, not the model
    return reply.splitlines()


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_status_shows_what_the_provider_said_and_what_the_last_turn_injected(
        workspace: Workspace, fake_openai: FakeOpenAIServer, streamed: bool) -> None:
    write_memory(workspace, ["## 2025-03-01\nMy dog is called Bob, a corgi.",
                             "## 2025-03-02\n我的狗叫 Bob，是一只柯基。",
                             "## 2025-03-03\nThe server runs on port 8443."])
    fake_openai.enqueue(Text("你的狗叫 Bob。Your dog is Bob.", usage={"prompt_tokens": 900, "completion_tokens": 5},
                             cached_tokens=800))
    fake_openai.enqueue(Text("它是柯基。A corgi.", usage={"prompt_tokens": 1234, "completion_tokens": 6}))
    pieces: list[str] = []

    async def on_text(piece: str) -> None:
        pieces.append(piece)

    async def body(loop: AgentLoop) -> None:
        for text in ("我的狗叫什么？ what is my dog called?", "我的狗是什么品种？ what breed is my dog?"):
            reply = await loop.handle(SESSION, text, on_text=on_text if streamed else None)
            assert reply.error is None
            await loop.wait_background()

    with frozen():
        with_agent(workspace, fake_openai, body)
        user, assistant = records_of(workspace, "message")[:2]
        assert (assistant["prompt_tokens"], assistant["cached_tokens"]) == (900, 800)
        assert len(user["blocks"]) == 2  # the two blocks about the dog, not the port
        assert "".join(pieces) == ("你的狗叫 Bob。Your dog is Bob.它是柯基。A corgi." if streamed else "")
        assert all(body.get("stream", False) is streamed for body in fake_openai.chat_requests())
        lines = status_lines(workspace, fake_openai)
    last = records_of(workspace, "message")[-1]
    assert last["prompt_tokens"] == 1234 and "cached_tokens" not in last  # "not said" is not 0

    assert lines[0] == f"model: {workspace.config.agents.defaults.model} (provider openai)"
    assert lines[1] == "conversation cli:test: 4 messages, 4 since the last summary (none yet)"
    assert lines[2] == "last prompt: 1,234 tokens, the provider did not say how many were cached"
    # The second turn's blocks were already in the conversation: none injected again.
    assert lines[3] == "last turn: 0 new blocks of memory and notes injected (2 in the conversation so far)"
    assert lines[4].startswith("policy: ")


def test_status_shows_the_cached_share_of_the_last_prompt(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    write_memory(workspace, ["## 2025-03-01\nMy coffee is an oat-milk latte / 我喝燕麦拿铁。"])
    fake_openai.enqueue(Text("燕麦拿铁。Oat-milk latte.", usage={"prompt_tokens": 900, "completion_tokens": 5},
                             cached_tokens=800))

    with frozen():
        chat(workspace, fake_openai, ["我喝什么咖啡？ what coffee do I drink?"])
        lines = status_lines(workspace, fake_openai)

    assert lines[1] == "conversation cli:test: 2 messages, 2 since the last summary (none yet)"
    assert lines[2] == "last prompt: 900 tokens, 800 of them cached by the provider"
    assert lines[3] == "last turn: 1 new blocks of memory and notes injected (1 in the conversation so far)"
    assert len(fake_openai.chat_requests()) == 1


def test_status_says_when_the_server_reports_no_usage(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    # llama-cpp-python's server sends no usage in streamed answers, even with stream_options.include_usage.
    fake_openai.enqueue(Text("燕麦拿铁。Oat-milk latte.", usage=False))

    with frozen():
        chat(workspace, fake_openai, ["我喝什么咖啡？ what coffee do I drink?"])
        lines = status_lines(workspace, fake_openai)

    assert lines[2] == "last prompt: the server reports no token usage for streamed answers"
    # The test run has no tiktoken encoding (offline), and /status says what that means for the counts.
    assert "token counts: estimated (tiktoken's encoding is not available offline; see docs/setup.md)" in lines


def test_status_of_a_new_conversation_needs_no_model_and_writes_nothing(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    lines = status_lines(workspace, fake_openai)

    assert lines[0] == f"model: {workspace.config.agents.defaults.model} (provider openai)"
    assert lines[1] == "conversation cli:test: 0 messages, 0 since the last summary (none yet)"
    assert lines[2] == "last prompt: no token count from the provider yet"
    assert not any(line.startswith("last turn:") for line in lines)
    assert fake_openai.requests == []
    assert not session_path(workspace).exists()


def test_status_names_the_timezone_dates_follow(home: Path, workspace: Workspace, fake_openai: FakeOpenAIServer,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert "timezone: Asia/Shanghai" in status_lines(workspace, fake_openai)  # written in config: shown as is
    # "local" (what onboarding writes now) is shown with the zone it stands for, here TZ's.
    with edit_config(home) as config:
        config["timezone"] = "local"
    monkeypatch.setenv("TZ", "Europe/Berlin")
    assert "timezone: local (Europe/Berlin)" in status_lines(App.open(home).workspace, fake_openai)


def test_status_is_listed_in_help_and_in_the_telegram_menu() -> None:
    assert any(line.startswith("/status — ") and "cached" in line for line in HELP.splitlines())
    assert "status" in [command.command for command in COMMANDS]
    assert parse_command("/status@picoclaw_bot") == Command("/status", "")
