"""MEMORY.md read as bytes: pieces of whole `## ` sections, and the derived table of its entries.

The table (`.MEMORY.md.entries`) keeps, for each entry, where its heading line starts and a hash of its
fingerprint, so that an append finds an entry already stored without reading the file as text: it costs
the same at 50 MB as at 1 MB. It is derived data, checked against the file before use and rescanned from
the first MiB that changed.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from picoclaw.disk.atomic import atomic_write
from picoclaw.memory.entries import SECTION_HEADING, entry_fingerprint

log = logging.getLogger(__name__)

ENTRIES_FILE = ".MEMORY.md.entries"  # derived: see EntryTable
BLOCK = 1 << 20  # read a MiB at a time; the entry table keeps a hash of every MiB of the file
_LINE_HASHES = re.compile(rb"(?m)^##")


def is_section_line(data: bytes, start: int, *, ends_file: bool = False) -> bool:
    """Whether the line starting at data[start] is a `## ` heading. A line running to the end of `data` is
    whole only when `data` ends the file (else it is False: the rest of the line is still to be read)."""
    end = data.find(b"\n", start)
    if end < 0 and not ends_file:
        return False
    return SECTION_HEADING.match(data[start:end if end >= 0 else len(data)].decode("utf-8", "replace")) is not None


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
        more = handle.read(BLOCK)
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


_TABLE_MAGIC = b"PCLWENT2"  # 2: fingerprints leave `Source:` lines out (entries.entry_fingerprint)
_TABLE_HEADER = struct.Struct("<8sQQQQQQ20s")  # magic, size, mtime_ns, inode, lines, blocks, records, digest
_RECORD = struct.Struct("<8sQQ")  # fingerprint hash, byte offset of the heading line, its line number
_DIGEST = 20  # sha1, of each MiB of the file


def fingerprint_hash(wanted: str) -> bytes:
    """What the table keeps of an entry's `fingerprint`."""
    return hashlib.blake2b(wanted.encode("utf-8"), digest_size=8).digest()


def _sha1(data: bytes | memoryview) -> bytes:
    return hashlib.sha1(data, usedforsecurity=False).digest()


@dataclass
class EntryTable:
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

    def appended(self, handle: BinaryIO, old_size: int, wanted: str, start: int, line: int, payload: bytes,
                 after: os.stat_result) -> None:
        """Take in an entry appended at byte `start` (line `line`) of a file `old_size` bytes long, as `payload`
        (its fingerprint `wanted`); `after` is the file's stat since, `handle` the file open for reading."""
        self.records += _RECORD.pack(fingerprint_hash(wanted), start, line)
        self.lines += payload.count(b"\n")
        first = old_size // BLOCK
        self.blocks[first:], self.size = _hash_blocks(handle, first)
        self.key = (after.st_mtime_ns, after.st_ino)

    def dump(self) -> list[bytes | bytearray]:
        """The table file's bytes, in pieces (the records are not copied: there may be millions)."""
        blocks = b"".join(self.blocks)
        digest = hashlib.sha1(blocks, usedforsecurity=False)
        digest.update(self.records)
        header = _TABLE_HEADER.pack(_TABLE_MAGIC, self.size, *self.key, self.lines, len(self.blocks), self.count,
                                    digest.digest())
        return [header, blocks, self.records]

    @classmethod
    def load(cls, path: Path) -> EntryTable | None:
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
    handle.seek(first * BLOCK)
    found, size = [], first * BLOCK
    while chunk := handle.read(BLOCK):
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
            wanted = entry_fingerprint(body.decode("utf-8"))
            records += _RECORD.pack(fingerprint_hash(wanted), offset + at, newlines + 1)
        newlines += data.count(b"\n", counted)
    return newlines


def current_entry_table(memory_dir: Path, handle: BinaryIO, info: os.stat_result) -> EntryTable | None:
    """The entry table of the MEMORY.md of `memory_dir`, open as `handle` (`info` its stat): the saved one when
    it still matches, else updated from the first MiB that changed (saved again); None when the file is not
    clean."""
    table = EntryTable.load(memory_dir / ENTRIES_FILE)
    if table is not None and table.key == (info.st_mtime_ns, info.st_ino) and table.size == info.st_size:
        last = (table.size - 1) // BLOCK if table.size else 0
        if _hash_blocks(handle, last)[0] == table.blocks[last:]:  # an edit keeping size and time
            return table
    kept, lines, records, start = 0, 1, bytearray(), 0
    if table is not None:
        for number, digest in enumerate(table.blocks):
            handle.seek(number * BLOCK)
            chunk = handle.read(min(BLOCK, table.size - number * BLOCK))
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
    first = start // BLOCK
    blocks, size = _hash_blocks(handle, first)
    table = EntryTable(size, (info.st_mtime_ns, info.st_ino), newlines,
                       (table.blocks[:first] if table is not None else []) + blocks, records)
    save_entry_table(memory_dir, table)
    return table


def save_entry_table(memory_dir: Path, table: EntryTable) -> None:
    """Keep `table` in `memory_dir`; a failure is only logged (it is a cache: the next append rebuilds it)."""
    try:
        atomic_write(memory_dir / ENTRIES_FILE, table.dump(), durable=False)
    except OSError as exc:
        log.warning("could not save %s (%s); the next append reads MEMORY.md again",
                    memory_dir / ENTRIES_FILE, exc.strerror or exc)
