"""How often each memory block was injected into a turn's prompt: the "use" that ranking weighs
(search/reranking.py), kept beside the memory files and never inside MEMORY.md, which stays the user's text.

The file (`memory/.access_counts.json`) maps a block's key (turn_memory.block_key: a hash of its text, so an
edited block starts from zero) to how often it was injected and on which day last. It is soft state: a
missing or corrupt file is logged once and started afresh, a write that fails or waits too long for the
lock is skipped, and no turn ever fails for it. It holds at most MAX_KEYS blocks; past that, the ones used
longest ago are dropped (a block deleted or edited away is never used again, so it goes first).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import date
from pathlib import Path

import orjson

from picoclaw.disk.file_identity import FileKey, file_key
from picoclaw.errors import ConfigError
from picoclaw.jsonio import read_json_object
from picoclaw.storage import Storage, StorageError, document_of

log = logging.getLogger(__name__)

ACCESS_COUNTS_FILE = ".access_counts.json"
MAX_KEYS = 5000
# A turn never waits longer than this for another process's count update: a count missed costs nothing.
LOCK_WAIT_SECONDS = 2.0
_VERSION = 1


class AccessCounts:
    """The injection counts of one memory folder: read with a stat-keyed cache, updated under a file lock."""

    def __init__(self, memory_dir: Path, *, storage: Storage, lock_wait: float = LOCK_WAIT_SECONDS,
                 max_keys: int = MAX_KEYS):
        self.path = Path(memory_dir) / ACCESS_COUNTS_FILE
        self.max_keys = max_keys
        self._lock = storage.lock(Path(memory_dir) / ".access_counts.lock", timeout=lock_wait)
        self.documents, self.name = document_of(storage, self.path)
        # The file's entries and counts as of its identity, in one tuple so a reader in another thread never
        # sees one without the other. Kept after this process's own write too: the next turn's ranking and the
        # next count then read nothing (a file of MAX_KEYS entries took milliseconds to parse and check).
        self._known: tuple[FileKey | None, dict[str, tuple[int, str]], dict[str, int]] | None = None
        self._warned = False

    def counts(self) -> Mapping[str, int]:
        """Block key → times injected; re-read only when the file changed (one stat)."""
        try:
            key = file_key(self.documents.local(self.name))
        except OSError as exc:  # the memory folder is gone or unreadable: nothing counted
            self._warn(str(exc))
            return {}
        known = self._known
        if known is None or known[0] != key:
            known = self._remember(key, self._load())
        return known[2]

    def record(self, keys: Iterable[str], day: date) -> None:
        """Count one more injection on `day` for each of `keys`; problems are logged, never raised."""
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return
        try:
            with self._lock:
                entries = dict(self._entries())  # a copy: the kept one may be in a reader's hands
                for key in wanted:
                    used, _ = entries.get(key, (0, ""))
                    entries[key] = (used + 1, day.isoformat())
                if len(entries) > self.max_keys:
                    # ISO dates sort as days do; among blocks last used the same day, the less used go first.
                    newest = sorted(entries.items(), key=lambda item: (item[1][1], item[1][0]), reverse=True)
                    entries = dict(newest[:self.max_keys])
                record = {"version": _VERSION, "blocks": {key: [used, last] for key, (used, last) in entries.items()}}
                # Not fsynced: losing the last counts to a power cut is harmless, a sync every turn is not free.
                self.documents.replace(self.name, orjson.dumps(record), durable=False)
                self._remember(file_key(self.documents.local(self.name)), entries)  # under the lock: our file
        except (OSError, StorageError) as exc:  # a held lock past its wait, a lost server: skipped, not fatal
            self._warn(f"cannot update {self.path}: {exc}")

    def read(self) -> dict[str, tuple[int, str]]:
        """Block key → (times injected, ISO day last injected), as the file holds them now (none for a missing
        file); ConfigError when it cannot be read or is not a counts file."""
        file = self.documents.local(self.name)
        try:
            raw = read_json_object(file)
        except ConfigError:
            if file.exists() or file.is_symlink():
                raise
            return {}
        blocks = raw.get("blocks")
        if raw.get("version") != _VERSION or not isinstance(blocks, dict):
            raise ConfigError(f"{self.path} is not a version {_VERSION} counts file")
        entries: dict[str, tuple[int, str]] = {}
        for key, value in blocks.items():
            # Entry by entry: one hand-damaged value costs that block's count, not the others'.
            if (isinstance(value, list) and len(value) == 2 and type(value[0]) is int and value[0] > 0
                    and isinstance(value[1], str)):
                entries[key] = (value[0], value[1])
        return entries

    def _entries(self) -> dict[str, tuple[int, str]]:
        """The file's entries: the kept ones while the file is the one last read or written here."""
        known = self._known
        key = file_key(self.documents.local(self.name))
        if known is not None and known[0] == key:
            return known[1]
        return self._remember(key, self._load())[1]

    def _remember(self, key: FileKey | None, entries: dict[str, tuple[int, str]]
                  ) -> tuple[FileKey | None, dict[str, tuple[int, str]], dict[str, int]]:
        self._known = (key, entries, {block: used for block, (used, _) in entries.items()})
        return self._known

    def _load(self) -> dict[str, tuple[int, str]]:
        """The file's entries; {} for a missing file, and for a corrupt one (logged once)."""
        try:
            return self.read()
        except ConfigError as exc:
            self._warn(f"{exc}; counting starts afresh")
            return {}

    def _warn(self, problem: str) -> None:
        if not self._warned:
            log.warning("memory access counts: %s; ranking goes on without them (logged once)", problem)
            self._warned = True
