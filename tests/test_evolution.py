"""Reflection and policy evolution: tolerant parsing, strict validation, the interval, live pick-up.

The model is the fake OpenAI server over real HTTP; agents are real AgentLoops; time is frozen.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from freezegun import freeze_time

from picoclaw.agent.loop import AgentLoop
from picoclaw.app import App
from picoclaw.curation import policy_suggestions
from picoclaw.curation.policy_suggestions import SuggestionError, key_guide, parse_suggestion, validate_suggestion
from picoclaw.curation.reflection import ReflectionOutcome, Reflector
from picoclaw.memory.policy import ValueChange
from picoclaw.memory.workspace import Workspace
from picoclaw.policy_schema import TUNABLE_KEYS, MemoryPolicy
from picoclaw.providers.base import BETWEEN_TURNS
from picoclaw.providers.openai_compat import from_config
from picoclaw.storage import FilesStorage
from picoclaw.tools.registry import build_tools
from picoclaw.transcripts.session_store import SessionStore
from tests.agent_helpers import turn_context
from tests.fakes import FakeOpenAIServer
from tests.test_compression import agent_turns, fake_provider, run_cli
from tests.test_repl import configure

FROZEN = "2025-03-10 02:00:00"  # 10:00 in Asia/Shanghai
CONVERSATION = [
    {"role": "user", "content": "我上周说的那家餐厅叫什么？"},
    {"role": "assistant", "content": "抱歉，我找不到这条记忆。"},
    {"role": "user", "content": "What was the bakery I told you about in January?"},
    {"role": "assistant", "content": "I don't have that stored, sorry."},
]
REASON_ZH = "用户多次问起较早的事，但相关记忆没有被检索到"


def is_reflection(body: dict[str, Any]) -> bool:
    """A reflection request, in its own prompt or asked after the conversation's last request."""
    last = str(body["messages"][-1]["content"])
    return (body["messages"][0]["content"] == policy_suggestions.INSTRUCTIONS
            or last.startswith(f"{BETWEEN_TURNS}\n{policy_suggestions.REFLECTION_ROLE}"))


def evolving(home: Path, server: FakeOpenAIServer, **memory: Any) -> Workspace:
    """Point config.json at the fake server with evolution on (plus `memory` keys); open the workspace."""
    configure(home, server, **{"evolution_enabled": True, **memory})
    return App.open(home).workspace


def reflect(workspace: Workspace, server: FakeOpenAIServer, messages: list[dict[str, Any]] = CONVERSATION
            ) -> ReflectionOutcome:
    async def go() -> ReflectionOutcome:
        async with fake_provider(server) as provider:
            return await Reflector(workspace.policy, provider).reflect("telegram:42", messages)
    return asyncio.run(go())


def written_files(workspace: Workspace) -> list[str]:
    """Every file reflection could write."""
    memory = workspace.memory_dir
    names = ["policy_overrides.json", "policy_history.jsonl"]
    found = [name for name in names if (memory / name).exists()]
    return found + [p.name for p in workspace.policy.snapshots()]


# -- parsing and validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        pytest.param('{"retrieve_limit": 15, "reason": "more"}', {"retrieve_limit": 15, "reason": "more"}, id="plain"),
        pytest.param('I suggest {"recent_days": 7, "reason": "last week matters"} because the user asks.',
                     {"recent_days": 7, "reason": "last week matters"}, id="in-prose"),
        pytest.param('根据对话，我建议：\n```json\n{"recent_days": 7, "reason": "用户常提上周"}\n```\n以上。',
                     {"recent_days": 7, "reason": "用户常提上周"}, id="chinese-prose-and-fence"),
        pytest.param('Set {braces} aside: {"retrieve_limit": 12}', {"retrieve_limit": 12}, id="brace-before"),
        pytest.param('{"reason": {"nested": true}, "retrieve_limit": 3}',
                     {"reason": {"nested": True}, "retrieve_limit": 3},
                     id="nested"),
        pytest.param("{}", {}, id="empty-object"),
    ],
)
def test_parse_finds_the_object(answer: str, expected: dict[str, Any]) -> None:
    assert parse_suggestion(answer) == expected


@pytest.mark.parametrize("answer", ["", "   ", "The policy looks fine to me.", "策略很好，不用改。", "[15, 3]",
                                    '{"retrieve_limit": 15', "x" * 30_000 + "{}"])
def test_parse_refuses_answers_without_an_object(answer: str) -> None:
    with pytest.raises(SuggestionError):
        parse_suggestion(answer)


def test_key_guide_lists_every_tunable_key_with_value_bounds_and_meaning() -> None:
    guide = key_guide(MemoryPolicy(retrieve_limit=12))
    lines = guide.splitlines()
    assert [line.split()[1] for line in lines] == list(TUNABLE_KEYS)
    assert "- retrieve_limit = 12 (allowed 1–50): most MEMORY.md blocks injected for a query" in lines
    assert "evolution_enabled" not in guide
    # Every key has both bounds, so the model is never invited to go as high as it likes.
    assert "long_term_compress_char_threshold = 0 (allowed 0–10000000)" in guide


@pytest.mark.parametrize(
    ("suggestion", "why"),
    [
        pytest.param({"retrieve_limt": 15}, "unknown policy key 'retrieve_limt'", id="unknown-key"),
        pytest.param({"evolution_enabled": False}, "may not change evolution_enabled", id="switch-off"),
        pytest.param({"retrieve_limit": 15, "evolution_enabled": True}, "evolution_enabled", id="with-switch"),
        pytest.param({"retrieve_limit": 99}, "allowed 1–50", id="too-high"),
        pytest.param({"recent_days": -1}, "allowed 0–30", id="negative"),
        pytest.param({"retrieve_limit": "15"}, "valid integer", id="string"),
        pytest.param({"retrieve_limit": 15.0}, "valid integer", id="float"),
        pytest.param({"retrieve_limit": True}, "valid integer", id="bool"),
        pytest.param({"retrieve_limit": None}, "valid integer", id="null"),
        pytest.param({"session_summary_keep_count": 30}, "must be smaller", id="cross-check"),
        pytest.param({"long_term_compress_char_threshold": 500}, "0 (off) or at least 1000", id="compress-500"),
    ],
)
def test_validation_refuses_the_whole_suggestion(workspace: Workspace, suggestion: dict[str, Any], why: str) -> None:
    with pytest.raises(SuggestionError, match=why.replace("(", r"\(").replace(")", r"\)")):
        validate_suggestion(suggestion, workspace.policy)


def test_validation_keeps_only_real_changes_and_the_reason(workspace: Workspace) -> None:
    suggestion = validate_suggestion({"retrieve_limit": 10, "recent_days": 5, "reason": " 中文理由 "}, workspace.policy)
    assert suggestion.changes == {"recent_days": 5}  # retrieve_limit is 10 already
    assert suggestion.reason == "中文理由"
    odd = validate_suggestion({"reason": ["not", "text"]}, workspace.policy)
    assert odd.changes == {} and odd.reason == '["not", "text"]'


# -- one reflection against the fake model ----------------------------------------------------------------


@freeze_time(FROZEN)
def test_valid_suggestion_snapshots_writes_and_records_history(
        home: Path, fake_openai: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    workspace = evolving(home, fake_openai)
    fake_openai.reply_text(json.dumps({"retrieve_limit": 15, "recent_days": 7, "reason": REASON_ZH},
                                      ensure_ascii=False))

    outcome = reflect(workspace, fake_openai)

    assert outcome.refused is None and outcome.changes == {"retrieve_limit": 15, "recent_days": 7}
    assert outcome.snapshot is not None and outcome.snapshot.name == "20250310_020000Z.json"
    assert outcome.snapshot.read_bytes() == b"{}\n"
    assert json.loads(workspace.policy.overrides_path.read_text()) == {"retrieve_limit": 15, "recent_days": 7}
    assert workspace.policy.current().retrieve_limit == 15
    [entry] = workspace.policy.history()
    assert entry.time == "2025-03-10T10:00:00+08:00"
    assert entry.source == "evolution" and entry.session == "telegram:42"
    assert entry.effective == {"recent_days": ValueChange(3, 7), "retrieve_limit": ValueChange(10, 15)}
    assert entry.reason == REASON_ZH

    # What the model was sent: the keys with their bounds, and the conversation (Chinese kept as is).
    [request] = fake_openai.chat_requests()
    prompt = request["messages"][1]["content"]
    assert "- retrieve_limit = 10 (allowed 1–50)" in prompt and "- evolution_enabled" not in prompt
    assert "User: 我上周说的那家餐厅叫什么？" in prompt and "What was the bakery" in prompt
    assert "tools" not in request

    code, out, _ = run_cli(capsys, "policy", "history")
    assert code == 0
    assert out.splitlines() == [
        "2025-03-10T10:00:00+08:00  evolution (session telegram:42)  retrieve_limit 10 → 15, recent_days 3 → 7"
        "  [before: 20250310_020000Z.json]",
        f"    reason: {REASON_ZH}",
    ]


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param('Looking at the chat, I would raise it: {"retrieve_limit": 15, "reason": "misses"} Done.',
                     id="english-prose"),
        pytest.param('建议如下：```json\n{"retrieve_limit": 15, "reason": "' + REASON_ZH + '"}\n```',
                     id="chinese-fence"),
    ],
)
def test_json_inside_prose_is_applied(home: Path, fake_openai: FakeOpenAIServer, answer: str) -> None:
    workspace = evolving(home, fake_openai)
    fake_openai.reply_text(answer)
    assert reflect(workspace, fake_openai).changes == {"retrieve_limit": 15}
    assert workspace.policy.current().retrieve_limit == 15


@pytest.mark.parametrize(
    ("answer", "refused"),
    [
        pytest.param("The policy is fine as it is.", "no JSON object", id="garbage-prose"),
        pytest.param("策略不需要调整。", "no JSON object", id="chinese-prose"),
        pytest.param("{}", None, id="empty-object"),
        pytest.param('{"reason": "一切正常，无需修改"}', None, id="reason-only"),
        pytest.param('{"retrieve_limit": 10, "reason": "same as now"}', None, id="unchanged-value"),
        pytest.param('{"retrieve_limt": 15}', "unknown policy key", id="unknown-key"),
        pytest.param('{"memory_size": 5, "retrieve_limit": 15}', "unknown policy key 'memory_size'", id="one-unknown"),
        pytest.param('{"evolution_enabled": false, "reason": "stop tuning"}', "evolution_enabled", id="switch-off"),
        pytest.param('{"retrieve_limit": 99, "reason": "更多"}', "allowed 1–50", id="out-of-bounds"),
        pytest.param('{"retrieve_limit": "15"}', "valid integer", id="string-number"),
    ],
)
def test_nothing_is_written_for_bad_or_empty_suggestions(
        home: Path, fake_openai: FakeOpenAIServer, answer: str, refused: str | None) -> None:
    workspace = evolving(home, fake_openai)
    fake_openai.reply_text(answer)

    outcome = reflect(workspace, fake_openai)

    assert outcome.changes == {} and outcome.snapshot is None
    if refused is None:
        assert outcome.refused is None
    else:
        assert outcome.refused is not None and refused in outcome.refused
    assert written_files(workspace) == []
    assert workspace.policy.current().retrieve_limit == 10  # not clamped to 50, not changed at all


@pytest.mark.parametrize("failure", ["error", "garbage"])
def test_model_failure_writes_nothing(home: Path, fake_openai: FakeOpenAIServer, failure: str) -> None:
    workspace = evolving(home, fake_openai)
    if failure == "error":
        fake_openai.reply_error(500, "服务器错误 / server error")
    else:
        fake_openai.reply_garbage()
    outcome = reflect(workspace, fake_openai)
    assert outcome.refused is not None and "model call failed" in outcome.refused
    assert written_files(workspace) == []


def test_evolution_switched_off_meanwhile_writes_nothing(home: Path, fake_openai: FakeOpenAIServer) -> None:
    workspace = evolving(home, fake_openai)

    def model(body: dict[str, Any]) -> str:
        # The user turns evolution off while the model is thinking.
        (workspace.memory_dir / "policy_overrides.json").write_text('{"evolution_enabled": false}')
        return '{"retrieve_limit": 15}'

    fake_openai.responder = model
    outcome = reflect(workspace, fake_openai)
    assert outcome.refused == "evolution was switched off meanwhile"
    assert workspace.policy.history() == [] and workspace.policy.snapshots() == []


# -- in the agent loop -----------------------------------------------------------------------------------


def reflections(home: Path, key: str = "cli:test") -> list[int]:
    sessions = SessionStore(home / "workspace" / "sessions", storage=FilesStorage(home / "workspace"))
    records = sessions.path_for(key).read_bytes().splitlines()
    return [r["through"] for r in map(orjson.loads, records) if r["type"] == "reflection"]


def kinds(server: FakeOpenAIServer) -> list[str]:
    return ["reflect" if is_reflection(body) else "turn" for body in server.chat_requests()]


@freeze_time(FROZEN)
def test_reflection_fires_at_the_interval_and_not_before(home: Path, fake_openai: FakeOpenAIServer) -> None:
    evolving(home, fake_openai, evolution_interval_messages=4)
    answer = json.dumps({"retrieve_limit": 15, "reason": REASON_ZH}, ensure_ascii=False)
    fake_openai.responder = lambda body: answer if is_reflection(body) else "好的"

    agent_turns(home, fake_openai, ["第一条", "second"])  # 4 messages: due after the second turn
    assert kinds(fake_openai) == ["turn", "turn", "reflect"]
    assert reflections(home) == [4]
    # Asked after the second turn's request (a local server keeps the conversation cached), about all of it.
    turn, reflection = fake_openai.chat_requests()[1:3]
    assert reflection["messages"][:-1] == [*turn["messages"], {"role": "assistant", "content": "好的"}]
    assert reflection["tools"] == turn["tools"] and reflection["tool_choice"] == "none"
    asked = reflection["messages"][-1]["content"]
    assert "Judge the newest part of the conversation above: from the user's message that begins «第一条»" in asked
    assert "retrieve_limit = 10 (allowed" in asked

    # A restarted agent counts on from the session file: 2 more messages are not enough, 4 are.
    agent_turns(home, fake_openai, ["third"])
    assert kinds(fake_openai) == ["turn", "turn", "reflect", "turn"]
    agent_turns(home, fake_openai, ["第四条"])
    assert kinds(fake_openai)[-2:] == ["turn", "reflect"]
    assert reflections(home) == [4, 8]
    # The second reflection saw only the messages since the first one.
    second = fake_openai.chat_requests()[-1]["messages"][-1]["content"]
    assert "from the user's message that begins «third» to the end" in second
    # It suggested what is already in force, so only the first changed anything.
    assert [entry.source for entry in App.open(home).workspace.policy.history()] == ["evolution"]


def test_no_reflection_when_evolution_is_off(home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai, evolution_interval_messages=2)
    fake_openai.responder = lambda body: '{"retrieve_limit": 15}' if is_reflection(body) else "ok"
    agent_turns(home, fake_openai, ["one", "二", "three"])
    assert kinds(fake_openai) == ["turn"] * 3
    assert reflections(home) == []
    assert not (home / "workspace" / "memory" / "policy_overrides.json").exists()


FALCON = ["## 2025-01-01\nProject Falcon deadline is March 15.", "## 2025-01-02\nProject Falcon budget is 20k.",
          "## 2025-01-03\nProject Falcon owner is Alice."]


def falcon_blocks(body: dict[str, Any]) -> int:
    """Falcon blocks in the turn's data block."""
    return turn_context(body).count("Project Falcon ")


def test_change_is_used_by_the_next_turn_of_every_running_agent(home: Path, fake_openai: FakeOpenAIServer) -> None:
    evolving(home, fake_openai, evolution_interval_messages=2)
    memory = home / "workspace" / "memory" / "MEMORY.md"
    memory.write_text("\n\n".join(FALCON) + "\n", encoding="utf-8")

    def model(body: dict[str, Any]) -> str:
        if not is_reflection(body):
            return "ok"
        if "无关的记忆太多" in str(body["messages"]):
            return json.dumps({"retrieve_limit": 1, "reason": "用户说无关的记忆太多"}, ensure_ascii=False)
        return "{}"

    fake_openai.responder = model

    async def two_agents() -> None:
        # Two agents, each with its own Workspace (own policy cache), as the bot and the REPL would be.
        first, second = App.open(home).workspace, App.open(home).workspace
        async with from_config(first.config, max_retries=0) as provider:
            bot = AgentLoop(first, provider, build_tools(first))
            repl = AgentLoop(second, provider, build_tools(second))
            await repl.handle("cli:other", "Project Falcon?")  # warms its policy cache; its reflection: {}
            await repl.wait_background()
            await bot.handle("telegram:1", "Project Falcon — 回答里无关的记忆太多了")
            await bot.wait_background()  # the reflection sets retrieve_limit 1
            # New conversations, so that no block is already in the context and left out for that reason.
            await bot.handle("telegram:2", "Project Falcon?")
            await repl.handle("cli:third", "Project Falcon?")
            await repl.wait_background()
            await bot.wait_background()

    asyncio.run(two_agents())

    turns = [body for body in fake_openai.chat_requests() if not is_reflection(body)]
    assert [falcon_blocks(body) for body in turns] == [3, 3, 1, 1]
    assert App.open(home).workspace.policy.current().retrieve_limit == 1


@freeze_time(FROZEN)
def test_rollback_restores_the_exact_previous_overrides_file(
        home: Path, fake_openai: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    workspace = evolving(home, fake_openai)
    hand_written = '{"recent_days":2,   "备注": "手写的，别动"}\n'
    workspace.policy.overrides_path.write_text(hand_written, encoding="utf-8")
    fake_openai.reply_text(json.dumps({"retrieve_limit": 20, "reason": REASON_ZH}, ensure_ascii=False))
    assert reflect(workspace, fake_openai).changes == {"retrieve_limit": 20}
    assert workspace.policy.current().retrieve_limit == 20

    code, out, _ = run_cli(capsys, "policy", "rollback")

    assert code == 0 and "20250310_020000Z.json" in out
    assert workspace.policy.overrides_path.read_text(encoding="utf-8") == hand_written
    assert workspace.policy.current().retrieve_limit == 10 and workspace.policy.current().recent_days == 2
    code, out, _ = run_cli(capsys, "policy", "history")
    lines = out.splitlines()
    assert lines[0].startswith("2025-03-10T10:00:00+08:00  evolution (session telegram:42)  retrieve_limit 10 → 20")
    assert lines[1] == f"    reason: {REASON_ZH}"
    assert lines[2] == ("2025-03-10T10:00:00+08:00  cli  retrieve_limit 20 → 10  [before: 20250310_020000Z_1.json]")
    assert lines[3] == "    reason: rollback to 20250310_020000Z.json"


def test_policy_history_when_empty(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "policy", "history")
    assert code == 0 and out.startswith("no policy changes yet")
