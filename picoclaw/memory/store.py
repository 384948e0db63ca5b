"""MemoryStore: the only writer of memory files (MEMORY.md, daily notes, MEMORY.md backups).

Every change happens under one cross-process lock per memory folder and is written atomically, so the
bot, the REPL and the CLI can write at the same time without losing or tearing an entry.

The files are user-editable, so reading never fails on bytes that are not UTF-8 (they read as U+FFFD,
with one warning naming the file and line), and everything written is valid UTF-8; a rewrite that
replaces such bytes keeps the file's original bytes in a backup first.
"""

from __future__ import annotations

import logging
import re
import time
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo
from pathlib import Path

from filelock import FileLock

from picoclaw import clock
from picoclaw.errors import MemoryStoreError
from picoclaw.fsutil import FileKey, atomic_write, file_key, stamped_files, write_new, write_stamped
from picoclaw.memory.updates import supersedes

log = logging.getLogger(__name__)

LONG_TERM_FILE = "MEMORY.md"
BACKUPS_DIR = "backups"
BACKUP_SUFFIX = "_MEMORY.md"
MAX_ENTRY_CHARS = 100_000
# A temp file in the backup folder older than this was left by a writer that was killed mid-write.
STALE_TEMP_SECONDS = 3600

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


def check_unicode(text: str) -> None:
    """Refuse text that cannot be written as UTF-8: a lone surrogate, which is what Python makes of a byte
    that is not UTF-8 on the command line (surrogateescape) or of a bad "\\ud800" escape in a model's JSON.

    Checked before anything is written (or backed up), so a refused write leaves the store as it was.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        byte = f" (the byte 0x{ord(bad) - 0xDC00:02X}: is the terminal set to UTF-8?)" if 0xDC80 <= ord(bad) <= 0xDCFF \
            else ""
        raise MemoryStoreError(f"the text is not valid Unicode: character {exc.start + 1} is a lone surrogate "
                               f"U+{ord(bad):04X}{byte}; nothing was stored") from None


def demote_headings(text: str) -> tuple[str, int]:
    """`text` with every line that would start a `## ` entry (or a `# ` title) demoted to `###`, and how many.

    The one rule for content put inside an entry: appended content (`_clean_entry`) and edit_file's
    new text, so neither can make a fake dated entry. str.splitlines breaks lines where the block
    splitter does (also at \u2028, \x0c …), unlike "^".
    """
    lines = text.splitlines(keepends=True)
    demoted = [_TOP_HEADING.sub("###", line, count=1) for line in lines]
    return "".join(demoted), sum(1 for old, new in zip(lines, demoted) if old != new)


def is_fence(line: str) -> bool:
    """A line that opens or closes fenced code (the rule retrieval splits by, too)."""
    stripped = line.lstrip()
    return stripped.startswith("```") or stripped.startswith("~~~")


def _close_fence(text: str) -> str:
    """`text` plus a closing fence line if it leaves a fence open, so one entry's unclosed ``` cannot
    swallow the entries after it for a Markdown viewer (retrieval closes it at the next heading anyway)."""
    opener = ""
    for line in text.split("\n"):
        if is_fence(line):
            opener = "" if opener else line.lstrip()
    if not opener:
        return text
    marker = opener[0] * (len(opener) - len(opener.lstrip(opener[0])))
    return f"{text}\n{marker}"


def _clean_entry(content: str) -> str:
    """The one place appended content is made safe: valid Unicode, no NULs, one entry, fences closed."""
    check_unicode(content)
    # NUL has no meaning in Markdown and makes tools (grep, editors) treat the file as binary.
    text = content.replace("\x00", "")
    # A lone "\r" would come back as "\n" when the file is read (universal newlines), so store it as one.
    text = text.replace("\r\n", "\n").replace("\r", "\n").strip()
    if not text:
        raise MemoryStoreError("nothing to store: the entry is empty")
    if len(text) > MAX_ENTRY_CHARS:
        raise MemoryStoreError(f"entry too long: {len(text)} characters (at most {MAX_ENTRY_CHARS})")
    return _close_fence(demote_headings(text)[0])


@dataclass(frozen=True)
class _Read:
    """A memory file as read: its raw bytes and its text (bytes that are not UTF-8 read as U+FFFD)."""

    raw: bytes
    text: str
    bad_line: int | None  # the line of the first byte that is not UTF-8; None when all of it is UTF-8


def _decode(raw: bytes, *, translate_newlines: bool = True) -> _Read:
    try:
        text = raw.decode("utf-8")
        bad_line = None
    except UnicodeDecodeError as exc:
        # A hand edit saved in another encoding must not make memory unreadable: the rest of the file is
        # still good, so the bad bytes become replacement characters and one warning names the line.
        text = raw.decode("utf-8", errors="replace")
        bad_line = raw.count(b"\n", 0, exc.start) + 1
    if translate_newlines:  # what open()'s universal newlines did for the strict read
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _Read(raw, text, bad_line)


_warned: set[tuple[Path, FileKey | None]] = set()


def _warn_unreadable(path: Path, read: _Read) -> None:
    """Warn once per version of the file (a chat reads the recent notes every turn, it must not nag)."""
    if read.bad_line is None:
        return
    key = (path, file_key(path))
    if key in _warned:
        return
    _warned.add(key)
    log.warning("%s line %d holds bytes that are not UTF-8; they are read as U+FFFD (\ufffd) and the file "
                "is left as it is (save it as UTF-8 to fix it)", path, read.bad_line)


def _warn_rewritten(path: Path, read: _Read, backup: Path | None) -> None:
    if read.bad_line is None:
        return
    kept = f"the original bytes are kept in {backup}" if backup is not None else "no backup was possible"
    log.warning("%s line %d held bytes that are not UTF-8; the file was rewritten as UTF-8 with U+FFFD "
                "(\ufffd) in their place; %s", path, read.bad_line, kept)


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
SUPERSEDED = "> superseded"  # how a marked entry's last line begins


def _mark_superseded(text: str, entries: list[LongTermEntry], marker: str) -> str:
    """`text` with `marker` added as the last line of each of `entries` (found by their first line)."""
    lines = text.split("\n")
    for entry in sorted(entries, key=lambda e: e.line, reverse=True):
        end = entry.line - 1 + entry.text.rstrip("\n").count("\n") + 1  # one past the entry's last line
        lines.insert(end, marker)
    return "\n".join(lines)


def _is_marked(entry: LongTermEntry) -> bool:
    return any(line.startswith(SUPERSEDED) for line in entry.text.splitlines())


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

    def _write(self, path: Path, data: str | bytes) -> None:
        atomic_write(path, data)
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

    def read_long_term(self, *, warn: bool = True) -> str:
        """MEMORY.md's text ("" when it does not exist yet); bytes that are not UTF-8 read as U+FFFD.

        `warn` False: the caller is about to rewrite the file, and the rewrite's warning (naming the backup
        that keeps the original bytes) is the one to give.
        """
        read = self._read_long_term()
        if warn:
            _warn_unreadable(self.long_term_path, read)
        return read.text

    def _read_long_term(self) -> _Read:
        try:
            return _decode(self.long_term_path.read_bytes())
        except FileNotFoundError:
            return _Read(b"", "", None)

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
            read = self._read_long_term()
            current = read.text
            existing = self.find_long_term(body, current)
            if existing is not None:
                _warn_unreadable(self.long_term_path, read)
                return existing
            # The backup holds the file's bytes as they were: if some were not UTF-8, the rewrite below
            # has U+FFFD in their place, and the backup is where the originals can be recovered.
            backup = self._backup_long_term()
            older = [entry for entry in _entries(current) if not _is_marked(entry)
                     and supersedes(body, entry.text.split("\n", 1)[-1])]
            if older:  # kept, never deleted: a wrong guess costs one line, a deleted fact would be lost
                summary = " ".join(body.split())
                marker = f"{SUPERSEDED} by the {self.today().isoformat()} entry: {summary[:80]}"
                current = _mark_superseded(current, older, marker + ("…" if len(summary) > 80 else ""))
            joined = _joined(current, f"{heading}\n{body}\n")
            self._write(self.long_term_path, joined)
            _warn_rewritten(self.long_term_path, read, backup)
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

    def rewrite_long_term(self, content: str | bytes) -> Path | None:
        """Replace MEMORY.md whole (after a backup); returns the backup taken, if there was a file.

        `content` as bytes is written exactly (a restore brings back a backup's own bytes); text must be
        valid Unicode, checked before the backup so a refused rewrite changes nothing.
        """
        if isinstance(content, str):
            check_unicode(content)
        with self.locked():
            read = self._read_long_term()
            backup = self._backup_long_term()
            self._write(self.long_term_path, content)
            if isinstance(content, str):
                _warn_rewritten(self.long_term_path, read, backup)
        return backup

    def replace_long_term_keeping_appends(self, expected: str, content: str) -> Replacement:
        """Replace MEMORY.md by `content` if it still is `expected` plus, maybe, entries appended since.

        For a rewrite made without the lock (a model call takes seconds): entries appended meanwhile are
        carried over to the end of `content`. Any other change meanwhile (a hand edit, a restore) raises
        MemoryStoreError and leaves the file as it is.
        """
        check_unicode(content)
        with self.locked():
            read = self._read_long_term()
            carried = _appended_since(expected, read.text)
            if carried is None:
                raise MemoryStoreError(f"{self.long_term_path} was changed (not just appended to) while it was "
                                       "being rewritten; the changed file was kept and the rewrite dropped")
            backup = self._backup_long_term()
            self._write(self.long_term_path, _joined(content, carried) if carried else content)
            _warn_rewritten(self.long_term_path, read, backup)
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
        # Its bytes, not its text: a backup taken of a file with bytes that are not UTF-8 keeps them, and
        # restoring it must give them back rather than replacement characters.
        return self.rewrite_long_term(chosen.read_bytes())

    def _backup_long_term(self) -> Path | None:
        # Called with the lock held. Nothing to keep when MEMORY.md does not exist yet.
        try:
            raw = self.long_term_path.read_bytes()
        except FileNotFoundError:
            return None
        return self._backup(raw, BACKUP_SUFFIX)

    def _backup(self, raw: bytes, suffix: str) -> Path:
        """Keep `raw` (a file's exact bytes) as a new stamped backup; prune old ones and stale temp files."""
        # write_stamped, not reserve-then-write: a crash must not leave an empty "backup" to restore.
        target = write_stamped(self.backups_dir, clock.stamp(clock.now(self.tz)), suffix, raw)
        for stale in stamped_files(self.backups_dir, suffix)[: -self.backup_keep]:
            stale.unlink(missing_ok=True)
        self._sweep_temp_files()
        return target

    def _sweep_temp_files(self) -> None:
        """Remove temp files a killed writer left in the backup folder (`write_stamped` names them
        `.<stamp>.<random>.tmp`); only old ones, as a young one may belong to a writer still running."""
        cutoff = time.time() - STALE_TEMP_SECONDS
        for path in self.backups_dir.glob(".*.tmp"):
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink(missing_ok=True)
            except OSError:  # gone meanwhile, or not ours to remove: the next prune tries again
                continue

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
                read = _decode(path.read_bytes())
            except FileNotFoundError:
                read = _Read(b"", f"# {moment.date().isoformat()}\n", None)
            self._rewrite_note(path, read, _joined(read.text, entry))
        return path

    def _rewrite_note(self, path: Path, read: _Read, text: str) -> None:
        # Called with the lock held. Notes are not backed up on every change like MEMORY.md, but a note
        # whose bytes are not all UTF-8 loses them to U+FFFD here, so its original bytes are kept first.
        check_unicode(text)
        backup = self._backup(read.raw, f"_note_{path.name}") if read.bad_line is not None else None
        self._write(path, text)
        _warn_rewritten(path, read, backup)

    def edit_note(self, path: Path, edit: Callable[[str], str]) -> None:
        """Rewrite the daily note `path` as `edit(its text)`, read and written under one lock hold.

        The text keeps its own line endings, so an edit made by exact text matching fits what was read.
        """
        with self.locked():
            read = _decode(path.read_bytes(), translate_newlines=False)
            self._rewrite_note(path, read, edit(read.text))

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
                read = _decode(path.read_bytes())
            except FileNotFoundError:
                continue
            _warn_unreadable(path, read)
            notes.append(DailyNote(day, path, read.text))
        return notes
