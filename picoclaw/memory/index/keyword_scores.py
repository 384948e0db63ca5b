"""Keyword scores from FTS5 (the hybrid fusion with vector scores is in fusion.py).

Keyword: FTS5's BM25 (k1 1.2, b 0.75, as the keyword search) over the pre-tokenised terms, times the
keyword search's bonus for an exact phrase. It is turned into 0–1 without changing its order:
x = BM25 / (the BM25 an average-length chunk would get with every query term once), score = tanh(x). So a
chunk holding all of the query's words scores about 0.76, with the exact phrase about 0.9, and the score
does not depend on what else happened to match.

In context, as the keyword search scores blocks (`in_context`): a daily-note entry's BM25 takes in the
previous entry's, then every chunk gains NEIGHBOUR_WEIGHT × its adjacent chunks' BM25, before the 0–1 map.

From the keyword search (`searched_chunks`): where the keyword search itself (KeywordSearch, whose ranking
has more to it than BM25) covers the sources searched, hybrid takes its list, each block as the chunks cut
from it, with the block's score over the best one's as its 0–1 score.
"""

from __future__ import annotations

import heapq
import math
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from picoclaw.memory.search.blocks import Hit
from picoclaw.memory.search.bm25 import NEIGHBOUR_WEIGHT, PHRASE_BONUS
from picoclaw.memory.terms import normalize, phrases, query_terms

_IDF_FLOOR = 1e-6  # what FTS5's bm25() uses for a term in half the chunks or more
_BATCH = 900  # ids per IN (...) query, under SQLite's variable limit
CANDIDATE_CAP = 200  # most candidates taken from each side for a search (unless limit is larger)


@dataclass(frozen=True)
class KeywordQuery:
    """A query prepared for FTS5: its MATCH expression, exact phrases, and its BM25 reference value."""

    match: str
    phrases: tuple[str, ...]
    reference: float

    @classmethod
    def prepare(cls, conn: sqlite3.Connection, query: str) -> KeywordQuery | None:
        """None when the query has no search terms (only stop words or punctuation)."""
        distinct = query_terms(query)  # the keyword search's: question words left out
        if not distinct:
            return None
        total = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
        marks = ",".join("?" * len(distinct))
        docs = dict(conn.execute(f"SELECT term, doc FROM chunks_vocab WHERE term IN ({marks})", distinct))
        # Terms that occur nowhere cannot match, so they are left out of the reference too.
        reference = sum(max(math.log((total - n + 0.5) / (n + 0.5)), _IDF_FLOOR) for n in docs.values())
        match = " OR ".join(f'"{term}"' for term in distinct)
        return cls(match, tuple(phrases(query)), reference or _IDF_FLOOR)

    def unit(self, bm25: float) -> float:
        """A BM25 value (positive, bonus included) as a 0–1 score with the same order."""
        return math.tanh(bm25 / self.reference)


def _where_sources(sources: frozenset[str] | None) -> tuple[str, tuple[str, ...]]:
    if sources is None:
        return "", ()
    ordered = tuple(sorted(sources))
    return f" AND c.source IN ({','.join('?' * len(ordered))})", ordered


def keyword_matches(conn: sqlite3.Connection, query: KeywordQuery,
                    sources: frozenset[str] | None) -> dict[int, float]:
    """BM25 of every chunk that matches the query, phrase bonus not applied: chunk id → value.

    One FTS5 pass: ranking by BM25 scores every match anyway, and the neighbours of a candidate need theirs.
    """
    where, params = _where_sources(sources)
    if not where:
        return dict(conn.execute("SELECT rowid, -bm25(chunks_fts) FROM chunks_fts WHERE chunks_fts MATCH ?",
                                 (query.match,)))
    return dict(conn.execute(f"SELECT f.rowid, -bm25(chunks_fts) FROM chunks_fts f JOIN chunks c ON c.id = f.rowid "
                             f"WHERE chunks_fts MATCH ?{where}", (query.match, *params)))


def phrase_boosted(conn: sqlite3.Connection, query: KeywordQuery, scores: dict[int, float],
                   ids: Iterable[int]) -> dict[int, float]:
    """The scores of `ids`, times the keyword search's phrase bonus where the chunk's text holds a phrase."""
    wanted = [i for i in ids if i in scores]
    if not query.phrases:
        return {i: scores[i] for i in wanted}
    out: dict[int, float] = {}
    for start in range(0, len(wanted), _BATCH):
        part = wanted[start:start + _BATCH]
        rows = conn.execute(f"SELECT id, text FROM chunks WHERE id IN ({','.join('?' * len(part))})", part)
        out.update((chunk_id, _with_bonus(query, scores[chunk_id], text)) for chunk_id, text in rows)
    return out


@dataclass(frozen=True)
class Adjacency:
    """Which chunk comes before and after a chunk in its file, and which chunks are daily-note entries."""

    previous: dict[int, int]
    next: dict[int, int]
    notes: frozenset[int]


def adjacency(conn: sqlite3.Connection, ids: Iterable[int]) -> Adjacency:
    """The chunks up to two before and one after each of `ids` in its file, and which are note entries.

    A sync writes each file's chunks in one transaction, in file order, with AUTOINCREMENT ids: the
    chunks of a file have consecutive ids, so the chunk before id n in its file is n − 1 if that has the
    same path.
    """
    window = sorted({i + step for i in ids for step in (-2, -1, 0, 1)})
    rows: dict[int, tuple[str, str]] = {}
    for start in range(0, len(window), _BATCH):
        part = window[start:start + _BATCH]
        rows.update((row[0], (row[1], row[2])) for row in conn.execute(
            f"SELECT id, path, source FROM chunks WHERE id IN ({','.join('?' * len(part))})", part))
    previous = {i: i - 1 for i, (path, _) in rows.items() if rows.get(i - 1, ("",))[0] == path}
    following = {i - 1: i for i in previous}
    notes = frozenset(i for i, (_, source) in rows.items() if source == "notes")
    return Adjacency(previous, following, notes)


def with_previous_entry(strengths: dict[int, float], adjacency: Adjacency) -> dict[int, float]:
    """Each daily-note entry's strength plus the previous entry's, as the keyword search indexes an entry
    together with the one before it (an entry so often answers what came just before it)."""
    out = dict(strengths)
    for chunk_id in adjacency.notes:
        before = adjacency.previous.get(chunk_id)
        if before is not None and before in strengths:
            out[chunk_id] = strengths.get(chunk_id, 0.0) + strengths[before]
    return out


def with_neighbours(scores: dict[int, float], adjacency: Adjacency, weight: float,
                    ids: Iterable[int] | None = None) -> dict[int, float]:
    """Each chunk of `ids` (default: every scored one) that has a score of its own, plus `weight` × its
    adjacent chunks' scores (a neighbour with no score adds 0), as the keyword search's `rank` does."""
    out: dict[int, float] = {}
    for chunk_id in scores if ids is None else ids:
        own = scores.get(chunk_id)
        if own is None:
            continue  # matching nothing itself, a chunk is not found through its neighbours alone
        around = sum(scores.get(other, 0.0) for other in (adjacency.previous.get(chunk_id),
                                                           adjacency.next.get(chunk_id)) if other is not None)
        out[chunk_id] = own + weight * around
    return out


def in_context(strengths: dict[int, float], adjacency: Adjacency, weight: float,
               ids: Iterable[int]) -> dict[int, float]:
    """The keyword strengths of `ids` as the keyword search scores blocks: a note entry with the entry
    before it, then every chunk with `weight` × its neighbours'. `strengths` must hold the chunks up to two
    before and one after each of `ids` (those that match)."""
    return with_neighbours(with_previous_entry(strengths, adjacency), adjacency, weight, ids)


def _with_bonus(query: KeywordQuery, raw: float, text: str) -> float:
    if query.phrases and any(phrase in normalize(text) for phrase in query.phrases):
        return raw * (1 + PHRASE_BONUS)
    return raw


def best_in_context(conn: sqlite3.Connection, query: KeywordQuery, matches: dict[int, float],
                    wanted: int) -> dict[int, float]:
    """The best `wanted` chunks by keywords in context (see `in_context_units`), with their 0–1 scores."""
    # The pool is wider than `wanted`, since neighbours can lift a chunk from below the cut; a note entry
    # right after a match is a match itself, as in the keyword search.
    pool = heapq.nlargest(max(wanted, CANDIDATE_CAP), matches, key=matches.__getitem__)
    around = adjacency(conn, pool)
    candidates = set(pool) | {after for i, after in around.next.items() if i in matches and after in around.notes}
    context = in_context(matches, around, NEIGHBOUR_WEIGHT, candidates)
    # Only a chunk the phrase bonus could lift into the best `wanted` needs its text read.
    floor = heapq.nlargest(wanted, context.values())[-1] if len(context) >= wanted else 0.0
    scores = {**context, **phrase_boosted(conn, query, context,
                                          [i for i, s in context.items() if s * (1 + PHRASE_BONUS) >= floor])}
    best = heapq.nlargest(wanted, scores.items(), key=lambda item: (item[1], item[0]))
    return {i: query.unit(score) for i, score in best}


def in_context_units(conn: sqlite3.Connection, query: KeywordQuery, matches: dict[int, float],
                     ids: set[int]) -> dict[int, float]:
    """0–1 keyword scores of `ids` as the keyword search scores blocks: BM25 of a note entry with the one
    before it, plus NEIGHBOUR_WEIGHT × the adjacent chunks' (`in_context`), then the phrase bonus.
    On LoCoMo dev (bench/retrieval_quality.py) this lifts hybrid B@10 by ~0.015 and notes turn recall@10
    by ~0.05 in both languages."""
    context = in_context(matches, adjacency(conn, ids), NEIGHBOUR_WEIGHT, ids)
    return {i: query.unit(s) for i, s in phrase_boosted(conn, query, context, context).items()}


def searched_chunks(conn: sqlite3.Connection, base: Path, hits: Sequence[Hit],
                    sources: frozenset[str] | None) -> dict[int, float]:
    """The keyword search's `hits` (best first) as chunk ids, in the same order, each with its block's
    score over the best block's (0–1); a block not indexed under `sources` (yet) is left out."""
    where, params = _where_sources(sources)
    top = max((hit.score for hit in hits), default=0.0) or 1.0
    out: dict[int, float] = {}
    for hit in hits:
        try:
            path = hit.block.path.relative_to(base).as_posix()
        except ValueError:
            continue
        # A block longer than the embedder's limit is several chunks, all within its lines.
        for (chunk_id,) in conn.execute(f"SELECT c.id FROM chunks c WHERE c.path = ? AND c.start_line BETWEEN ? "
                                        f"AND ? AND c.end_line <= ?{where} ORDER BY c.id",
                                        (path, hit.block.start_line, hit.block.end_line, hit.block.end_line,
                                         *params)):
            out.setdefault(chunk_id, hit.score / top)
    return out
