"""MemoryStore: the only writer of memory files (MEMORY.md, daily notes, MEMORY.md backups).

Every change happens under one cross-process lock per memory folder and is written atomically, so the
bot, the REPL and the CLI can write at the same time without losing or tearing an entry.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo
from pathlib import Path

from filelock import FileLock

from picoclaw import clock
from picoclaw.errors import MemoryStoreError
from picoclaw.fsutil import atomic_write, stamped_files, write_new, write_stamped

LONG_TERM_FILE = "MEMORY.md"
BACKUPS_DIR = "backups"
BACKUP_SUFFIX = "_MEMORY.md"
MAX_ENTRY_CHARS = 100_000

# A line inside an entry that would start a new "## " block (or a title) is demoted so the entry
# stays one block under its date heading. Matched per line (see _clean_entry), "$" so that a bare
# "##" as the last line counts too.
_TOP_HEADING = re.compile(r"^#{1,2}(?=\s|$)")


@dataclass(frozen=True)
class DailyNote:
    """One day's notes file."""

    day: date
    path: Path
    text: str


def _clean_entry(content: str) -> str:
    # A lone "\r" would come back as "\n" when the file is read (universal newlines), so store it as one.
    text = content.replace("\r\n", "\n").replace("\r", "\n").strip()
    if not text:
        raise MemoryStoreError("nothing to store: the entry is empty")
    if len(text) > MAX_ENTRY_CHARS:
        raise MemoryStoreError(f"entry too long: {len(text)} characters (at most {MAX_ENTRY_CHARS})")
    # str.splitlines breaks lines where the block splitter does (also at \u2028, \x0c …), unlike "^".
    return "".join(_TOP_HEADING.sub("###", line, count=1) for line in text.splitlines(keepends=True))


def fingerprint(text: str) -> str:
    """What two entries must share to say the same thing: letters and digits only, in one width and case.

    NFKC folds full-width forms (ＡＢＣ１２３ → ABC123) and compatibility characters; casefold lowers
    Latin; punctuation, spaces and line breaks do not count ("My dog is Bob." = "my dog is bob").
    """
    return "".join(ch for ch in unicodedata.normalize("NFKC", text).casefold() if ch.isalnum())


@dataclass(frozen=True)
class LongTermEntry:
    """An entry of MEMORY.md: its `## date` heading, its text as in the file, and its first line there."""

    heading: str
    text: str
    line: int
    new: bool = True  # False: the same content was already stored and nothing was written


def _entries(text: str) -> Iterator[LongTermEntry]:
    """The `## ` sections of MEMORY.md, in file order."""
    lines = text.split("\n")
    starts = [n for n, line in enumerate(lines) if _SECTION.match(line)]
    for start, end in zip(starts, [*starts[1:], len(lines)]):
        body = "\n".join(lines[start:end]).rstrip("\n") + "\n"
        yield LongTermEntry(lines[start].rstrip(), body, start + 1, new=False)


_SECTION = re.compile(r"^##(?=\s|$)")


def _joined(existing: str, block: str) -> str:
    if not existing.strip():
        return block
    return existing.rstrip("\n") + "\n\n" + block


def _appended_since(expected: str, current: str) -> str | None:
    """The text appended to `expected` to make `current` ("" for none), or None if it was changed otherwise."""
    base = expected.rstrip("\n")
    if current.rstrip("\n") == base:
        return ""
    # Appends join at a line break (see _joined); a longer last line is an edit, not an append.
    if base and not current.startswith(base + "\n"):
        return None
    return current[len(base):].strip("\n") + "\n"


@dataclass(frozen=True)
class Replacement:
    """What a compare-and-replace of MEMORY.md did: the backup taken and the entries carried over."""

    backup: Path | None
    carried_over: str


class MemoryStore:
    """MEMORY.md, daily notes `YYYYMM/YYYYMMDD.md` and backups inside one memory folder."""

    def __init__(self, memory_dir: Path, tz: tzinfo, backup_keep: int = 50):
        self.memory_dir = Path(memory_dir)
        self.tz = tz
        self.backup_keep = backup_keep
        self.long_term_path = self.memory_dir / LONG_TERM_FILE
        self.backups_dir = self.memory_dir / BACKUPS_DIR
        self._lock = FileLock(str(self.memory_dir / ".memory.lock"))
        self._listeners: list[Callable[[Path], None]] = []

    def on_change(self, listener: Callable[[Path], None]) -> None:
        """Call `listener(path)` after every write of a memory file (the optional index marks it changed)."""
        self._listeners.append(listener)

    def _write(self, path: Path, text: str) -> None:
        atomic_write(path, text)
        for listener in self._listeners:
            listener(path)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the cross-process memory lock (reentrant within one store object)."""
        self.memory_dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            yield

    def today(self) -> date:
        """Today's date in the configured timezone."""
        return clock.now(self.tz).date()

    # -- MEMORY.md ---------------------------------------------------------------------------------

    def read_long_term(self) -> str:
        """MEMORY.md's text ("" when it does not exist yet)."""
        try:
            return self.long_term_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""

    def create_long_term(self, content: str) -> bool:
        """Write a first MEMORY.md (onboarding's template); False, and nothing written, if one exists."""
        if not write_new(self.long_term_path, content):
            return False
        for listener in self._listeners:
            listener(self.long_term_path)
        return True

    def append_long_term(self, content: str) -> LongTermEntry:
        """Append `## YYYY-MM-DD` + content to MEMORY.md; returns the entry as written.

        Content that an entry already holds (compared by `fingerprint`: case, width, spaces and punctuation
        aside) is not written twice: the existing entry comes back, with `new` False.
        """
        body = _clean_entry(content)
        heading = f"## {self.today().isoformat()}"
        with self.locked():
            current = self.read_long_term()
            existing = self.find_long_term(body, current)
            if existing is not None:
                return existing
            self._backup_long_term(current)
            joined = _joined(current, f"{heading}\n{body}\n")
            self._write(self.long_term_path, joined)
        return LongTermEntry(heading, f"{heading}\n{body}\n", joined.count("\n") - body.count("\n") - 1)

    def find_long_term(self, content: str, text: str | None = None) -> LongTermEntry | None:
        """The entry of MEMORY.md (or of `text`) whose content is `content`, by fingerprint; None if none."""
        wanted = fingerprint(content)
        if not wanted:
            return None
        for entry in _entries(self.read_long_term() if text is None else text):
            if fingerprint(entry.text.split("\n", 1)[1] if "\n" in entry.text else "") == wanted:
                return entry
        return None

    def rewrite_long_term(self, content: str) -> Path | None:
        """Replace MEMORY.md whole (after a backup); returns the backup taken, if there was a file."""
        with self.locked():
            backup = self._backup_long_term(self.read_long_term())
            self._write(self.long_term_path, content)
        return backup

    def replace_long_term_keeping_appends(self, expected: str, content: str) -> Replacement:
        """Replace MEMORY.md by `content` if it still is `expected` plus, maybe, entries appended since.

        For a rewrite made without the lock (a model call takes seconds): entries appended meanwhile are
        carried over to the end of `content`. Any other change meanwhile (a hand edit, a restore) raises
        MemoryStoreError and leaves the file as it is.
        """
        with self.locked():
            current = self.read_long_term()
            carried = _appended_since(expected, current)
            if carried is None:
                raise MemoryStoreError(f"{self.long_term_path} was changed (not just appended to) while it was "
                                       "being rewritten; the changed file was kept and the rewrite dropped")
            backup = self._backup_long_term(current)
            self._write(self.long_term_path, _joined(content, carried) if carried else content)
        return Replacement(backup, carried)

    # -- backups -----------------------------------------------------------------------------------

    def backups(self) -> list[Path]:
        """Backups of MEMORY.md, oldest first."""
        return stamped_files(self.backups_dir, BACKUP_SUFFIX)

    def restore_backup(self, name: str) -> Path | None:
        """Make the backup called `name` the current MEMORY.md (the current one is backed up first)."""
        chosen = next((path for path in self.backups() if path.name == name), None)
        if chosen is None:
            raise MemoryStoreError(f"no backup named {name!r} in {self.backups_dir}; see `picoclaw memory backups`")
        return self.rewrite_long_term(chosen.read_text(encoding="utf-8"))

    def _backup_long_term(self, current: str) -> Path | None:
        # Called with the lock held. Nothing to keep when MEMORY.md does not exist yet.
        if not self.long_term_path.exists():
            return None
        # write_stamped, not reserve-then-write: a crash must not leave an empty "backup" to restore.
        target = write_stamped(self.backups_dir, clock.stamp(clock.now(self.tz)), BACKUP_SUFFIX, current)
        for stale in self.backups()[: -self.backup_keep]:
            stale.unlink(missing_ok=True)
        return target

    # -- bookkeeping -------------------------------------------------------------------------------

    def write_marker(self, name: str, text: str) -> Path:
        """Write a small bookkeeping file of the memory folder (say, when compression last ran); atomic."""
        path = self.memory_dir / name
        atomic_write(path, text)
        return path

    # -- daily notes -------------------------------------------------------------------------------

    def note_path(self, day: date) -> Path:
        """`memory/YYYYMM/YYYYMMDD.md` for that day."""
        return self.memory_dir / day.strftime("%Y%m") / f"{day.strftime('%Y%m%d')}.md"

    def append_note(self, content: str, at: datetime | None = None) -> Path:
        """Append `## HH:MM` + content to the daily note of `at` (default: now, local time)."""
        moment = (at or clock.now(self.tz)).astimezone(self.tz)
        path = self.note_path(moment.date())
        entry = f"## {moment.strftime('%H:%M')}\n{_clean_entry(content)}\n"
        with self.locked():
            try:
                current = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                current = f"# {moment.date().isoformat()}\n"
            self._write(path, _joined(current, entry))
        return path

    def edit_note(self, path: Path, edit: Callable[[str], str]) -> None:
        """Rewrite the daily note `path` as `edit(its text)`, read and written under one lock hold.

        The text keeps its own line endings, so an edit made by exact text matching fits what was read.
        """
        with self.locked():
            with open(path, encoding="utf-8", newline="") as handle:
                current = handle.read()
            self._write(path, edit(current))

    def note_files(self) -> list[Path]:
        """Every daily note file, oldest first."""
        found = [
            path
            for month in self.memory_dir.glob("[0-9][0-9][0-9][0-9][0-9][0-9]")
            if month.is_dir()
            for path in month.glob("[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9].md")
        ]
        return sorted(found, key=lambda path: path.name)

    def read_recent_notes(self, days: int) -> list[DailyNote]:
        """The notes of the last `days` days including today, oldest first (days without notes skipped)."""
        today = self.today()
        notes = []
        for offset in range(days - 1, -1, -1):
            day = today - timedelta(days=offset)
            path = self.note_path(day)
            try:
                notes.append(DailyNote(day, path, path.read_text(encoding="utf-8")))
            except FileNotFoundError:
                continue
        return notes
