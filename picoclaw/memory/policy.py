"""MemoryPolicy: the tunable memory settings, layered defaults ← config.json ← policy_overrides.json.

The overrides file is re-read whenever it changes on disk (one stat per turn), so a change written by
reflection or by `picoclaw policy set` applies on the next turn of every running agent. Every change of
the overrides first snapshots the previous overrides and is recorded in policy_history.jsonl.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

import orjson
from filelock import FileLock
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from picoclaw import clock
from picoclaw.errors import ConfigError, PicoclawError
from picoclaw.fsutil import atomic_write, stamped_files, write_stamped
from picoclaw.jsonio import dumps_pretty, read_json_object
from picoclaw.validation import describe_error

log = logging.getLogger(__name__)

Source = Literal["default", "config", "overrides"]

OVERRIDES_FILE = "policy_overrides.json"
SNAPSHOTS_DIR = "policy_snapshots"
HISTORY_FILE = "policy_history.jsonl"
SNAPSHOT_SUFFIX = ".json"


class MemoryPolicy(BaseModel):
    """Every policy key with its default and bounds (DESIGN §3). Strict: "15" is not an int."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    retrieve_limit: int = Field(10, ge=1, le=50, description="most MEMORY.md blocks injected for a query")
    recent_days: int = Field(3, ge=0, le=30, description="days of daily notes injected")
    session_summary_message_threshold: int = Field(
        20, ge=4, le=1000, description="summarise the session when its history has more messages than this"
    )
    session_summary_token_percent: int = Field(
        75, ge=10, le=95, description="…or when its history is over this % of the context window"
    )
    session_summary_keep_count: int = Field(
        4, ge=1, le=100, description="recent messages kept verbatim after a summary (< the threshold)"
    )
    session_relevant_history_limit: int = Field(
        0, ge=0, le=100, description=">0: inject only this many past turns, chosen by relevance to the query"
    )
    session_relevant_fallback_keep: int = Field(
        8, ge=0, le=100, description="recent messages kept when no past turn is relevant"
    )
    long_term_compress_char_threshold: int = Field(
        0, ge=0, description=">0: compress MEMORY.md when longer than this (≥ 1000), at most once per 24 h"
    )
    evolution_enabled: bool = Field(False, description="reflection may tune the policy")
    evolution_interval_messages: int = Field(
        20, ge=2, le=1000, description="reflect every this many messages of a session"
    )
    memory_token_budget: int = Field(
        2000, ge=200, le=32000, description="most tokens of retrieved memory + notes put into one prompt"
    )

    @model_validator(mode="after")
    def _cross_checks(self) -> MemoryPolicy:
        if self.session_summary_keep_count >= self.session_summary_message_threshold:
            raise ValueError(
                "session_summary_keep_count must be smaller than session_summary_message_threshold "
                f"({self.session_summary_keep_count} ≥ {self.session_summary_message_threshold})"
            )
        if 0 < self.long_term_compress_char_threshold < 1000:
            raise ValueError("long_term_compress_char_threshold must be 0 (off) or at least 1000")
        return self


POLICY_KEYS: tuple[str, ...] = tuple(MemoryPolicy.model_fields)
# Reflection may change every key but the switch that lets it change keys.
TUNABLE_KEYS: tuple[str, ...] = tuple(key for key in POLICY_KEYS if key != "evolution_enabled")


class PolicyError(PicoclawError):
    """A requested policy change is invalid; nothing was written."""


@dataclass(frozen=True)
class EffectivePolicy:
    """The policy in force and, for each key, the layer its value came from."""

    policy: MemoryPolicy
    sources: dict[str, Source]


def parse_cli_value(text: str) -> Any:
    """`policy set` values are JSON scalars (15, true); anything else stays a string and fails validation."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


class PolicyManager:
    """Owns policy_overrides.json, its snapshots and history, and caches the effective policy."""

    def __init__(self, memory_dir: Path, config_values: Mapping[str, Any] | None = None, tz: Any = None):
        self.memory_dir = Path(memory_dir)
        self.overrides_path = self.memory_dir / OVERRIDES_FILE
        self.snapshots_dir = self.memory_dir / SNAPSHOTS_DIR
        self.history_path = self.memory_dir / HISTORY_FILE
        self._config_values = dict(config_values or {})
        self._tz = tz
        self._lock = FileLock(str(self.memory_dir / ".policy.lock"))
        self._cache_key: tuple[int, int, int] | None = None
        self._cached: EffectivePolicy | None = None
        unknown = set(self._config_values) - set(POLICY_KEYS)
        if unknown:
            raise ConfigError(f"unknown policy keys: {', '.join(sorted(unknown))}")

    # -- reading ---------------------------------------------------------------------------------

    def effective(self) -> EffectivePolicy:
        """The policy in force now; re-reads the overrides only when the file changed."""
        try:
            st = os.stat(self.overrides_path)
            key = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            key = (0, -1, 0)
        if self._cached is None or key != self._cache_key:
            self._cached = self._load()
            self._cache_key = key
        return self._cached

    def current(self) -> MemoryPolicy:
        """Shortcut for `effective().policy`."""
        return self.effective().policy

    def read_overrides(self) -> dict[str, Any]:
        """The overrides file as written (a JSON object), {} when absent or unreadable."""
        if not self.overrides_path.exists():
            return {}
        try:
            return read_json_object(self.overrides_path)
        except ConfigError as exc:
            log.warning("ignoring policy overrides: %s", exc)
            return {}

    def _load(self) -> EffectivePolicy:
        values: dict[str, Any] = dict(self._config_values)
        sources: dict[str, Source] = {key: "default" for key in POLICY_KEYS}
        for key in self._config_values:
            sources[key] = "config"
        pending: dict[str, Any] = {}
        for key, value in self.read_overrides().items():
            if key not in POLICY_KEYS:
                log.warning("%s: ignoring unknown key %r", self.overrides_path, key)
                continue
            pending[key] = value
        # Keys checked against each other (keep_count < threshold) may be valid only together, e.g. after
        # `policy set session_summary_keep_count=30 session_summary_message_threshold=50`: retry rejected
        # keys while others still apply, so file order never matters; what is left is really invalid.
        errors: dict[str, str] = {}
        progress = True
        while pending and progress:
            progress = False
            for key, value in list(pending.items()):
                try:
                    MemoryPolicy(**{**values, key: value})
                except ValidationError as exc:
                    errors[key] = describe_error(MemoryPolicy, exc)
                    continue
                values[key] = value
                sources[key] = "overrides"
                del pending[key]
                progress = True
        for key in pending:
            detail = errors[key]
            if not detail.startswith(f"{key}:"):  # a cross-key check reports no key of its own
                detail = f"{key}: {detail.removeprefix('(top level): ')}"
            log.warning("%s: ignoring %s", self.overrides_path, detail)
        return EffectivePolicy(MemoryPolicy(**values), sources)

    def snapshots(self) -> list[Path]:
        """Snapshot files, oldest first."""
        return stamped_files(self.snapshots_dir, SNAPSHOT_SUFFIX)

    def history(self) -> list[dict[str, Any]]:
        """Every recorded policy change, oldest first (unreadable lines are skipped)."""
        if not self.history_path.exists():
            return []
        entries = []
        for line in self.history_path.read_bytes().splitlines():
            try:
                entries.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue
        return entries

    # -- changing ----------------------------------------------------------------------------------

    def validate_changes(self, changes: Mapping[str, Any]) -> None:
        """Raise PolicyError unless every key is a policy key and the result is a valid policy."""
        unknown = [key for key in changes if key not in POLICY_KEYS]
        if unknown:
            raise PolicyError(f"unknown policy key {unknown[0]!r}; known keys: {', '.join(POLICY_KEYS)}")
        current = self.current().model_dump()
        try:
            MemoryPolicy(**{**current, **changes})
        except ValidationError as exc:
            raise PolicyError(describe_error(MemoryPolicy, exc)) from None

    def set(self, changes: Mapping[str, Any], *, source: str, reason: str = "", session: str | None = None) -> Path:
        """Validate and apply `changes` on top of the current overrides; returns the snapshot taken."""
        self.validate_changes(changes)
        with self._lock:
            before = self.read_overrides()
            after = {**before, **changes}
            return self._replace_overrides(before, after, source=source, reason=reason, session=session)

    def rollback(self, snapshot: str | None = None, *, source: str = "cli") -> Path:
        """Restore a snapshot (newest when None); the current overrides are snapshotted first."""
        with self._lock:
            target = self._find_snapshot(snapshot)
            restored = read_json_object(target)
            before = self.read_overrides()
            self._replace_overrides(before, restored, source=source, reason=f"rollback to {target.name}",
                                    raw=target.read_bytes())
            return target

    def reset(self, *, source: str = "cli") -> Path:
        """Drop every override (back to config.json + defaults); the current overrides are snapshotted."""
        with self._lock:
            before = self.read_overrides()
            return self._replace_overrides(before, {}, source=source, reason="reset")

    def _find_snapshot(self, name: str | None) -> Path:
        snapshots = self.snapshots()
        if not snapshots:
            raise PolicyError(f"no policy snapshots in {self.snapshots_dir}")
        if name is None:
            return snapshots[-1]
        for path in snapshots:
            if name in (path.name, path.stem):
                return path
        raise PolicyError(f"no snapshot named {name!r}; see `picoclaw policy snapshots`")

    def _replace_overrides(self, before: dict[str, Any], after: dict[str, Any], *, source: str, reason: str,
                           session: str | None = None, raw: bytes | None = None) -> Path:
        moment = clock.now(self._tz)
        previous = self.overrides_path.read_bytes() if self.overrides_path.exists() else b"{}\n"
        in_force = self.current()
        # write_stamped: a crash must not leave an empty snapshot that a rollback would then restore.
        snapshot = write_stamped(self.snapshots_dir, clock.stamp(moment), SNAPSHOT_SUFFIX, previous)
        atomic_write(self.overrides_path, raw if raw is not None else dumps_pretty(after))
        self._cached = None
        changed = {
            key: {"old": before.get(key), "new": after.get(key)}
            for key in sorted(set(before) | set(after))
            if before.get(key) != after.get(key)
        }
        # "changes" is the overrides layer (old null = not overridden); "effective" is the value in force,
        # which is what a person reading the history wants to see (retrieve_limit 10 → 15).
        now_in_force = self.current()
        effective = {
            key: {"old": getattr(in_force, key), "new": getattr(now_in_force, key)}
            for key in POLICY_KEYS
            if getattr(in_force, key) != getattr(now_in_force, key)
        }
        record = {"time": moment.isoformat(), "source": source, "session": session, "changes": changed,
                  "effective": effective, "reason": reason, "snapshot": snapshot.name}
        self._append_history(record)
        return snapshot

    def _append_history(self, record: dict[str, Any]) -> None:
        # Append-only log written under the policy lock; a torn last line is skipped by history().
        with open(self.history_path, "ab") as fh:
            fh.write(orjson.dumps(record) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
