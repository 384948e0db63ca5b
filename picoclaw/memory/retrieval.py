"""Retrieval over MEMORY.md and daily notes: split into blocks, score with BM25, return the best.

A block is a `## ` section, split further at blank lines with every part keeping its heading (a date
heading stays with its entry). Each file is parsed and indexed once and reused until its size, mtime or
inode changes, so a query on an unchanged MEMORY.md costs one stat per file plus the scoring.

A matching block's score also takes in a share of its adjacent blocks' scores in the same file
(NEIGHBOUR_WEIGHT): what is said next to a match is often what the match is about ("Where did you go?" /
"Paris, in May"). A daily-note entry is moreover indexed together with the entry before it, since an entry
so often answers what came just before it.

A MEMORY.md larger than LARGE_FILE is not indexed whole (at 50 MB that took 24 s and 800 MB): each search
reads it a MiB at a time, finds the `## ` sections holding a needle of a query term (`prefilter.needle`,
looked up in the raw bytes, ASCII case folded), ranks them roughly, and tokenises and scores exactly only
the best few hundred (`_large_index`), so memory stays bounded. What BM25 needs from every block (the
block count, the average length, a common term's frequency) is estimated from a sample of every MiB, so
scores differ a little from the whole index's: on the 20 queries of bench/retrieval.py at 50 MB, the
exact scores of the hits are 99.4% of those of the whole index's hits. A non-ASCII letter in a needle is
matched in lower, upper or title case only.
"""

from __future__ import annotations

import heapq
import logging
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from picoclaw.fsutil import FileCache, NotAFileError, read_regular
from picoclaw.memory.prefilter import needle
from picoclaw.memory.store import MemoryStore, is_fence, whole_sections
from picoclaw.memory.terms import block_terms, normalize, phrases, query_terms

log = logging.getLogger(__name__)

K1 = 1.2
B = 0.75
PHRASE_BONUS = 0.5  # relative boost for a block containing the query (or a quoted part) verbatim
# Share of each adjacent block's score a block gets (MemoryRetriever.search). On LoCoMo's dev split 0.2–0.3
# are best for both layouts (bench/retrieval_quality.py); from 0.4 up neighbours start to outrank the match.
NEIGHBOUR_WEIGHT = 0.25
# A larger MEMORY.md is searched as a stream (see the module docstring): its whole index would take some 16
# bytes of memory per byte of text, and seconds to build after every change.
LARGE_FILE = 2 << 20
# What `long_term_blocks` gives of a larger MEMORY.md: its newest blocks, far more than the largest
# memory_token_budget (32,000 tokens) can take.
LARGE_FILE_TAIL = 1 << 20
_SAMPLE = 2048  # bytes of each MiB of a large MEMORY.md whose blocks are counted and tokenised for the statistics
CANDIDATES_PER_HIT = 10  # sections of a large MEMORY.md scored exactly, per hit asked for (at least 100)
COMMON_SHARE = 0.05  # a term in more of a large MEMORY.md's sections than this does not pick sections itself


@dataclass(frozen=True)
class Block:
    """One retrieval unit: its text (heading included) and where it sits in its file (1-based lines)."""

    path: Path
    heading: str
    text: str
    start_line: int
    end_line: int


@dataclass(frozen=True)
class Hit:
    """A block that matched a query, with its score (higher is better)."""

    block: Block
    score: float


def _is_section_heading(line: str) -> bool:
    return line.startswith("## ") or line.rstrip() == "##"


_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def _lines(text: str) -> list[str]:
    # Lines as editors and `sed -n N,Mp` count them. str.splitlines also breaks at \u2028, \x0c, \x85 …,
    # which would shift the line numbers of every later block and rewrite the block's text.
    lines = _LINE_BREAK.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def split_blocks(text: str, path: Path, first_line: int = 1) -> list[Block]:
    """Split Markdown into blocks; blank lines inside fenced code do not split. `text` starts on line
    `first_line` of its file (a part of a large MEMORY.md).

    A `## ` line at the start of a line is a section heading wherever it is, and closes a fence left
    open before it: one entry's unclosed ``` must not swallow every later entry. (The store demotes
    `## ` lines inside the entries it writes, so only a hand edit puts one inside a fence.)
    """
    blocks: list[Block] = []
    heading = ""
    heading_line = 0
    paragraph: list[str] = []
    para_start = 0
    heading_used = True
    in_fence = False

    def flush() -> None:
        nonlocal paragraph, heading_used
        while paragraph and not paragraph[-1].strip():  # blank lines of a fence a heading closed
            paragraph.pop()
        if paragraph:
            start = heading_line if (heading and not heading_used) else para_start
            body = "\n".join(paragraph)
            blocks.append(Block(path, heading, f"{heading}\n{body}" if heading else body, start,
                                para_start + len(paragraph) - 1))
            heading_used = True
            paragraph = []

    def close_section() -> None:
        flush()
        if heading and not heading_used:  # a heading with nothing under it is still a block
            blocks.append(Block(path, heading, heading, heading_line, heading_line))

    for number, line in enumerate(_lines(text), start=first_line):
        if _is_section_heading(line):
            close_section()
            heading, heading_line, heading_used, in_fence = line.rstrip(), number, False, False
            continue
        if is_fence(line):
            in_fence = not in_fence
        if not in_fence and not line.strip():
            flush()
            continue
        if not paragraph:
            para_start = number
        paragraph.append(line)
    close_section()
    return blocks


@dataclass
class FileIndex:
    """BM25 statistics of one file's blocks, in file order."""

    blocks: list[Block]
    lengths: list[int]
    postings: dict[str, list[tuple[int, int]]]
    normalized: list[str]
    total_length: int = 0
    # A large MEMORY.md's index holds only the blocks that may match one query: these stand for the whole
    # file's block count (0: `blocks` is all of it) and, in `breaks`, mark the blocks that do not come right
    # after the one before them in the file (`total_length` is then an estimate for the whole file too).
    total_blocks: int = 0
    breaks: frozenset[int] = frozenset()
    doc_freqs: dict[str, int] | None = None  # for such a part: how many blocks of the whole file hold a term
    # Per term, each posting's length-normalised tf part of BM25, for the corpus average length it was
    # made with: a warm query then does one multiply-add per posting instead of the whole formula.
    _parts: dict[str, list[tuple[int, float]]] = field(default_factory=dict, repr=False)
    _parts_average: float = 0.0
    _positions: dict[tuple[int, int], int] | None = field(default=None, repr=False)

    def tf_parts(self, term: str, average: float) -> list[tuple[int, float]]:
        """(block, tf·(K1+1) / (tf + K1·(1 − B + B·length/average))) for every block holding `term`."""
        if average != self._parts_average:
            self._parts.clear()
            self._parts_average = average
        parts = self._parts.get(term)
        if parts is None:
            base, per_length, lengths = K1 * (1 - B), K1 * B / average, self.lengths
            parts = [(block, tf * (K1 + 1) / (tf + base + per_length * lengths[block]))
                     for block, tf in self.postings.get(term, ())]
            self._parts[term] = parts
        return parts

    def position(self, block: Block) -> int | None:
        """Where `block` is in this file's blocks, or None when it is not one of them."""
        if self._positions is None:
            self._positions = {(b.start_line, b.end_line): n for n, b in enumerate(self.blocks)}
        found = self._positions.get((block.start_line, block.end_line))
        return found if found is not None and self.blocks[found] == block else None

    @classmethod
    def build(cls, blocks: list[Block], *, with_previous: bool = False) -> FileIndex:
        """Index `blocks`; `with_previous`: each block is indexed under its own and the previous block's terms."""
        postings: dict[str, list[tuple[int, int]]] = {}
        lengths = []
        own = [block_terms(block.text, block.heading, block.path) for block in blocks]
        for number, found in enumerate(own):
            counts = Counter(found)
            if with_previous and number:
                counts.update(own[number - 1])
            lengths.append(sum(counts.values()))
            for term, tf in counts.items():
                postings.setdefault(term, []).append((number, tf))
        return cls(blocks, lengths, postings, [normalize(b.text) for b in blocks], sum(lengths))


def entry_blocks(text: str, path: Path) -> list[Block]:
    """MEMORY.md's blocks without its title and intro (everything above the first `## `): they describe
    the file, they are not memories, and must never be injected or found."""
    return [block for block in split_blocks(text, path) if block.heading]


def is_title(block: Block) -> bool:
    """A lone `# Title` line (a daily note's `# YYYY-MM-DD`): it carries nothing to find."""
    return not block.heading and "\n" not in block.text and block.text.startswith("# ")


def _read_text(path: Path) -> str:
    # As open() in text mode reads it: bad bytes as U+FFFD, every line break as "\n".
    text = read_regular(path).decode("utf-8", errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _index_note(path: Path) -> FileIndex:
    blocks = split_blocks(_read_text(path), path)
    # The title is left out: with the note's date in words it would match every question about that day.
    # An entry is indexed with the one before it: on LoCoMo's dev notes turn recall@10 +0.035 EN, +0.014 ZH.
    return FileIndex.build([block for block in blocks if not is_title(block)], with_previous=True)


def _index_long_term(path: Path) -> FileIndex:
    return FileIndex.build(entry_blocks(_read_text(path), path))


# -- a large MEMORY.md, a MiB at a time ----------------------------------------------------------------


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


def _large_index(path: Path, query: str, limit: int) -> FileIndex | None:
    """The index of the blocks of a large MEMORY.md most likely to be the best `limit` for `query`, with
    estimated statistics for the whole file (see the module docstring); None when the file is gone.

    A first pass finds the `## ` sections holding a needle of a query term and scores each by the terms it
    holds (BM25 as if each were there once, its bytes standing for its length, plus its neighbours' share);
    only the best CANDIDATES_PER_HIT × `limit` of them and their neighbours are then read again, split and
    tokenised for the exact scores of their blocks. A term in many sections (COMMON_SHARE) weighs little and
    would cost a look-up per section: it only scores the sections the other terms find, unless they find too
    few, when a second pass looks for it too. A CJK pair is looked for in the sections of its characters.
    """
    terms = _byte_needles(query)
    groups = set(terms.values())
    singles = {next(iter(group)) for group in groups if len(group) == 1}
    derived = {group for group in groups if len(group) == 1
               and any(part != form and part in form for form in group for part in singles)}
    scan = _Scan({group: set() for group in groups})
    need = max(CANDIDATES_PER_HIT * limit, 100)
    try:
        handle = open(path, "rb")
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
            rough[start] + NEIGHBOUR_WEIGHT * sum(rough[near] for near in around[start]), start))
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


def _large_tail(path: Path) -> list[Block]:
    """The blocks of the last LARGE_FILE_TAIL bytes of a large MEMORY.md (from a section start), in file order."""
    try:
        handle = open(path, "rb")
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


def _large_neighbours(path: Path, block: Block, before: int, after: int) -> list[Block]:
    """`MemoryRetriever.neighbours` in a large MEMORY.md: read up to the block's section, not indexed whole."""

    def blocks(data: bytes, line: int) -> list[Block]:
        return [b for b in split_blocks(data.decode("utf-8", errors="replace"), path, line) if b.heading]

    try:
        handle = open(path, "rb")
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


def rank(indexes: list[FileIndex], query: str, limit: int, *, neighbours: float = 0.0) -> list[Hit]:
    """BM25 over all blocks of `indexes` as one corpus, plus a bonus for an exact phrase hit; with
    `neighbours`, each matching block also gets that share of its adjacent blocks' scores (a block that
    matches nothing itself is never returned: in MEMORY.md the entry next to a match is often unrelated)."""
    wanted_terms = query_terms(query)
    total_blocks = sum(ix.total_blocks or len(ix.blocks) for ix in indexes)
    if not wanted_terms or total_blocks == 0 or limit <= 0:
        return []
    avg_length = (sum(ix.total_length for ix in indexes) / total_blocks) or 1.0
    idf = {}
    for term in wanted_terms:
        df = sum(len(ix.postings.get(term, ())) if ix.doc_freqs is None else ix.doc_freqs.get(term, 0)
                 for ix in indexes)
        if df:
            idf[term] = math.log(1 + (total_blocks - df + 0.5) / (df + 0.5))
    raw: list[tuple[float, int, int]] = []
    for file_number, ix in enumerate(indexes):
        scores: dict[int, float] = {}
        get = scores.get
        for term, weight in idf.items():
            for block_number, part in ix.tf_parts(term, avg_length):
                scores[block_number] = get(block_number, 0.0) + weight * part
        if neighbours:
            breaks = ix.breaks
            raw.extend((score + neighbours * ((0.0 if block in breaks else get(block - 1, 0.0))
                                              + (0.0 if block + 1 in breaks else get(block + 1, 0.0))),
                        file_number, block)
                       for block, score in scores.items())
        else:
            raw.extend((score, file_number, block) for block, score in scores.items())
    # No block below the limit-th score can reach the top `limit` but by the bonus, so only blocks that
    # could are looked at again (the phrase check scans the block's text).
    floor = heapq.nlargest(limit, raw)[-1][0] if len(raw) >= limit else 0.0
    wanted = phrases(query)
    bonus = 1 + PHRASE_BONUS
    scored: list[tuple[float, int, int]] = []
    for score, file_number, block_number in raw:
        if score * bonus >= floor:
            text = indexes[file_number].normalized[block_number]
            if any(phrase in text for phrase in wanted):
                score *= bonus
            # On equal scores the later block wins: newer memories are likelier to be current.
            scored.append((score, file_number, block_number))
    best = heapq.nlargest(limit, scored)
    return [Hit(indexes[f].blocks[b], s) for s, f, b in best]


class MemoryRetriever:
    """Searches one memory folder's MEMORY.md (and optionally its daily notes) with a warm cache."""

    def __init__(self, store: MemoryStore):
        self.store = store
        self.cache: FileCache[FileIndex] = FileCache(_index_long_term)  # MEMORY.md
        self.notes_cache: FileCache[FileIndex] = FileCache(_index_note)

    def _large(self) -> bool:
        """Whether MEMORY.md is searched as a stream (larger than LARGE_FILE); its index, if it was cached
        while the file was smaller, is dropped then."""
        try:
            large = os.stat(self.store.long_term_path).st_size > LARGE_FILE
        except OSError:
            return False
        if large:
            self.cache.discard(self.store.long_term_path)
        return large

    def long_term_blocks(self) -> list[Block]:
        """MEMORY.md's blocks in file order (of a MEMORY.md larger than LARGE_FILE, the newest ones)."""
        self.store.repair()
        if self._large():
            return _large_tail(self.store.long_term_path)
        index = self.cache.get(self.store.long_term_path)
        return list(index.blocks) if index else []

    def neighbours(self, block: Block, before: int = 1, after: int = 1) -> list[Block]:
        """`block` with up to `before` blocks above it and `after` below it in its file, in file order
        (a daily note's title left out); [] when the block is no longer in its file as it is now."""
        if block.path == self.store.long_term_path and self._large():
            return _large_neighbours(block.path, block, before, after)
        cache = self.cache if block.path == self.store.long_term_path else self.notes_cache
        index = cache.get(block.path)
        at = index.position(block) if index is not None else None
        if index is None or at is None:
            return []
        return index.blocks[max(at - before, 0):at + after + 1]

    def close(self) -> None:
        """Nothing to close: the cache is plain memory (the index-backed searcher has a database)."""

    def search(self, query: str, limit: int, *, include_notes: bool = False) -> list[Hit]:
        """The best `limit` blocks for `query`, best first; daily notes join when `include_notes`."""
        self.store.repair()
        path = self.store.long_term_path
        found = [_large_index(path, query, limit) if self._large() else self.cache.get(path)]
        if include_notes:
            for note in self.store.note_files():
                try:
                    found.append(self.notes_cache.get(note))
                except NotAFileError as exc:  # a note linked to a device or a FIFO: the other notes still count
                    log.warning("%s", exc)
        return rank([index for index in found if index is not None], query, limit, neighbours=NEIGHBOUR_WEIGHT)
