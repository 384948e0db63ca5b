"""Slash commands: answered by the loop itself, never by the model, and /new really starts afresh."""

from __future__ import annotations

from picoclaw.agent.commands import HELP
from picoclaw.config import POLICY_KEYS
from picoclaw.memory.workspace import Workspace
from tests.agent_helpers import SESSION, chat, contents, frozen, session_path, set_policy, turn_requests, write_memory
from tests.fakes import FakeOpenAIServer


def test_commands_never_reach_the_model(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    replies = chat(workspace, fake_openai, ["/help", "/start", "/policy", "/memory", "/nonsense"])

    assert replies[0] == HELP and replies[1] == HELP
    assert replies[4] == "Unknown command /nonsense; see /help."
    assert fake_openai.chat_requests() == []
    assert not session_path(workspace).exists()  # a command is not a conversation message


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
    assert missing.startswith("No block matches; the newest blocks that fit the budget:")
    assert fake_openai.chat_requests() == []


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
