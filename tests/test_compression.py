"""Long-term compression (issue 5): the 24-hour gate, checks on the rewrite, appends carried over, the CLI.

The model is the fake OpenAI server over real HTTP; time is frozen with freezegun.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time

from picoclaw.agent.loop import AgentLoop
from picoclaw.app import App
from picoclaw.cli import main
from picoclaw.config import AgentDefaults, MemoryPolicy
from picoclaw.errors import MemoryStoreError
from picoclaw.memory import compression
from picoclaw.memory.compression import (
    CompressionResult,
    LongTermCompressor,
    check_rewrite,
    clean_rewrite,
    split_preamble,
    why_not_due,
)
from picoclaw.memory.store import MemoryStore
from picoclaw.memory.workspace import Workspace
from picoclaw.providers.openai_compat import OpenAICompatProvider, from_config
from picoclaw.tools.registry import build_tools
from tests.fakes import FakeOpenAIServer
from tests.test_repl import configure, picoclaw

# 02:00 UTC is 10:00 in Asia/Shanghai, the timezone onboarding writes.
FROZEN = "2025-03-10 02:00:00"
FROZEN_LOCAL = "2025-03-10T10:00:00+08:00"
THRESHOLD = 1000
POLICY = MemoryPolicy(long_term_compress_char_threshold=THRESHOLD)
PREAMBLE = ('# Long-term memory\n\nFacts picoclaw keeps about you, one "## YYYY-MM-DD" entry each. '
            "Edit freely: this file is yours.\n")

ENGLISH = [f"## 2025-01-{day:02d}\nProject Falcon note {day}: the build server is ci-{day}.example.com, "
           f"ticket FAL-{100 + day}, owner Alice Zhang." for day in range(1, 21)]
ENGLISH_REWRITE = ("## Project Falcon (2025-01-01 to 2025-01-20)\nOwner Alice Zhang; build server and ticket by day:\n"
                   + "".join(f"- 01-{day:02d}: ci-{day}.example.com, FAL-{100 + day}\n" for day in range(1, 21)))
CHINESE = [f"## 2025-02-{day:02d}\n第 {day} 条：张伟的手机号是 1380013800{day % 10}，住在杭州西湖区，"
           f"喜欢龙井茶，项目代号「猎鹰」，预算 {day} 万元。" for day in range(1, 21)]
CHINESE_REWRITE = ("## 张伟（2025-02-01 至 2025-02-20）\n住在杭州西湖区，喜欢龙井茶，项目代号「猎鹰」。\n"
                   + "".join(f"- 02-{day:02d}：手机 1380013800{day % 10}，预算 {day} 万元\n" for day in range(1, 21)))


def is_compression(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == compression.INSTRUCTIONS


def write_memory(store: MemoryStore, entries: list[str]) -> str:
    text = PREAMBLE + "\n" + "\n\n".join(entries) + "\n"
    store.long_term_path.write_text(text, encoding="utf-8")
    return text


def compress(store: MemoryStore, server: FakeOpenAIServer, policy: MemoryPolicy = POLICY,
             **options: bool) -> CompressionResult | None:
    """One compression against the fake server (provider made and closed in its own event loop): the
    after-turn job, or with `options` (force, dry_run) the one the CLI runs."""
    async def go() -> CompressionResult | None:
        async with fake_provider(server) as provider:
            compressor = LongTermCompressor(store, provider)
            return await (compressor.run(policy, **options) if options else compressor.run_if_due(policy))
    return asyncio.run(go())


@asynccontextmanager
async def fake_provider(server: FakeOpenAIServer) -> AsyncIterator[Any]:
    """A provider pointed at the fake server (no retries: failures are scripted)."""
    provider = OpenAICompatProvider(name="openai", api_base=server.base_url, api_key="sk-compress-0123456789",
                                    defaults=AgentDefaults(), timeout=10, max_retries=0)
    async with provider:
        yield provider


def drop_last_block(body: dict[str, Any]) -> str:
    """A fake model that 'compresses' by dropping the last ## block of what it was sent."""
    sent = body["messages"][1]["content"].split("\n\n", 1)[1]
    return sent[: sent.rindex("\n## ")] + "\n"


def gate(store: MemoryStore) -> Path:
    return store.memory_dir / compression.GATE_FILE


# -- a good compression --------------------------------------------------------------------------------


@pytest.mark.parametrize(("entries", "rewrite"), [(ENGLISH, ENGLISH_REWRITE), (CHINESE, CHINESE_REWRITE)],
                         ids=["english", "chinese"])
@freeze_time(FROZEN)
def test_good_compression_replaces_memory_after_a_backup(
        workspace: Workspace, fake_openai: FakeOpenAIServer, entries: list[str], rewrite: str) -> None:
    store = workspace.store
    original = write_memory(store, entries)
    assert len(original) > THRESHOLD
    fake_openai.reply_text(rewrite)

    result = compress(store, fake_openai)

    assert result is not None and result.status == "compressed", result
    # The title and intro are kept verbatim and never sent; the blocks are the model's rewrite.
    assert store.read_long_term() == PREAMBLE + "\n" + rewrite
    [backup] = store.backups()
    assert backup.read_text(encoding="utf-8") == original and result.backup == backup
    assert gate(store).read_text(encoding="utf-8") == FROZEN_LOCAL + "\n"
    [request] = fake_openai.chat_requests()
    sent = request["messages"][1]["content"]
    assert entries[0] in sent and entries[-1] in sent and "# Long-term memory" not in sent
    assert "tools" not in request
    instructions = request["messages"][0]["content"]
    for must_keep in ("date", "name", "number", "identifier"):
        assert must_keep in instructions
    assert "characters" in result.detail and "'## ' blocks 20 → 1" in result.detail


def test_a_fenced_answer_with_an_echoed_title_is_cleaned(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    write_memory(workspace.store, ENGLISH)
    fake_openai.reply_text("```markdown\n" + PREAMBLE + "\n" + ENGLISH_REWRITE + "```")

    result = compress(workspace.store, fake_openai)

    assert result is not None and result.status == "compressed"
    assert workspace.store.read_long_term() == PREAMBLE + "\n" + ENGLISH_REWRITE


def test_split_preamble_and_clean_rewrite_units() -> None:
    text = PREAMBLE + "\n## a\nx\n\n## b\ny\n"
    assert split_preamble(text) == (PREAMBLE + "\n", "## a\nx\n\n## b\ny\n")
    assert split_preamble("## 只有条目\n内容\n") == ("", "## 只有条目\n内容\n")
    assert split_preamble("no headings at all\n") == ("no headings at all\n", "")
    assert clean_rewrite("  ## a\r\nb  \n\n", "") == "## a\nb\n"
    assert clean_rewrite(None, PREAMBLE) == ""


# -- refused rewrites ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "finish_reason", "why"),
    [
        pytest.param("", "stop", "empty", id="empty"),
        pytest.param("   \n\n", "stop", "empty", id="blank"),
        pytest.param("Here is the compressed memory: Alice owns Project Falcon, tickets FAL-101 to FAL-120.",
                     "stop", "'## ' block form", id="no-headers"),
        pytest.param("压缩后的记忆：张伟住在杭州。\n\n## 张伟\n喜欢龙井茶。", "stop", "'## ' block form",
                     id="chinese-text-before-first-header"),
        pytest.param("## Falcon\nAlice.", "stop", "kept too little", id="near-empty"),
        pytest.param("\n\n".join(ENGLISH + ENGLISH) + "\n", "stop", "not shorter", id="longer"),
        pytest.param(ENGLISH_REWRITE, "length", "cut off", id="cut-off"),
    ],
)
@freeze_time(FROZEN)
def test_bad_rewrites_are_refused_and_memory_is_unchanged_byte_for_byte(
        workspace: Workspace, fake_openai: FakeOpenAIServer, answer: str, finish_reason: str, why: str,
        caplog: pytest.LogCaptureFixture) -> None:
    store = workspace.store
    write_memory(store, ENGLISH)
    before = store.long_term_path.read_bytes()
    fake_openai.reply_text(answer, finish_reason=finish_reason)

    result = compress(store, fake_openai)

    assert result is not None and result.status == "refused" and why in result.detail
    assert store.long_term_path.read_bytes() == before
    assert store.backups() == []
    assert why in caplog.text and "kept as it was" in caplog.text
    # The gate is still set, so a broken model is not asked again on every turn.
    assert gate(store).read_text(encoding="utf-8") == FROZEN_LOCAL + "\n"
    assert compress(store, fake_openai) is None
    assert len(fake_openai.chat_requests()) == 1


def test_check_rewrite_accepts_exactly_ten_percent_and_refuses_just_under() -> None:
    original = "## a\n" + "x" * 995  # 1000 characters
    assert check_rewrite(original, "## a\n" + "y" * 95) is None  # 100 characters: 10%
    assert "kept too little" in (check_rewrite(original, "## a\n" + "y" * 94) or "")


@freeze_time(FROZEN)
def test_model_failure_keeps_memory_and_sets_the_gate(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    store = workspace.store
    write_memory(store, CHINESE)
    before = store.long_term_path.read_bytes()
    fake_openai.reply_error(500, "模型出错了 / internal error")

    result = compress(store, fake_openai)

    assert result is not None and result.status == "failed" and "model call failed" in result.detail
    assert store.long_term_path.read_bytes() == before
    assert gate(store).exists()
    assert why_not_due(store, POLICY) is not None


def test_memory_without_blocks_is_not_sent(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    workspace.store.long_term_path.write_text("free text without headings. " * 50, encoding="utf-8")
    result = compress(workspace.store, fake_openai)
    assert result is not None and result.status == "refused" and "no '## ' blocks" in result.detail
    assert fake_openai.chat_requests() == []


# -- appends while the model works -------------------------------------------------------------------


@freeze_time(FROZEN)
def test_an_append_during_compression_survives(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    store = workspace.store
    write_memory(store, ENGLISH)
    # Another writer (the bot, another process) with its own store object appends while the model works.
    other = MemoryStore(store.memory_dir, workspace.tz)

    def model(body: dict[str, Any]) -> str:
        other.append_long_term("新的事实：Alice 的生日是 4 月 2 日 / Alice's birthday is April 2")
        return ENGLISH_REWRITE

    fake_openai.responder = model

    result = compress(store, fake_openai)

    assert result is not None and result.status == "compressed"
    appended = "## 2025-03-10\n新的事实：Alice 的生日是 4 月 2 日 / Alice's birthday is April 2\n"
    assert store.read_long_term() == PREAMBLE + "\n" + ENGLISH_REWRITE + "\n" + appended
    assert result.carried_over == appended
    # The backup taken at the replace holds the appended entry too: nothing exists only in memory.
    assert appended in store.backups()[-1].read_text(encoding="utf-8")


def test_a_hand_edit_during_compression_wins(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    store = workspace.store
    original = write_memory(store, CHINESE)
    edited = original.replace("喜欢龙井茶", "喜欢碧螺春", 1)

    def model(body: dict[str, Any]) -> str:
        store.long_term_path.write_text(edited, encoding="utf-8")  # the user edits the file meanwhile
        return CHINESE_REWRITE

    fake_openai.responder = model

    result = compress(store, fake_openai)

    assert result is not None and result.status == "failed" and "changed (not just appended to)" in result.detail
    assert store.read_long_term() == edited


@pytest.mark.parametrize(
    ("expected", "current", "carried"),
    [
        pytest.param("## a\nx\n", "## a\nx\n", "", id="unchanged"),
        pytest.param("## a\nx\n", "## a\nx\n\n\n", "", id="trailing-newlines"),
        pytest.param("## a\nx\n", "## a\nx\n\n## 2025-03-10\n新\n", "## 2025-03-10\n新\n", id="appended"),
        pytest.param("", "## 2025-03-10\nfirst\n", "## 2025-03-10\nfirst\n", id="was-empty"),
    ],
)
def test_replace_keeping_appends(tmp_path: Path, expected: str, current: str, carried: str) -> None:
    store = MemoryStore(tmp_path, UTC)
    store.long_term_path.write_text(current, encoding="utf-8")
    replaced = store.replace_long_term_keeping_appends(expected, "## new\nrewritten\n")
    assert replaced.carried_over == carried
    assert store.read_long_term() == "## new\nrewritten\n" + (f"\n{carried}" if carried else "")


@pytest.mark.parametrize("current", ["## a\nxy\n", "## b\nx\n## a\nx\n", ""],
                         ids=["longer-line", "prepended", "deleted"])
def test_replace_keeping_appends_refuses_other_changes(tmp_path: Path, current: str) -> None:
    store = MemoryStore(tmp_path, UTC)
    store.long_term_path.write_text(current, encoding="utf-8")
    with pytest.raises(MemoryStoreError, match="was changed"):
        store.replace_long_term_keeping_appends("## a\nx\n", "## new\n")
    assert store.read_long_term() == current and store.backups() == []


# -- the 24-hour gate ---------------------------------------------------------------------------------


def test_runs_when_due_not_twice_within_24_hours_and_again_after(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    store = workspace.store
    write_memory(store, ENGLISH)
    fake_openai.responder = drop_last_block
    with freeze_time(FROZEN) as frozen:
        assert why_not_due(store, POLICY) is None
        first = compress(store, fake_openai)
        assert first is not None and first.status == "compressed"
        assert "2025-01-20" not in store.read_long_term()

        frozen.tick(timedelta(hours=23, minutes=59, seconds=59))
        assert "less than 24 hours ago" in (why_not_due(store, POLICY) or "")
        assert compress(store, fake_openai) is None
        assert len(fake_openai.chat_requests()) == 1

        frozen.tick(timedelta(seconds=1))
        second = compress(store, fake_openai)
        assert second is not None and second.status == "compressed"
        assert "2025-01-19" not in store.read_long_term()
        assert len(fake_openai.chat_requests()) == 2
        assert gate(store).read_text(encoding="utf-8") == "2025-03-11T10:00:00+08:00\n"


@pytest.mark.parametrize(
    ("policy", "size", "why"),
    [
        pytest.param(MemoryPolicy(), 5000, "compression is off", id="threshold-0"),
        pytest.param(MemoryPolicy(long_term_compress_char_threshold=100_000), 5000, "not more than", id="under"),
    ],
)
def test_not_due_means_no_call_and_no_gate(workspace: Workspace, fake_openai: FakeOpenAIServer,
                                           policy: MemoryPolicy, size: int, why: str) -> None:
    store = workspace.store
    write_memory(store, ["## 2025-01-01\n" + "x" * size])
    assert why in (why_not_due(store, policy) or "")
    assert compress(store, fake_openai, policy) is None
    assert fake_openai.chat_requests() == [] and not gate(store).exists()


@pytest.mark.parametrize("content", ["not a time\n", "", "2099-01-01T00:00:00+00:00\n"],
                         ids=["garbage", "empty", "future"])
@freeze_time(FROZEN)
def test_unreadable_or_future_gate_means_due(workspace: Workspace, content: str) -> None:
    write_memory(workspace.store, ENGLISH)
    gate(workspace.store).write_text(content, encoding="utf-8")
    assert why_not_due(workspace.store, POLICY) is None


@freeze_time(FROZEN)
def test_gate_without_offset_is_local_time(workspace: Workspace) -> None:
    write_memory(workspace.store, ENGLISH)
    gate(workspace.store).write_text("2025-03-10T09:00:00", encoding="utf-8")  # an hour ago, Shanghai time
    assert "less than 24 hours ago" in (why_not_due(workspace.store, POLICY) or "")


@freeze_time(FROZEN)
def test_dry_run_writes_nothing(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    store = workspace.store
    write_memory(store, CHINESE)
    before = {p: p.read_bytes() for p in store.memory_dir.rglob("*") if p.is_file()}
    fake_openai.reply_text(CHINESE_REWRITE)

    result = compress(store, fake_openai, dry_run=True)

    assert result is not None and result.status == "dry_run"
    assert result.after == PREAMBLE + "\n" + CHINESE_REWRITE
    assert {p: p.read_bytes() for p in store.memory_dir.rglob("*") if p.is_file()} == before


# -- in the agent loop -----------------------------------------------------------------------------------


def agent_turns(home: Path, server: FakeOpenAIServer, texts: list[str], key: str = "cli:test") -> list[str]:
    """Run turns through a real AgentLoop (provider from config.json), waiting for background work each time."""
    workspace = App.open(home).workspace

    async def go() -> list[str]:
        async with from_config(workspace.config, max_retries=0) as provider:
            loop = AgentLoop(workspace, provider, build_tools(workspace))
            replies = []
            for text in texts:
                replies.append((await loop.handle(key, text)).text)
                await loop.wait_background()
            return replies
    return asyncio.run(go())


def model_that(compress_with: Callable[[dict[str, Any]], str], answer: str = "好的 / ok"
               ) -> Callable[[dict[str, Any]], str]:
    return lambda body: compress_with(body) if is_compression(body) else answer


def test_a_turn_compresses_in_the_background_once_a_day(home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai, long_term_compress_char_threshold=THRESHOLD)
    store = App.open(home).workspace.store
    write_memory(store, CHINESE)
    fake_openai.responder = model_that(drop_last_block)

    with freeze_time(FROZEN) as frozen:
        assert agent_turns(home, fake_openai, ["你好", "hello again"]) == ["好的 / ok", "好的 / ok"]
        kinds = ["compress" if is_compression(b) else "turn" for b in fake_openai.chat_requests()]
        assert kinds == ["turn", "compress", "turn"]
        assert "2025-02-20" not in store.read_long_term() and "2025-02-19" in store.read_long_term()

        frozen.tick(timedelta(days=1))
        agent_turns(home, fake_openai, ["明天见"])
        assert "2025-02-19" not in store.read_long_term()


# -- the command line ------------------------------------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@freeze_time(FROZEN)
def test_cli_compress_not_due_dry_run_and_force(home: Path, fake_openai: FakeOpenAIServer,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    configure(home, fake_openai)  # threshold 0: compression is off
    store = App.open(home).workspace.store
    original = write_memory(store, ENGLISH)

    code, out, _ = run_cli(capsys, "memory", "compress")
    assert code == 0 and out == ("not compressing: compression is off (long_term_compress_char_threshold is 0); "
                                 "use --force to compress anyway\n")

    fake_openai.reply_text(ENGLISH_REWRITE)
    code, out, _ = run_cli(capsys, "memory", "compress", "--force", "--dry-run")
    assert code == 0
    assert out.startswith(PREAMBLE + "\n" + ENGLISH_REWRITE)
    assert re.search(r"--- dry run, nothing written: characters \d+ → \d+ \(\d+%\); '## ' blocks 20 → 1", out)
    assert store.read_long_term() == original and not gate(store).exists()

    fake_openai.reply_text(ENGLISH_REWRITE)
    code, out, _ = run_cli(capsys, "memory", "compress", "--force")
    assert code == 0 and out.startswith(f"compressed {store.long_term_path}: characters")
    assert "the previous version was saved as 20250310_100000_MEMORY.md" in out
    assert store.read_long_term() == PREAMBLE + "\n" + ENGLISH_REWRITE

    # The previous version comes back with `memory restore`.
    assert run_cli(capsys, "memory", "restore", "20250310_100000_MEMORY.md")[0] == 0
    assert store.read_long_term() == original


def test_cli_refused_rewrite_is_one_line_and_changes_nothing(home: Path, fake_openai: FakeOpenAIServer,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    configure(home, fake_openai, long_term_compress_char_threshold=THRESHOLD)
    store = App.open(home).workspace.store
    write_memory(store, CHINESE)
    before = store.long_term_path.read_bytes()
    fake_openai.reply_text("我无法压缩这些内容。")  # "I cannot compress this": no ## blocks

    code, out, err = run_cli(capsys, "memory", "compress")

    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("picoclaw: error: compression refused: ")
    assert "MEMORY.md was left unchanged" in err
    assert store.long_term_path.read_bytes() == before
    # Within 24 hours a plain run says why it does nothing, without calling the model.
    code, out, _ = run_cli(capsys, "memory", "compress")
    assert code == 0 and "less than 24 hours ago" in out
    assert len(fake_openai.chat_requests()) == 1


def test_cli_refusal_is_one_line_on_stderr_in_a_real_process(home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai, long_term_compress_char_threshold=THRESHOLD)
    store = App.open(home).workspace.store
    write_memory(store, ENGLISH)
    before = store.long_term_path.read_bytes()
    fake_openai.reply_text("")

    result = picoclaw(home, "memory", "compress")

    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == ("picoclaw: error: compression refused: the rewrite is empty; "
                             "MEMORY.md was left unchanged\n")
    assert store.long_term_path.read_bytes() == before
