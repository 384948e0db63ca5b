"""Memory flushes that wait for the budget: the messages a flush could not read because the day's background budget
was spent, kept (`memory/.deferred_flushes.json`) until a later turn finds budget again and flushes them.

Only messages that leave the conversation unflushed are kept here (set aside when the history outgrew the window,
or left behind by /new): the rest are still in the conversation, and its next summary flushes them. Nothing is lost:
an entry goes only once its flush read it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from picoclaw.errors import ConfigError
from picoclaw.providers.base import Message
from picoclaw.storage import Storage, document_of

log = logging.getLogger(__name__)

DEFERRED_FILE = ".deferred_flushes.json"
MOST_KEPT = 200  # a month of set-asides at most; the oldest go first (each was a window's worth of chat)
_VERSION = 1


@dataclass(frozen=True)
class DeferredFlush:
    """The messages of session `session` a flush is owed; `id` names the entry for `done`."""

    id: str
    session: str
    messages: list[Message]


class DeferredFlushes:
    """The flushes one memory folder owes; blocking calls, atomic across processes."""

    def __init__(self, memory_dir: Path, *, storage: Storage):
        self.path = Path(memory_dir) / DEFERRED_FILE
        self._lock = storage.lock(Path(memory_dir) / ".deferred_flushes.lock")
        self.documents, self.name = document_of(storage, self.path)

    def add(self, session: str, messages: list[Message], stamp: str) -> None:
        """Keep `messages` of `session` for a later flush (`stamp`: when, which names the entry)."""
        with self._lock:
            entries = self._read_or_fresh()
            taken = {entry["id"] for entry in entries}
            entry_id = stamp
            n = 1
            while entry_id in taken:
                n += 1
                entry_id = f"{stamp}-{n}"
            entries.append({"id": entry_id, "session": session, "messages": messages})
            self._write(entries[-MOST_KEPT:])

    def pending(self) -> list[DeferredFlush]:
        """What is owed, oldest first ([] when the file is damaged: logged)."""
        try:
            entries = self._read()
        except ConfigError as exc:
            log.warning("deferred flushes: %s; none can be run", exc)
            return []
        return [DeferredFlush(e["id"], e["session"], e["messages"]) for e in entries]

    def done(self, entry_id: str) -> None:
        """The flush of `entry_id` read its messages: it is owed no more."""
        with self._lock:
            entries = self._read_or_fresh()
            self._write([entry for entry in entries if entry["id"] != entry_id])

    def _read_or_fresh(self) -> list[dict[str, Any]]:
        try:
            return self._read()
        except ConfigError as exc:
            log.warning("deferred flushes: %s; starting a fresh list", exc)
            return []

    def _read(self) -> list[dict[str, Any]]:
        stored = self.documents.read(self.name).data
        if stored is None:
            return []
        try:
            raw = orjson.loads(stored)
        except orjson.JSONDecodeError:
            raise ConfigError(f"{self.path} is not valid JSON") from None
        entries = raw.get("flushes") if isinstance(raw, dict) and raw.get("version") == _VERSION else None
        if not isinstance(entries, list) or not all(
                isinstance(e, dict) and isinstance(e.get("id"), str) and isinstance(e.get("session"), str)
                and isinstance(e.get("messages"), list) for e in entries):
            raise ConfigError(f"{self.path} is not a version {_VERSION} list of deferred flushes")
        return entries

    def _write(self, entries: list[dict[str, Any]]) -> None:
        self.documents.replace(self.name, orjson.dumps({"version": _VERSION, "flushes": entries}))
