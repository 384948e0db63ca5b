"""BM25 ranking of blocks: the per-file statistics (FileIndex) and `rank`, which scores blocks of several
files as one corpus.

A matching block's score also takes in a share of its adjacent blocks' scores in the same file
(NEIGHBOUR_WEIGHT): what is said next to a match is often what the match is about ("Where did you go?" /
"Paris, in May"). A block holding the query (or a quoted part of it) verbatim gets PHRASE_BONUS more.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass, field

from picoclaw.memory.search.blocks import Block, Hit
from picoclaw.memory.terms import block_terms, normalize, phrases, query_terms

K1 = 1.2
B = 0.75
PHRASE_BONUS = 0.5  # relative boost for a block containing the query (or a quoted part) verbatim
# Share of each adjacent block's score a block gets (KeywordSearch.search). On LoCoMo's dev split 0.2–0.3
# are best for both layouts (bench/retrieval_quality.py); from 0.4 up neighbours start to outrank the match.
NEIGHBOUR_WEIGHT = 0.25


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


def rank_blocks(blocks: list[Block], query: str, limit: int) -> list[Hit]:
    """The best `limit` of `blocks` for `query` by BM25, best first (say, a session's past turns)."""
    return rank([FileIndex.build(blocks)], query, limit)
