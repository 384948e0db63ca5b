"""What each turn measured about memory: how long retrieval took, kept for `picoclaw memory stats`.

The file (`memory/.turn_metrics.jsonl`) holds one JSON line a turn: its time and `retrieval_ms`, the time the
turn spent choosing its memory and building its prompt. Appends take a file lock (so two processes never
lose each other's lines to a trim) and are not fsynced. An agent's turns share one append a second (the lines
wait up to `settle_after`; AgentLoop.wait_background writes what waits): a busy bot pays a lock and one write
a second, not at every turn. Past
TRIM_BYTES the file is trimmed to its newest KEEP_TURNS lines. It is soft state: a damaged line is
skipped, a damaged file is trimmed to its good lines on the next trim, and no turn ever fails for it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

import orjson

from picoclaw.disk.bounded_read import FileTooLargeError, read_bounded
from picoclaw.disk.links import NotAFileError
from picoclaw.storage import Storage, StorageError, document_of

log = logging.getLogger(__name__)

TURN_METRICS_FILE = ".turn_metrics.jsonl"
KEEP_TURNS = 500
# A line is about 60 bytes: trimming at 64 KiB keeps between 500 and about 1,100 turns, one trim per ~600 turns.
TRIM_BYTES = 64 * 1024
# What a reader reads at most; a larger file was not written by picoclaw (or is a link to something else).
READ_LIMIT = 1 << 20
# A turn never waits longer than this for another process's append: a missed measurement costs nothing.
LOCK_WAIT_SECONDS = 0.5


@dataclass(frozen=True)
class TurnMetric:
    """One turn's measurements."""

    time: str  # ISO 8601, the turn's local time
    retrieval_ms: float


@dataclass(frozen=True)
class MetricsRead:
    """The newest turns' metrics as read, oldest first, and how many lines could not be read."""

    turns: list[TurnMetric]
    damaged: int = 0
    problem: str | None = None  # why nothing could be read (an unreadable file), else None


class TurnMetrics:
    """The per-turn metrics of one memory folder."""

    def __init__(self, memory_dir: Path, *, storage: Storage, lock_wait: float = LOCK_WAIT_SECONDS,
                 settle_after: float = 0.0):
        self.path = Path(memory_dir) / TURN_METRICS_FILE
        self._lock = storage.lock(Path(memory_dir) / ".turn_metrics.lock", timeout=lock_wait)
        self.documents, self.name = document_of(storage, self.path)
        self._warned = False
        # Seconds a turn's line may wait to share a write with the turns after it (0: written at once). The first
        # line after a quiet spell is written at once; the lines of the next `settle_after` s by a timer, together.
        self.settle_after = settle_after
        self._due: list[TurnMetric] = []
        self._due_lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._written_at = -math.inf  # time.monotonic() of the last write

    def record(self, retrieval_ms: float, at: datetime) -> None:
        """Add one turn's measurements, now or with the next ones (`settle_after`); problems are logged (once),
        never raised."""
        if self.add(retrieval_ms, at):
            self.flush()

    def add(self, retrieval_ms: float, at: datetime) -> bool:
        """Queue one turn's measurements without writing; True when they are to be written now (`flush`), False
        when a timer writes them with the next ones. Never blocks on the file: an event loop may call it."""
        with self._due_lock:
            self._due.append(TurnMetric(at.isoformat(timespec="seconds"), round(retrieval_ms, 3)))
            if self._timer is not None:  # a write is due soon: it takes this line too
                return False
            wait = self._written_at + self.settle_after - time.monotonic()
            if wait > 0:
                self._timer = threading.Timer(wait, self.flush)
                self._timer.daemon = True  # the agent flushes as it closes (AgentLoop.wait_background)
                self._timer.start()
                return False
        return True

    def waiting(self) -> bool:
        """Whether lines wait for their shared write (a timer's): whoever holds this must `flush` before letting go."""
        with self._due_lock:
            return bool(self._due)

    def flush(self) -> None:
        """Write the lines waiting for their shared write, if any."""
        with self._due_lock:
            due, self._due = self._due, []
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if due:
                self._written_at = time.monotonic()
        if due:
            self._write(due)

    def _write(self, turns: list[TurnMetric]) -> None:
        try:
            with self._lock:
                size = self.documents.append_records(self.name, [asdict(turn) for turn in turns], durable=False)
                if size > TRIM_BYTES:
                    self._trim()
        except (OSError, StorageError) as exc:  # a held lock past its wait, a lost server: skipped, not fatal
            if not self._warned:
                log.warning("turn metrics: cannot update %s (%s); turns go on without it (logged once)",
                            self.path, exc)
                self._warned = True

    def read(self) -> MetricsRead:
        """The newest KEEP_TURNS turns' metrics, oldest first; damaged lines are counted and skipped."""
        try:
            raw = read_bounded(self.documents.local(self.name), READ_LIMIT)
        except FileNotFoundError:
            return MetricsRead([])
        except (FileTooLargeError, NotAFileError, OSError) as exc:
            return MetricsRead([], problem=str(exc))
        turns, damaged = _parse(raw.split(b"\n"))
        return MetricsRead(turns[-KEEP_TURNS:], damaged)

    def _trim(self) -> None:
        # Under the lock. Only readable lines are kept: a damaged file heals here, and one too large to be
        # picoclaw's starts afresh.
        try:
            turns, _ = _parse(read_bounded(self.documents.local(self.name), READ_LIMIT).split(b"\n"))
        except FileTooLargeError:
            turns = []
        kept: list[bytes | bytearray] = [orjson.dumps(asdict(turn)) + b"\n" for turn in turns[-KEEP_TURNS:]]
        self.documents.replace(self.name, b"".join(kept), durable=False)


def _parse(lines: Sequence[bytes]) -> tuple[list[TurnMetric], int]:
    turns: list[TurnMetric] = []
    damaged = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
            value = record["retrieval_ms"]
            when = record["time"]
            if type(value) not in (int, float) or not math.isfinite(value) or value < 0 or not isinstance(when, str):
                raise ValueError
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            damaged += 1
            continue
        turns.append(TurnMetric(when, float(value)))
    return turns, damaged

