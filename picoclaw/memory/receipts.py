"""Receipts of the writes to MEMORY.md and LEARNINGS.md that no command of the user's made.

The memory flush, the model's `memory_append` and the lessons drafted after a turn all write long-term memory
on their own. Each such write is a `MemoryWrite`: the agent shows it once where the user is (its `notice`,
"remembered: …"), and keeps it in a short log beside the memory files (`memory/.memory_writes.json`, the
newest KEEP_WRITES), which `/memory recent` lists with the source of each. The log is soft state: a write
that cannot be logged is logged as a warning, and the memory write itself stands.

A turn's writes are collected by the `TurnWrites` in `current_turn`, which the agent sets for the turn: it
also carries what the user said in the conversation so far, which `memory_append` grounds its fact in
(memory/grounding.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson

from picoclaw import clock
from picoclaw.errors import ConfigError
from picoclaw.jsonio import read_json_object
from picoclaw.memory.grounding import user_texts
from picoclaw.storage import Storage, StorageError, document_of

log = logging.getLogger(__name__)

WRITES_FILE = ".memory_writes.json"
KEEP_WRITES = 50
NOTICE_CHARS = 160  # a receipt is one line; the whole text is in the file
LOCK_WAIT_SECONDS = 10.0
LONG_TERM = "MEMORY.md"
LEARNINGS = "LEARNINGS.md"
_VERSION = 1


@dataclass(frozen=True)
class MemoryWrite:
    """One automatic write: the document, the text written, where it came from ("memory flush", "memory_append",
    "lesson (correction)" …), the session, whether the words are the user's, and when (ISO 8601, UTC)."""

    document: str  # LONG_TERM or LEARNINGS
    text: str
    source: str
    session: str | None = None
    by_user: bool = True
    outcome: str = "added"  # "updated": a lesson that restated one replaced it
    time: str = field(default_factory=lambda: clock.now().isoformat(timespec="seconds"))

    @property
    def notice(self) -> str:
        """The receipt as one line: "remembered: …" (a lesson: "learned: …"), saying when the words are not
        the user's."""
        what = "remembered" if self.document == LONG_TERM else "learned"
        whose = "" if self.by_user else " (the assistant's words, not yours)"
        return f"{what}{whose}: {shorten(self.text)}"


def shorten(text: str, limit: int = NOTICE_CHARS) -> str:
    """`text` on one line, cut at `limit` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


@dataclass
class TurnWrites:
    """One turn's automatic writes, and what the user said in the conversation so far (the ground of a fact)."""

    session: str
    writes: list[MemoryWrite] = field(default_factory=list)
    # The conversation before this turn and the turn's message (`heard`), kept as they were when the turn began;
    # read into `said` only when a tool saves a fact, which most turns do not.
    conversation: tuple[dict[str, Any], ...] | None = field(default=None, repr=False)
    text: str = ""

    def heard(self, conversation: Iterable[dict[str, Any]], text: str) -> None:
        """The conversation so far (as stored) and the message this turn answers."""
        self.conversation, self.text = tuple(conversation), text
        self.__dict__.pop("said", None)

    @cached_property
    def said(self) -> tuple[str, ...]:
        """What the user typed in the conversation so far, this turn's message last; () before `heard`."""
        if self.conversation is None:
            return ()
        return (*user_texts(self.conversation), self.text)


# Set by the agent for the length of a turn; tools read it (a worker thread gets a copy of the context, and the
# copy holds the same TurnWrites, so what a tool adds is seen by the turn).
current_turn: ContextVar[TurnWrites | None] = ContextVar("current_turn", default=None)


class WriteLog:
    """The newest automatic writes of one memory folder, for `/memory recent`."""

    def __init__(self, memory_dir: Path, *, storage: Storage, lock_wait: float = LOCK_WAIT_SECONDS):
        self.path = Path(memory_dir) / WRITES_FILE
        # A lock in the memory folder (the scope's lock on PostgreSQL); the file is read and written through the
        # scope's documents, like every document of the scope.
        self._lock = storage.lock(Path(memory_dir) / ".memory_writes.lock", timeout=lock_wait)
        self.documents, self.name = document_of(storage, self.path)

    def record(self, writes: list[MemoryWrite]) -> None:
        """Add `writes` to the log (the newest KEEP_WRITES are kept); a failure is logged, never raised."""
        if not writes:
            return
        try:
            with self._lock:
                try:
                    kept = self._read()
                except ConfigError as exc:
                    log.warning("memory writes: %s; the log starts afresh", exc)
                    kept = []
                kept = (kept + list(writes))[-KEEP_WRITES:]
                self.documents.replace(self.name, orjson.dumps({"version": _VERSION,
                                                      "writes": [asdict(write) for write in kept]}))
        except (OSError, StorageError) as exc:  # a held lock past its wait, a lost server: skipped, not fatal
            log.warning("memory writes: cannot update %s (%s); not logged: %s", self.path, exc,
                        "; ".join(shorten(write.text, 60) for write in writes))

    def recent(self, limit: int = KEEP_WRITES) -> list[MemoryWrite]:
        """The newest `limit` writes, newest first; ConfigError when the log is damaged or cannot be read.
        Without the lock, as every reader of soft state: the read itself asks the storage for the log as it is."""
        return list(reversed(self._read()))[:limit]

    def _read(self) -> list[MemoryWrite]:
        file = self.documents.local(self.name)
        if not (file.exists() or file.is_symlink()):
            return []
        raw = read_json_object(file)
        writes = raw.get("writes")
        if raw.get("version") != _VERSION or not isinstance(writes, list):
            raise ConfigError(f"{self.path} is not a version {_VERSION} log of memory writes")
        found = []
        for item in writes:
            try:
                found.append(MemoryWrite(**item))
            except TypeError:  # a hand-edited record: the others still count
                continue
        return found
