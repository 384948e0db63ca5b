"""MemoryStore: the only writer of memory files (MEMORY.md, LEARNINGS.md, daily notes, their backups).

Every change happens under one cross-process lock per memory folder (and, for a MEMORY.md that is a link,
one beside the file it names) and is written atomically, so the bot, the REPL and the CLI can write at the
same time without losing or tearing an entry.

An entry is appended to MEMORY.md in place, never by copying the file (memory/in_place_append.py: a journal
makes it crash-safe, a derived table of the entries' fingerprints finds one already stored), and an update
is looked for among the newest UPDATE_WINDOW entries, so an append costs the same at 50 MB as at 1 MB. A
rewrite (compression, restore, an edit, an update that marks an older entry) replaces the whole file after
a backup. What an entry is, and how it is made safe to append, is memory/entries.py. LEARNINGS.md, the
lessons (memory/learnings.py), is small: each change rewrites it whole, after a backup, under the same lock.

Every read goes through the documents port too (`local`: on files the file itself; on PostgreSQL this
machine's cache of the row, checked against its revision at each read), so what a read sees never depends on
a lock taken before it.

The files are user-editable, so reading never fails on bytes that are not UTF-8 (memory/reading.py: they
read as U+FFFD, with one warning naming the file and line), and everything written is valid UTF-8; a
rewrite that replaces such bytes keeps the file's original bytes in a backup first.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo
from pathlib import Path

from picoclaw import clock
from picoclaw.disk.bounded_read import read_regular
from picoclaw.disk.folder_entries import folder_entries
from picoclaw.disk.links import NotAFileError, write_target
from picoclaw.errors import MemoryStoreError
from picoclaw.memory.entries import (
    SUPERSEDED,
    LongTermEntry,
    appended_since,
    check_unicode,
    clean_entry,
    entry_fingerprint,
    entry_version,
    fingerprint,
    joined,
    long_term_entries,
    mark_superseded,
    updated_by,
    without_source,
)
from picoclaw.memory.entry_table import ENTRIES_FILE
from picoclaw.memory.in_place_append import append_in_place, journal_path, repair_append
from picoclaw.memory.learnings import (
    LEARNINGS_FILE,
    MAX_LESSON_CHARS,
    given_by_a_person,
    lesson_of,
    lesson_text,
    restates,
    stands,
)
from picoclaw.memory.reading import FileText, decode, warn_rewritten, warn_unreadable
from picoclaw.storage import FilesStorage, StaleRevision, Storage, StorageError, document_of

log = logging.getLogger(__name__)

LONG_TERM_FILE = "MEMORY.md"
BACKUPS_DIR = "backups"
BACKUP_SUFFIX = "_MEMORY.md"
LEARNINGS_BACKUP_SUFFIX = "_LEARNINGS.md"
# A temp file in the backup folder older than this was left by a writer that was killed mid-write.
STALE_TEMP_SECONDS = 3600
# An appended entry that updates an older one marks it (see memory/supersede.py) among this many newest entries:
# a bound, so that an append to a MEMORY.md of half a million entries does not tokenise them all.
UPDATE_WINDOW = 10_000
NOTE_PATHS_KEPT = 64  # days whose note paths a store keeps made (a turn asks for the last few)


@dataclass(frozen=True)
class DailyNote:
    """One day's notes file."""

    day: date
    path: Path
    text: str


@dataclass(frozen=True)
class LessonWrite:
    """What storing a lesson did: "added" a new entry, "updated" one that said the same thing (`replaced`
    is its lesson as it was), or found it "known" already (nothing written)."""

    entry: LongTermEntry
    outcome: str
    replaced: str = ""


@dataclass(frozen=True)
class Replacement:
    """What a compare-and-replace of MEMORY.md did: the backup taken and the entries carried over."""

    backup: Path | None
    carried_over: str


# As pathlib's glob matched them: without regard to case where the file system has none (Windows).
_MONTH_DIR = re.compile(r"[0-9]{6}")  # memory/YYYYMM/
_NOTE_FILE = re.compile(r"[0-9]{8}\.md", re.IGNORECASE if os.name == "nt" else 0)  # YYYYMMDD.md


def _is_folder(entry: os.DirEntry[str]) -> bool:
    """Whether `entry` is a folder or links to one; a link to nothing, or looping, is not (as Path.is_dir)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


class MemoryStore:
    """MEMORY.md, daily notes `YYYYMM/YYYYMMDD.md` and backups inside one memory folder."""

    def __init__(self, memory_dir: Path, tz: tzinfo, backup_keep: int = 50, *, storage: Storage,
                 update_window: int = UPDATE_WINDOW):
        self.memory_dir = Path(memory_dir)
        self.update_window = update_window  # how many newest entries an append looks among for one it updates
        self.tz = tz
        self.storage = storage  # the workspace's backend: its locks, and the index's table on PostgreSQL
        self.documents, _ = document_of(storage, self.memory_dir / LONG_TERM_FILE)  # every write goes through it
        self.backup_keep = backup_keep
        self.long_term_path = self.memory_dir / LONG_TERM_FILE
        self.learnings_path = self.memory_dir / LEARNINGS_FILE
        self.backups_dir = self.memory_dir / BACKUPS_DIR
        self._lock = storage.lock(self.memory_dir / ".memory.lock")
        self._target_locks: dict[Path, AbstractContextManager[object]] = {}
        self._listeners: list[Callable[[Path], None]] = []
        self._names: dict[Path, str] = {}
        self._notes_folder: Path | None = None  # `notes`' Paths, by (month, name), while its folder is the same
        self._note_places: dict[tuple[str, str], tuple[Path, Path]] = {}
        self._note_paths: dict[date, Path] = {}  # `note_path`'s, for the days last asked

    def on_change(self, listener: Callable[[Path], None]) -> None:
        """Call `listener(path)` after every write of a memory file (the optional index marks it changed)."""
        self._listeners.append(listener)

    def _name(self, path: Path) -> str:
        name = self._names.get(path)
        if name is None:
            name = self._names[path] = self.documents.name(path)
        return name

    def local(self, path: Path) -> Path:
        """The file on this machine holding the document at `path` as it is now, to read (files: `path`)."""
        return self.documents.local(self._name(path))

    def _write(self, path: Path, data: str | bytes) -> None:
        self.documents.replace(self._name(path), data)
        if path == self.long_term_path:  # a new file: its entry table is rebuilt when next needed
            (self.local(path).parent / ENTRIES_FILE).unlink(missing_ok=True)
        self._changed(path)

    def _changed(self, path: Path) -> None:
        for listener in self._listeners:
            listener(path)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the cross-process memory lock (reentrant within one store object).

        When MEMORY.md is a link, a lock beside the file it names is held too: two memory folders linking the
        same file (two workspaces sharing a vault note) then take turns like one. An append cut off by a crash
        is repaired first (see `in_place_append.repair_append`).
        """
        self.memory_dir.mkdir(parents=True, exist_ok=True)
        with ExitStack() as held:
            held.enter_context(self._lock)
            local = self.local(self.long_term_path)
            real = _linked(local)
            if real is not None:
                lock = self._target_locks.get(real)
                if lock is None:
                    lock = self._target_locks[real] = self._target_lock(real.with_name(f".{real.name}.lock"))
                held.enter_context(lock)
            repair_append(local)
            yield

    def _target_lock(self, lock_file: Path) -> AbstractContextManager[object]:
        """The lock named by `lock_file`: the storage's inside its workspace; outside it, a file no backend keeps
        (a note elsewhere on this machine), a plain lock file."""
        if Path(os.path.abspath(lock_file)).is_relative_to(os.path.abspath(self.storage.root)):
            return self.storage.lock(lock_file)
        return FilesStorage(lock_file.parent, lock_wait=self.storage.lock_wait).lock(lock_file)

    def today(self) -> date:
        """Today's date in the configured timezone."""
        return clock.now(self.tz).date()

    # -- MEMORY.md ---------------------------------------------------------------------------------

    def read_long_term(self, *, warn: bool = True) -> str:
        """MEMORY.md's text ("" when it does not exist yet); bytes that are not UTF-8 read as U+FFFD.

        `warn` False: the caller is about to rewrite the file, and the rewrite's warning (naming the backup
        that keeps the original bytes) is the one to give.
        """
        self.repair()
        read = self._read_long_term()
        if warn:
            warn_unreadable(self.long_term_path, read)
        return read.text

    def repair(self) -> None:
        """Remove the partial entry of an append cut off by a crash, if there is one (`repair_append`).

        One stat when there is nothing to do, so readers call it before they read MEMORY.md; while an append
        is being written it waits for the lock, so a reader never sees half an entry either.
        """
        try:
            real = write_target(self.local(self.long_term_path))
        except OSError:
            return
        if journal_path(real).exists():
            with self.locked():
                pass

    def _read_long_term(self) -> FileText:
        try:
            return decode(read_regular(self.local(self.long_term_path)))
        except FileNotFoundError:
            return FileText(b"", "", None)

    def create_long_term(self, content: str) -> bool:
        """Write a first MEMORY.md (onboarding's template); False, and nothing written, if one exists."""
        if not self.documents.create(self._name(self.long_term_path), content):
            return False
        for listener in self._listeners:
            listener(self.long_term_path)
        return True

    def append_long_term(self, content: str) -> LongTermEntry:
        """Append `## YYYY-MM-DD` + content to MEMORY.md; returns the entry as written.

        Content that an entry already holds (compared by `entry_fingerprint`: case, width, spaces, punctuation
        and `Source:` lines aside) is not written twice: the existing entry comes back, with `new` False.
        """
        body = clean_entry(content)
        heading = f"## {self.today().isoformat()}"
        with self.locked():
            appended = append_in_place(self.local(self.long_term_path), self._name(self.long_term_path), heading,
                                       body, self.update_window, self.documents)
            if appended is not None:
                if appended.new:
                    self._changed(self.long_term_path)
                    self._sweep_temp_files()
                return appended
            # The rest is for what cannot be appended in place: a new or preamble-only file, one with bytes that
            # are not UTF-8 or with CRs (rewritten clean), or an update that marks an older entry.
            read = self._read_long_term()
            current = read.text
            existing = self.find_long_term(body, current)
            if existing is not None:
                warn_unreadable(self.long_term_path, read)
                return existing
            # The backup holds the file's bytes as they were: if some were not UTF-8, the rewrite below
            # has U+FFFD in their place, and the backup is where the originals can be recovered.
            backup = self._backup_long_term()
            older = updated_by(body, list(long_term_entries(current))[-self.update_window:])
            if older:  # kept, never deleted: a wrong guess costs one line, a deleted fact would be lost
                summary = " ".join(without_source(body).split())
                marker = f"{SUPERSEDED} by the {self.today().isoformat()} entry: {summary[:80]}"
                current = mark_superseded(current, older, marker + ("…" if len(summary) > 80 else ""))
            whole = joined(current, f"{heading}\n{body}\n")
            self._write(self.long_term_path, whole)
            warn_rewritten(self.long_term_path, read, backup)
        return LongTermEntry(heading, f"{heading}\n{body}\n", whole.count("\n") - body.count("\n") - 1)

    def find_long_term(self, content: str, text: str | None = None) -> LongTermEntry | None:
        """The entry of MEMORY.md (or of `text`) whose content is `content`, by fingerprint; None if none."""
        wanted = entry_fingerprint(content)
        if not wanted:
            return None
        for entry in long_term_entries(self.read_long_term() if text is None else text):
            if entry_fingerprint(entry.text.split("\n", 1)[1] if "\n" in entry.text else "") == wanted:
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
            write_target(self.local(self.long_term_path))  # a link to a device or a FIFO: refused before it is read
            read = self._read_long_term()
            backup = self._backup_long_term()
            self._write(self.long_term_path, content)
            if isinstance(content, str):
                warn_rewritten(self.long_term_path, read, backup)
        return backup

    def replace_long_term_keeping_appends(self, expected: str, content: str) -> Replacement:
        """Replace MEMORY.md by `content` if it still is `expected` plus, maybe, entries appended since.

        For a rewrite made without the lock (a model call takes seconds): entries appended meanwhile are
        carried over to the end of `content`. Any other change meanwhile (a hand edit, a restore) raises
        MemoryStoreError and leaves the file as it is.
        """
        check_unicode(content)
        with self.locked():
            write_target(self.local(self.long_term_path))
            read = self._read_long_term()
            carried = appended_since(expected, read.text)
            if carried is None:
                raise MemoryStoreError(f"{self.long_term_path} was changed (not just appended to) while it was "
                                       "being rewritten; the changed file was kept and the rewrite dropped")
            backup = self._backup_long_term()
            self._write(self.long_term_path, joined(content, carried) if carried else content)
            warn_rewritten(self.long_term_path, read, backup)
        return Replacement(backup, carried)

    def replace_long_term_entry(self, line: int, version: str, content: str | None) -> Path | None:
        """Give the entry that starts at `line` new content, or delete it (`content` None), if it still is the
        version read (`entry_version`); returns the backup taken. MemoryStoreError, and nothing written, if it
        changed or moved meanwhile: an edit made against an old page never overwrites a newer entry."""
        body = None if content is None else clean_entry(content)
        if body is not None:
            check_unicode(body)
            if not body.strip():
                raise MemoryStoreError("an entry cannot be empty: delete it instead")
        with self.locked():
            write_target(self.local(self.long_term_path))
            read = self._read_long_term()
            entry = next((e for e in long_term_entries(read.text) if e.line == line), None)
            if entry is None or entry_version(entry.text) != version:
                raise MemoryStoreError(f"the entry at line {line} of {self.long_term_path} changed since it was "
                                       "read; nothing was written (reload and edit it again)")
            lines = read.text.split("\n")
            start, end = line - 1, line - 1 + entry.text.rstrip("\n").count("\n") + 1
            if body is None:
                while end < len(lines) and not lines[end].strip() and end + 1 < len(lines):
                    end += 1  # the blank lines that separated it from the next entry go with it
                lines[start:end] = []
            else:
                lines[start:end] = [entry.heading, *body.rstrip("\n").split("\n")]
            backup = self._backup_long_term()
            self._write(self.long_term_path, "\n".join(lines))
        return backup

    # -- LEARNINGS.md ------------------------------------------------------------------------------

    def read_learnings(self) -> str:
        """LEARNINGS.md's text ("" when it does not exist yet); bytes that are not UTF-8 read as U+FFFD."""
        try:
            read = decode(read_regular(self.local(self.learnings_path)))
        except FileNotFoundError:
            return ""
        warn_unreadable(self.learnings_path, read)
        return read.text

    def create_learnings(self, content: str) -> bool:
        """Write a first LEARNINGS.md (onboarding's header); False, and nothing written, if one exists."""
        if not self.documents.create(self._name(self.learnings_path), content):
            return False
        self._changed(self.learnings_path)
        return True

    def append_learning(self, content: str, source: str = "") -> LessonWrite:
        """Store a lesson as a `## YYYY-MM-DD` entry of LEARNINGS.md, with a `Source:` line when given.

        A lesson already there (same fingerprint) is not written again. One that restates a lesson
        (`lessons.restates`) replaces it instead of adding a second one: a whole dated entry under today's
        date; a paragraph of a section holding several lessons (a hand-written `## Tools`), that paragraph alone.
        """
        # Imported here: the search package imports this module (the keyword search reads through the store).
        from picoclaw.memory.search.blocks import lesson_blocks

        body = clean_entry(content)
        if len(body) > MAX_LESSON_CHARS:
            raise MemoryStoreError(f"a lesson is at most {MAX_LESSON_CHARS} characters (this one has {len(body)}); "
                                   "say when it applies and what to do in a few sentences")
        heading = f"## {self.today().isoformat()}"
        path = self.learnings_path
        with self.locked():
            local = self.local(path)
            write_target(local)
            try:
                read = decode(read_regular(local))
            except FileNotFoundError:
                read = FileText(b"", "", None)
            current = read.text
            # The same lessons search finds, one a paragraph, so what is compared is what is used.
            lessons = lesson_blocks(current, path)
            wanted = fingerprint(body)
            for lesson in lessons:
                if fingerprint(lesson_of(lesson.text)) == wanted:
                    warn_unreadable(path, read)
                    known = LongTermEntry(lesson.heading, lesson.text, lesson.start_line, new=False)
                    return LessonWrite(known, "known")
            older = next((lesson for lesson in reversed(lessons) if restates(body, lesson_of(lesson.text))), None)
            if older is not None and stands(older.text) and not given_by_a_person(lesson_text(body, source)):
                # The model's restatement never takes the place of a standing lesson a person gave: it would take
                # the lesson out of every system prompt with the person's source line.
                warn_unreadable(path, read)
                return LessonWrite(LongTermEntry(older.heading, older.text, older.start_line, new=False), "known")
            entry = f"{heading}\n{lesson_text(body, source)}\n"
            if older is None:
                whole = joined(current, entry)
                written = LongTermEntry(heading, entry, whole.count("\n") - entry.count("\n") + 1)
            else:
                whole, written = _replace_lesson(current, older.start_line, older.end_line, entry,
                                                 lesson_text(body, source))
            backup = self._backup(path, read.raw, LEARNINGS_BACKUP_SUFFIX) if read.raw else None
            self._write(path, whole)
            warn_rewritten(path, read, backup)
        return LessonWrite(written, "updated", lesson_of(older.text)) if older else LessonWrite(written, "added")

    # -- backups -----------------------------------------------------------------------------------

    def backups(self) -> list[Path]:
        """Backups of MEMORY.md, oldest first, by their place in the workspace (on PostgreSQL, names of versions:
        read them with `read_backup`)."""
        return [self.backups_dir / label for label in self.documents.versions(BACKUP_SUFFIX)]

    def backup_sizes(self) -> list[tuple[str, int]]:
        """(name, size in bytes) of each backup of MEMORY.md, oldest first."""
        return self.documents.version_sizes(BACKUP_SUFFIX)

    def read_backup(self, name: str) -> bytes:
        """The bytes of the backup called `name` (MemoryStoreError if there is none)."""
        if name not in self.documents.versions(BACKUP_SUFFIX):
            raise MemoryStoreError(f"no backup named {name!r} in {self.backups_dir}; see `picoclaw memory backups`")
        try:
            return self.documents.read_version(name)
        except StorageError as exc:  # pruned meanwhile
            raise MemoryStoreError(f"{exc}; see `picoclaw memory backups`") from None

    def restore_backup(self, name: str) -> Path | None:
        """Make the backup called `name` the current MEMORY.md (the current one is backed up first)."""
        # Its bytes, not its text: a backup taken of a file with bytes that are not UTF-8 keeps them, and
        # restoring it must give them back rather than replacement characters.
        return self.rewrite_long_term(self.read_backup(name))

    def _backup_long_term(self) -> Path | None:
        # Called with the lock held. Nothing to keep when MEMORY.md does not exist yet.
        try:
            raw = read_regular(self.local(self.long_term_path))
        except FileNotFoundError:
            return None
        return self._backup(self.long_term_path, raw, BACKUP_SUFFIX)

    def _backup(self, path: Path, raw: bytes, suffix: str) -> Path:
        """Keep `raw` (the exact bytes `path` held) as a new stamped backup; prune old ones and stale temp files."""
        label = self.documents.keep_version(self._name(path), raw, suffix, self.backup_keep)
        self._sweep_temp_files()
        return self.backups_dir / label

    def _sweep_temp_files(self) -> None:
        """Remove temp files a killed writer left in the backup folder (`write_stamped` names them
        `.<stamp>.<random>.tmp`); only old ones, as a young one may belong to a writer still running.
        After every backup and every append (which takes none)."""
        cutoff = time.time() - STALE_TEMP_SECONDS
        for path in self.backups_dir.glob(".*.tmp"):
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink(missing_ok=True)
            except OSError:  # gone meanwhile, or not ours to remove: the next prune tries again
                continue

    # -- editing by hand ---------------------------------------------------------------------------

    def replace_document(self, path: Path, data: bytes, expect: str) -> Path | None:
        """Replace the document at `path` (MEMORY.md, LEARNINGS.md, a note, a bootstrap file) by `data` if it is
        still at revision `expect` (`Documents.read`); else StaleRevision and nothing written. MEMORY.md and
        LEARNINGS.md are backed up first; the backup is returned."""
        name = self._name(path)
        with self.locked():
            current = self.documents.read(name)
            if current.revision != expect:
                raise StaleRevision(f"{name} was changed since it was read; nothing was written")
            backup = None
            if current.data and path in (self.long_term_path, self.learnings_path):
                suffix = BACKUP_SUFFIX if path == self.long_term_path else LEARNINGS_BACKUP_SUFFIX
                backup = self._backup(path, current.data, suffix)
            self._write(path, data)
        return backup

    # -- bookkeeping -------------------------------------------------------------------------------

    def write_marker(self, name: str, text: str) -> Path:
        """Write a small bookkeeping file of the memory folder (say, when compression last ran); atomic."""
        path = self.memory_dir / name
        self.documents.replace(self._name(path), text)
        return path

    # -- daily notes -------------------------------------------------------------------------------

    def note_path(self, day: date) -> Path:
        """`memory/YYYYMM/YYYYMMDD.md` for that day."""
        path = self._note_paths.get(day)
        if path is None:  # a turn asks for the last few days' notes: the same Path objects each time
            if len(self._note_paths) >= NOTE_PATHS_KEPT:
                self._note_paths.clear()
            path = self._note_paths[day] = self.memory_dir / day.strftime("%Y%m") / f"{day.strftime('%Y%m%d')}.md"
        return path

    def append_note(self, content: str, at: datetime | None = None) -> Path:
        """Append `## HH:MM` + content to the daily note of `at` (default: now, local time)."""
        moment = (at or clock.now(self.tz)).astimezone(self.tz)
        path = self.note_path(moment.date())
        entry = f"## {moment.strftime('%H:%M')}\n{clean_entry(content)}\n"
        with self.locked():
            local = self.local(path)
            write_target(local)
            try:
                read = decode(read_regular(local))
            except FileNotFoundError:
                read = FileText(b"", f"# {moment.date().isoformat()}\n", None)
            self._rewrite_note(path, read, joined(read.text, entry))
        return path

    def _rewrite_note(self, path: Path, read: FileText, text: str) -> None:
        # Called with the lock held. Notes are not backed up on every change like MEMORY.md, but a note
        # whose bytes are not all UTF-8 loses them to U+FFFD here, so its original bytes are kept first.
        check_unicode(text)
        backup = self._backup(path, read.raw, f"_note_{path.name}") if read.bad_line is not None else None
        self._write(path, text)
        warn_rewritten(path, read, backup)

    def edit_note(self, path: Path, edit: Callable[[str], str]) -> None:
        """Rewrite the daily note `path` as `edit(its text)`, read and written under one lock hold.

        The text keeps its own line endings, so an edit made by exact text matching fits what was read.
        """
        with self.locked():
            local = self.local(path)
            write_target(local)
            read = decode(read_regular(local), translate_newlines=False)
            self._rewrite_note(path, read, edit(read.text))

    def note_files(self) -> list[Path]:
        """Every daily note, oldest first, by its place in the workspace."""
        return [path for path, _ in self.notes()]

    def notes(self) -> list[tuple[Path, Path]]:
        """Every daily note, oldest first: (its place in the workspace, the file on this machine that holds it
        now, as `local` gives it), all brought up to date at once."""
        folder = self.documents.local_folder(f"{self._name(self.memory_dir)}/")
        found: list[tuple[str, str]] = []  # (YYYYMMDD.md, YYYYMM)
        for month in folder_entries(folder):
            if _MONTH_DIR.fullmatch(month.name) and _is_folder(month):
                found += [(note.name, month.name) for note in folder_entries(month.path)
                          if _NOTE_FILE.fullmatch(note.name)]
        found.sort(key=lambda note: note[0])  # by day; stable, as the months were listed
        # A turn searches every note: the same Path objects each time (made once, their hashes kept).
        if folder != self._notes_folder or len(self._note_places) > 2 * len(found) + 64:
            self._notes_folder, self._note_places = folder, {}
        places = self._note_places
        notes = []
        for day, month_name in found:
            place = places.get((month_name, day))
            if place is None:
                place = places[(month_name, day)] = (self.memory_dir / month_name / day, folder / month_name / day)
            notes.append(place)
        return notes

    def read_note(self, path: Path, local: Path | None = None) -> str:
        """The text of a daily note (one of `note_files`; `local`, its file as `notes` gave it); bytes that are not
        UTF-8 read as U+FFFD."""
        read = decode(read_regular(local or self.local(path)))
        warn_unreadable(path, read)
        return read.text

    def read_recent_notes(self, days: int) -> list[DailyNote]:
        """The notes of the last `days` days including today, oldest first (days without notes skipped)."""
        today = self.today()
        notes = []
        for offset in range(days - 1, -1, -1):
            day = today - timedelta(days=offset)
            path = self.note_path(day)
            try:
                read = decode(read_regular(self.local(path)))
            except FileNotFoundError:
                continue
            except NotAFileError as exc:  # a note linked to a device or a FIFO: the other notes still count
                log.warning("%s", exc)
                continue
            warn_unreadable(path, read)
            notes.append(DailyNote(day, path, read.text))
        return notes


def _replace_lesson(text: str, start: int, end: int, entry: str, paragraph: str) -> tuple[str, LongTermEntry]:
    """`text` with the lesson on lines `start`–`end` (1-based) replaced: a whole `## ` entry by `entry` (under
    its new date); a paragraph of a section of several, or one outside any entry, by `paragraph` alone."""
    lines = text.split("\n")
    section = next((found for found in long_term_entries(text)
                    if found.line <= start < found.line + found.text.rstrip("\n").count("\n") + 1), None)
    if section is not None:
        last = section.line + section.text.rstrip("\n").count("\n")  # its last line, 1-based
        if start == section.line and end >= last:
            new = entry.rstrip("\n").split("\n")
            return "\n".join([*lines[:start - 1], *new, *lines[last:]]), LongTermEntry(new[0], entry, start)
        if start == section.line:  # the first paragraph: the section's heading stays
            start += 1
    new = paragraph.split("\n")
    replaced = "\n".join([*lines[:start - 1], *new, *lines[end:]])
    return replaced, LongTermEntry(section.heading if section else "", paragraph + "\n", start)


def _linked(path: Path) -> Path | None:
    """The file `path` links to, when it is a link to a regular file (MEMORY.md in a vault, on files)."""
    if not path.is_symlink():
        return None
    try:
        return write_target(path)
    except OSError:  # a link to no file: every write refuses it, there is nothing to lock
        return None
