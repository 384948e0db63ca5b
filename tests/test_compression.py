"""Long-term compression: the 24-hour gate, checks on the rewrite, appends carried over, the CLI;
no fact lost (real small-model rewrites replayed, hand-made ones), compression group by group.

The model is the fake OpenAI server over real HTTP; time is frozen with freezegun.
"""

from __future__ import annotations

import asyncio
import json
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
from picoclaw.config import AgentDefaults
from picoclaw.curation import compression
from picoclaw.curation.compression import (
    CompressionResult,
    LongTermCompressor,
    check_rewrite,
    clean_rewrite,
    split_preamble,
    why_not_due,
)
from picoclaw.errors import MemoryStoreError
from picoclaw.memory.job_outcomes import GATE_FILE
from picoclaw.memory.rewrite_guard import key_facts, missing_facts
from picoclaw.memory.store import MemoryStore
from picoclaw.memory.workspace import Workspace
from picoclaw.policy_schema import MemoryPolicy
from picoclaw.providers.openai_compat import OpenAICompatProvider, from_config
from picoclaw.tools.registry import build_tools
from tests.fakes import FakeOpenAIServer
from tests.homes import edit_config
from tests.stores import memory_store
from tests.test_repl import configure, picoclaw

# 02:00 UTC is 10:00 in Asia/Shanghai, the test homes' timezone (tests/zones.py).
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


def compress(store: MemoryStore, server: FakeOpenAIServer, policy: MemoryPolicy = POLICY, *,
             group_chars: int | None = None, **options: bool) -> CompressionResult | None:
    """One compression against the fake server (provider made and closed in its own event loop): the
    after-turn job, or with `options` (force, dry_run) the one the CLI runs."""
    async def go() -> CompressionResult | None:
        async with fake_provider(server) as provider:
            compressor = LongTermCompressor(store, provider, group_chars=group_chars)
            return await (compressor.run(policy, **options) if options else compressor.run_if_due(policy))
    return asyncio.run(go())


@asynccontextmanager
async def fake_provider(server: FakeOpenAIServer) -> AsyncIterator[Any]:
    """A provider pointed at the fake server (no retries: failures are scripted)."""
    provider = OpenAICompatProvider(name="openai", api_base=server.base_url, api_key="sk-compress-0123456789",
                                    defaults=AgentDefaults(), timeout=10, max_retries=0)
    async with provider:
        yield provider


def merge_last_two_blocks(body: dict[str, Any]) -> str:
    """A fake model that compresses faithfully, a little: the last two ## blocks of what it was sent become
    one, under a heading with both their dates ("## 2025-01-19, 2025-01-20"), every fact kept."""
    sent = body["messages"][1]["content"].split("\n\n", 1)[1]
    *rest, one, two = re.split(r"\n+(?=## )", sent.strip("\n"))
    (heading_one, text_one), (heading_two, text_two) = one.split("\n", 1), two.split("\n", 1)
    merged = f"{heading_one}, {heading_two.removeprefix('## ')}\n{text_one}\n{text_two}"
    return "\n\n".join([*rest, merged]) + "\n"


def gate(store: MemoryStore) -> Path:
    return store.memory_dir / GATE_FILE


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
    other = MemoryStore(store.memory_dir, workspace.tz, storage=workspace.storage)

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
    store = memory_store(tmp_path, UTC)
    store.long_term_path.write_text(current, encoding="utf-8")
    replaced = store.replace_long_term_keeping_appends(expected, "## new\nrewritten\n")
    assert replaced.carried_over == carried
    assert store.read_long_term() == "## new\nrewritten\n" + (f"\n{carried}" if carried else "")


@pytest.mark.parametrize("current", ["## a\nxy\n", "## b\nx\n## a\nx\n", ""],
                         ids=["longer-line", "prepended", "deleted"])
def test_replace_keeping_appends_refuses_other_changes(tmp_path: Path, current: str) -> None:
    store = memory_store(tmp_path, UTC)
    store.long_term_path.write_text(current, encoding="utf-8")
    with pytest.raises(MemoryStoreError, match="was changed"):
        store.replace_long_term_keeping_appends("## a\nx\n", "## new\n")
    assert store.read_long_term() == current and store.backups() == []


# -- the 24-hour gate ---------------------------------------------------------------------------------


def test_runs_when_due_not_twice_within_24_hours_and_again_after(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    store = workspace.store
    write_memory(store, ENGLISH)
    fake_openai.responder = merge_last_two_blocks
    with freeze_time(FROZEN) as frozen:
        assert why_not_due(store, POLICY) is None
        first = compress(store, fake_openai)
        assert first is not None and first.status == "compressed", first
        assert "\n## 2025-01-20" not in store.read_long_term()
        assert "\n## 2025-01-19, 2025-01-20\n" in store.read_long_term()

        frozen.tick(timedelta(hours=23, minutes=59, seconds=59))
        assert "less than 24 hours ago" in (why_not_due(store, POLICY) or "")
        assert compress(store, fake_openai) is None
        assert len(fake_openai.chat_requests()) == 1

        frozen.tick(timedelta(seconds=1))
        second = compress(store, fake_openai)
        assert second is not None and second.status == "compressed"
        assert "\n## 2025-01-18, 2025-01-19, 2025-01-20\n" in store.read_long_term()
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
            # The fake server is local: background calls continue the conversation, as app.py wires it.
            loop = AgentLoop(workspace, provider, build_tools(workspace), continue_background=True)
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
    fake_openai.responder = model_that(merge_last_two_blocks)

    with freeze_time(FROZEN) as frozen:
        assert agent_turns(home, fake_openai, ["你好", "hello again"]) == ["好的 / ok", "好的 / ok"]
        kinds = ["compress" if is_compression(b) else "turn" for b in fake_openai.chat_requests()]
        assert kinds == ["turn", "compress", "turn"]
        assert "\n## 2025-02-20" not in store.read_long_term()
        assert "\n## 2025-02-19, 2025-02-20\n" in store.read_long_term()

        frozen.tick(timedelta(days=1))
        agent_turns(home, fake_openai, ["明天见"])
        assert "\n## 2025-02-18, 2025-02-19, 2025-02-20\n" in store.read_long_term()


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
    assert "the previous version was saved as 20250310_020000Z_MEMORY.md" in out
    assert store.read_long_term() == PREAMBLE + "\n" + ENGLISH_REWRITE

    # The previous version comes back with `memory restore`.
    assert run_cli(capsys, "memory", "restore", "20250310_020000Z_MEMORY.md")[0] == 0
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


@pytest.mark.slow
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


# -- no fact lost: real rewrites by a small model ----------------------------------------------------------

REAL = Path(__file__).resolve().parent / "data" / "real-model" / "lossy_compression.json"
REAL_REPLIES: list[dict[str, Any]] = json.loads(REAL.read_text(encoding="utf-8"))
# Every reply answers the same request; its user message is the `## ` part of the MEMORY.md it was about.
REAL_BODY = ("## 2026-11-23\nMy dog is called Bob. My coffee is an oat-milk latte.\n\n"
             "## 2026-11-23\n我女儿叫小雨，她在上海读大学（复旦大学）。\n\n"
             "## 2026-11-23\nmy cat is called Mimi\n\n## 2026-11-23\nmy cat is called Mimi\n\n"
             "## 2026-11-23\nI work as a nurse at Charité hospital in Berlin since 2019.\n\n"
             "## 2026-11-23\nMy phone number for work is +49 30 450 50; my locker is number 217.\n\n"
             "## 2026-11-23\nI am allergic to penicillin.\n\n"
             "## 2026-11-23\nMy sister Anna lives in Munich and her birthday is 14 March.\n\n"
             "## 2026-11-23\nI drive a blue 2015 VW Golf, plate B-AX 4021.\n\n"
             "## 2026-11-23\n我每周三晚上七点去游泳。\n\n"
             "## 2026-11-23\nI work as a nurse at Charité, I started in 2019.\n\n"
             "## 2026-11-23\nMy dog Bob is a 4-year-old corgi.\n")

# Read off the data by hand. Replies 1 and 4 are the same text, and so are 2 and 5: they drop the Chinese
# daughter entry, the cat, the Berlin entry, the phone and locker, the allergy, and translate the swimming
# entry into English; 2 and 5 also drop the coffee. Reply 0 merges the two Charité entries and loses
# "Berlin" with the first; reply 3 only drops the duplicate cat entry, a faithful compression.
LOST_BY_BOTH = ("小雨", "复旦大学", "“我女儿叫小雨，她在上海读大学（复旦大学）。”", "Mimi", "Berlin", "+49 30 450 50",
                "217", "“my locker is number 217.”", "“I am allergic to penicillin.”", "“我每周三晚上七点去游泳。”")
REAL_EXPECTED: dict[int, tuple[str, ...]] = {
    0: ("Berlin",),
    1: LOST_BY_BOTH,
    2: ("“My coffee is an oat-milk latte.”", *LOST_BY_BOTH),
    3: (),
    4: LOST_BY_BOTH,
    5: ("“My coffee is an oat-milk latte.”", *LOST_BY_BOTH),
}


def test_the_real_data_is_what_the_table_was_read_from() -> None:
    assert len(REAL_REPLIES) == len(REAL_EXPECTED)
    for item in REAL_REPLIES:
        assert item["request_messages"][1]["content"] == (
            f"Entries to rewrite ({len(REAL_BODY)} characters; the result must be shorter):\n\n{REAL_BODY}")


@pytest.mark.parametrize("number", sorted(REAL_EXPECTED))
@freeze_time(FROZEN)
def test_real_small_model_rewrites_are_refused_when_they_lose_a_fact(
        workspace: Workspace, fake_openai: FakeOpenAIServer, number: int, caplog: pytest.LogCaptureFixture) -> None:
    store = workspace.store
    original = PREAMBLE + "\n" + REAL_BODY
    store.long_term_path.write_text(original, encoding="utf-8")
    before = store.long_term_path.read_bytes()
    reply = REAL_REPLIES[number]["reply"]
    fake_openai.reply_text(reply)

    result = compress(store, fake_openai, force=True)

    # The request is the one the real model answered (the instructions have changed since, not the entries).
    [request] = fake_openai.chat_requests()
    assert request["messages"][1] == REAL_REPLIES[number]["request_messages"][1]
    assert result is not None
    expected = REAL_EXPECTED[number]
    assert result.missing == expected
    if expected:
        assert result.status == "refused"
        assert f"the rewrite lost {len(expected)} fact" in result.detail
        assert store.long_term_path.read_bytes() == before and store.backups() == []
    else:
        assert result.status == "compressed", result.detail
        assert store.read_long_term() == PREAMBLE + "\n" + reply + "\n"
    # The English-only answers translated the Chinese entries away; the reason says so.
    assert ("translated?" in result.detail) == (number in (1, 2, 4, 5))


@freeze_time(FROZEN)
def test_cli_names_what_a_real_rewrite_lost(home: Path, fake_openai: FakeOpenAIServer,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    configure(home, fake_openai)
    store = App.open(home).workspace.store
    store.long_term_path.write_text(PREAMBLE + "\n" + REAL_BODY, encoding="utf-8")
    before = store.long_term_path.read_bytes()
    fake_openai.reply_text(REAL_REPLIES[2]["reply"])

    code, out, err = run_cli(capsys, "memory", "compress", "--force")

    assert code == 1 and out == ""
    refusal, missing_line = err.splitlines()
    assert refusal == ("picoclaw: error: compression refused: the rewrite lost 11 facts of the original (no "
                       "Chinese/Japanese/Korean text is left in it: translated?); MEMORY.md was left unchanged")
    assert missing_line == ("missing: “My coffee is an oat-milk latte.”, 小雨, 复旦大学, "
                            "“我女儿叫小雨，她在上海读大学（复旦大学）。”, Mimi, Berlin, +49 30 450 50, 217, "
                            "“my locker is number 217.”, “I am allergic to penicillin.” and 1 more")
    assert store.long_term_path.read_bytes() == before

    # The dry run applies the same check and lists the same items, writing nothing.
    fake_openai.reply_text(REAL_REPLIES[2]["reply"])
    code, out, err = run_cli(capsys, "memory", "compress", "--force", "--dry-run")
    assert code == 1 and err.startswith("picoclaw: error: compression refused: the rewrite lost 11 facts")
    assert out.startswith(PREAMBLE + "\n" + REAL_REPLIES[2]["reply"])
    assert "--- group 1 of 1 (lines 5–39): kept as it was: the rewrite lost 11 facts" in out
    assert "missing: “My coffee is an oat-milk latte.”, 小雨" in out and "and 1 more" in out
    assert store.long_term_path.read_bytes() == before


# -- no fact lost: hand-made rewrites ----------------------------------------------------------------------

FAITHFUL = ("## 2026-11-23\n"
            "- Dog Bob, a 4-year-old corgi; coffee: oat-milk latte; cat Mimi.\n"
            "- 我女儿叫小雨，在上海读复旦大学。\n"
            "- Nurse at Charité hospital, Berlin, since 2019; work phone +49-30-450-50; locker 217.\n"
            "- Allergic to penicillin.\n"
            "- Sister Anna lives in Munich; birthday March 14.\n"
            "- Drives a blue 2015 VW Golf, plate B-AX 4021.\n"
            "- 每周三晚上七点游泳。\n")


@pytest.mark.parametrize(
    ("rewrite", "lost"),
    [
        pytest.param(FAITHFUL, (), id="faithful-merged-en-zh"),
        pytest.param(FAITHFUL.replace("我女儿叫小雨，在上海读复旦大学。",
                                      "Daughter Xiaoyu studies at Fudan University, Shanghai."),
                     ("小雨", "复旦大学", "“我女儿叫小雨，她在上海读大学（复旦大学）。”"),
                     id="chinese-entry-translated"),
        pytest.param(FAITHFUL.replace("每周三晚上七点游泳。", "Swims on Wednesdays at 7 pm."),
                     ("“我每周三晚上七点去游泳。”",), id="chinese-entry-without-names-translated"),
        pytest.param(FAITHFUL.replace("- Allergic to penicillin.\n", ""),
                     ("“I am allergic to penicillin.”",), id="allergy-dropped"),
    ],
)
@freeze_time(FROZEN)
def test_hand_made_rewrites_of_the_real_entries(workspace: Workspace, fake_openai: FakeOpenAIServer,
                                                rewrite: str, lost: tuple[str, ...]) -> None:
    store = workspace.store
    store.long_term_path.write_text(PREAMBLE + "\n" + REAL_BODY, encoding="utf-8")
    before = store.long_term_path.read_bytes()
    fake_openai.reply_text(rewrite)

    result = compress(store, fake_openai, force=True)

    assert result is not None and result.missing == lost
    if lost:
        assert result.status == "refused" and store.long_term_path.read_bytes() == before
    else:
        assert result.status == "compressed" and store.read_long_term() == PREAMBLE + "\n" + FAITHFUL


IDENTIFIERS = ["## 2025-03-01\nAlice Zhang's e-mail is alice.zhang@example.com; the team wiki is "
               "https://wiki.example.com/falcon/setup and the runbook is in ~/ops/falcon/runbook.md.",
               "## 2025-03-02\nThe deploy fails with ECONNREFUSED when the VPN is down; the coffee machine PIN "
               "is printed on sticker CAF-42 (1,200 cups so far).",
               "## 2025-03-03\nAlice prefers tea over coffee and reviews pull requests on Friday mornings."]
IDENTIFIERS_REWRITE = ("## Falcon team (2025-03-01, 2025-03-02, 2025-03-03)\n"
                       "Alice Zhang: alice.zhang@example.com, tea over coffee, reviews pull requests Friday mornings. "
                       "Wiki https://wiki.example.com/falcon/setup; runbook ~/ops/falcon/runbook.md. Deploy fails "
                       "with econnrefused if the VPN is down; coffee machine PIN on sticker caf-42 (1200 cups).\n")


@pytest.mark.parametrize(
    ("rewrite", "lost"),
    [
        pytest.param(IDENTIFIERS_REWRITE, (), id="all-kept-case-and-separators-aside"),
        pytest.param(IDENTIFIERS_REWRITE.replace("alice.zhang@example.com, ", ""), ("alice.zhang@example.com",),
                     id="e-mail"),
        pytest.param(IDENTIFIERS_REWRITE.replace("Wiki https://wiki.example.com/falcon/setup; ", ""),
                     ("https://wiki.example.com/falcon/setup",), id="url"),
        pytest.param(IDENTIFIERS_REWRITE.replace(" on sticker caf-42", ""), ("CAF-42",), id="code"),
        pytest.param(IDENTIFIERS_REWRITE.replace("with econnrefused ", ""), ("ECONNREFUSED",), id="error-code"),
        pytest.param(IDENTIFIERS_REWRITE.replace("2025-03-02, ", ""), ("2025-03-02",), id="entry-date"),
    ],
)
@freeze_time(FROZEN)
def test_a_rewrite_that_drops_an_identifier_is_refused_naming_it(
        workspace: Workspace, fake_openai: FakeOpenAIServer, rewrite: str, lost: tuple[str, ...]) -> None:
    store = workspace.store
    write_memory(store, IDENTIFIERS)
    before = store.long_term_path.read_bytes()
    fake_openai.reply_text(rewrite)

    result = compress(store, fake_openai, force=True)

    assert result is not None and result.missing == lost, result
    assert result.status == ("refused" if lost else "compressed")
    if lost:
        assert store.long_term_path.read_bytes() == before


# -- block groups ------------------------------------------------------------------------------------------

TRANSLATED_CHINESE = ("## Zhang Wei (2025-02-01 to 2025-02-20)\nLives in Hangzhou, West Lake district; likes Longjing "
                      "tea; project codename Falcon.\n"
                      + "".join(f"- 02-{day:02d}: phone 1380013800{day % 10}, budget {day} wan yuan\n"
                                for day in range(1, 21)))
GROUP_CHARS = 2300  # the 20 English entries (2,241 characters) make one group, the 20 Chinese ones another


def one_good_one_bad(body: dict[str, Any]) -> str:
    """Compresses the English group faithfully and translates the Chinese group into English."""
    return ENGLISH_REWRITE if "Project Falcon" in body["messages"][1]["content"] else TRANSLATED_CHINESE


def test_groups_are_whole_entries_within_the_budget() -> None:
    body = "\n\n".join(ENGLISH + CHINESE) + "\n"
    groups = compression.group_sections(body, GROUP_CHARS)
    assert [g.text for g in groups] == ["\n\n".join(ENGLISH) + "\n", "\n\n".join(CHINESE) + "\n"]
    assert "\n".join(g.text for g in groups) == body
    assert [(g.first_line, g.last_line) for g in groups] == [(1, 59), (61, 119)]
    # A section over the budget is a group of its own; one budget for everything is one group.
    assert len(compression.group_sections(body, 10)) == 40
    assert [g.text for g in compression.group_sections(body, 100_000)] == [body]


@pytest.mark.parametrize("dry_run", [False, True], ids=["real", "dry-run"])
@freeze_time(FROZEN)
def test_one_bad_group_keeps_its_text_and_the_good_group_is_compressed(
        workspace: Workspace, fake_openai: FakeOpenAIServer, dry_run: bool, caplog: pytest.LogCaptureFixture) -> None:
    store = workspace.store
    original = write_memory(store, ENGLISH + CHINESE)
    files_before = {p: p.read_bytes() for p in store.memory_dir.rglob("*") if p.is_file()}
    fake_openai.responder = one_good_one_bad

    result = compress(store, fake_openai, force=True, dry_run=dry_run, group_chars=GROUP_CHARS)

    expected = PREAMBLE + "\n" + ENGLISH_REWRITE + "\n" + "\n\n".join(CHINESE) + "\n"
    assert result is not None and result.status == ("dry_run" if dry_run else "compressed"), result
    assert result.after == expected
    assert len(fake_openai.chat_requests()) == 2
    good, bad = result.groups
    assert good.accepted and not good.missing
    assert not bad.accepted and "translated?" in (bad.problem or "")
    # The translation kept every number and date; it lost the bracketed name and every Chinese sentence.
    # Long sentences are shown cut at 40 characters.
    first_sentence = "“" + CHINESE[0].split("\n")[1][:39] + "…”"
    assert bad.missing[:2] == ("猎鹰", first_sentence) and len(bad.missing) == 21
    assert "groups compressed 1 of 2, kept as they were: 2" in result.detail
    good_line, bad_line = result.group_report()
    assert good_line == "group 1 of 2 (lines 5–63): compressed, 2241 → 807 characters"
    assert bad_line.startswith("group 2 of 2 (lines 65–123): kept as it was: the rewrite lost 21 facts of the "
                               "original (no Chinese/Japanese/Korean text is left in it: translated?); "
                               f"missing: 猎鹰, {first_sentence}, “第 2 条")
    assert bad_line.endswith(" and 11 more")  # ten shown
    if dry_run:
        assert {p: p.read_bytes() for p in store.memory_dir.rglob("*") if p.is_file()} == files_before
    else:
        assert store.read_long_term() == expected
        assert check_rewrite("\n\n".join(ENGLISH + CHINESE) + "\n", expected.removeprefix(PREAMBLE + "\n")) is None
        [backup] = store.backups()
        assert backup.read_text(encoding="utf-8") == original


@freeze_time(FROZEN)
def test_a_failed_call_keeps_its_group_and_sends_no_more(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    store = workspace.store
    write_memory(store, ENGLISH + CHINESE + ENGLISH)
    fake_openai.reply_text(ENGLISH_REWRITE)
    fake_openai.reply_error(500, "模型出错了 / internal error")

    async def go() -> CompressionResult | None:
        async with fake_provider(fake_openai) as provider:
            return await LongTermCompressor(store, provider, group_chars=GROUP_CHARS).run(POLICY, force=True)
    result = asyncio.run(go())

    assert result is not None and result.status == "compressed"
    assert [o.accepted for o in result.groups] == [True, False, False]
    assert "model call failed" in (result.groups[1].problem or "")
    assert result.groups[2].problem == compression.NOT_SENT
    assert len(fake_openai.chat_requests()) == 2
    assert store.read_long_term().endswith("\n\n".join(CHINESE + ENGLISH) + "\n")


@freeze_time(FROZEN)
def test_cli_shows_each_group(home: Path, fake_openai: FakeOpenAIServer, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    # `memory compress` makes its own compressor, with the module's group size: patched, as no argument reaches it.
    monkeypatch.setattr(compression, "GROUP_CHARS", GROUP_CHARS)
    configure(home, fake_openai)
    store = App.open(home).workspace.store
    original = write_memory(store, ENGLISH + CHINESE)
    fake_openai.responder = one_good_one_bad

    code, out, _ = run_cli(capsys, "memory", "compress", "--force", "--dry-run")
    assert code == 0 and store.read_long_term() == original
    dry_lines = [line.removeprefix("--- ") for line in out.splitlines() if line.startswith("--- group ")]
    assert dry_lines[0] == "group 1 of 2 (lines 5–63): compressed, 2241 → 807 characters"
    assert dry_lines[1].startswith("group 2 of 2 (lines 65–123): kept as it was: the rewrite lost 21 facts")

    code, out, _ = run_cli(capsys, "memory", "compress", "--force")
    assert code == 0 and out.startswith(f"compressed {store.long_term_path}: characters")
    # The real run keeps the same group, for the same reason, as the dry run said.
    assert dry_lines[1] in out.splitlines()


# -- the fact rules ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("original", "rewrite", "lost"),
    [
        pytest.param("Budget: 1,200 euros, room ５０２.", "Budget 1200 euros; room 502.", [],
                     id="separators-full-width"),
        pytest.param("## 2025-03-10\n会议", "## 2025年3月10日\n会议", [], id="date-forms"),
        pytest.param("## 2025-03-10\nA.\n\n## 2025-03-11\nB.", "## 2025 (03-10, 03-11)\nA. B.", [], id="month-day"),
        pytest.param("## 2025-03-10\nA.", "## 2025-03\nA.", ["2025-03-10"], id="month-only-loses-the-day"),
        pytest.param("The meeting is at 3.", "Meeting at 3.5.", ["3"], id="3-is-not-3.5"),
        pytest.param("My car is red. The bike is blue.", "Red car, blue bike.", [], id="the-and-my-are-not-names"),
        pytest.param("My dog is Bob. My cat is Mimi.", "Pets: dog Bob, cat Mimi.", [], id="merged"),
        pytest.param("Anna lives in Munich.", "Anna's home: munich.", [], id="case-and-possessive"),
        pytest.param("Call +86 138 0013 8000.", "Phone +8613800138000.", [], id="phone-grouping"),
        pytest.param("Call +86 138 0013 8000.", "Phone 138 0013 8000.", ["+86 138 0013 8000"], id="phone-country"),
        pytest.param("Error handleWebSocketReconnect in sync_worker.py.", "sync_worker.py: handlewebsocketreconnect.",
                     [], id="identifiers-without-case"),
        pytest.param("## Pets And Family (2026-11-23)\nDog Bob.\n\n## Work Life (2026-11-24)\nNurse at Charité.",
                     "## Personal (2026-11-23, 2026-11-24)\nDog Bob; nurse at Charité.", [],
                     id="topic-headings-renamed"),
        pytest.param("## Project Falcon (2025-01-01)\nOwner: Alice.", "## Work (2025-01-01)\nOwner: Alice.", ["Falcon"],
                     id="a-name-in-a-heading-counts"),
        pytest.param("Note: Call mom. Error ECONNRESET again.", "ECONNRESET again; mom.", [],
                     id="sentence-initial-common-words"),
        pytest.param("我每周三晚上七点去游泳。", "每周三晚七点游泳。", [], id="chinese-rephrased"),
        pytest.param("项目代号「猎鹰」，预算 5 万元。", "项目预算 5 万元。", ["猎鹰"], id="bracketed-term"),
        pytest.param("我女儿叫小雨，在上海。", "女儿在上海。", ["小雨"], id="called-name"),
        pytest.param("我每周三晚上七点去游泳。\n我喜欢龙井茶。", "我喜欢龙井茶。", ["“我每周三晚上七点去游泳。”"],
                     id="chinese-sentence-dropped"),
    ],
)
def test_missing_rules(original: str, rewrite: str, lost: list[str]) -> None:
    assert missing_facts(original, rewrite) == lost


def test_key_facts_kinds() -> None:
    found = key_facts("## 2025-03-10\nThe server ci-1.example.com returns ECONNREFUSED; ask Alice "
                      "(alice@example.com) on Monday, ticket CAF-42, 3 retries, see https://x.example.org/a.\n"
                      "我女儿叫小雨。")
    assert [(f.kind, f.text) for f in found.facts] == [
        ("date", "2025-03-10"), ("identifier", "ci-1.example.com"), ("identifier", "ECONNREFUSED"),
        ("name", "Alice"), ("identifier", "alice@example.com"), ("name", "Monday"), ("identifier", "CAF-42"),
        ("number", "3"), ("identifier", "https://x.example.org/a"), ("term", "小雨")]
    assert found.has_cjk


# -- the rewrite's room ------------------------------------------------------------------------------------


@pytest.mark.parametrize("entries", [ENGLISH, CHINESE], ids=["english", "chinese"])
@freeze_time(FROZEN)
def test_a_rewrite_through_the_windowed_provider_may_be_as_long_as_its_group(
        workspace: Workspace, fake_openai: FakeOpenAIServer, entries: list[str]) -> None:
    """The background provider caps replies at BACKGROUND_REPLY_CAP; a group of ~4,000 Chinese characters needs
    more (the cap cut it off, and the cut rewrite was refused, so Chinese memory was never compressed)."""
    from picoclaw.agent import WindowedProvider
    from picoclaw.agent.background_room import BACKGROUND_REPLY_CAP
    from picoclaw.providers.base import ContextWindow, FixedWindow
    from picoclaw.tokens import count_tokens

    store = workspace.store
    long_entries = [entry + " " + entry.split("\n", 1)[1] * 2 for entry in entries] * 2  # one large group
    write_memory(store, long_entries)
    fake_openai.reply_text(ENGLISH_REWRITE if entries is ENGLISH else CHINESE_REWRITE)

    async def go() -> None:
        async with fake_provider(fake_openai) as provider:
            windowed = WindowedProvider(provider, FixedWindow(ContextWindow(128_000, "config", "")))
            await LongTermCompressor(store, windowed, group_chars=20_000).run(POLICY, force=True, dry_run=True)
    asyncio.run(go())

    [request] = fake_openai.chat_requests()
    group_tokens = count_tokens(request["messages"][1]["content"])
    assert group_tokens > BACKGROUND_REPLY_CAP
    assert request["max_tokens"] >= group_tokens


@freeze_time(FROZEN)
def test_cli_compress_fits_the_rewrite_to_a_small_window(home: Path, fake_openai: FakeOpenAIServer,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`memory compress` asked with config's max_tokens (4,096) whatever the window: on a 4k one every request
    was over it."""
    configure(home, fake_openai)
    with edit_config(home) as config:
        config["agents"]["defaults"]["context_window"] = 4096
    store = App.open(home).workspace.store
    write_memory(store, CHINESE)
    fake_openai.reply_text(CHINESE_REWRITE)

    code, _, _ = run_cli(capsys, "memory", "compress", "--force", "--dry-run")

    assert code == 0
    [request] = fake_openai.chat_requests()
    assert 256 <= request["max_tokens"] < 4096
