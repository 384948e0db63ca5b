"""MemoryStore: the only writer of memory files (MEMORY.md, daily notes, MEMORY.md backups).

Every change happens under one cross-process lock per memory folder (and, for a MEMORY.md that is a link,
one beside the file it names) and is written atomically, so the bot, the REPL and the CLI can write at the
same time without losing or tearing an entry.

An entry is appended to MEMORY.md in place, never by copying the file: its bytes are added at the end and
fsynced, with a journal naming the old size written first, so an append cut off by a crash is removed by
the next reader or writer (the file is the old one or the new one, never half). Finding an entry already
stored reads a small derived table of the entries' fingerprints (`.MEMORY.md.entries`, checked against the
file and rebuilt whenever it does not match), and an update is looked for among the newest UPDATE_WINDOW
entries, so an append costs the same at 50 MB as at 1 MB. A rewrite (compression, restore, an edit, an
update that marks an older entry) replaces the whole file after a backup.

The files are user-editable, so reading never fails on bytes that are not UTF-8 (they read as U+FFFD,
with one warning naming the file and line), and everything written is valid UTF-8; a rewrite that
replaces such bytes keeps the file's original bytes in a backup first.
"""

from __future__ import annotations

import bisect
import codecs
import hashlib
import logging
import os
import re
import struct
import time
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo
from pathlib import Path
from typing import BinaryIO

import orjson
from filelock import FileLock

from picoclaw import clock
from picoclaw.errors import MemoryStoreError
from picoclaw.fsutil import (
    FileKey,
    NotAFileError,
    atomic_write,
    file_key,
    read_regular,
    stamped_files,
    write_new,
    write_stamped,
    write_target,
)
from picoclaw.memory.prefilter import fold, needles, shares_two
from picoclaw.memory.updates import supersedes
from picoclaw.printable import printable

log = logging.getLogger(__name__)

LONG_TERM_FILE = "MEMORY.md"
BACKUPS_DIR = "backups"
BACKUP_SUFFIX = "_MEMORY.md"
MAX_ENTRY_CHARS = 100_000
# A temp file in the backup folder older than this was left by a writer that was killed mid-write.
STALE_TEMP_SECONDS = 3600
# An appended entry that updates an older one marks it (see memory/updates.py) among this many newest entries:
# a bound, so that an append to a MEMORY.md of half a million entries does not tokenise them all.
UPDATE_WINDOW = 10_000
ENTRIES_FILE = ".MEMORY.md.entries"  # derived: see _EntryTable

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
    """The one place appended content is made safe: valid Unicode, no NULs or terminal escapes, one entry,
    fences closed."""
    check_unicode(content)
    # A lone "\r" would come back as "\n" when the file is read (universal newlines), so store it as one.
    # NUL and other control characters have no meaning in Markdown, make tools treat the file as binary, and
    # an escape sequence would drive the terminal each time the memory is shown (whoever wrote it: the
    # model's flush, a file tool, a hand-typed CLI argument).
    text = printable(content.replace("\r\n", "\n").replace("\r", "\n")).strip()
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


_NOT_ALNUM = re.compile(r"[\W_]+")  # exactly the characters for which str.isalnum() is False


def fingerprint(text: str) -> str:
    """What two entries must share to say the same thing: letters and digits only, in one width and case.

    NFKC folds full-width forms (ＡＢＣ１２３ → ABC123) and compatibility characters; casefold lowers
    Latin; punctuation, spaces and line breaks do not count ("My dog is Bob." = "my dog is bob").
    """
    return _NOT_ALNUM.sub("", unicodedata.normalize("NFKC", text).casefold())


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


def _updated_by(body: str, entries: Iterator[LongTermEntry] | list[LongTermEntry]) -> list[LongTermEntry]:
    """The entries that the new entry `body` updates (memory/updates.py), not marked already.

    A text sharing fewer than two of the new entry's terms cannot be one: `shares_two` rules most of them
    out on their raw text before the update rule tokenises any.
    """
    wanted = needles(body)
    older = []
    for entry in entries:
        old = entry.text.split("\n", 1)[-1]
        if shares_two(wanted, fold(old)) and not _is_marked(entry) and supersedes(body, old):
            older.append(entry)
    return older


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


# -- MEMORY.md as bytes: whole sections, the entry table, the append journal ---------------------------

_BLOCK = 1 << 20  # read a MiB at a time; the entry table keeps a hash of every MiB of the file
_LINE_HASHES = re.compile(rb"(?m)^##")


def is_section_line(data: bytes, start: int, *, ends_file: bool = False) -> bool:
    """Whether the line starting at data[start] is a `## ` heading. A line running to the end of `data` is
    whole only when `data` ends the file (else it is False: the rest of the line is still to be read)."""
    end = data.find(b"\n", start)
    if end < 0 and not ends_file:
        return False
    return _SECTION.match(data[start:end if end >= 0 else len(data)].decode("utf-8", "replace")) is not None


def _section_starts(data: bytes) -> Iterator[int]:
    """Where each `## ` heading line starts in `data`, a piece from `whole_sections`."""
    for match in _LINE_HASHES.finditer(data):
        if is_section_line(data, match.start(), ends_file=True):
            yield match.start()


def whole_sections(handle: BinaryIO, start: int) -> Iterator[tuple[int, bytes]]:
    """MEMORY.md from byte `start` (a line start) to its end, in pieces of about a MiB, each ending where a
    `## ` heading line starts (or at the end of the file): no section is split between two pieces."""
    handle.seek(start)
    offset, carry = start, b""
    while True:
        more = handle.read(_BLOCK)
        data = carry + more
        if not more:
            if data:
                yield offset, data
            return
        cut = data.rfind(b"\n##")
        while cut >= 0 and not is_section_line(data, cut + 1):
            cut = data.rfind(b"\n##", 0, cut)
        if cut < 0:  # one section longer than what was read so far: read on
            carry = data
            continue
        yield offset, data[:cut + 1]
        offset, carry = offset + cut + 1, data[cut + 1:]


_TABLE_MAGIC = b"PCLWENT1"
_TABLE_HEADER = struct.Struct("<8sQQQQQQ20s")  # magic, size, mtime_ns, inode, lines, blocks, records, digest
_RECORD = struct.Struct("<8sQQ")  # fingerprint hash, byte offset of the heading line, its line number
_DIGEST = 20  # sha1, of each MiB of the file


def _fingerprint_hash(wanted: str) -> bytes:
    return hashlib.blake2b(wanted.encode("utf-8"), digest_size=8).digest()


def _sha1(data: bytes | memoryview) -> bytes:
    return hashlib.sha1(data, usedforsecurity=False).digest()


@dataclass
class _EntryTable:
    """Each `## ` entry of MEMORY.md's first `size` bytes: where its heading line starts (byte, line) and the
    hash of its fingerprint, and a sha1 of each MiB of those bytes. Kept in `.MEMORY.md.entries`: derived data,
    written without fsync, checked against the file before use and rescanned from the first MiB that changed.

    Only a clean MEMORY.md gets one (UTF-8, no CR); any other is read whole as text, as it always was.
    """

    size: int
    key: tuple[int, int]  # (mtime_ns, inode) of the file when the table was made
    lines: int  # line breaks in the first `size` bytes
    blocks: list[bytes]
    records: bytearray

    @property
    def count(self) -> int:
        return len(self.records) // _RECORD.size

    def record(self, index: int) -> tuple[bytes, int, int]:
        """(fingerprint hash, byte offset, line) of the index-th entry."""
        return _RECORD.unpack_from(self.records, index * _RECORD.size)

    def end_of(self, index: int) -> int:
        """Where the index-th entry ends: the next one's start, or the end of the file."""
        return self.record(index + 1)[1] if index + 1 < self.count else self.size

    def find(self, digest: bytes) -> Iterator[int]:
        """The indexes of the entries with this fingerprint hash, in file order."""
        at = self.records.find(digest)
        while at >= 0:
            if at % _RECORD.size == 0:
                yield at // _RECORD.size
            at = self.records.find(digest, at + 1)

    def dump(self) -> list[bytes | bytearray]:
        """The table file's bytes, in pieces (the records are not copied: there may be millions)."""
        blocks = b"".join(self.blocks)
        digest = hashlib.sha1(blocks, usedforsecurity=False)
        digest.update(self.records)
        header = _TABLE_HEADER.pack(_TABLE_MAGIC, self.size, *self.key, self.lines, len(self.blocks), self.count,
                                    digest.digest())
        return [header, blocks, self.records]

    @classmethod
    def load(cls, path: Path) -> _EntryTable | None:
        """The table `dump` wrote to `path`; None when there is none, or it is damaged or of another version."""
        try:
            with open(path, "rb") as handle:
                raw = bytearray(os.fstat(handle.fileno()).st_size)
                read = handle.readinto(raw)
        except FileNotFoundError:
            return None
        if read != len(raw) or read < _TABLE_HEADER.size:
            return None
        magic, size, mtime, inode, lines, blocks, count, digest = _TABLE_HEADER.unpack_from(raw)
        with memoryview(raw) as view:
            intact = (magic == _TABLE_MAGIC and len(raw) == _TABLE_HEADER.size + blocks * _DIGEST + count * _RECORD.size
                      and _sha1(view[_TABLE_HEADER.size:]) == digest)
        if not intact:
            return None
        cut = _TABLE_HEADER.size + blocks * _DIGEST
        found = [bytes(raw[n:n + _DIGEST]) for n in range(_TABLE_HEADER.size, cut, _DIGEST)]
        del raw[:cut]  # the records stay where they were read: no copy of them
        return cls(size, (mtime, inode), lines, found, raw)


def _hash_blocks(handle: BinaryIO, first: int) -> tuple[list[bytes], int]:
    """The sha1 of each MiB of the file from MiB number `first` on, and the file's size."""
    handle.seek(first * _BLOCK)
    found, size = [], first * _BLOCK
    while chunk := handle.read(_BLOCK):
        found.append(_sha1(chunk))
        size += len(chunk)
    return found, size


def _scan_entries(handle: BinaryIO, start: int, line: int, records: bytearray) -> int | None:
    """Add a record to `records` for each entry from byte `start` (a heading on line `line`, or the file's
    start) to the end; returns the line breaks of the whole file, or None when the part read is not clean
    (not UTF-8, or holding a CR: such a file is read as text and rewritten, which cleans it)."""
    newlines = line - 1
    for offset, data in whole_sections(handle, start):
        if b"\r" in data:
            return None
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        starts = list(_section_starts(data))
        counted = 0
        for number, at in enumerate(starts):
            newlines += data.count(b"\n", counted, at)
            counted = at
            section = data[at:starts[number + 1] if number + 1 < len(starts) else len(data)]
            body = section.split(b"\n", 1)[1] if b"\n" in section else b""
            records += _RECORD.pack(_fingerprint_hash(fingerprint(body.decode("utf-8"))), offset + at, newlines + 1)
        newlines += data.count(b"\n", counted)
    return newlines


def _blank(handle: BinaryIO) -> bool:
    """Whether the file holds nothing but white space (an entry then replaces it, see _joined)."""
    handle.seek(0)
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    while chunk := handle.read(_BLOCK):
        if decoder.decode(chunk).strip():
            return False
    return not decoder.decode(b"", final=True).strip()


def _journal_path(real: Path) -> Path:
    """Where an append to `real` notes what it is about to do, beside the file (see MemoryStore._append_bytes)."""
    return real.with_name(f".{real.name}.append")


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
        self._target_locks: dict[Path, FileLock] = {}
        self._listeners: list[Callable[[Path], None]] = []

    def on_change(self, listener: Callable[[Path], None]) -> None:
        """Call `listener(path)` after every write of a memory file (the optional index marks it changed)."""
        self._listeners.append(listener)

    def _write(self, path: Path, data: str | bytes) -> None:
        atomic_write(path, data)
        if path == self.long_term_path:  # a new file: its entry table is rebuilt when next needed
            (self.memory_dir / ENTRIES_FILE).unlink(missing_ok=True)
        self._changed(path)

    def _changed(self, path: Path) -> None:
        for listener in self._listeners:
            listener(path)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the cross-process memory lock (reentrant within one store object).

        When MEMORY.md is a link, a lock beside the file it names is held too: two memory folders linking the
        same file (two workspaces sharing a vault note) then take turns like one. An append cut off by a crash
        is repaired first (see `_repair_append`).
        """
        self.memory_dir.mkdir(parents=True, exist_ok=True)
        with ExitStack() as held:
            held.enter_context(self._lock)
            real = self._linked_long_term()
            if real is not None:
                lock = self._target_locks.setdefault(real, FileLock(str(real.with_name(f".{real.name}.lock"))))
                held.enter_context(lock)
            self._repair_append()
            yield

    def _linked_long_term(self) -> Path | None:
        """The file MEMORY.md links to, when it is a link to a regular file."""
        if not self.long_term_path.is_symlink():
            return None
        try:
            return write_target(self.long_term_path)
        except OSError:  # a link to no file: every write refuses it, there is nothing to lock
            return None

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
            _warn_unreadable(self.long_term_path, read)
        return read.text

    def repair(self) -> None:
        """Remove the partial entry of an append cut off by a crash, if there is one (`_repair_append`).

        One stat when there is nothing to do, so readers call it before they read MEMORY.md; while an append
        is being written it waits for the lock, so a reader never sees half an entry either.
        """
        try:
            real = write_target(self.long_term_path)
        except OSError:
            return
        if _journal_path(real).exists():
            with self.locked():
                pass

    def _read_long_term(self) -> _Read:
        try:
            return _decode(read_regular(self.long_term_path))
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
            appended = self._append_in_place(heading, body)
            if appended is not None:
                return appended
            # The rest is for what cannot be appended in place: a new or preamble-only file, one with bytes that
            # are not UTF-8 or with CRs (rewritten clean), or an update that marks an older entry.
            read = self._read_long_term()
            current = read.text
            existing = self.find_long_term(body, current)
            if existing is not None:
                _warn_unreadable(self.long_term_path, read)
                return existing
            # The backup holds the file's bytes as they were: if some were not UTF-8, the rewrite below
            # has U+FFFD in their place, and the backup is where the originals can be recovered.
            backup = self._backup_long_term()
            older = _updated_by(body, list(_entries(current))[-UPDATE_WINDOW:])
            if older:  # kept, never deleted: a wrong guess costs one line, a deleted fact would be lost
                summary = " ".join(body.split())
                marker = f"{SUPERSEDED} by the {self.today().isoformat()} entry: {summary[:80]}"
                current = _mark_superseded(current, older, marker + ("…" if len(summary) > 80 else ""))
            joined = _joined(current, f"{heading}\n{body}\n")
            self._write(self.long_term_path, joined)
            _warn_rewritten(self.long_term_path, read, backup)
        return LongTermEntry(heading, f"{heading}\n{body}\n", joined.count("\n") - body.count("\n") - 1)

    def _append_in_place(self, heading: str, body: str) -> LongTermEntry | None:
        """Append the entry at the end of a clean MEMORY.md without copying it (or find it already stored);
        None when the file needs the text path of `append_long_term`. Called with the lock held."""
        real = write_target(self.long_term_path)
        try:
            handle = open(real, "rb")
        except FileNotFoundError:
            return None
        with handle:
            info = os.fstat(handle.fileno())
            table = self._entry_table(handle, info)
            if table is None or (table.count == 0 and _blank(handle)):
                return None
            wanted = fingerprint(body)
            for index in table.find(_fingerprint_hash(wanted)) if wanted else ():
                _, start, line = table.record(index)
                handle.seek(start)
                text = handle.read(table.end_of(index) - start).decode("utf-8").rstrip("\n") + "\n"
                if fingerprint(text.split("\n", 1)[1]) == wanted:
                    return LongTermEntry(text.split("\n", 1)[0].rstrip(), text, line, new=False)
            handle.seek(table.record(max(table.count - UPDATE_WINDOW, 0))[1] if table.count else info.st_size)
            if _updated_by(body, _entries(handle.read().decode("utf-8"))):
                return None
            handle.seek(max(info.st_size - 3, 0))
            tail = handle.read()
            trailing = len(tail) - len(tail.rstrip(b"\n"))
            if trailing > 2:  # the text path trims the extra blank lines at the end
                return None
            text = f"{heading}\n{body}\n"
            payload = b"\n" * (2 - trailing) + text.encode("utf-8")
            after = self._append_bytes(real, info, payload)
            line = table.lines + 2 - trailing + 1
            table.records += _RECORD.pack(_fingerprint_hash(wanted), info.st_size + 2 - trailing, line)
            table.lines += payload.count(b"\n")
            first = info.st_size // _BLOCK
            table.blocks[first:], table.size = _hash_blocks(handle, first)
            table.key = (after.st_mtime_ns, after.st_ino)
        self._save_entry_table(table)
        self._changed(self.long_term_path)
        self._sweep_temp_files()
        return LongTermEntry(heading, text, line)

    def _entry_table(self, handle: BinaryIO, info: os.stat_result) -> _EntryTable | None:
        """The entry table of the file open as `handle` (`info` its stat): the saved one when it still
        matches, else updated from the first MiB that changed (saved again); None when the file is not clean."""
        table = _EntryTable.load(self.memory_dir / ENTRIES_FILE)
        if table is not None and table.key == (info.st_mtime_ns, info.st_ino) and table.size == info.st_size:
            last = (table.size - 1) // _BLOCK if table.size else 0
            if _hash_blocks(handle, last)[0] == table.blocks[last:]:  # an edit keeping size and time
                return table
        kept, lines, records, start = 0, 1, bytearray(), 0
        if table is not None:
            for number, digest in enumerate(table.blocks):
                handle.seek(number * _BLOCK)
                chunk = handle.read(min(_BLOCK, table.size - number * _BLOCK))
                if _sha1(chunk) != digest:
                    break
                kept += len(chunk)
            # The entries starting before the first changed byte stand, but for the last one: it may go on.
            record = table.record
            count = bisect.bisect_left(range(table.count), kept, key=lambda n: record(n)[1])
            if count > 0:
                _, start, lines = table.record(count - 1)
                records = table.records[:(count - 1) * _RECORD.size]
        newlines = _scan_entries(handle, start, lines, records)
        if newlines is None:
            return None
        first = start // _BLOCK
        blocks, size = _hash_blocks(handle, first)
        table = _EntryTable(size, (info.st_mtime_ns, info.st_ino), newlines,
                            (table.blocks[:first] if table is not None else []) + blocks, records)
        self._save_entry_table(table)
        return table

    def _save_entry_table(self, table: _EntryTable) -> None:
        try:
            atomic_write(self.memory_dir / ENTRIES_FILE, table.dump(), durable=False)
        except OSError as exc:  # only a cache: the next append rebuilds it
            log.warning("could not save %s (%s); the next append reads MEMORY.md again",
                        self.memory_dir / ENTRIES_FILE, exc.strerror or exc)

    def _append_bytes(self, real: Path, info: os.stat_result, payload: bytes) -> os.stat_result:
        """Add `payload` at the end of `real` (whose stat is `info`), fsynced; the file's stat after.

        A journal beside the file names the size before and the bytes being added, fsynced before the first
        byte is written: a writer killed half-way leaves it behind, and `_repair_append` cuts the file back.
        A write that fails (a full disk) cuts the file back at once. Called with the lock held.
        """
        fd = os.open(real, os.O_WRONLY | os.O_APPEND)  # first: a file that cannot be written leaves no journal
        try:
            journal = _journal_path(real)
            atomic_write(journal, orjson.dumps({"inode": info.st_ino, "size": info.st_size,
                                                "entry": payload.decode("utf-8")}))
            try:
                view = memoryview(payload)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except BaseException:
                os.ftruncate(fd, info.st_size)  # should this fail too, the journal stays for the next writer
                os.fsync(fd)
                journal.unlink(missing_ok=True)
                raise
            journal.unlink(missing_ok=True)
            return os.fstat(fd)
        finally:
            os.close(fd)

    def _repair_append(self) -> None:
        """Undo an append that a crash cut off: the file is cut back to its size before it, so it holds the
        old entries (never half a new one). Only when the bytes after that size are the append's own (or the
        zeros a power cut can leave); a file changed otherwise since is left as it is. Lock held."""
        try:
            real = write_target(self.long_term_path)
        except OSError:
            return
        journal = _journal_path(real)
        try:
            intent = orjson.loads(journal.read_bytes())
            inode, size, entry = intent["inode"], intent["size"], intent["entry"].encode("utf-8")
        except FileNotFoundError:
            return
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, OSError):
            journal.unlink(missing_ok=True)
            return
        try:
            with open(real, "rb") as handle:
                info = os.fstat(handle.fileno())
                handle.seek(size)
                tail = handle.read(len(entry) + 1)
            if info.st_ino == inode and size <= info.st_size and tail and tail != entry \
                    and len(tail) <= len(entry) and all(a in (b, 0) for a, b in zip(tail, entry)):
                with open(real, "r+b") as handle:
                    handle.truncate(size)
                    os.fsync(handle.fileno())
                (self.memory_dir / ENTRIES_FILE).unlink(missing_ok=True)
                log.warning("%s: an append was cut off (the writer stopped half-way); its %d partial bytes were "
                            "removed, the file is as it was before it", real, len(tail))
        except FileNotFoundError:
            pass
        except OSError as exc:  # say, the file is read-only now: readers go on, the next writer tries again
            log.warning("%s: an append was cut off and could not be undone yet (%s)", real, exc.strerror or exc)
            return
        journal.unlink(missing_ok=True)

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
            write_target(self.long_term_path)  # a link to a device or a FIFO: refused before it is read
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
            write_target(self.long_term_path)
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
            raw = read_regular(self.long_term_path)
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
        `.<stamp>.<random>.tmp`); only old ones, as a young one may belong to a writer still running.
        After every backup and every append (which takes none)."""
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
            write_target(path)
            try:
                read = _decode(read_regular(path))
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
            write_target(path)
            read = _decode(read_regular(path), translate_newlines=False)
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
                read = _decode(read_regular(path))
            except FileNotFoundError:
                continue
            except NotAFileError as exc:  # a note linked to a device or a FIFO: the other notes still count
                log.warning("%s", exc)
                continue
            _warn_unreadable(path, read)
            notes.append(DailyNote(day, path, read.text))
        return notes
