"""What background memory work spent on the model, per day and purpose: the calls made and their tokens.

Background jobs that call the model on their own (drafting lessons) claim a call here before they make it,
so a daily cap holds across every process of the workspace and across restarts; `memory stats` reports the
tokens. The file (`memory/.model_usage.json`) keeps the last KEEP_DAYS days. It fails closed: when it
cannot be read or written, `claim` says no and the job does not call the model (a lesson missed costs
little, an unbounded loop of calls costs money); a damaged file counts as today's cap spent and starts
afresh tomorrow.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import orjson

from picoclaw.errors import ConfigError
from picoclaw.jsonio import read_json_object
from picoclaw.storage import Storage, StorageError, document_of

log = logging.getLogger(__name__)

MODEL_USAGE_FILE = ".model_usage.json"
KEEP_DAYS = 60
LOCK_WAIT_SECONDS = 10.0
_VERSION = 1


@dataclass(frozen=True)
class Usage:
    """Model calls and their tokens (tokens as the server reported them; a call without a report adds none)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.calls + other.calls, self.prompt_tokens + other.prompt_tokens,
                     self.completion_tokens + other.completion_tokens)


class ModelUsage:
    """The per-day, per-purpose ledger of one memory folder's background model calls."""

    def __init__(self, memory_dir: Path, *, storage: Storage, lock_wait: float = LOCK_WAIT_SECONDS):
        self.path = Path(memory_dir) / MODEL_USAGE_FILE
        self._lock = storage.lock(Path(memory_dir) / ".model_usage.lock", timeout=lock_wait)
        self.documents, self.name = document_of(storage, self.path)

    def claim(self, purpose: str, day: date, limit: int) -> bool:
        """Count one call of `purpose` on `day` if fewer than `limit` were made that day; False (nothing
        counted) when the cap is reached or the ledger cannot be updated."""
        if limit <= 0:
            return False
        try:
            with self._lock:
                try:
                    days = self.read() or {}
                except ConfigError as exc:
                    # Fail closed: a damaged ledger cannot say what today cost, so today counts as spent
                    # (a fresh ledger from tomorrow on), never as a fresh cap that could be spent again.
                    log.warning("model usage: %s; no more %s calls today, counting starts afresh tomorrow", exc,
                                purpose)
                    self._save({day.isoformat(): {purpose: Usage(calls=limit)}}, day)
                    return False
                used = days.get(day.isoformat(), {}).get(purpose, Usage())
                if used.calls >= limit:
                    return False
                days.setdefault(day.isoformat(), {})[purpose] = used + Usage(calls=1)
                self._save(days, day)
        except (OSError, StorageError) as exc:  # a held lock past its wait, a lost server: skipped, not fatal
            log.warning("model usage: cannot update %s (%s); no %s call is made", self.path, exc, purpose)
            return False
        return True

    def add_tokens(self, purpose: str, day: date, prompt_tokens: int, completion_tokens: int) -> None:
        """Add the tokens a claimed call of `purpose` used; a failure is logged, never raised."""
        try:
            with self._lock:
                days = self._load()
                used = days.get(day.isoformat(), {}).get(purpose, Usage())
                days.setdefault(day.isoformat(), {})[purpose] = used + Usage(0, prompt_tokens, completion_tokens)
                self._save(days, day)
        except (OSError, StorageError) as exc:  # a held lock past its wait, a lost server: skipped, not fatal
            log.warning("model usage: cannot update %s (%s); tokens not counted", self.path, exc)

    def on(self, purpose: str, day: date) -> Usage:
        """What `purpose` used on `day`."""
        return self._load().get(day.isoformat(), {}).get(purpose, Usage())

    def since(self, purpose: str, first: date) -> Usage:
        """What `purpose` used from `first` on (the ledger keeps KEEP_DAYS days)."""
        return used_since(self._load(), purpose, first)

    def read(self) -> dict[str, dict[str, Usage]] | None:
        """What each purpose used, by ISO day, as the ledger holds it now; None when there is no ledger yet.
        ConfigError when it cannot be read or is not a ledger."""
        file = self.documents.local(self.name)
        try:
            raw = read_json_object(file)
        except ConfigError:
            if file.exists() or file.is_symlink():
                raise
            return None
        days = raw.get("days")
        if raw.get("version") != _VERSION or not isinstance(days, dict):
            raise ConfigError(f"{self.path} is not a version {_VERSION} model usage file")
        found: dict[str, dict[str, Usage]] = {}
        for day, purposes in days.items():
            if not isinstance(purposes, dict):
                continue
            for purpose, value in purposes.items():
                if isinstance(value, list) and len(value) == 3 and all(type(n) is int and n >= 0 for n in value):
                    found.setdefault(str(day), {})[str(purpose)] = Usage(*value)
        return found

    def _load(self) -> dict[str, dict[str, Usage]]:
        try:
            return self.read() or {}
        except ConfigError as exc:
            log.warning("model usage: %s; counting starts afresh", exc)
            return {}

    def _save(self, days: dict[str, dict[str, Usage]], today: date) -> None:
        oldest = (today - timedelta(days=KEEP_DAYS)).isoformat()
        kept = {day: {purpose: [u.calls, u.prompt_tokens, u.completion_tokens] for purpose, u in purposes.items()}
                for day, purposes in sorted(days.items()) if day >= oldest}
        self.documents.replace(self.name, orjson.dumps({"version": _VERSION, "days": kept}))


def used_since(days: Mapping[str, Mapping[str, Usage]], purpose: str, first: date) -> Usage:
    """What `purpose` used from `first` on, in a ledger's days (as `ModelUsage.read` gives them)."""
    total = Usage()
    for day, purposes in days.items():
        if day >= first.isoformat():
            total = total + purposes.get(purpose, Usage())
    return total
