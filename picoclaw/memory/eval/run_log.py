"""The log of eval runs (memory/eval/runs.jsonl): one line a run under the policy in force, so `memory stats` and the
console can show the last figures and their trend. A what-if run (`--policy FILE`) is not logged: its figures are
not the memory's as it runs."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson

from picoclaw import clock
from picoclaw.memory.eval.run import EvalReport
from picoclaw.storage import Documents, StorageError

log = logging.getLogger(__name__)

RUNS_NAME = "memory/eval/runs.jsonl"
TREND_RUNS = 10  # the newest runs a trend is drawn over


@dataclass(frozen=True)
class EvalRun:
    """One logged run: when, at which K, over how many cases, and what it found."""

    time: str
    k: int
    cases: int
    scored: int
    found: int
    recall: float
    gone: int

    @classmethod
    def of(cls, record: dict[str, Any]) -> EvalRun | None:
        try:
            return cls(str(record["time"]), int(record["k"]), int(record["cases"]), int(record["scored"]),
                       int(record["found"]), float(record["recall"]), int(record.get("gone", 0)))
        except (KeyError, TypeError, ValueError):
            return None


def log_run(documents: Documents, report: EvalReport, tz: Any = None) -> None:
    """Add `report` to the run log (soft state: a run that cannot be logged is still printed)."""
    record = {"time": clock.now(tz).isoformat(timespec="seconds"), "k": report.k, "cases": len(report.results),
              "scored": len(report.scored), "found": report.found, "recall": round(report.recall, 4),
              "gone": len(report.gone),
              "recall_at": {str(cut): round(report.recall_at(cut), 4) for cut in report.cutoffs()}}
    try:
        documents.append_records(RUNS_NAME, [record], durable=False)
    except (OSError, StorageError) as exc:
        log.warning("the eval run could not be logged in %s: %s", RUNS_NAME, exc)


def logged_runs(documents: Documents) -> list[EvalRun]:
    """Every logged run, oldest first (unreadable lines skipped); [] with no log."""
    found = documents.read(RUNS_NAME)
    runs = []
    for line in (found.data or b"").splitlines():
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        run = EvalRun.of(record) if isinstance(record, dict) else None
        if run is not None:
            runs.append(run)
    return runs
