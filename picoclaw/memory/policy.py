"""PolicyManager: the memory policy in force, layered defaults ← config.json ← policy_overrides.json.

The keys, defaults and bounds (MemoryPolicy) are policy_schema.py's; this module owns the overrides layer.

The overrides file is re-read whenever it changes on disk (one stat per turn), so a change written by
reflection or by `picoclaw policy set` applies on the next turn of every running agent. Every change of
the overrides first snapshots the previous overrides and is recorded in policy_history.jsonl; a bare
rollback walks that history back one change at a time, like an undo stack.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import ValidationError

from picoclaw import clock
from picoclaw.disk.file_identity import FileKey, file_key
from picoclaw.disk.stamped import stamped_files
from picoclaw.errors import ConfigError, PicoclawError
from picoclaw.jsonio import dumps_pretty, read_json_object
from picoclaw.policy_schema import POLICY_KEYS, MemoryPolicy
from picoclaw.pydantic_errors import describe_error
from picoclaw.storage import Storage, document_of

log = logging.getLogger(__name__)

Source = Literal["default", "config", "overrides"]

OVERRIDES_FILE = "policy_overrides.json"
SNAPSHOTS_DIR = "policy_snapshots"
HISTORY_FILE = "policy_history.jsonl"
SNAPSHOT_SUFFIX = ".json"


class PolicyError(PicoclawError):
    """A requested policy change is invalid; nothing was written."""


@dataclass(frozen=True)
class ValueChange:
    """One key's value before and after a change (None: not set in that layer)."""

    old: Any
    new: Any


@dataclass(frozen=True)
class PolicyChange:
    """One line of policy_history.jsonl: when, who, what changed, why, and the snapshot taken before.

    `undoes` is set on the records of step-back rollbacks: the snapshot name of the change undone, so the
    next rollback skips that change and walks further back instead of redoing it. `check`: the eval's figures
    before and after, when the change was tried against it (memory/eval/policy_check.py). `refused`: a change
    that was proposed and not applied, and why; it has no snapshot, changed nothing, and a rollback passes it by.
    """

    time: str
    source: str
    session: str | None
    overrides: dict[str, ValueChange]  # the overrides layer (old None: the key was not overridden)
    effective: dict[str, ValueChange]  # the values in force, which is what a person wants to see
    reason: str
    snapshot: str
    undoes: str | None = None
    check: dict[str, Any] | None = None
    refused: str | None = None
    proposed: dict[str, ValueChange] | None = None  # a refused change's keys, as they would have changed

    def to_record(self) -> dict[str, Any]:
        def plain(changes: dict[str, ValueChange]) -> dict[str, Any]:
            return {key: {"old": change.old, "new": change.new} for key, change in changes.items()}
        record = {"time": self.time, "source": self.source, "session": self.session,
                  "changes": plain(self.overrides), "effective": plain(self.effective), "reason": self.reason,
                  "snapshot": self.snapshot}
        if self.undoes is not None:
            record["undoes"] = self.undoes
        if self.check is not None:
            record["check"] = self.check
        if self.refused is not None:
            record["refused"] = self.refused
            record["proposed"] = plain(self.proposed or {})
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> PolicyChange:
        """Parse a history line; older lines have no "effective", so the overrides layer stands in."""
        def changes(raw: Any) -> dict[str, ValueChange]:
            if not isinstance(raw, dict):
                return {}
            return {str(key): ValueChange(value.get("old"), value.get("new"))
                    for key, value in raw.items() if isinstance(value, dict)}
        overrides = changes(record.get("changes"))
        effective = changes(record["effective"]) if "effective" in record else overrides
        session = record.get("session")
        undoes = record.get("undoes")
        check = record.get("check")
        refused = record.get("refused")
        return cls(str(record.get("time", "?")), str(record.get("source", "?")),
                   str(session) if session else None, overrides, effective, str(record.get("reason") or ""),
                   str(record.get("snapshot", "?")), str(undoes) if undoes else None,
                   check if isinstance(check, dict) else None, str(refused) if refused else None,
                   changes(record.get("proposed")) if refused else None)


@dataclass(frozen=True)
class EffectivePolicy:
    """The policy in force and, for each key, the layer its value came from."""

    policy: MemoryPolicy
    sources: dict[str, Source]


class PolicyManager:
    """Owns policy_overrides.json, its snapshots and history, and caches the effective policy."""

    def __init__(self, memory_dir: Path, config_values: Mapping[str, Any] | None = None, tz: Any = None, *,
                 storage: Storage):
        self.memory_dir = Path(memory_dir)
        self.overrides_path = self.memory_dir / OVERRIDES_FILE
        self.snapshots_dir = self.memory_dir / SNAPSHOTS_DIR
        self.history_path = self.memory_dir / HISTORY_FILE
        self._config_values = dict(config_values or {})
        self._tz = tz
        self._lock = storage.lock(self.memory_dir / ".policy.lock")
        self.documents, self._overrides_name = document_of(storage, self.overrides_path)  # every read and write
        self._cache_key: FileKey | None = None
        self._cached: EffectivePolicy | None = None
        unknown = set(self._config_values) - set(POLICY_KEYS)
        if unknown:
            raise ConfigError(f"unknown policy keys: {', '.join(sorted(unknown))}")

    # -- reading ---------------------------------------------------------------------------------

    def effective(self) -> EffectivePolicy:
        """The policy in force now; re-reads the overrides only when they changed."""
        key = file_key(self._overrides())  # None (no overrides file) is cached like any other state
        if self._cached is None or key != self._cache_key:
            self._cached = self._load()
            self._cache_key = key
        return self._cached

    def current(self) -> MemoryPolicy:
        """Shortcut for `effective().policy`."""
        return self.effective().policy

    def _overrides(self) -> Path:
        """The file on this machine holding the overrides as stored now (`Documents.local`)."""
        return self.documents.local(self._overrides_name)

    def read_overrides(self) -> dict[str, Any]:
        """The overrides file as written (a JSON object), {} when absent or unreadable."""
        file = self._overrides()
        if not file.exists():
            return {}
        try:
            return read_json_object(file)
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
        """Snapshot files, oldest first, as this machine holds them now (`Documents.local_folder`)."""
        folder = self.documents.local_folder(f"{self.documents.name(self.snapshots_dir)}/")
        return stamped_files(folder, SNAPSHOT_SUFFIX)

    def history(self) -> list[PolicyChange]:
        """Every recorded policy change, oldest first (unreadable lines are skipped)."""
        file = self.documents.local(self.documents.name(self.history_path))
        if not file.exists():
            return []
        entries = []
        for line in file.read_bytes().splitlines():
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(record, dict):
                entries.append(PolicyChange.from_record(record))
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

    def set(self, changes: Mapping[str, Any], *, source: str, reason: str = "", session: str | None = None,
            check: dict[str, Any] | None = None) -> Path:
        """Validate and apply `changes` on top of the current overrides; returns the snapshot taken. `check`: the
        eval's figures for the change, kept in its history line.

        Validated under the lock of the write, against the overrides as they are then: checked only before
        taking it, two changes valid alone but not together (keep_count 10 and threshold 5) could both
        pass, each checked against the file without the other, and both be written. The check before the
        lock refuses a change that is invalid anyway without creating the lock file or any other file.
        """
        self.validate_changes(changes)
        with self._lock:
            self._cached = None  # read the overrides afresh: another process may have just changed them
            self.validate_changes(changes)
            before = self.read_overrides()
            after = {**before, **changes}
            return self._replace_overrides(before, after, source=source, reason=reason, session=session,
                                           check=check)

    def record_refusal(self, changes: Mapping[str, Any], why: str, *, source: str, reason: str = "",
                       session: str | None = None, check: dict[str, Any] | None = None) -> PolicyChange:
        """Keep in the history that `changes` were proposed and not applied, and why (nothing else is written)."""
        with self._lock:
            current = self.current()
            proposed = {key: ValueChange(getattr(current, key, None), value) for key, value in changes.items()}
            change = PolicyChange(clock.now(self._tz).isoformat(), source, session, {}, {}, reason, "", None, check,
                                  why, proposed)
            self.documents.append_records(self.documents.name(self.history_path), [change.to_record()])
            return change

    def rollback(self, snapshot: str | None = None, *, source: str = "cli") -> Path:
        """Undo the most recent change not yet undone (`snapshot` None), or restore the named snapshot.

        A bare rollback is a step back: it restores the snapshot taken before that change and records
        which change it undid, so repeated rollbacks keep walking back (restoring merely the newest
        snapshot would return to the state just left, since a rollback snapshots the current overrides
        first, and two rollbacks would undo each other). PolicyError when nothing is left to undo. A
        rollback to a named snapshot is an ordinary change, which a later bare rollback undoes.
        Returns the snapshot restored; the current overrides are snapshotted first.
        """
        with self._lock:
            undoes: str | None = None
            if snapshot is None:
                target, undoes = self._step_back()
            else:
                target = self._find_snapshot(snapshot)
            restored = read_json_object(target)
            before = self.read_overrides()
            self._replace_overrides(before, restored, source=source, reason=f"rollback to {target.name}",
                                    raw=target.read_bytes(), undoes=undoes)
            return target

    def reset(self, *, source: str = "cli") -> Path:
        """Drop every override (back to config.json + defaults); the current overrides are snapshotted."""
        with self._lock:
            before = self.read_overrides()
            return self._replace_overrides(before, {}, source=source, reason="reset")

    def _step_back(self) -> tuple[Path, str]:
        """The snapshot before the most recent change not yet undone, and that change's snapshot name.

        Walks the history newest first; each step-back record marks the change it undid, which is then
        passed over (step-backs themselves are not changes to undo: that would redo).
        """
        undone: set[str] = set()
        for change in reversed(self.history()):
            if change.undoes is not None:
                undone.add(change.undoes)
            elif change.refused is None and change.snapshot not in undone:  # a refusal changed nothing
                # Looked up among the snapshot files, so a hand-edited history cannot name a path elsewhere.
                found = next((path for path in self.snapshots() if path.name == change.snapshot), None)
                if found is None:
                    raise PolicyError(f"cannot undo the change of {change.time}: its snapshot {change.snapshot!r} "
                                      f"is not in {self.snapshots_dir}; see `picoclaw policy snapshots`")
                return found, change.snapshot
        if not self.snapshots():
            raise PolicyError(f"no policy snapshots in {self.snapshots_dir}")
        raise PolicyError(f"nothing further back to roll back: every change in {self.history_path} is undone "
                          "already (`picoclaw policy rollback <snapshot>` restores any snapshot)")

    def _find_snapshot(self, name: str) -> Path:
        snapshots = self.snapshots()
        if not snapshots:
            raise PolicyError(f"no policy snapshots in {self.snapshots_dir}")
        for path in snapshots:
            if name in (path.name, path.stem):
                return path
        raise PolicyError(f"no snapshot named {name!r}; see `picoclaw policy snapshots`")

    def _replace_overrides(self, before: dict[str, Any], after: dict[str, Any], *, source: str, reason: str,
                           session: str | None = None, raw: bytes | None = None, undoes: str | None = None,
                           check: dict[str, Any] | None = None) -> Path:
        moment = clock.now(self._tz)
        file = self._overrides()
        previous = file.read_bytes() if file.exists() else b"{}\n"
        in_force = self.current()
        snapshot = self._new_snapshot(clock.stamp(moment), previous)
        self.documents.replace(self.documents.name(self.overrides_path),
                               raw if raw is not None else dumps_pretty(after))
        self._cached = None
        overrides = {
            key: ValueChange(before.get(key), after.get(key))
            for key in sorted(set(before) | set(after))
            if before.get(key) != after.get(key)
        }
        now_in_force = self.current()
        effective = {
            key: ValueChange(getattr(in_force, key), getattr(now_in_force, key))
            for key in POLICY_KEYS
            if getattr(in_force, key) != getattr(now_in_force, key)
        }
        change = PolicyChange(moment.isoformat(), source, session, overrides, effective, reason, snapshot.name,
                              undoes, check)
        # Append-only log written under the policy lock; after a torn last line (skipped by history())
        # append_jsonl starts this record on a line of its own.
        self.documents.append_records(self.documents.name(self.history_path), [change.to_record()])
        return snapshot

    def _new_snapshot(self, stamp: str, data: bytes) -> Path:
        """Keep `data` as a new snapshot `<stamp>[_<n>]<suffix>`, written whole under a name never used before
        (`Documents.create`: a crash leaves no empty snapshot for a rollback to restore)."""
        counter = 0
        while True:
            path = self.snapshots_dir / f"{stamp}{f'_{counter}' if counter else ''}{SNAPSHOT_SUFFIX}"
            if self.documents.create(self.documents.name(path), data):
                return path
            counter += 1
