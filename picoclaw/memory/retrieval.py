"""Retrieval over MEMORY.md and daily notes: split into blocks, score with BM25, return the best.

A block is a `## ` section, split further at blank lines with every part keeping its heading (a date
heading stays with its entry). Each file is parsed and indexed once and reused until its size, mtime or
inode changes, so a query on an unchanged MEMORY.md costs one stat per file plus the scoring.

A matching block's score also takes in a share of its adjacent blocks' scores in the same file
(NEIGHBOUR_WEIGHT): what is said next to a match is often what the match is about ("Where did you go?" /
"Paris, in May"). A daily-note entry is moreover indexed together with the entry before it, since an entry
so often answers what came just before it.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from picoclaw.fsutil import FileCache
from picoclaw.memory.store import MemoryStore, is_fence
from picoclaw.memory.terms import block_terms, normalize, phrases, query_terms

K1 = 1.2
B = 0.75
PHRASE_BONUS = 0.5  # relative boost for a block containing the query (or a quoted part) verbatim
# Share of each adjacent block's score a block gets (MemoryRetriever.search). On LoCoMo's dev split 0.2–0.3
# are best for both layouts (bench/retrieval_quality.py); from 0.4 up neighbours start to outrank the match.
NEIGHBOUR_WEIGHT = 0.25


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


def split_blocks(text: str, path: Path) -> list[Block]:
    """Split Markdown into blocks; blank lines inside fenced code do not split.

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

    for number, line in enumerate(_lines(text), start=1):
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


def _index_note(path: Path) -> FileIndex:
    blocks = split_blocks(path.read_text(encoding="utf-8", errors="replace"), path)
    # The title is left out: with the note's date in words it would match every question about that day.
    # An entry is indexed with the one before it: on LoCoMo's dev notes turn recall@10 +0.035 EN, +0.014 ZH.
    return FileIndex.build([block for block in blocks if not is_title(block)], with_previous=True)


def _index_long_term(path: Path) -> FileIndex:
    return FileIndex.build(entry_blocks(path.read_text(encoding="utf-8", errors="replace"), path))


def rank(indexes: list[FileIndex], query: str, limit: int, *, neighbours: float = 0.0) -> list[Hit]:
    """BM25 over all blocks of `indexes` as one corpus, plus a bonus for an exact phrase hit; with
    `neighbours`, each matching block also gets that share of its adjacent blocks' scores (a block that
    matches nothing itself is never returned: in MEMORY.md the entry next to a match is often unrelated)."""
    wanted_terms = query_terms(query)
    total_blocks = sum(len(ix.blocks) for ix in indexes)
    if not wanted_terms or total_blocks == 0 or limit <= 0:
        return []
    avg_length = (sum(ix.total_length for ix in indexes) / total_blocks) or 1.0
    idf = {}
    for term in wanted_terms:
        df = sum(len(ix.postings.get(term, ())) for ix in indexes)
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
            raw.extend((score + neighbours * (get(block - 1, 0.0) + get(block + 1, 0.0)), file_number, block)
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

    def long_term_blocks(self) -> list[Block]:
        """MEMORY.md's blocks in file order."""
        index = self.cache.get(self.store.long_term_path)
        return list(index.blocks) if index else []

    def neighbours(self, block: Block, before: int = 1, after: int = 1) -> list[Block]:
        """`block` with up to `before` blocks above it and `after` below it in its file, in file order
        (a daily note's title left out); [] when the block is no longer in its file as it is now."""
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
        found = [self.cache.get(self.store.long_term_path)]
        if include_notes:
            found.extend(self.notes_cache.get(path) for path in self.store.note_files())
        return rank([index for index in found if index is not None], query, limit, neighbours=NEIGHBOUR_WEIGHT)
