"""What the memory flush did, day by day, for `picoclaw memory stats`: the facts the model proposed,
those written, those MEMORY.md already held, and those refused, by reason (memory/grounding.py).

Kept beside the memory files as `memory/.flush_counts.json` (the last KEEP_DAYS days), updated under a lock of the
memory folder, so every process of the workspace adds to the same numbers, and on PostgreSQL the file is a
document of the scope like the other bookkeeping files. Soft state: an update that fails is logged and the
flush's own work stands; a damaged file reads as unknown and starts afresh with the next flush.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path

import orjson

from picoclaw.errors import ConfigError
from picoclaw.jsonio import read_json_object
from picoclaw.storage import Storage, StorageError, document_of

log = logging.getLogger(__name__)

FLUSH_COUNTS_FILE = ".flush_counts.json"
KEEP_DAYS = 60
LOCK_WAIT_SECONDS = 10.0
_VERSION = 1
_NUMBERS = ("runs", "proposed", "written", "known")


@dataclass(frozen=True)
class FlushTally:
    """Flushes run, and the facts they proposed, wrote, found known, and refused (reason → how many)."""

    runs: int = 0
    proposed: int = 0
    written: int = 0
    known: int = 0
    rejected: dict[str, int] = field(default_factory=dict)

    def __add__(self, other: FlushTally) -> FlushTally:
        rejected = Counter(self.rejected)
        rejected.update(other.rejected)
        return FlushTally(self.runs + other.runs, self.proposed + other.proposed, self.written + other.written,
                          self.known + other.known, dict(rejected))

    @property
    def refused(self) -> int:
        return sum(self.rejected.values())

    def as_json(self) -> list[object]:
        return [self.runs, self.proposed, self.written, self.known, dict(sorted(self.rejected.items()))]


class FlushCounts:
    """The per-day counts of one memory folder's flushes."""

    def __init__(self, memory_dir: Path, *, storage: Storage, lock_wait: float = LOCK_WAIT_SECONDS):
        self.path = Path(memory_dir) / FLUSH_COUNTS_FILE
        self._lock = storage.lock(Path(memory_dir) / ".flush_counts.lock", timeout=lock_wait)
        self.documents, self.name = document_of(storage, self.path)

    def add(self, day: date, tally: FlushTally) -> None:
        """Add one flush's `tally` to `day`; a failure is logged, never raised."""
        try:
            with self._lock:
                try:
                    days = self._read() or {}
                except ConfigError as exc:
                    log.warning("flush counts: %s; counting starts afresh", exc)
                    days = {}
                key = day.isoformat()
                days[key] = days.get(key, FlushTally()) + tally
                oldest = (day - timedelta(days=KEEP_DAYS)).isoformat()
                kept = {d: counts.as_json() for d, counts in sorted(days.items()) if d >= oldest}
                self.documents.replace(self.name, orjson.dumps({"version": _VERSION, "days": kept}))
        except (OSError, StorageError) as exc:  # a held lock past its wait, a lost server: skipped, not fatal
            log.warning("flush counts: cannot update %s (%s); this flush is not counted", self.path, exc)

    def read(self) -> dict[str, FlushTally] | None:
        """Each day's tally by ISO day; None when no flush was counted yet. ConfigError when it cannot be read.

        Without the lock: a reader writes nothing (not even a lock file), and reads the counts as stored now."""
        return self._read()

    def _read(self) -> dict[str, FlushTally] | None:
        file = self.documents.local(self.name)
        if not (file.exists() or file.is_symlink()):
            return None
        raw = read_json_object(file)
        days = raw.get("days")
        if raw.get("version") != _VERSION or not isinstance(days, dict):
            raise ConfigError(f"{self.path} is not a version {_VERSION} file of flush counts")
        found: dict[str, FlushTally] = {}
        for day, value in days.items():
            tally = _tally(value)
            if tally is not None:
                found[str(day)] = tally
        return found


def _tally(value: object) -> FlushTally | None:
    """A day's counts as stored, or None when they are not (a hand edit): that day is left out."""
    if not isinstance(value, list) or len(value) != len(_NUMBERS) + 1:
        return None
    numbers, rejected = value[:-1], value[-1]
    if not all(type(n) is int and n >= 0 for n in numbers) or not isinstance(rejected, dict):
        return None
    if not all(isinstance(k, str) and type(n) is int and n >= 0 for k, n in rejected.items()):
        return None
    runs, proposed, written, known = numbers
    return FlushTally(runs, proposed, written, known, dict(rejected))


def tally_since(days: Mapping[str, FlushTally], first: date) -> FlushTally:
    """The flushes' counts from `first` on."""
    total = FlushTally()
    for day, tally in days.items():
        if day >= first.isoformat():
            total = total + tally
    return total
