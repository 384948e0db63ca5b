"""FileScores in numpy arrays: what bm25.py's dicts do per posting, done per term.

Every sum is the dicts' own, term by term in the same order (0.0 + x is x; a block's neighbours are added
before their share is taken, as there), so each score is the same float and the ranking the same: only the
speed differs. The keyword search uses them for a file large enough to gain from it (keyword.ARRAYS_FROM).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from picoclaw.memory.search.bm25 import PARTS_KEPT, FileIndex, phrase_holders, term_share

Floats = npt.NDArray[np.float64]
Numbers = npt.NDArray[np.intp]
# What a term no block holds gives: one shared empty pair, kept nowhere.
_NOWHERE: tuple[Numbers, Floats] = (np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.float64))


@dataclass
class TermArrays:
    """A FileIndex's postings as arrays, per term asked for so far. Block n is at n + 1 in them: a score array
    has a 0 at either end, so every block has two neighbours to take a share of."""

    lengths: Floats  # each block's length, at n + 1
    postings: dict[str, tuple[Numbers, Floats]] = field(default_factory=dict)
    # Per term and weight, each posting's share of BM25 for the average length `parts_average` (as
    # FileIndex.weighted_parts keeps them), so a warm query does one addition per term.
    parts: dict[tuple[str, float], tuple[Numbers, Floats]] = field(default_factory=dict)
    parts_average: float = 0.0

    @classmethod
    def of(cls, index: FileIndex) -> TermArrays:
        if not isinstance(index.arrays, cls):
            index.arrays = cls(np.array([0, *index.lengths, 0], dtype=np.float64))
        return index.arrays

    def holding(self, index: FileIndex, term: str) -> tuple[Numbers, Floats]:
        """Where the blocks holding `term` are (n + 1), ascending, and how often each holds it."""
        found = self.postings.get(term)
        if found is None:
            pairs = index.postings.get(term)
            if not pairs:  # not kept, as FileIndex.weighted_parts keeps no term that no block holds
                return _NOWHERE
            if len(self.postings) >= PARTS_KEPT:
                self.postings.clear()
            found = self.postings[term] = (np.array([block + 1 for block, _ in pairs], dtype=np.intp),
                                           np.array([tf for _, tf in pairs], dtype=np.float64))
        return found

    def weighted_parts(self, index: FileIndex, term: str, average: float, weight: float) -> tuple[Numbers, Floats]:
        """FileIndex.weighted_parts as arrays: where the blocks holding `term` are, and each one's share."""
        if average != self.parts_average or len(self.parts) >= PARTS_KEPT:
            self.parts.clear()
            self.parts_average = average
        found = self.parts.get((term, weight))
        if found is None:
            at, tf = self.holding(index, term)
            if not at.size:
                return _NOWHERE
            found = self.parts[(term, weight)] = (at, term_share(tf, self.lengths[at], weight, average))
        return found


class ArrayScores:
    """FileScores with every block's score in an array (for a whole file: its blocks are all adjacent)."""

    def __init__(self, index: FileIndex, avg_length: float, neighbours: float):
        assert not index.breaks, "arrays score whole files only"
        self.index, self.avg_length, self.neighbours = index, avg_length, neighbours
        self.arrays = TermArrays.of(index)
        self.matched: Numbers = _NOWHERE[0]  # where the blocks holding a query term are, ascending
        self.context: Floats = _NOWHERE[1]  # their scores in context

    def _own(self, idf: dict[str, float]) -> Floats:
        """Every block's BM25 for the terms of `idf`: above 0 exactly for the blocks holding one of them (every
        weight is, and every share)."""
        scores = np.zeros(self.arrays.lengths.size)
        for term, weight in idf.items():
            at, parts = self.arrays.weighted_parts(self.index, term, self.avg_length, weight)
            scores[at] += parts
        return scores

    def match(self, idf: dict[str, float]) -> None:
        own, share = self._own(idf), self.neighbours
        at = self.matched = (own > 0).nonzero()[0]  # of a bool array: several times faster than of floats
        self.context = own[at] + share * (own[at - 1] + own[at + 1]) if share else own[at]

    def add(self, idf: dict[str, float]) -> None:
        added, share, at = self._own(idf), self.neighbours, self.matched
        self.context = self.context + ((added[at] + share * added[at - 1]) + share * added[at + 1])

    def best(self, limit: int) -> list[float]:
        values = self.context
        if values.size > limit:
            values = np.partition(values, values.size - limit)[values.size - limit:]
        return values.tolist()

    def top(self, limit: int, floor: float, bonus: float, wanted: list[str],
            texts: list[str]) -> list[tuple[float, int]]:
        near = (self.context * bonus >= floor).nonzero()[0]
        blocks, scores = self.matched[near] - 1, self.context[near]
        numbers = blocks.tolist()
        holders = phrase_holders(wanted, [texts[block] for block in numbers])
        if holders:
            scores[holders] *= bonus  # a copy: indexed by an array
        if len(numbers) > limit:
            best = np.lexsort((blocks, scores))[-limit:]  # by score, then block: as (score, block) tuples compare
            blocks, scores = blocks[best], scores[best]
        return list(zip(scores.tolist(), blocks.tolist()))
