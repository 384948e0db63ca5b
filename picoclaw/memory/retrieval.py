"""Retrieval over MEMORY.md and daily notes: split into blocks, score with BM25, return the best.

A block is a `## ` section, split further at blank lines with every part keeping its heading (a date
heading stays with its entry). Each file is parsed and indexed once and reused until its size, mtime or
inode changes, so a query on an unchanged MEMORY.md costs one stat per file plus the scoring.
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
from picoclaw.memory.terms import normalize, phrases, terms

K1 = 1.2
B = 0.75
PHRASE_BONUS = 0.5  # relative boost for a block containing the query (or a quoted part) verbatim


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
    """BM25 statistics of one file's blocks."""

    blocks: list[Block]
    lengths: list[int]
    postings: dict[str, list[tuple[int, int]]]
    normalized: list[str]
    total_length: int = 0
    # Per term, each posting's length-normalised tf part of BM25, for the corpus average length it was
    # made with: a warm query then does one multiply-add per posting instead of the whole formula.
    _parts: dict[str, list[tuple[int, float]]] = field(default_factory=dict, repr=False)
    _parts_average: float = 0.0

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

    @classmethod
    def build(cls, blocks: list[Block]) -> FileIndex:
        postings: dict[str, list[tuple[int, int]]] = {}
        lengths = []
        for number, block in enumerate(blocks):
            counts = Counter(terms(block.text))
            lengths.append(sum(counts.values()))
            for term, tf in counts.items():
                postings.setdefault(term, []).append((number, tf))
        return cls(blocks, lengths, postings, [normalize(b.text) for b in blocks], sum(lengths))


def entry_blocks(text: str, path: Path) -> list[Block]:
    """MEMORY.md's blocks without its title and intro (everything above the first `## `): they describe
    the file, they are not memories, and must never be injected or found."""
    return [block for block in split_blocks(text, path) if block.heading]


def _index_note(path: Path) -> FileIndex:
    return FileIndex.build(split_blocks(path.read_text(encoding="utf-8", errors="replace"), path))


def _index_long_term(path: Path) -> FileIndex:
    return FileIndex.build(entry_blocks(path.read_text(encoding="utf-8", errors="replace"), path))


def rank(indexes: list[FileIndex], query: str, limit: int) -> list[Hit]:
    """BM25 over all blocks of `indexes` as one corpus, plus a bonus for an exact phrase hit."""
    query_terms = list(dict.fromkeys(terms(query)))
    total_blocks = sum(len(ix.blocks) for ix in indexes)
    if not query_terms or total_blocks == 0 or limit <= 0:
        return []
    avg_length = (sum(ix.total_length for ix in indexes) / total_blocks) or 1.0
    idf = {}
    for term in query_terms:
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
        raw.extend((score, file_number, block_number) for block_number, score in scores.items())
    # The phrase check scans the block's text, so only blocks that could still reach the top `limit`
    # with the bonus are checked.
    wanted = phrases(query)
    bonus = 1 + PHRASE_BONUS
    floor = heapq.nlargest(limit, raw)[-1][0] if len(raw) >= limit else 0.0
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

    def close(self) -> None:
        """Nothing to close: the cache is plain memory (the index-backed searcher has a database)."""

    def search(self, query: str, limit: int, *, include_notes: bool = False) -> list[Hit]:
        """The best `limit` blocks for `query`, best first; daily notes join when `include_notes`."""
        found = [self.cache.get(self.store.long_term_path)]
        if include_notes:
            found.extend(self.notes_cache.get(path) for path in self.store.note_files())
        return rank([index for index in found if index is not None], query, limit)
