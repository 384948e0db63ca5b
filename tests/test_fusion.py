"""The index's ranking: keyword scores in context (neighbours, a note entry with the one before it) and the
hybrid fusion rules (weighted, reciprocal-rank), on small synthetic memories in English and Chinese (a fake
embedder pins the vectors)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from picoclaw.config import EmbeddingsConfig, IndexConfig, parse_config
from picoclaw.errors import ConfigError
from picoclaw.memory.index import MemoryIndex
from picoclaw.memory.index.chunks import DEFAULT_LIMIT, TokenLimit
from picoclaw.memory.index.fusion import RankWeights, Weights, reciprocal_rank, weighted
from picoclaw.memory.index.keyword_scores import Adjacency, in_context, with_neighbours, with_previous_entry
from picoclaw.memory.search.bm25 import NEIGHBOUR_WEIGHT
from picoclaw.memory.store import MemoryStore
from tests.stores import memory_store

# -- the pure rules ------------------------------------------------------------------------------------------

# Chunks 1, 2, 3 of one file in order; 7 stands alone. 2 and 3 are daily-note entries.
CHAIN = Adjacency(previous={2: 1, 3: 2}, next={1: 2, 2: 3}, notes=frozenset({2, 3}))


def test_a_chunk_gains_the_neighbour_weight_of_its_adjacent_chunks_scores() -> None:
    got = with_neighbours({1: 1.0, 2: 2.0, 3: 4.0, 7: 3.0}, CHAIN, NEIGHBOUR_WEIGHT)
    assert got == pytest.approx({1: 1.0 + 0.25 * 2.0, 2: 2.0 + 0.25 * (1.0 + 4.0), 3: 4.0 + 0.25 * 2.0, 7: 3.0})


def test_a_chunk_that_matches_nothing_is_not_found_through_its_neighbours() -> None:
    assert with_neighbours({1: 1.0, 3: 4.0}, CHAIN, NEIGHBOUR_WEIGHT) == pytest.approx({1: 1.0, 3: 4.0})
    assert with_neighbours({1: 1.0, 3: 4.0}, CHAIN, NEIGHBOUR_WEIGHT, ids=[2, 3]) == pytest.approx({3: 4.0})


def test_a_note_entry_is_scored_with_the_entry_before_it_a_memory_block_is_not() -> None:
    # 2 (a note) takes 1's strength even though it matched nothing itself; 1 is no note entry.
    assert with_previous_entry({1: 1.0, 3: 4.0}, CHAIN) == pytest.approx({1: 1.0, 2: 1.0, 3: 4.0})
    memory = Adjacency(CHAIN.previous, CHAIN.next, frozenset())
    assert with_previous_entry({1: 1.0, 3: 4.0}, memory) == {1: 1.0, 3: 4.0}


def test_in_context_is_previous_entry_then_neighbours() -> None:
    # 2: 0 + 1 (previous entry) = 1; 3: 4 + 0 = 4; then 2 + 0.25 × (1 + 4), 3 + 0.25 × 1.
    got = in_context({1: 1.0, 3: 4.0}, CHAIN, NEIGHBOUR_WEIGHT, [2, 3])
    assert got == pytest.approx({2: 1.0 + 0.25 * 5.0, 3: 4.0 + 0.25 * 1.0})


def test_the_weighted_fusion_is_normalised_and_min_score_drops_weak_chunks() -> None:
    weights = Weights(0.84, 0.16, 0.08)
    ranked = weighted({1: 1.0, 2: 0.2}, {1: 0.0, 2: 0.9, 3: 0.05}, weights)
    assert [i for _, i in ranked] == [2, 1]  # 3: 0.84 × 0.05 < 0.08
    assert ranked[1][0] == pytest.approx(0.16)  # keyword only, at full strength: just the text weight


def test_the_default_fusion_weights_and_min_score() -> None:
    # Chosen on LoCoMo dev (bench/retrieval_quality.py); a keyword-only hit of text score ≥ 0.5 still passes.
    settings = IndexConfig()
    assert (settings.vector_weight, settings.text_weight, settings.min_score) == (0.84, 0.16, 0.08)
    assert Weights(settings.vector_weight, settings.text_weight, 0).combine(0.0, 0.5) >= settings.min_score


def test_reciprocal_rank_fusion_sums_weighted_reciprocal_ranks() -> None:
    fused = dict((i, score) for score, i in reciprocal_rank([5, 6, 7], [7, 8], RankWeights(k=10, keyword=2.0)))
    assert fused == pytest.approx({5: 2 / 11, 6: 2 / 12, 7: 2 / 13 + 1 / 11, 8: 1 / 12})


def test_reciprocal_rank_fusion_order_and_ties() -> None:
    # Third by keywords and first by vectors (2/13 + 1/11) beats first by keywords alone (2/11).
    assert [i for _, i in reciprocal_rank([5, 6, 7], [7, 8], RankWeights(10, 2.0))] == [7, 5, 6, 8]
    # The keyword weight decides between a keyword-only and a vector-only chunk at the same place.
    assert [i for _, i in reciprocal_rank([5], [6], RankWeights(10, 2.0))] == [5, 6]
    assert [i for _, i in reciprocal_rank([5], [6], RankWeights(10, 0.5))] == [6, 5]
    # The same rank on each list, equal weights: a tie, which the newer chunk (higher id) wins.
    assert [i for _, i in reciprocal_rank([3], [4], RankWeights(10, 1.0))] == [4, 3]
    # Keyword weight 0: the vector list's order alone (keyword-only chunks trail with score 0).
    assert [i for _, i in reciprocal_rank([5, 6], [6, 8], RankWeights(10, 0.0))] == [6, 8, 5]
    assert reciprocal_rank([], [], RankWeights(10, 2.0)) == []


def test_a_smaller_k_lets_the_first_places_count_more() -> None:
    # 9 and 3 are first on one list each, 5 is fourth on both: with k = 1 the first places win (1/2 against
    # 2/5), with k = 60 being on both lists does (2/64 against 1/61).
    lists = ([9, 1, 2, 5], [3, 4, 6, 5])
    assert [i for _, i in reciprocal_rank(*lists, RankWeights(1, 1.0))][:3] == [9, 3, 5]
    assert [i for _, i in reciprocal_rank(*lists, RankWeights(60, 1.0))][0] == 5


def test_the_default_fusion_is_weighted_and_the_rrf_defaults() -> None:
    settings = IndexConfig()
    assert (settings.fusion, settings.rrf_k, settings.rrf_keyword_weight) == ("weighted", 10, 3.0)


def index_config(**index: object) -> IndexConfig:
    return parse_config({"memory": {"index": index}}, "config.json").memory.index


@pytest.mark.parametrize(("key", "value"), [
    ("fusion", "rrf"), ("fusion", "weighted"), ("rrf_k", 1), ("rrf_k", 1000), ("rrf_keyword_weight", 0.0),
    ("rrf_keyword_weight", 10.0),
])
def test_fusion_keys_take_values_within_their_bounds(key: str, value: object) -> None:
    assert getattr(index_config(**{key: value}), key) == value


@pytest.mark.parametrize(("key", "value", "says"), [
    ("fusion", "sum", "'weighted' or 'rrf'"), ("fusion", "RRF", "'weighted' or 'rrf'"),
    ("rrf_k", 0, "greater than or equal to 1"), ("rrf_k", 1001, "less than or equal to 1000"),
    ("rrf_k", 2.5, "integer"), ("rrf_keyword_weight", -0.1, "greater than or equal to 0"),
    ("rrf_keyword_weight", 10.5, "less than or equal to 10"),
])
def test_bad_fusion_values_are_a_clear_config_error(key: str, value: object, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        index_config(**{key: value})
    message = str(info.value)
    assert f"memory.index.{key}" in message and "config.json" in message and says in message, message


# -- through the index -----------------------------------------------------------------------------------------


class PinnedEmbedder:
    """A fake embedder: every query is axis 0; a passage holding one of `axes`' keys gets that axis, any
    other passage the last one (orthogonal to every query)."""

    def __init__(self, axes: dict[str, int], dims: int = 8):
        self.axes, self.dims = axes, dims
        self.key = self.label = f"pinned:{sorted(axes.items())}"

    def token_limit(self) -> TokenLimit:
        return DEFAULT_LIMIT

    async def embed(self, texts: list[str], *, query: bool = False) -> np.ndarray:
        rows = np.zeros((len(texts), self.dims), dtype=np.float32)
        for row, text in zip(rows, texts):
            row[0 if query else next((a for key, a in self.axes.items() if key in text), self.dims - 1)] = 1.0
        return rows

    def close(self) -> None:
        pass


@pytest.fixture
def open_index(tmp_path: Path) -> Iterator[Callable[..., MemoryIndex]]:
    """open_index(store, embedder=None, sources=("memory",), **settings): closed after the test."""
    made: list[MemoryIndex] = []

    def make(store: MemoryStore, embedder: PinnedEmbedder | None = None, sources: tuple[str, ...] = ("memory",),
             **settings: float) -> MemoryIndex:
        config = IndexConfig(enabled=True, sources=list(sources),  # type: ignore[arg-type]
                             embeddings=EmbeddingsConfig(provider="openai") if embedder else None, **settings)
        index = MemoryIndex(store, config, embedder, sessions_dir=tmp_path / "sessions")
        made.append(index)
        return index

    yield make
    for index in made:
        index.close()


def long_term(tmp_path: Path, entries: list[str]) -> MemoryStore:
    """A MEMORY.md with one `## date` block per entry, in order."""
    store = memory_store(tmp_path / "memory", UTC)
    blocks = [f"## 2024-01-{n:02d}\n{text}\n" for n, text in enumerate(entries, start=1)]
    store.rewrite_long_term("# Long-term memory\n\n" + "\n".join(blocks))
    return store


# A lone short block holding the query word outranks a longer one by BM25 alone; only the neighbour (also
# holding the word) lifts the longer one above it, as in the plain retriever.
CASES = {
    "en": (["Alice adopted a little puppy from the shelter downtown last spring.",
            "The puppy is called Rex.",
            "Tax forms are due in April.",
            "Bob saw a puppy.",
            "The bakery opens at seven."], "puppy"),
    "zh": (["小林春天从收容所领养了一只小狗。",
            "那只小狗叫旺财。",
            "四月要交税表。",
            "小王看到一只小狗。",
            "面包店七点开门。"], "小狗"),
}


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_keyword_search_ranks_a_match_next_to_another_match_first(
        tmp_path: Path, open_index: Callable[..., MemoryIndex], lang: str) -> None:
    entries, query = CASES[lang]
    store = long_term(tmp_path, entries)
    hits = [hit.block.text.split("\n")[1] for hit in open_index(store).search(query, 3)]
    assert hits[2] == entries[3], hits  # the lone match last, though BM25 alone would put it first
    assert set(hits[:2]) == {entries[0], entries[1]}


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_keyword_search_never_returns_a_memory_block_for_its_neighbour_alone(
        tmp_path: Path, open_index: Callable[..., MemoryIndex], lang: str) -> None:
    entries, query = CASES[lang]
    hits = open_index(long_term(tmp_path, entries)).search(query, 5)
    assert len(hits) == 3 and not any(entries[2] in hit.block.text for hit in hits)  # next to a match only


NOTES = {
    "en": ("Mel: Where did you travel last summer?", "Caroline: Kyoto, with my sister.", "travel last summer"),
    "zh": ("小美：你去年夏天去哪里旅行了？", "卡罗琳：京都，和我妹妹一起。", "去年夏天旅行"),
}


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_note_entry_is_found_through_the_entry_before_it(
        tmp_path: Path, open_index: Callable[..., MemoryIndex], lang: str) -> None:
    question, answer, query = NOTES[lang]
    store = memory_store(tmp_path / "memory", UTC)
    for hour, text in enumerate([question, answer, "Lunch was fine." if lang == "en" else "午饭不错。"], start=9):
        store.append_note(text, at=datetime(2024, 5, 2, hour, tzinfo=UTC))
    hits = open_index(store, sources=("notes",)).search(query, 5)
    found = [hit.block.text.split("\n")[1] for hit in hits]
    assert found[:2] == [question, answer] or found[:2] == [answer, question], found
    assert len(found) == 2  # the third entry follows a non-match: not found


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_hybrid_scores_are_the_weighted_sum_with_keywords_in_context(
        tmp_path: Path, open_index: Callable[..., MemoryIndex], lang: str) -> None:
    entries, query = CASES[lang]
    store = long_term(tmp_path, entries)
    # The query and the bakery share an axis: found by meaning alone, with no keyword score.
    bakery, tax = entries[4], entries[2]
    embedder = PinnedEmbedder({bakery: 0, tax: 1})
    hybrid = open_index(store, embedder)
    by_text = {hit.block.text.split("\n")[1]: hit.score for hit in hybrid.search(query, 5)}
    assert by_text[bakery] == pytest.approx(0.84)  # cosine 1 × 0.84, no keyword
    keyword = {hit.block.text.split("\n")[1]: hit.score for hit in open_index(store).search(query, 5)}
    for text, score in keyword.items():  # orthogonal vectors: only the text side counts
        assert by_text[text] == pytest.approx(0.16 * score)
    assert tax not in by_text  # neither side: below min_score
    assert list(by_text)[0] == bakery


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_strong_keyword_only_hit_survives_the_default_min_score(
        tmp_path: Path, open_index: Callable[..., MemoryIndex], lang: str) -> None:
    entries, query = CASES[lang]
    store = long_term(tmp_path, entries)
    hybrid = open_index(store, PinnedEmbedder({}))  # every passage orthogonal to the query
    found = {hit.block.text.split("\n")[1] for hit in hybrid.search(query, 5)}
    assert {entries[0], entries[1], entries[3]} <= found
    strict = open_index(store, PinnedEmbedder({}), min_score=0.2)
    assert strict.search(query, 5) == []  # 0.16 × a keyword score never reaches 0.2


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_rrf_hybrid_scores_are_the_reciprocal_ranks_of_the_keyword_and_vector_lists(
        tmp_path: Path, open_index: Callable[..., MemoryIndex], lang: str) -> None:
    entries, query = CASES[lang]
    store = long_term(tmp_path, entries)
    bakery = entries[4]
    hybrid = open_index(store, PinnedEmbedder({bakery: 0}), fusion="rrf", rrf_k=10, rrf_keyword_weight=2.0)
    got = {hit.block.text.split("\n")[1]: hit.score for hit in hybrid.search(query, 5)}
    keyword_order = [hit.block.text.split("\n")[1] for hit in open_index(store).search(query, 5)]
    # Vectors: the bakery first (cosine 1), then every other entry at cosine 0, the newer (later) first.
    vector_order = [bakery] + [text for text in reversed(entries) if text != bakery]
    expected = {text: (2.0 / (10 + keyword_order.index(text) + 1) if text in keyword_order else 0.0)
                + 1.0 / (10 + vector_order.index(text) + 1) for text in entries}
    assert got == pytest.approx(expected)
    assert list(got)[0] == keyword_order[0] and bakery in got  # the best by keywords first; the bakery by meaning


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_rrf_hybrid_with_no_keyword_match_ranks_by_meaning(
        tmp_path: Path, open_index: Callable[..., MemoryIndex], lang: str) -> None:
    entries, _ = CASES[lang]
    store = long_term(tmp_path, entries)
    tax = entries[2]
    hybrid = open_index(store, PinnedEmbedder({tax: 0}), fusion="rrf")
    query = "nothing in common" if lang == "en" else "毫不相干"
    hits = hybrid.search(query, 2)
    assert [hit.block.text.split("\n")[1] for hit in hits][0] == tax
    assert open_index(store).search(query, 2) == []  # keywords alone find nothing
