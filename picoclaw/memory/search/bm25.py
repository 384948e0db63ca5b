"""BM25 ranking of blocks: the per-file statistics (FileIndex) and `rank`, which scores blocks of several
files as one corpus.

A matching block's score also takes in a share of its adjacent blocks' scores in the same file
(NEIGHBOUR_WEIGHT): what is said next to a match is often what the match is about ("Where did you go?" /
"Paris, in May"). A block holding the query (or a quoted part of it) verbatim gets PHRASE_BONUS more.
The keyword search then ranks the matching blocks again with the query expanded by terms of its best hits
(`rank(..., feedback=True)`, query_expansion.py).

Each file's sums are made per posting in a dict (`DictScores`), or in numpy arrays (array_scores.py, which the
keyword search picks for a large file): the same numbers in the same order, so the same ranking.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from itertools import chain, count
from typing import Any, Protocol

from picoclaw.memory.search.blocks import Block, Hit
from picoclaw.memory.search.query_expansion import (
    FEEDBACK_BLOCKS,
    FEEDBACK_MIN_BLOCKS,
    FEEDBACK_WEIGHT,
    best_terms,
    telling_terms,
)
from picoclaw.memory.terms import block_terms, normalize, phrases, query_terms, terms

K1 = 1.2
B = 0.75
PHRASE_BONUS = 0.5  # relative boost for a block containing the query (or a quoted part) verbatim
# Share of each adjacent block's score a block gets (KeywordSearch.search). On LoCoMo's dev split 0.2–0.3
# are best for both layouts (bench/retrieval_quality.py); from 0.4 up neighbours start to outrank the match.
NEIGHBOUR_WEIGHT = 0.25
_OWN_TERMS_KEPT = 256  # blocks whose terms a FileIndex keeps for query expansion: the hits of recent queries
PARTS_KEPT = 8192  # (term, weight) entries a FileIndex keeps: recent queries' terms and their added ones
_serials = count(1)  # FileIndex.serial: what an index holds never changes once searched, so its serial names it


def term_share(tf: Any, length: Any, weight: float, average: float) -> Any:
    """A posting's share of BM25: weight · tf·(K1+1) / (tf + K1·(1 − B + B·length/average)); of numbers, or of
    numpy arrays of them (array_scores.py), by the same operations in the same order: the same floats."""
    return weight * (tf * (K1 + 1) / (tf + K1 * (1 - B) + K1 * B / average * length))


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
    # Per term and weight (its idf, times FEEDBACK_WEIGHT for an added term), each posting's share of BM25 for
    # the corpus average length it was made with: a warm query then does one addition per posting instead of
    # the whole formula. The weight is part of the key as the float it is, so a weight that moved is a new entry.
    _parts: dict[tuple[str, float], list[tuple[int, float]]] = field(default_factory=dict, repr=False)
    _parts_average: float = 0.0
    _positions: dict[tuple[int, int], int] | None = field(default=None, repr=False)
    _own_terms: dict[int, Counter[str]] = field(default_factory=dict, repr=False)
    # Per block, its telling terms (query_expansion.telling_terms) and the serials of the indexes searched
    # together that their weights were made for: while those are the same, so is every document frequency.
    _telling: dict[int, tuple[tuple[int, ...], list[tuple[str, float]]]] = field(default_factory=dict, repr=False)
    serial: int = field(default_factory=_serials.__next__, repr=False, compare=False)
    searches: int = field(default=0, repr=False, compare=False)  # how often a keyword search ranked this index
    arrays: object | None = field(default=None, repr=False, compare=False)  # array_scores.TermArrays, once used

    def weighted_parts(self, term: str, average: float, weight: float) -> list[tuple[int, float]]:
        """(block, weight · tf·(K1+1) / (tf + K1·(1 − B + B·length/average))) for every block holding `term`."""
        if average != self._parts_average or len(self._parts) >= PARTS_KEPT:
            self._parts.clear()
            self._parts_average = average
        parts = self._parts.get((term, weight))
        if parts is None:
            postings = self.postings.get(term)
            if not postings:  # not kept: over many daily notes, most terms asked are in none of a note's blocks
                return []
            lengths = self.lengths
            parts = [(block, term_share(tf, lengths[block], weight, average)) for block, tf in postings]
            self._parts[(term, weight)] = parts
        return parts

    def own_terms(self, number: int) -> Counter[str]:
        """Each term of block `number`'s text with its count: not its previous block's, nor its date in words
        (those name a day, not what the block is about; as feedback they cost 0.006 of B@10 in English)."""
        found = self._own_terms.get(number)
        if found is None:
            if len(self._own_terms) >= _OWN_TERMS_KEPT:
                self._own_terms.clear()
            found = self._own_terms[number] = Counter(terms(self.blocks[number].text))
        return found

    def telling_terms(self, number: int, corpus: tuple[int, ...], doc_freq: Callable[[str], int],
                      total: int) -> list[tuple[str, float]]:
        """`telling_terms` of block `number`'s own terms in the corpus of the indexes whose serials are `corpus`
        (`doc_freq` and `total` are that corpus's)."""
        found = self._telling.get(number)
        if found is None or found[0] != corpus:
            if len(self._telling) >= _OWN_TERMS_KEPT:
                self._telling.clear()
            found = self._telling[number] = (corpus, telling_terms(self.own_terms(number), doc_freq, total))
        return found[1]

    def position(self, block: Block) -> int | None:
        """Where `block` is in this file's blocks, or None when it is not one of them."""
        if self._positions is None:
            self._positions = {(b.start_line, b.end_line): n for n, b in enumerate(self.blocks)}
        found = self._positions.get((block.start_line, block.end_line))
        return found if found is not None and self.blocks[found] == block else None

    @classmethod
    def build(cls, blocks: list[Block], *, with_previous: bool = False, own: list[list[str]] | None = None,
              only: Collection[str] | None = None) -> FileIndex:
        """Index `blocks`; `with_previous`: each block is indexed under its own and the previous block's terms.
        `own`: each block's `block_terms`, when the caller kept them. `only`: postings for these terms alone (an
        index made for one query; lengths still count every term)."""
        postings: dict[str, list[tuple[int, int]]] = {}
        lengths = []
        if own is None:
            own = [block_terms(block.text, block.heading, block.path) for block in blocks]
        for number, found in enumerate(own):
            counts = Counter(found)
            if with_previous and number:
                counts.update(own[number - 1])
            lengths.append(sum(counts.values()))
            # Most postings are of a term a block holds once: they share one tuple, so a large file's index makes
            # (and the garbage collector walks) a tuple per block instead of one per posting: half the time.
            once = (number, 1)
            if only is None:
                for term, tf in counts.items():
                    postings.setdefault(term, []).append(once if tf == 1 else (number, tf))
                continue
            for term in only:
                if term in counts:
                    tf = counts[term]
                    postings.setdefault(term, []).append(once if tf == 1 else (number, tf))
        return cls(blocks, lengths, postings, [normalize(b.text) for b in blocks], sum(lengths))

    def extended(self, blocks: list[Block]) -> FileIndex:
        """A new index of this one's blocks and then `blocks`, as `build` of them all would make it, indexing only
        `blocks` (a file appended to). For whole files indexed block by block (not `with_previous`, nor `only`)."""
        assert not (self.total_blocks or self.breaks or self.doc_freqs), "extended: a whole file's index only"
        added, offset = FileIndex.build(blocks), len(self.blocks)
        postings = dict(self.postings)  # the lists of the terms the new blocks hold are new ones: this index stays
        for term, found in added.postings.items():
            moved = [(number + offset, tf) for number, tf in found]
            before = postings.get(term)
            postings[term] = before + moved if before else moved
        grown = FileIndex(self.blocks + added.blocks, self.lengths + added.lengths, postings,
                          self.normalized + added.normalized, self.total_length + added.total_length)
        grown.searches = self.searches  # the same file, searched as often (keyword.py picks its sums by it)
        return grown


def _doc_freq(indexes: list[FileIndex], term: str) -> int:
    return sum(len(ix.postings.get(term, ())) if ix.doc_freqs is None else ix.doc_freqs.get(term, 0)
               for ix in indexes)


def _doc_freq_of(indexes: list[FileIndex]) -> Callable[[str], int]:
    # MEMORY.md alone is the common case, and query expansion asks for every term of two blocks.
    if len(indexes) == 1 and indexes[0].doc_freqs is None:
        postings = indexes[0].postings
        return lambda term: len(postings.get(term, ()))
    return lambda term: _doc_freq(indexes, term)


def _idf(indexes: list[FileIndex], words: Iterable[str], weight: float, total_blocks: int) -> dict[str, float]:
    """Each of `words` that some block holds, with its inverse document frequency times `weight`."""
    idf = {}
    doc_freq = _doc_freq_of(indexes)
    for term in words:
        df = doc_freq(term)
        if df:
            idf[term] = weight * math.log(1 + (total_blocks - df + 0.5) / (df + 0.5))
    return idf


def _own_scores(ix: FileIndex, idf: dict[str, float], avg_length: float) -> dict[int, float]:
    """The BM25 score of every block of `ix` holding one of the terms of `idf`, by block."""
    scores: dict[int, float] = {}
    get = scores.get
    for term, term_weight in idf.items():
        parts = ix.weighted_parts(term, avg_length, term_weight)
        if not scores:  # 0.0 + x is x: the first term's scores need no lookups
            scores = dict(parts)
            get = scores.get
            continue
        for block_number, part in parts:
            scores[block_number] = get(block_number, 0.0) + part
    return scores


def _in_context(ix: FileIndex, own: dict[int, float], neighbours: float) -> dict[int, float]:
    """Each block of `own` with its score plus `neighbours` × its adjacent blocks' scores."""
    if not neighbours:
        return own
    breaks, get = ix.breaks, own.get
    if breaks:
        return {block: score + neighbours * ((0.0 if block in breaks else get(block - 1, 0.0))
                                             + (0.0 if block + 1 in breaks else get(block + 1, 0.0)))
                for block, score in own.items()}
    return {block: score + neighbours * (get(block - 1, 0.0) + get(block + 1, 0.0)) for block, score in own.items()}


def _added_in_context(context: dict[int, float], own: dict[int, float], neighbours: float) -> dict[int, float]:
    """Each block of `context` with what `own` (another set of terms' scores) adds to its score in context: its
    own part and `neighbours` × its adjacent blocks'. Only `context`'s blocks are looked at, not every block
    `own` scores (query expansion's terms are common ones, held by many blocks that never match). For whole
    files' indexes: `rank` expands no part of a large file, whose blocks are not all adjacent."""
    get = own.get
    return {block: score + ((get(block, 0.0) + neighbours * get(block - 1, 0.0)) + neighbours * get(block + 1, 0.0))
            for block, score in context.items()}


def phrase_holders(wanted: list[str], texts: list[str]) -> list[int]:
    """Where in `texts` (blocks' normalized texts) those are that hold one of the phrases `wanted` (usually one:
    the query). One search of them all joined first: a question is seldom written down word for word."""
    joined = "\0".join(texts)  # a phrase in none of them is in no part of it
    if not any(phrase in joined for phrase in wanted):
        return []
    if len(wanted) == 1:
        phrase = wanted[0]
        return [at for at, text in enumerate(texts) if phrase in text]
    return [at for at, text in enumerate(texts) if any(phrase in text for phrase in wanted)]


class FileScores(Protocol):
    """One query's scores over one file's blocks: the matching blocks' BM25 in context."""

    def match(self, idf: dict[str, float]) -> None:
        """Score the blocks holding a term of `idf` (each with its weight), each with its neighbours' share."""

    def add(self, idf: dict[str, float]) -> None:
        """Add to each matching block what the terms of `idf` give it in context; no block starts to match."""

    def best(self, limit: int) -> list[float]:
        """The `limit` highest scores, in no order (all of them when fewer blocks match)."""

    def top(self, limit: int, floor: float, bonus: float, wanted: list[str],
            texts: list[str]) -> list[tuple[float, int]]:
        """The best `limit` (score, block) of the matching blocks whose score × `bonus` reaches `floor`, each
        score × `bonus` when its block's text (of `texts`) holds a phrase of `wanted`: best by score, then the
        later block first; in no order."""


class DictScores:
    """FileScores in a dict: one lookup per posting, nothing to set up."""

    def __init__(self, index: FileIndex, avg_length: float, neighbours: float):
        self.index, self.avg_length, self.neighbours = index, avg_length, neighbours
        self.context: dict[int, float] = {}

    def match(self, idf: dict[str, float]) -> None:
        self.context = _in_context(self.index, _own_scores(self.index, idf, self.avg_length), self.neighbours)

    def add(self, idf: dict[str, float]) -> None:
        self.context = _added_in_context(self.context, _own_scores(self.index, idf, self.avg_length), self.neighbours)

    def best(self, limit: int) -> list[float]:
        return heapq.nlargest(limit, self.context.values())

    def top(self, limit: int, floor: float, bonus: float, wanted: list[str],
            texts: list[str]) -> list[tuple[float, int]]:
        scored = [(score, block) for block, score in self.context.items() if score * bonus >= floor]
        for at in phrase_holders(wanted, [texts[block] for _, block in scored]):
            score, block = scored[at]
            scored[at] = (score * bonus, block)
        return scored if len(scored) <= limit else heapq.nlargest(limit, scored)


class _NoMatch:
    """FileScores of a file holding no term of the query: none of its blocks matches, and none starts to."""

    def match(self, idf: dict[str, float]) -> None:
        pass

    def add(self, idf: dict[str, float]) -> None:
        pass

    def best(self, limit: int) -> list[float]:
        return []

    def top(self, limit: int, floor: float, bonus: float, wanted: list[str],
            texts: list[str]) -> list[tuple[float, int]]:
        return []


_NO_MATCH = _NoMatch()


def _phrase_scored(indexes: list[FileIndex], files: list[FileScores], wanted: list[str],
                   limit: int) -> list[tuple[float, int, int]]:
    """The best `limit` (score, file, block) once a phrase hit earns its bonus, best first."""
    # No block below the limit-th score can reach the top `limit` but by the bonus, so only blocks that
    # could are looked at again (the phrase check scans the block's text). The limit-th score of all files
    # is that of the union of each file's best `limit`.
    best = heapq.nlargest(limit, files[0].best(limit) if len(files) == 1
                          else chain.from_iterable(file.best(limit) for file in files))
    floor = best[-1] if len(best) >= limit else 0.0
    bonus = 1 + PHRASE_BONUS
    # On equal scores the later block wins (and the later file): newer memories are likelier to be current.
    return heapq.nlargest(limit, [(score, file_number, block_number)
                                  for file_number, (ix, file) in enumerate(zip(indexes, files))
                                  for score, block_number in file.top(limit, floor, bonus, wanted, ix.normalized)])


# Makes one file's sums, given its index, the corpus's average block length and the neighbours' share.
ScoresKind = Callable[[FileIndex, float, float], FileScores]


def rank(indexes: list[FileIndex], query: str, limit: int, *, neighbours: float = 0.0,
         feedback: bool = False, scores: ScoresKind = DictScores) -> list[Hit]:
    """BM25 over all blocks of `indexes` as one corpus, plus a bonus for an exact phrase hit; with
    `neighbours`, each matching block also gets that share of its adjacent blocks' scores (a block that
    matches nothing itself is never returned: in MEMORY.md the entry next to a match is often unrelated).

    With `feedback`, the matching blocks are ranked again with the query expanded by terms of its best
    FEEDBACK_BLOCKS hits (query_expansion.py); not over part of a large MEMORY.md, whose index lacks them,
    nor over fewer than FEEDBACK_MIN_BLOCKS blocks. `scores` makes each file's sums (the ranking is the same
    whatever it makes them in).
    """
    wanted_terms = query_terms(query)
    total_blocks = sum(ix.total_blocks or len(ix.blocks) for ix in indexes)
    if not wanted_terms or total_blocks == 0 or limit <= 0:
        return []
    avg_length = (sum(ix.total_length for ix in indexes) / total_blocks) or 1.0
    wanted = phrases(query)
    feedback = feedback and total_blocks >= FEEDBACK_MIN_BLOCKS and all(ix.doc_freqs is None for ix in indexes)
    idf = _idf(indexes, wanted_terms, 1.0, total_blocks)
    if not idf:  # no block holds a term of the query
        return []
    # A turn searches every daily note, and most hold no word of the query: those are not scored at all.
    files = [scores(ix, avg_length, neighbours) if any(term in ix.postings for term in idf) else _NO_MATCH
             for ix in indexes]
    for file in files:
        file.match(idf)
    # Expanded, the first pass only names the best FEEDBACK_BLOCKS (fewer blocks for the phrase check).
    scored = _phrase_scored(indexes, files, wanted, FEEDBACK_BLOCKS if feedback else limit)
    if feedback and scored:
        corpus, doc_freq = tuple(ix.serial for ix in indexes), _doc_freq_of(indexes)
        extra = best_terms(frozenset(wanted_terms),
                           [indexes[f].telling_terms(b, corpus, doc_freq, total_blocks) for _, f, b in scored])
        # Only the blocks that match the query itself are ranked again: the added terms re-order, they
        # never add a hit (a neighbour's share still takes in its added terms' score).
        added = _idf(indexes, extra, FEEDBACK_WEIGHT, total_blocks)
        for file in files:
            file.add(added)
        scored = _phrase_scored(indexes, files, wanted, limit)
    return [Hit(indexes[f].blocks[b], s) for s, f, b in scored]


def rank_blocks(blocks: list[Block], query: str, limit: int) -> list[Hit]:
    """The best `limit` of `blocks` for `query` by BM25, best first (say, a session's past turns)."""
    return rank([FileIndex.build(blocks)], query, limit)
