"""`picoclaw memory stats`: what each memory document holds and how it is used, the retrieval time
each turn records, the prompt-cache share from the providers' reports, background model use, and what the last
compression and reflection did. What nothing has measured says so; damaged soft state is a warning, never a
traceback. Turns run through a real AgentLoop against the fake OpenAI server; time is frozen."""

from __future__ import annotations

import json
from datetime import date, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from picoclaw.cli import main
from picoclaw.curation.reflection import ReflectionOutcome
from picoclaw.memory import memory_stats
from picoclaw.memory.job_outcomes import GATE_FILE, outcome_path
from picoclaw.memory.model_usage import ModelUsage
from picoclaw.memory.search.access_counts import ACCESS_COUNTS_FILE
from picoclaw.memory.turn_metrics import KEEP_TURNS, TRIM_BYTES, TURN_METRICS_FILE, TurnMetrics
from picoclaw.memory.workspace import Workspace
from picoclaw.policy_schema import MemoryPolicy
from picoclaw.storage import FilesStorage
from picoclaw.tokens import count_tokens
from tests.agent_helpers import chat, frozen
from tests.fakes import FakeOpenAIServer
from tests.test_compression import ENGLISH, compress, write_memory
from tests.test_evolution import evolving, reflect

DAY = "2025-03-12 02:00:00"  # 10:00 in Asia/Shanghai, the day the turns run
TODAY = "2025-03-12"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def stats_json(capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    """`memory stats --json` parsed, and what it said on stderr; it must succeed."""
    code, out, err = run(capsys, "memory", "stats", "--json")
    assert code == 0, err
    return json.loads(out), err


def document(stats: dict[str, Any], name: str) -> dict[str, Any]:
    return next(doc for doc in stats["documents"] if doc["name"] == name)


def tree(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in root.rglob("*") if path.is_file()}


def remember(workspace: Workspace) -> None:
    """English and Chinese facts (one of them updated, so marked superseded), a lesson, a Chinese note."""
    store = workspace.store
    with frozen("2025-03-10 02:00:00"):
        store.append_long_term("My dog is called Bob.")
        store.append_long_term("我的猫叫咪咪，是一只橘猫。")
        store.append_long_term("I like green tea in the morning.")
        store.append_learning("When the user asks about their dog, give the newest name in memory.", source="test")
        store.append_note("我们聊了咖啡和茶，用户喜欢龙井。")
    with frozen("2025-03-11 02:00:00"):
        store.append_long_term("My dog is now called Max.")


# -- a fresh workspace: nothing measured yet ---------------------------------------------------------------


def test_a_fresh_workspace_says_what_is_not_known_and_writes_nothing(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = tree(home)
    code, out, err = run(capsys, "memory", "stats")
    assert (code, err) == (0, "")
    lines = {line.split(":", 1)[0].strip(): line for line in out.splitlines() if ":" in line}
    assert "not measured yet" in lines["retrieval"]
    assert "not measured yet" in lines["prompt cache"]
    assert "none recorded yet" in lines["learning"] and "skill_draft" not in lines  # drafts call no model
    assert "none recorded yet" in lines["last compression"] and "compression is off" in lines["last compression"]
    assert "none recorded yet" in lines["last reflection"] and "reflection is off" in lines["last reflection"]
    assert "most injected: none yet" in out
    assert " 0 ms" not in out and "0%" not in out  # an unknown is never shown as a measured zero

    stats, err = stats_json(capsys)
    assert err == ""
    assert stats["retrieval"] == {"turns": 0, "p50_ms": None, "p99_ms": None}
    assert stats["prompt_cache"]["share"] is None
    assert stats["background"] == {"learning": {"last_30d": None, "today": None}}
    assert stats["last_compression"] is None and stats["last_reflection"] is None
    memory = document(stats, "MEMORY.md")
    assert (memory["files"], memory["entries"], memory["superseded"]) == (1, 0, 0)  # onboarding's title only
    assert memory["tokens"] == count_tokens((home / "workspace/memory/MEMORY.md").read_text(encoding="utf-8"))
    assert stats["warnings"] == {}
    assert tree(home) == before  # stats only reads


# -- documents -------------------------------------------------------------------------------------------


def test_entries_superseded_lessons_and_notes_are_counted_in_both_languages(
        home: Path, workspace: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    remember(workspace)
    store = workspace.store
    with frozen(DAY):
        stats, _ = stats_json(capsys)
    memory = document(stats, "MEMORY.md")
    text = store.long_term_path.read_text(encoding="utf-8")
    assert (memory["entries"], memory["superseded"]) == (4, 1)
    assert (memory["characters"], memory["tokens"]) == (len(text), count_tokens(text))
    lessons = document(stats, "LEARNINGS.md")
    assert (lessons["files"], lessons["entries"], lessons["superseded"]) == (1, 1, 0)
    assert lessons["tokens"] == count_tokens(store.learnings_path.read_text(encoding="utf-8"))
    notes = document(stats, "notes")
    note_text = store.note_files()[0].read_text(encoding="utf-8")
    assert (notes["files"], notes["entries"], notes["tokens"]) == (1, 1, count_tokens(note_text))
    # Each Chinese character is a token, not a quarter of one as for English text: more tokens than 1 in 4.
    assert notes["tokens"] >= len("我们聊了咖啡和茶，用户喜欢龙井。") > notes["characters"] / 4
    # Nothing was injected yet: every entry counts as not injected in the last 30 days.
    assert [doc["not_injected_30d"] for doc in stats["documents"]] == [4, 1, 1]


def test_a_paragraphed_entry_is_one_entry_and_two_notes_of_one_minute_are_two(
        workspace: Workspace) -> None:
    store = workspace.store
    store.long_term_path.write_text("# Long-term memory\n\n## 2025-03-01\nFirst paragraph.\n\nSecond paragraph of it."
                                    "\n\n## 2025-03-02\n咖啡。\n", encoding="utf-8")
    with frozen(DAY):
        store.append_note("Called the bank.")
        store.append_note("Called the dentist.")  # the same minute: the same "## 10:00" heading
        stats = memory_stats(workspace)
    counts = {doc.name: doc.entries for doc in stats.documents}
    assert (counts["MEMORY.md"], counts["notes"]) == (2, 2)


# -- after real turns ------------------------------------------------------------------------------------


def test_after_real_turns_stats_shows_use_latency_and_the_cache_share(
        home: Path, workspace: Workspace, fake_openai: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    remember(workspace)
    scripted = [(1000, 600), (1200, 800), (1000, 0)]  # (prompt tokens, cached tokens) the server reports
    for prompt, cached in scripted:
        fake_openai.reply_text("ok", usage={"prompt_tokens": prompt, "completion_tokens": 5}, cached_tokens=cached)
    with frozen(DAY):
        # Two conversations ask about the dog: a block is injected once per conversation, so it is used twice.
        chat(workspace, fake_openai, ["What is my dog called?", "我的猫叫什么？"], key="cli:one")
        chat(workspace, fake_openai, ["What is my dog called now?"], key="cli:two")
        stats, err = stats_json(capsys)
        code, out, _ = run(capsys, "memory", "stats")
    assert err == "" and code == 0
    assert stats["retrieval"]["turns"] == 3
    assert stats["retrieval"]["p50_ms"] is not None and stats["retrieval"]["p99_ms"] is not None
    assert stats["retrieval"]["p50_ms"] <= stats["retrieval"]["p99_ms"]
    cache = stats["prompt_cache"]
    assert (cache["replies"], cache["prompt_tokens"], cache["cached_tokens"]) == (3, 3200, 1400)
    assert cache["share"] == pytest.approx(1400 / 3200)
    assert "44% of prompt tokens cached (1,400 of 3,200) over the last 3 model replies" in out

    memory = document(stats, "MEMORY.md")
    # Both dog entries (the old one marked) came in both conversations, the cat once, the tea never.
    assert [(use["preview"], use["injected"]) for use in memory["most_injected"]] == [
        ("(superseded) My dog is called Bob.", 2), ("My dog is now called Max.", 2), ("我的猫叫咪咪，是一只橘猫。", 1)]
    newest = memory["most_injected"][1]
    assert (newest["file"], newest["line"], newest["heading"], newest["last_injected"]) == (
        "MEMORY.md", 15, "## 2025-03-11", TODAY)
    assert memory["not_injected_30d"] == 1
    # The lesson about the dog came with the first dog question of each conversation.
    lesson = document(stats, "LEARNINGS.md")["most_injected"][0]
    assert lesson["injected"] == 2 and lesson["preview"].startswith("When the user asks about their dog")
    assert "Source:" not in lesson["preview"]
    assert "My dog is now called Max." in out and "2×" in out


def test_retrieval_time_is_measured_on_a_running_clock(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    # Not frozen: freezegun stops perf_counter too, and a measured time must be more than nothing.
    fake_openai.reply_text("ok")
    fake_openai.reply_text("ok")
    chat(workspace, fake_openai, ["hello", "你好"])
    retrieval = memory_stats(workspace).retrieval
    assert retrieval.turns == 2
    assert retrieval.p50_ms is not None and retrieval.p50_ms > 0


def test_a_turn_that_failed_records_no_retrieval_time(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_error(500, "the model is down")
    fake_openai.reply_text("ok")
    with frozen(DAY):
        replies = chat(workspace, fake_openai, ["hello", "你好"])
        retrieval = memory_stats(workspace).retrieval
    assert replies[0].startswith("Sorry") and replies[1] == "ok"
    assert retrieval.turns == 1  # the answered turn only


def test_a_provider_that_reports_no_cache_leaves_the_share_unknown(
        home: Path, workspace: Workspace, fake_openai: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    fake_openai.reply_text("ok", usage={"prompt_tokens": 900, "completion_tokens": 3})  # no cached part
    with frozen(DAY):
        chat(workspace, fake_openai, ["hello"])
        stats, _ = stats_json(capsys)
        _, out, _ = run(capsys, "memory", "stats")
    assert stats["prompt_cache"] == {"replies": 0, "prompt_tokens": 0, "cached_tokens": 0, "share": None,
                                     "unreported": 1}
    assert "unknown: the provider reported no cached tokens for the last 1 model reply" in out


def test_background_model_use_for_30_days_and_today(
        home: Path, workspace: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = ModelUsage(workspace.memory_dir, storage=workspace.storage)
    ledger.claim("learning", date(2025, 3, 1), 10)
    ledger.add_tokens("learning", date(2025, 3, 1), 300, 40)
    ledger.claim("learning", date(2025, 3, 12), 10)
    ledger.add_tokens("learning", date(2025, 3, 12), 200, 30)
    ledger.claim("learning", date(2025, 1, 20), 10)  # older than 30 days
    ledger.claim("summary_test", date(2025, 3, 12), 10)  # a purpose stats does not know of is shown too
    ledger.claim("old_job", date(2025, 1, 20), 10)  # … and one with no call in the window
    with frozen(DAY):
        stats, _ = stats_json(capsys)
        _, out, _ = run(capsys, "memory", "stats")
    learning = stats["background"]["learning"]
    assert learning["last_30d"] == {"calls": 2, "prompt_tokens": 500, "completion_tokens": 70}
    assert learning["today"] == {"calls": 1, "prompt_tokens": 200, "completion_tokens": 30}
    assert stats["background"]["old_job"]["last_30d"] == {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0}
    assert stats["background"]["summary_test"]["today"]["calls"] == 1
    assert "2 calls, 500 prompt + 70 completion tokens; today 1 call, 200 prompt + 30 completion tokens" in out
    assert "old_job:" in out and "old_job:        no calls; today no calls" in out  # a real zero, in words


# -- the last compression and reflection -------------------------------------------------------------------


def test_a_refused_compression_is_recorded_and_shown(
        home: Path, workspace: Workspace, fake_openai: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    store = workspace.store
    original = write_memory(store, ENGLISH)
    fake_openai.reply_text("## Everything\nProject Falcon.")  # loses every ticket and server: refused
    with frozen(DAY):
        result = compress(store, fake_openai, force=True)
        stats, _ = stats_json(capsys)
        _, out, _ = run(capsys, "memory", "stats")
    assert result is not None and result.status == "refused"
    assert store.read_long_term() == original
    last = stats["last_compression"]
    assert (last["status"], last["time"]) == ("refused", "2025-03-12T10:00:00+08:00")
    assert last["detail"] == result.detail and "facts would be lost" in last["detail"]
    assert f"last compression: 2025-03-12 10:00 refused: {result.detail}" in out


def test_a_compression_that_left_no_outcome_is_shown_as_unknown(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    write_memory(workspace.store, ENGLISH)
    fake_openai.reply_text("## Everything\nProject Falcon.")
    with frozen("2025-03-11 02:00:00"):
        compress(workspace.store, fake_openai, force=True)
    # A later run claimed the gate and was stopped before it ended (or an older version ran it).
    (workspace.memory_dir / GATE_FILE).write_text("2025-03-12T09:00:00+08:00\n", encoding="utf-8")
    with frozen(DAY):
        last = memory_stats(workspace).last_compression
    assert last is not None
    assert (last.status, last.time) == ("unknown", "2025-03-12T09:00:00+08:00")


def test_a_dry_run_records_no_outcome(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    write_memory(workspace.store, ENGLISH)
    fake_openai.reply_text("## Everything\nProject Falcon.")
    with frozen(DAY):
        result = compress(workspace.store, fake_openai, force=True, dry_run=True)
    assert result is not None and result.status == "refused"  # what a real run would have recorded
    assert not outcome_path(workspace.memory_dir, "compression").exists()


@pytest.mark.parametrize(("answer", "status", "detail"), [
    ('{"retrieve_limit": 15, "reason": "older facts were missed"}', "changed",
     "session telegram:42: retrieve_limit → 15 (older facts were missed)"),
    ('{"reason": "all is well"}', "unchanged", "session telegram:42: all is well"),
    ("I cannot help with that.", "refused", "session telegram:42: no JSON object in the answer"),
])
def test_every_reflection_records_what_came_of_it(home: Path, fake_openai: FakeOpenAIServer, answer: str,
                                                  status: str, detail: str) -> None:
    workspace = evolving(home, fake_openai)
    fake_openai.reply_text(answer)
    with frozen(DAY):
        outcome = reflect(workspace, fake_openai)
        last = memory_stats(workspace).last_reflection
    assert isinstance(outcome, ReflectionOutcome) and outcome.status == status
    assert last is not None
    assert (last.status, last.detail, last.time) == (status, detail, "2025-03-12T10:00:00+08:00")


# -- damaged soft state ----------------------------------------------------------------------------------


def test_damaged_soft_state_files_are_warnings_and_unknowns_not_tracebacks(
        home: Path, workspace: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    remember(workspace)
    folder = workspace.memory_dir
    (folder / ACCESS_COUNTS_FILE).write_bytes(b"{not json")
    (folder / TURN_METRICS_FILE).write_bytes(b"\x00\xff garbage\n[1, 2]\n")
    (folder / ".model_usage.json").write_text('{"version": 99, "days": {}}', encoding="utf-8")
    outcome_path(folder, "compression").write_text("{", encoding="utf-8")
    outcome_path(folder, "reflection").write_text('{"time": 3}', encoding="utf-8")
    with frozen(DAY):
        code, out, err = run(capsys, "memory", "stats")
        stats, json_err = stats_json(capsys)
    assert code == 0
    assert "Traceback" not in out + err
    warnings = err.splitlines()
    assert len(warnings) == 5 and all(line.startswith("warning: ") for line in warnings)
    for name in (ACCESS_COUNTS_FILE, TURN_METRICS_FILE, ".model_usage.json", ".last_compression.json",
                 ".last_reflection.json"):
        assert sum(name in line for line in warnings) == 1, name
    assert json_err == err
    assert "unknown" in out.splitlines()[3]  # MEMORY.md's row: entries not injected
    assert "most injected: unknown" in out
    lines = {line.split(":", 1)[0].strip(): line for line in out.splitlines() if ":" in line}
    for label in ("retrieval", "learning", "last compression", "last reflection"):
        assert "unknown" in lines[label], label
    assert [doc["not_injected_30d"] for doc in stats["documents"]] == [None, None, None]
    assert stats["warnings"]["retrieval"].endswith("2 damaged line(s) skipped; retrieval times are unknown")
    assert stats["retrieval"]["turns"] is None
    assert stats["background"]["learning"]["last_30d"] is None
    assert stats["last_compression"] is None and stats["last_reflection"] is None
    assert set(stats["warnings"]) == {"documents", "retrieval", "background", "last_compression", "last_reflection"}
    # What could be read still is: the documents' own numbers.
    assert document(stats, "MEMORY.md")["entries"] == 4


def test_a_damaged_line_of_the_metrics_costs_only_itself(workspace: Workspace) -> None:
    metrics = TurnMetrics(workspace.memory_dir, storage=workspace.storage)
    metrics.record(4.0, datetime.fromisoformat("2025-03-12T10:00:00+08:00"))
    with metrics.path.open("ab") as file:
        file.write(b'{"time": "2025-03-12T10:01:00+08:00", "retrieval_ms": "fast"}\n{"torn": ')
    metrics.record(6.0, datetime.fromisoformat("2025-03-12T10:02:00+08:00"))
    stats = memory_stats(workspace)
    assert (stats.retrieval.turns, stats.retrieval.p50_ms, stats.retrieval.p99_ms) == (2, 4.0, 6.0)
    assert "2 damaged line(s)" in stats.warnings["retrieval"]


# -- the metrics file ----------------------------------------------------------------------------------


def test_the_metrics_file_stays_bounded_and_keeps_the_newest_turns(tmp_path: Path) -> None:
    metrics = TurnMetrics(tmp_path, storage=FilesStorage(tmp_path))
    at = datetime.fromisoformat("2025-03-12T10:00:00+08:00")
    for turn in range(1500):
        metrics.record(float(turn), at)
        assert metrics.path.stat().st_size <= TRIM_BYTES + 100
    read = metrics.read()
    assert len(read.turns) == KEEP_TURNS and read.damaged == 0
    assert read.turns[-1].retrieval_ms == 1499.0
    assert [turn.retrieval_ms for turn in read.turns] == sorted(turn.retrieval_ms for turn in read.turns)


def test_an_agents_turns_share_a_write_and_nothing_waits_past_a_flush(tmp_path: Path) -> None:
    metrics = TurnMetrics(tmp_path, storage=FilesStorage(tmp_path), settle_after=3600)  # longer than any test
    at = datetime.fromisoformat("2025-03-12T10:00:00+08:00")

    def written() -> list[float]:  # what another process (`memory stats`) reads
        return [turn.retrieval_ms for turn in TurnMetrics(tmp_path, storage=FilesStorage(tmp_path)).read().turns]

    metrics.record(1.0, at)  # the first turn after a quiet spell: written at once
    assert written() == [1.0]
    metrics.record(2.0, at)
    metrics.record(3.0, at)  # these two wait for one shared write
    assert written() == [1.0]
    metrics.flush()
    assert written() == [1.0, 2.0, 3.0]
    metrics.flush()  # nothing waiting: nothing written twice
    assert written() == [1.0, 2.0, 3.0]


def test_adding_a_turn_never_writes_and_says_when_its_caller_must(tmp_path: Path) -> None:
    # What the agent loop calls on its event loop: the write, when due, is the caller's, in a thread.
    metrics = TurnMetrics(tmp_path, storage=FilesStorage(tmp_path), settle_after=3600)
    at = datetime.fromisoformat("2025-03-12T10:00:00+08:00")
    assert metrics.add(1.0, at) is True  # the first after a quiet spell: due now, but not written here
    assert not metrics.path.exists()
    metrics.flush()
    assert metrics.add(2.0, at) is False and metrics.add(3.0, at) is False  # the timer's shared write takes them
    assert [turn.retrieval_ms for turn in metrics.read().turns] == [1.0]
    metrics.flush()
    assert [turn.retrieval_ms for turn in metrics.read().turns] == [1.0, 2.0, 3.0]


def test_waiting_turns_are_written_by_the_timer_without_a_flush(tmp_path: Path) -> None:
    metrics = TurnMetrics(tmp_path, storage=FilesStorage(tmp_path), settle_after=0.5)
    at = datetime.fromisoformat("2025-03-12T10:00:00+08:00")
    for turn in range(3):
        metrics.record(float(turn), at)
    timer = metrics._timer  # None only on a machine so slow that half a second passed between two records
    if timer is not None:
        timer.join(timeout=60)  # how long it waits is the timer's; the test only waits for it to have run
    assert [turn.retrieval_ms for turn in metrics.read().turns] == [0.0, 1.0, 2.0]
    assert metrics._timer is None


def test_a_garbage_metrics_file_heals_at_the_next_trim(tmp_path: Path) -> None:
    (tmp_path / TURN_METRICS_FILE).write_bytes(b"\xff" * (TRIM_BYTES + 10))  # one long damaged line
    metrics = TurnMetrics(tmp_path, storage=FilesStorage(tmp_path))
    metrics.record(2.5, datetime.fromisoformat("2025-03-12T10:00:00+08:00"))
    read = metrics.read()
    assert [turn.retrieval_ms for turn in read.turns] == [2.5] and read.damaged == 0


def test_a_metrics_file_that_cannot_be_written_never_fails_a_turn(
        home: Path, workspace: Workspace, fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    (workspace.memory_dir / TURN_METRICS_FILE).mkdir()  # a folder where the file should be
    fake_openai.reply_text("still answered")
    with frozen(DAY):
        assert chat(workspace, fake_openai, ["hello"]) == ["still answered"]
    assert any("turn metrics" in record.getMessage() for record in caplog.records)


# -- scopes ----------------------------------------------------------------------------------------------


def test_a_per_user_scope_has_its_own_numbers(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    alice = workspace.for_user("alice")
    with frozen(DAY):
        alice.store.append_long_term("Alice 的生日是五月一日。")
        alice.store.append_long_term("Alice likes hiking.")
        fake_openai.reply_text("ok", usage={"prompt_tokens": 500, "completion_tokens": 2}, cached_tokens=500)
        chat(alice, fake_openai, ["When is Alice's birthday?"])
        mine, shared = memory_stats(alice), memory_stats(workspace)
    assert mine.memory_dir == str(workspace.root / "users" / "alice" / "memory")
    assert (mine.documents[0].entries, shared.documents[0].entries) == (2, 0)
    assert (mine.retrieval.turns, shared.retrieval.turns) == (1, 0)
    assert (mine.prompt_cache.share, shared.prompt_cache.share) == (1.0, None)


def test_json_holds_the_numbers_the_table_shows(home: Path, workspace: Workspace,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    remember(workspace)
    with frozen(DAY):
        stats, _ = stats_json(capsys)
        _, out, _ = run(capsys, "memory", "stats")
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[3:6]}
    for doc in stats["documents"]:
        files, entries, characters, tokens, superseded, not_injected = rows[doc["name"]]
        assert (int(files), int(entries), int(characters.replace(",", "")), int(tokens.replace(",", "")),
                int(superseded), int(not_injected)) == (doc["files"], doc["entries"], doc["characters"],
                                                        doc["tokens"], doc["superseded"], doc["not_injected_30d"])
    assert orjson.loads(orjson.dumps(stats)) == stats  # plain JSON values only
    assert MemoryPolicy().learning_enabled == stats["learning_enabled"]
