"""Keyword scores from FTS5 and the hybrid merge with vector scores.

Keyword: FTS5's BM25 (k1 1.2, b 0.75, as the plain retriever) over the pre-tokenised terms, times the
plain retriever's bonus for an exact phrase. It is turned into 0–1 without changing its order:
x = BM25 / (the BM25 an average-length chunk would get with every query term once), score = tanh(x). So a
chunk holding all of the query's words scores about 0.76, with the exact phrase about 0.9, and the score
does not depend on what else happened to match.

Hybrid: the union of the best keyword and the best vector candidates; each chunk in it gets both of its
scores (not a 0 for the side whose shortlist it missed) and the weighted sum ranks them.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

from picoclaw.memory.retrieval import PHRASE_BONUS
from picoclaw.memory.terms import normalize, phrases, query_terms

_IDF_FLOOR = 1e-6  # what FTS5's bm25() uses for a term in half the chunks or more
_BATCH = 900


@dataclass(frozen=True)
class KeywordQuery:
    """A query prepared for FTS5: its MATCH expression, exact phrases, and its BM25 reference value."""

    match: str
    phrases: tuple[str, ...]
    reference: float

    @classmethod
    def prepare(cls, conn: sqlite3.Connection, query: str) -> KeywordQuery | None:
        """None when the query has no search terms (only stop words or punctuation)."""
        distinct = query_terms(query)  # the plain retriever's: question words left out
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


def keyword_scores(conn: sqlite3.Connection, query: KeywordQuery, limit: int,
                   sources: frozenset[str] | None) -> dict[int, float]:
    """The best `limit` chunks by BM25 with the phrase bonus: chunk id → 0–1 score."""
    where, params = _where_sources(sources)
    # Twice the candidates by raw BM25, so the phrase bonus can still lift one from below the cut.
    rows = conn.execute(
        f"SELECT f.rowid, -bm25(chunks_fts), c.text FROM chunks_fts f JOIN chunks c ON c.id = f.rowid "
        f"WHERE chunks_fts MATCH ?{where} ORDER BY bm25(chunks_fts) LIMIT ?",
        (query.match, *params, 2 * limit)).fetchall()
    scored = sorted(((_with_bonus(query, raw, text), chunk_id) for chunk_id, raw, text in rows), reverse=True)
    return {chunk_id: query.unit(raw) for raw, chunk_id in scored[:limit]}


def keyword_scores_of(conn: sqlite3.Connection, query: KeywordQuery, ids: Iterable[int]) -> dict[int, float]:
    """The 0–1 keyword score of each of `ids` that matches the query at all."""
    wanted = list(ids)
    out: dict[int, float] = {}
    for start in range(0, len(wanted), _BATCH):
        part = wanted[start:start + _BATCH]
        rows = conn.execute(
            f"SELECT f.rowid, -bm25(chunks_fts), c.text FROM chunks_fts f JOIN chunks c ON c.id = f.rowid "
            f"WHERE chunks_fts MATCH ? AND f.rowid IN ({','.join('?' * len(part))})", (query.match, *part))
        out.update((chunk_id, query.unit(_with_bonus(query, raw, text))) for chunk_id, raw, text in rows)
    return out


def _with_bonus(query: KeywordQuery, raw: float, text: str) -> float:
    if query.phrases and any(phrase in normalize(text) for phrase in query.phrases):
        return raw * (1 + PHRASE_BONUS)
    return raw


@dataclass(frozen=True)
class Weights:
    """How the hybrid score mixes the two sides, and the least score a hybrid result must reach."""

    vector: float
    text: float
    min_score: float

    def combine(self, vector: float, text: float) -> float:
        # Normalised by the weights' sum so the result stays within 0–1 whatever the user configured.
        return (self.vector * max(vector, 0.0) + self.text * text) / (self.vector + self.text)


def merge(keyword: dict[int, float], vector: dict[int, float], weights: Weights) -> list[tuple[float, int]]:
    """(hybrid score, chunk id) for every chunk in either dict, best first, below min_score dropped.

    Both dicts must hold every chunk of the union with its real score on that side (0 when it has none).
    On equal scores the newer chunk (higher id) wins, as in the plain retriever.
    """
    union = set(keyword) | set(vector)
    scored = [(weights.combine(vector.get(i, 0.0), keyword.get(i, 0.0)), i) for i in union]
    return sorted((item for item in scored if item[0] >= weights.min_score), reverse=True)
