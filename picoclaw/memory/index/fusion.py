"""Hybrid fusion: how the keyword and the vector candidates of a search become one ranking.

Two rules, chosen by `memory.index.fusion`:
- "weighted": each chunk of the union gets both of its scores (not a 0 for the side whose shortlist it
  missed) and the weighted sum ranks them; below `min_score` a chunk is dropped.
- "rrf" (reciprocal-rank fusion): a chunk scores Σ weight / (k + its rank) over the two lists; only the
  order of each list counts, so whatever orders the keyword list (a re-ranker) carries into hybrid as is.

On equal scores the newer chunk (higher id) wins, as in the keyword search.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Weights:
    """How the weighted fusion mixes the two sides, and the least score a result must reach."""

    vector: float
    text: float
    min_score: float

    def combine(self, vector: float, text: float) -> float:
        # Normalised by the weights' sum so the result stays within 0–1 whatever the user configured.
        return (self.vector * max(vector, 0.0) + self.text * text) / (self.vector + self.text)


def weighted(keyword: dict[int, float], vector: dict[int, float], weights: Weights,
             below: list[tuple[float, int]] | None = None) -> list[tuple[float, int]]:
    """(hybrid score, chunk id) for every chunk in either dict, best first, below min_score dropped (and
    added to `below`, best first, when given: a turn's record says what the floor left out).

    Both dicts must hold every chunk of the union with its real score on that side (0 when it has none).
    """
    union = set(keyword) | set(vector)
    scored = sorted(((weights.combine(vector.get(i, 0.0), keyword.get(i, 0.0)), i) for i in union), reverse=True)
    if below is not None:
        below.extend(item for item in scored if item[0] < weights.min_score)
    return [item for item in scored if item[0] >= weights.min_score]


@dataclass(frozen=True)
class RankWeights:
    """Reciprocal-rank fusion: the rank offset k and how much a place in the keyword list counts against
    the same place in the vector list."""

    k: int
    keyword: float

    def share(self, rank: int) -> float:
        """What 1-based `rank` in a list of weight 1 adds to a chunk's score."""
        return 1.0 / (self.k + rank)


def reciprocal_rank(keyword: Sequence[int], vector: Sequence[int], weights: RankWeights) -> list[tuple[float, int]]:
    """(fused score, chunk id) for every chunk in either list (each best first), best first."""
    scores: dict[int, float] = {}
    for rank, chunk_id in enumerate(keyword, start=1):
        scores[chunk_id] = scores.get(chunk_id, 0.0) + weights.keyword * weights.share(rank)
    for rank, chunk_id in enumerate(vector, start=1):
        scores[chunk_id] = scores.get(chunk_id, 0.0) + weights.share(rank)
    return sorted(((score, chunk_id) for chunk_id, score in scores.items()), reverse=True)
