"""Searching a MEMORY.md larger than LARGE_FILE as a stream, never indexed whole (at 50 MB that took 24 s
and 800 MB).

Each search reads the file a MiB at a time, finds the `## ` sections holding a needle of a query term
(`prefilter.needle`, looked up in the raw bytes, ASCII case folded), ranks them roughly, and tokenises and
scores exactly only the best few hundred (`large_index`), so memory stays bounded. What BM25 needs from
every block (the block count, the average length, a common term's frequency) is estimated from a sample of
every MiB, so scores differ a little from the whole index's: on the 20 queries of bench/retrieval.py at
50 MB, the exact scores of the hits are 99.4% of those of the whole index's hits. A non-ASCII letter in a
needle is matched in lower, upper or title case only.
"""

from __future__ import annotations

import heapq
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

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
class _Scan:
    """What one search learns of a large MEMORY.md: the sections holding each term's needles (by the byte
    offset of their heading, with their end and the heading's line), and a sample of each MiB (its bytes,
    blocks, terms, sections, and how often each term's needles occur in it) for the statistics."""

    holders: dict[frozenset[bytes], set[int]]
    where: dict[int, tuple[int, int]] = field(default_factory=dict)
    skipped: set[frozenset[bytes]] = field(default_factory=set)  # terms too common to pick sections themselves
    sampled_bytes: int = 0
    sampled_blocks: int = 0
    sampled_terms: int = 0
    sampled_sections: int = 0
    in_sample: Counter[frozenset[bytes]] = field(default_factory=Counter)

    def share(self, group: frozenset[bytes]) -> float:
        return self.in_sample[group] / max(self.sampled_sections, 1)

    def sample(self, path: Path, data: bytes) -> None:
        sample = data[:_next_heading(data, min(_SAMPLE, len(data)))]
        for block in entry_blocks(sample.decode("utf-8", errors="replace"), path):
            self.sampled_blocks += 1
            self.sampled_terms += len(block_terms(block.text, block.heading, path))
        self.sampled_bytes += len(sample)
        self.sampled_sections += sample.count(_HEADING) + sample.startswith(_HEADING[1:])
        low = sample.lower()
        for group in self.holders:
            self.in_sample[group] += sum(low.count(form) for form in group)

    def find(self, handle: BinaryIO, path: Path, mapped: set[frozenset[bytes]], checked: set[frozenset[bytes]],
             sampling: bool) -> None:
        """One pass over the file: the sections holding a needle of a `mapped` term, and which of the `checked`
        terms (whose sections are among them, or which only score them) they hold. `sampling`: the first pass,
        which samples every MiB and leaves a term that the samples so far show in many sections to be checked
        only (all but the rarest term: some term always picks sections)."""
        line = 1
        for offset, data in whole_sections(handle, 0):
            picking, looking = mapped, checked
            if sampling:
                self.sample(path, data)
                rarest = min((self.share(group) for group in mapped), default=0.0)
                common = {group for group in mapped if self.share(group) > max(COMMON_SHARE, rarest)}
                self.skipped |= common
                picking, looking = mapped - common, checked | common
            low = data.lower()
            found: dict[int, int] = {}
            for group in picking:
                for form in group:
                    at = low.find(form)
                    while at >= 0:
                        start, end = _heading_before(data, at), _next_heading(data, at)
                        if start >= 0:
                            self.holders[group].add(offset + start)
                            found[start] = end
                        at = low.find(form, end)
            for group in looking:
                for form in group:
                    self.holders[group].update(offset + start for start, end in found.items()
                                               if low.find(form, start, end) >= 0)
            counted, lines_before = 0, line - 1
            for start in sorted(found):
                lines_before += data.count(b"\n", counted, start)
                counted = start
                self.where.setdefault(offset + start, (offset + found[start], lines_before + 1))
            line += data.count(b"\n")


def large_index(path: Path, query: str, limit: int, file: Path | None = None, *,
                neighbours: float = NEIGHBOUR_WEIGHT) -> FileIndex | None:
    """The index of the blocks of a large MEMORY.md most likely to be the best `limit` for `query`, with
    estimated statistics for the whole file (see the module docstring); None when the file is gone. Blocks are
    labelled `path`, read from `file` (default: `path`), as everywhere here.

    A first pass finds the `## ` sections holding a needle of a query term and scores each by the terms it
    holds (BM25 as if each were there once, its bytes standing for its length, plus `neighbours` × its
    neighbours'); only the best CANDIDATES_PER_HIT × `limit` of them and their neighbours are then read again,
    split and tokenised for the exact scores of their blocks. A term in many sections (COMMON_SHARE) weighs
    little and would cost a look-up per section: it only scores the sections the other terms find, unless they
    find too few, when a second pass looks for it too. A CJK pair is looked for in the sections of its characters.
    """
    terms = _byte_needles(query)
    groups = set(terms.values())
    singles = {next(iter(group)) for group in groups if len(group) == 1}
    derived = {group for group in groups if len(group) == 1
               and any(part != form and part in form for form in group for part in singles)}
    scan = _Scan({group: set() for group in groups})
    need = max(CANDIDATES_PER_HIT * limit, 100)
    try:
        handle = open(file or path, "rb")
    except FileNotFoundError:
        return None
    with handle:
        total = os.fstat(handle.fileno()).st_size
        scan.find(handle, path, groups - derived, derived, sampling=True)
        if scan.skipped and len(scan.where) < need:
            scan.find(handle, path, set(scan.skipped), derived, sampling=False)
            scan.skipped.clear()
        blocks_in_file = max(round(scan.sampled_blocks * total / max(scan.sampled_bytes, 1)), 1)
        sections_in_file = scan.sampled_sections * total / max(scan.sampled_bytes, 1)
        frequency = {group: max(len(held), round(scan.share(group) * sections_in_file)) if group in scan.skipped
                     else len(held) for group, held in scan.holders.items()}
        weight = {group: math.log(1 + (blocks_in_file - frequency[group] + 0.5) / (frequency[group] + 0.5))
                  for group in groups}
        rough = dict.fromkeys(scan.where, 0.0)
        for group, held in scan.holders.items():
            for start in held:
                rough[start] += weight[group]
        average = scan.sampled_bytes / max(scan.sampled_blocks, 1)
        for start, (end, _) in scan.where.items():
            rough[start] *= (K1 + 1) / (1 + K1 * (1 - B + B * (end - start) / average))
        before = {end: start for start, (end, _) in scan.where.items()}
        around = {start: [near for near in (before.get(start), scan.where[start][0]) if near in rough]
                  for start in rough}
        best = heapq.nlargest(need, rough, key=lambda start: (
            rough[start] + neighbours * sum(rough[near] for near in around[start]), start))
        blocks: list[Block] = []
        breaks: set[int] = set()
        previous_end = -1
        for start in sorted({*best, *(near for start in best for near in around[start])}):
            end, first_line = scan.where[start]
            handle.seek(start)
            if start != previous_end:
                breaks.add(len(blocks))
            blocks.extend(split_blocks(handle.read(end - start).decode("utf-8", errors="replace"), path, first_line))
            previous_end = end
    index = FileIndex.build(blocks)
    index.total_blocks = max(blocks_in_file, len(blocks))
    index.total_length = round(index.total_blocks * scan.sampled_terms / max(scan.sampled_blocks, 1))
    index.breaks = frozenset(breaks)
    index.doc_freqs = {term: frequency[group] for term, group in terms.items()}
    return index


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
