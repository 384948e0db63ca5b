"""`picoclaw memory stats` (issue 27): the retrieval time each turn records, what the last compression and
reflection did. Turns run through a real AgentLoop against the fake OpenAI server."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from picoclaw.agent.reflection import ReflectionOutcome
from picoclaw.memory.job_outcomes import COMPRESSION, REFLECTION, last_outcome, outcome_path
from picoclaw.memory.turn_metrics import KEEP_TURNS, TRIM_BYTES, TURN_METRICS_FILE, TurnMetrics
from picoclaw.memory.workspace import Workspace
from tests.agent_helpers import chat, frozen
from tests.fakes import FakeOpenAIServer
from tests.test_compression import ENGLISH, compress, write_memory
from tests.test_evolution import evolving, reflect

DAY = "2025-03-12 02:00:00"  # 10:00 in Asia/Shanghai, the day the turns run


def test_each_turn_records_its_retrieval_time(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    # Not frozen: freezegun stops perf_counter too, and a measured time must be more than nothing.
    fake_openai.reply_text("ok")
    fake_openai.reply_text("ok")
    chat(workspace, fake_openai, ["hello", "你好"])
    read = TurnMetrics(workspace.memory_dir).read()
    assert len(read.turns) == 2 and read.damaged == 0
    assert all(turn.retrieval_ms > 0 for turn in read.turns)


def test_a_damaged_line_of_the_metrics_costs_only_itself(tmp_path: Path) -> None:
    metrics = TurnMetrics(tmp_path)
    metrics.record(4.0, datetime.fromisoformat("2025-03-12T10:00:00+08:00"))
    with metrics.path.open("ab") as file:
        file.write(b'{"time": "2025-03-12T10:01:00+08:00", "retrieval_ms": "fast"}\n{"torn": ')
    metrics.record(6.0, datetime.fromisoformat("2025-03-12T10:02:00+08:00"))
    read = metrics.read()
    assert ([turn.retrieval_ms for turn in read.turns], read.damaged) == ([4.0, 6.0], 2)


def test_the_metrics_file_stays_bounded_and_keeps_the_newest_turns(tmp_path: Path) -> None:
    metrics = TurnMetrics(tmp_path)
    at = datetime.fromisoformat("2025-03-12T10:00:00+08:00")
    for turn in range(1500):
        metrics.record(float(turn), at)
        assert metrics.path.stat().st_size <= TRIM_BYTES + 100
    read = metrics.read()
    assert len(read.turns) == KEEP_TURNS and read.damaged == 0
    assert read.turns[-1].retrieval_ms == 1499.0
    assert [turn.retrieval_ms for turn in read.turns] == sorted(turn.retrieval_ms for turn in read.turns)


def test_a_garbage_metrics_file_heals_at_the_next_trim(tmp_path: Path) -> None:
    (tmp_path / TURN_METRICS_FILE).write_bytes(b"\xff" * (TRIM_BYTES + 10))  # one long damaged line
    metrics = TurnMetrics(tmp_path)
    metrics.record(2.5, datetime.fromisoformat("2025-03-12T10:00:00+08:00"))
    read = metrics.read()
    assert [turn.retrieval_ms for turn in read.turns] == [2.5] and read.damaged == 0


def test_a_metrics_file_that_cannot_be_written_never_fails_a_turn(
        workspace: Workspace, fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    (workspace.memory_dir / TURN_METRICS_FILE).mkdir()  # a folder where the file should be
    fake_openai.reply_text("still answered")
    with frozen(DAY):
        assert chat(workspace, fake_openai, ["hello"]) == ["still answered"]
    assert any("turn metrics" in record.getMessage() for record in caplog.records)


# -- the last compression and reflection -------------------------------------------------------------------


def test_a_refused_compression_is_recorded(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    store = workspace.store
    original = write_memory(store, ENGLISH)
    fake_openai.reply_text("## Everything\nProject Falcon.")  # loses every ticket and server: refused
    with frozen(DAY):
        result = compress(store, fake_openai, force=True)
    assert result is not None and result.status == "refused"
    assert store.read_long_term() == original
    last = last_outcome(workspace.memory_dir, COMPRESSION)
    assert last is not None
    assert (last.status, last.detail, last.time) == ("refused", result.detail, "2025-03-12T02:00:00+00:00")


def test_a_dry_run_records_no_outcome(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    write_memory(workspace.store, ENGLISH)
    fake_openai.reply_text("## Everything\nProject Falcon.")
    with frozen(DAY):
        result = compress(workspace.store, fake_openai, force=True, dry_run=True)
    assert result is not None and result.status == "refused"  # what a real run would have recorded
    assert not outcome_path(workspace.memory_dir, COMPRESSION).exists()


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
    last = last_outcome(workspace.policy.memory_dir, REFLECTION)
    assert isinstance(outcome, ReflectionOutcome) and outcome.status == status
    assert last is not None
    assert (last.status, last.detail) == (status, detail)
