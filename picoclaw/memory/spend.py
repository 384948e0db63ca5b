"""The spend ledger: what every model call cost, per day and purpose, and the capped calls still under way.

One ledger per workspace (`memory/.spend.json` in the shared memory folder), because the caps are the workspace's,
whoever's memory a call serves. Each day holds, per purpose ("chat", "summary", "heartbeat" …), the calls made,
their prompt tokens (and how many of those the provider had cached), their output tokens and their cost; and the
*holds*: estimates written for calls made under a cap before the call went out, replaced by what the provider
reported when it ends (a process killed meanwhile leaves its hold counted for that day: an over-count, never an
under-count). Every change reads the document from the backend's truth and writes it back under a lock that holds
across processes and machines (`Storage.lock`), so two processes claiming at once never both take the last room.

A ledger that cannot be read is damaged: the change that finds it starts a fresh one, with the day marked damaged
(the caller counts such a day as spent); the days before are lost. Days older than KEEP_DAYS are dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import date, timedelta
from pathlib import Path
from typing import Any, TypeVar

import orjson

from picoclaw.errors import ConfigError
from picoclaw.storage import Storage, document_of

log = logging.getLogger(__name__)

SPEND_FILE = ".spend.json"
KEEP_DAYS = 62  # a month's report, and the month before it
LOCK_WAIT_SECONDS = 10.0
_VERSION = 1
_SPENT_FIELDS = 7

T = TypeVar("T")


@dataclass(frozen=True)
class Spent:
    """Model calls and what they used: prompt tokens (`cached` of them from the provider's prompt cache), output
    tokens, cost in millionths of a US dollar; `unpriced` calls had no price (their cost is not in `micro_usd`),
    `estimated` calls reported no usage (their tokens are picoclaw's estimate)."""

    calls: int = 0
    prompt: int = 0
    cached: int = 0
    completion: int = 0
    micro_usd: int = 0
    unpriced: int = 0
    estimated: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt + self.completion

    @property
    def uncached(self) -> int:
        return self.prompt - self.cached

    def __add__(self, other: Spent) -> Spent:
        return Spent(self.calls + other.calls, self.prompt + other.prompt, self.cached + other.cached,
                     self.completion + other.completion, self.micro_usd + other.micro_usd,
                     self.unpriced + other.unpriced, self.estimated + other.estimated)

    def as_list(self) -> list[int]:
        return [self.calls, self.prompt, self.cached, self.completion, self.micro_usd, self.unpriced, self.estimated]


@dataclass(frozen=True)
class Hold:
    """A capped call under way: its purpose, and the tokens and cost it may use at most (its estimate)."""

    purpose: str
    tokens: int
    micro_usd: int = 0


@dataclass
class Day:
    """One day of the ledger."""

    spent: dict[str, Spent] = field(default_factory=dict)
    held: dict[str, Hold] = field(default_factory=dict)
    noticed: bool = False  # the owner was told today that the background budget is spent
    damaged: str | None = None  # why the ledger was found damaged on this day (the day then counts as spent)

    def tokens(self, purposes: Callable[[str], bool]) -> int:
        """Tokens used and held by the purposes `purposes` accepts."""
        return (sum(s.tokens for p, s in self.spent.items() if purposes(p))
                + sum(h.tokens for h in self.held.values() if purposes(h.purpose)))

    def micro_usd(self, purposes: Callable[[str], bool]) -> int:
        """Cost (known prices only) spent and held by the purposes `purposes` accepts."""
        return (sum(s.micro_usd for p, s in self.spent.items() if purposes(p))
                + sum(h.micro_usd for h in self.held.values() if purposes(h.purpose)))

    def add(self, purpose: str, spent: Spent) -> None:
        self.spent[purpose] = self.spent.get(purpose, Spent()) + spent

    def total(self, purposes: Callable[[str], bool] = lambda _: True) -> Spent:
        found = Spent()
        for purpose, spent in self.spent.items():
            if purposes(purpose):
                found = found + spent
        return found


class SpendLedger:
    """The spend ledger of one workspace (see the module doc); every method is blocking (call it in a thread)."""

    def __init__(self, memory_dir: Path, *, storage: Storage, lock_wait: float = LOCK_WAIT_SECONDS):
        self.path = Path(memory_dir) / SPEND_FILE
        self._lock = storage.lock(Path(memory_dir) / ".spend.lock", timeout=lock_wait)
        self.documents, self.name = document_of(storage, self.path)

    def change(self, day: date, edit: Callable[[Day], T]) -> T:
        """Apply `edit` to `day` (created if missing) and store the ledger; what `edit` returned. Atomic across
        processes. StorageError (or OSError) when the ledger cannot be reached: nothing changed."""
        with self._lock:
            try:
                days = self._read()
            except ConfigError as exc:
                log.warning("spend ledger: %s; a fresh one starts, and %s counts as spent", exc, day.isoformat())
                days = {day.isoformat(): Day(damaged=str(exc))}
            today = days.setdefault(day.isoformat(), Day())
            result = edit(today)
            self._write(days, day)
        return result

    def read(self) -> dict[str, Day]:
        """Every day kept, by ISO date; {} before the first call. ConfigError when the ledger is damaged."""
        return self._read()

    def _read(self) -> dict[str, Day]:
        stored = self.documents.read(self.name).data
        if stored is None:
            return {}
        try:
            raw = orjson.loads(stored)
        except orjson.JSONDecodeError:
            raise ConfigError(f"{self.path} is not valid JSON") from None
        days = raw.get("days") if isinstance(raw, dict) else None
        if not isinstance(raw, dict) or raw.get("version") != _VERSION or not isinstance(days, dict):
            raise ConfigError(f"{self.path} is not a version {_VERSION} spend ledger")
        return {str(name): _day(name, value, self.path) for name, value in days.items()}

    def _write(self, days: Mapping[str, Day], today: date) -> None:
        oldest = (today - timedelta(days=KEEP_DAYS)).isoformat()
        kept = {name: _stored_day(day) for name, day in sorted(days.items()) if name >= oldest}
        # Soft state: a power cut may take back the last few calls' counts, never leave half a ledger.
        self.documents.replace(self.name, orjson.dumps({"version": _VERSION, "days": kept}), durable=False)


def _count(value: object) -> bool:
    return type(value) is int and value >= 0


def _day(name: str, value: object, path: Path) -> Day:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: day {name[:20]!r} is not an object")
    day = Day(noticed=value.get("noticed") is True,
              damaged=str(value["damaged"]) if value.get("damaged") else None)
    for purpose, numbers in (value.get("spent") or {}).items():
        if not (isinstance(numbers, list) and len(numbers) == _SPENT_FIELDS and all(map(_count, numbers))):
            raise ConfigError(f"{path}: day {name[:20]!r}, purpose {str(purpose)[:40]!r} is not {_SPENT_FIELDS} "
                              "counts")
        day.spent[str(purpose)] = Spent(*numbers)
    for hold_id, held in (value.get("held") or {}).items():
        if not (isinstance(held, list) and len(held) == 3 and isinstance(held[0], str) and _count(held[1])
                and _count(held[2])):
            raise ConfigError(f"{path}: day {name[:20]!r} holds a call that is not [purpose, tokens, cost]")
        day.held[str(hold_id)] = Hold(held[0], held[1], held[2])
    return day


def _stored_day(day: Day) -> dict[str, Any]:
    stored: dict[str, Any] = {"spent": {p: s.as_list() for p, s in sorted(day.spent.items())}}
    if day.held:
        stored["held"] = {i: [h.purpose, h.tokens, h.micro_usd] for i, h in day.held.items()}
    if day.noticed:
        stored["noticed"] = True
    if day.damaged:
        stored["damaged"] = day.damaged
    return stored


def without_holds(day: Day) -> Day:
    """`day` as it is settled (for reports): its holds left out."""
    return replace(day, held={})
