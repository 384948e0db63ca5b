"""Searching a MEMORY.md larger than LARGE_FILE as a stream, never indexed whole (at 50 MB that took 24 s
and 800 MB).

A search finds the `## ` sections holding a needle of a query term (`prefilter.needle`, looked up in the raw
bytes, ASCII case folded), ranks them roughly, and tokenises and scores exactly only the best few hundred
(`LargeMemory.index`), so memory stays bounded. What BM25 needs from every block (the block count, the average
length) is estimated from a sample of every MiB, so scores differ a little from the whole index's. A non-ASCII
letter in a needle is matched in lower, upper or title case only.

While the file is unchanged (its `file_key`), KeywordSearch keeps its `LargeMemory`: the samples (one pass over
the file after each change), the sections holding each needle group an earlier query looked for (with their ends
and lines), and the last sections read and tokenised. A query then reads the file only for terms no earlier
query had (bench/retrieval.py, 4.5 MB: about 13 ms warm, against about 48 ms when every query read it all).
"""

from __future__ import annotations

import heapq
import math
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from picoclaw.disk.file_identity import FileKey
from picoclaw.memory.entry_table import whole_sections
from picoclaw.memory.prefilter import needle
from picoclaw.memory.search.blocks import Block, entry_blocks, split_blocks
from picoclaw.memory.search.bm25 import K1, NEIGHBOUR_WEIGHT, B, FileIndex
from picoclaw.memory.terms import block_terms, query_terms

# A larger MEMORY.md is searched as a stream (see the module docstring): its whole index would take some 16
# bytes of memory per byte of text, and seconds to build after every change.
LARGE_FILE = 2 << 20
# What `long_term_blocks` gives of a larger MEMORY.md: its newest blocks, far more than the largest
# memory_token_budget (32,000 tokens) can take.
LARGE_FILE_TAIL = 1 << 20
_SAMPLE = 2048  # bytes of each MiB of a large MEMORY.md whose blocks are counted and tokenised for the statistics
CANDIDATES_PER_HIT = 10  # sections of a large MEMORY.md scored exactly, per hit asked for (at least 100)
COMMON_SHARE = 0.05  # a term in more of a large MEMORY.md's sections than this does not pick sections itself
SECTIONS_KEPT = 8_192  # sections kept read, split and tokenised: the candidates of the last queries
# ... and their text up to this many bytes (some 90 MB tokenised): of long sections (a day of entries under one
# heading), fewer are kept.
SECTION_BYTES_KEPT = 4 << 20
HELD_KEPT = 200_000  # section offsets kept for the needle groups of earlier queries (some 20 MB at most)


def _byte_needles(query: str) -> dict[str, frozenset[bytes]]:
    """Each query term with what to look for in a large MEMORY.md's bytes (ASCII lower-cased) to find it."""
    found = {}
    for term in query_terms(query):
        wanted = needle(term)
        forms = {wanted} if wanted.isascii() else {wanted, wanted.upper(), wanted.capitalize(), wanted.title()}
        found[term] = frozenset(form.encode("utf-8").lower() for form in forms)
    return found


# Sections of a large MEMORY.md are found by their "## " headings only: a bare "##" line still starts a block
# (split_blocks), it just does not end the section read around a match.
_HEADING = b"\n## "


def _heading_before(data: bytes, at: int) -> int:
    """Where the `## ` heading line of the section holding data[at] starts; -1 when none does (the title)."""
    start = data.rfind(_HEADING, 0, at)
    if start >= 0:
        return start + 1
    return 0 if data.startswith(_HEADING[1:]) else -1


def _next_heading(data: bytes, at: int) -> int:
    """Where the next `## ` heading line after data[at] starts; the end of `data` when none does."""
    start = data.find(_HEADING, at)
    return start + 1 if start >= 0 else len(data)


@dataclass
class LargeMemory:
    """What searching a large MEMORY.md keeps while the file is unchanged (`file_key`): a sample of each MiB (for
    the statistics), per needle group the sections holding it (by the byte offset of their heading), where each
    of those sections ends and its first line, and the last sections read and tokenised. A query reads the file
    only for terms no earlier query had.

    The sections of the groups are kept up to HELD_KEPT offsets in all, the least recently used group dropped
    first; the ends and lines of sections, up to HELD_KEPT sections, then all are dropped at once.
    """

    path: Path  # what blocks are labelled with
    file: Path  # what is read
    key: FileKey
    sampled_bytes: int = 0
    sampled_blocks: int = 0
    sampled_terms: int = 0
    sampled_sections: int = 0
    samples: list[bytes] = field(default_factory=list)  # each MiB's sample, ASCII lower-cased
    holders: OrderedDict[frozenset[bytes], frozenset[int]] = field(default_factory=OrderedDict)
    where: dict[int, tuple[int, int]] = field(default_factory=dict)  # a section's heading offset: (end, line)
    held_kept: int = HELD_KEPT
    sections_kept: int = SECTIONS_KEPT
    section_bytes_kept: int = SECTION_BYTES_KEPT
    _held: int = 0
    _section_bytes: int = 0
    # A section's heading offset: its blocks, their terms and its length in bytes.
    _sections: OrderedDict[int, tuple[list[Block], list[list[str]], int]] = field(default_factory=OrderedDict)

    @classmethod
    def scan(cls, path: Path, file: Path | None = None) -> LargeMemory | None:
        """One pass over the file for its samples; None when the file is gone."""
        try:
            handle = open(file or path, "rb")
        except FileNotFoundError:
            return None
        with handle:
            return cls._scan(path, file or path, handle)

    @classmethod
    def _scan(cls, path: Path, file: Path, handle: BinaryIO) -> LargeMemory:
        st = os.fstat(handle.fileno())
        kept = cls(path, file, (st.st_mtime_ns, st.st_size, st.st_ino))
        for _, data in whole_sections(handle, 0):
            kept._sample(data)
        return kept

    def _sample(self, data: bytes) -> None:
        sample = data[:_next_heading(data, min(_SAMPLE, len(data)))]
        for block in entry_blocks(sample.decode("utf-8", errors="replace"), self.path):
            self.sampled_blocks += 1
            self.sampled_terms += len(block_terms(block.text, block.heading, self.path))
        self.sampled_bytes += len(sample)
        self.sampled_sections += sample.count(_HEADING) + sample.startswith(_HEADING[1:])
        self.samples.append(sample.lower())

    def share(self, group: frozenset[bytes]) -> float:
        """How many needles of `group` the samples hold, per sampled section."""
        found = sum(sample.count(form) for sample in self.samples for form in group)
        return found / max(self.sampled_sections, 1)

    def held(self, groups: set[frozenset[bytes]], handle: BinaryIO) -> dict[frozenset[bytes], frozenset[int]]:
        """The sections holding a needle of each of `groups`: those kept, the others found in one pass."""
        missing = [group for group in groups if group not in self.holders]
        if missing and len(self.where) > self.held_kept:
            self.where.clear()
            self.holders.clear()
            self._held = 0
            missing = list(groups)
        # The groups of this query, kept ones first made the most recent: keeping the new ones drops others.
        result = {group: self.holders[group] for group in groups if group in self.holders}
        for group in result:
            self.holders.move_to_end(group)
        if missing:
            found: dict[frozenset[bytes], set[int]] = {group: set() for group in missing}
            line = 1
            for offset, data in whole_sections(handle, 0):
                self._find(offset, line, data, found)
                line += data.count(b"\n")
            for group, starts in found.items():
                result[group] = frozenset(starts)
                self._keep(group, result[group])
        return result

    def _find(self, offset: int, line: int, data: bytes, found: dict[frozenset[bytes], set[int]]) -> None:
        """Into `found`, the sections of the piece `data` (at `offset`, its first line `line`) holding a needle
        of each group; into `where`, their ends and lines."""
        low = data.lower()
        ends: dict[int, int] = {}
        for group, into in found.items():
            for form in group:
                at = low.find(form)
                while at >= 0:
                    start, end = _heading_before(data, at), _next_heading(data, at)
                    if start >= 0:  # else the title, before the first heading: in no section
                        into.add(offset + start)
                        ends[start] = end
                    at = low.find(form, end)
        counted, lines_before = 0, line - 1
        for start in sorted(ends):
            lines_before += data.count(b"\n", counted, start)
            counted = start
            self.where.setdefault(offset + start, (offset + ends[start], lines_before + 1))

    def _keep(self, group: frozenset[bytes], starts: frozenset[int]) -> None:
        self.holders[group] = starts
        self._held += len(starts)
        while self._held > self.held_kept and len(self.holders) > 1:
            _, dropped = self.holders.popitem(last=False)
            self._held -= len(dropped)

    def _read_section(self, start: int, handle: BinaryIO) -> tuple[list[Block], list[list[str]]]:
        """The blocks of the section at `start` and their terms: kept for the last sections read, up to
        SECTIONS_KEPT of them and SECTION_BYTES_KEPT of their text."""
        kept = self._sections.get(start)
        if kept is None:
            end, line = self.where[start]
            handle.seek(start)
            blocks = split_blocks(handle.read(end - start).decode("utf-8", errors="replace"), self.path, line)
            kept = (blocks, [block_terms(block.text, block.heading, block.path) for block in blocks], end - start)
            self._sections[start] = kept
            self._section_bytes += end - start
            while len(self._sections) > 1 and (len(self._sections) > self.sections_kept
                                               or self._section_bytes > self.section_bytes_kept):
                self._section_bytes -= self._sections.popitem(last=False)[1][2]
        else:
            self._sections.move_to_end(start)
        return kept[0], kept[1]

    def index(self, query: str, limit: int, *, neighbours: float = NEIGHBOUR_WEIGHT) -> FileIndex | None:
        """The index of the blocks most likely to be the best `limit` for `query` (see `large_index`)."""
        try:
            handle = open(self.file, "rb")
        except FileNotFoundError:
            return None
        with handle:
            st = os.fstat(handle.fileno())
            if (st.st_mtime_ns, st.st_size, st.st_ino) != self.key:  # changed since it was kept
                return LargeMemory._scan(self.path, self.file, handle).index_from(handle, query, limit, neighbours)
            return self.index_from(handle, query, limit, neighbours)

    def index_from(self, handle: BinaryIO, query: str, limit: int, neighbours: float) -> FileIndex:
        terms = _byte_needles(query)
        groups = set(terms.values())
        singles = {next(iter(group)) for group in groups if len(group) == 1}
        derived = {group for group in groups if len(group) == 1
                   and any(part != form and part in form for form in group for part in singles)}
        mapped = groups - derived
        shares = {group: self.share(group) for group in groups}
        rarest = min((shares[group] for group in mapped), default=0.0)
        common = {group for group in mapped if shares[group] > max(COMMON_SHARE, rarest)}
        need = max(CANDIDATES_PER_HIT * limit, 100)
        held = self.held(groups, handle)
        picked: set[int] = set().union(*(held[group] for group in mapped - common))
        if common and len(picked) < need:
            picked.update(*(held[group] for group in common))
        blocks_in_file = max(round(self.sampled_blocks * self.key[1] / max(self.sampled_bytes, 1)), 1)
        frequency = {group: len(starts) for group, starts in held.items()}
        rough = dict.fromkeys(picked, 0.0)
        for group, starts in held.items():
            weight = math.log(1 + (blocks_in_file - frequency[group] + 0.5) / (frequency[group] + 0.5))
            for start in starts & picked if len(starts) > len(picked) else starts:
                if start in rough:
                    rough[start] += weight
        average = self.sampled_bytes / max(self.sampled_blocks, 1)
        ends = {start: self.where[start][0] for start in rough}
        for start, end in ends.items():
            rough[start] *= (K1 + 1) / (1 + K1 * (1 - B + B * (end - start) / average))
        before = {end: start for start, end in ends.items()}.get

        def around(start: int) -> list[int]:  # the adjacent sections that hold a query word too
            return [near for near in (before(start, -1), ends[start]) if near in rough]

        # -1: no section ends there. A neighbour not scored adds 0: the same sum, term by term, as over those that are.
        score_of = rough.get
        in_context = [(score + neighbours * (score_of(before(start, -1), 0) + score_of(ends[start], 0)), start)
                      for start, score in rough.items()]
        best = [start for _, start in heapq.nlargest(need, in_context)]
        blocks: list[Block] = []
        own: list[list[str]] = []
        breaks: set[int] = set()
        previous_end = -1
        for start in sorted({*best, *(near for start in best for near in around(start))}):
            if start != previous_end:
                breaks.add(len(blocks))
            read, read_terms = self._read_section(start, handle)
            blocks += read
            own += read_terms
            previous_end = ends[start]
        index = FileIndex.build(blocks, own=own, only=terms)  # the query's terms: no other is ever looked up
        index.total_blocks = max(blocks_in_file, len(blocks))
        index.total_length = round(index.total_blocks * self.sampled_terms / max(self.sampled_blocks, 1))
        index.breaks = frozenset(breaks)
        index.doc_freqs = {term: frequency[group] for term, group in terms.items()}
        return index


def large_index(path: Path, query: str, limit: int, file: Path | None = None, *,
                neighbours: float = NEIGHBOUR_WEIGHT) -> FileIndex | None:
    """The index of the blocks of a large MEMORY.md most likely to be the best `limit` for `query`, with
    statistics for the whole file (see the module docstring); None when the file is gone. Blocks are labelled
    `path`, read from `file` (default: `path`), as everywhere here. KeywordSearch keeps the `LargeMemory` of a
    file between searches; this makes a new one.

    The sections holding a needle of a query term are scored by the terms they hold (BM25 as if each were there
    once, its bytes standing for its length, plus `neighbours` × its neighbours'); only the best
    CANDIDATES_PER_HIT × `limit` of them and their neighbours are read again, split and tokenised for the exact
    scores of their blocks. A term in many sections (COMMON_SHARE of the samples) weighs little: it only scores
    the sections the other terms find, unless they find too few. A CJK pair only scores the sections of its
    characters.
    """
    table = LargeMemory.scan(path, file)
    return None if table is None else table.index(query, limit, neighbours=neighbours)


def large_tail(path: Path, file: Path | None = None) -> list[Block]:
    """The blocks of the last LARGE_FILE_TAIL bytes of a large MEMORY.md (from a section start), in file order."""
    try:
        handle = open(file or path, "rb")
    except FileNotFoundError:
        return []
    with handle:
        skipped = max(os.fstat(handle.fileno()).st_size - LARGE_FILE_TAIL, 0)
        handle.seek(skipped)
        data = handle.read()
        start = _next_heading(data, 0) if skipped else 0
        handle.seek(0)
        left, lines = skipped + start, 0
        while left > 0 and (chunk := handle.read(min(left, 1 << 20))):
            lines, left = lines + chunk.count(b"\n"), left - len(chunk)
    return [block for block in split_blocks(data[start:].decode("utf-8", errors="replace"), path, lines + 1)
            if block.heading]


def large_neighbours(path: Path, block: Block, before: int, after: int, file: Path | None = None) -> list[Block]:
    """`KeywordSearch.neighbours` in a large MEMORY.md: read up to the block's section, not indexed whole."""

    def blocks(data: bytes, line: int) -> list[Block]:
        return [b for b in split_blocks(data.decode("utf-8", errors="replace"), path, line) if b.heading]

    try:
        handle = open(file or path, "rb")
    except FileNotFoundError:
        return []
    with handle:
        line, previous = 1, (1, b"")
        pieces = whole_sections(handle, 0)
        for _, data in pieces:
            lines = data.count(b"\n")
            if line + lines > block.start_line:
                found = blocks(data, line)
                at = next((n for n, b in enumerate(found) if b == block), None)
                if at is None:
                    return []
                if at < before:  # the blocks above it may end the piece before
                    earlier = blocks(previous[1], previous[0])
                    found, at = earlier + found, at + len(earlier)
                if at + after >= len(found) and (following := next(pieces, None)) is not None:
                    found += blocks(following[1], line + lines)
                return found[max(at - before, 0):at + after + 1]
            previous, line = (line, data), line + lines
    return []
