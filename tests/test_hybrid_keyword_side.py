"""Hybrid's keyword side is the keyword search's own ranking (KeywordSearch, through MemoryIndex's
`keywords`) wherever it covers the sources searched, so whatever improves keyword ranking improves hybrid;
FTS5's BM25 answers only beyond it (session files). English and Chinese."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from picoclaw.config import EmbeddingsConfig, IndexConfig
from picoclaw.memory.index import MemoryIndex
from picoclaw.memory.index.chunks import TokenLimit
from picoclaw.memory.index.memory_index import KeywordRanking
from picoclaw.memory.search import Hit, KeywordSearch, RerankedSearch, open_search
from picoclaw.memory.search.indexed import index_of
from picoclaw.memory.store import MemoryStore
from picoclaw.policy_schema import MemoryPolicy
from tests.stores import memory_store
from tests.test_fusion import CASES, PinnedEmbedder, long_term


@dataclass
class ScriptedKeywords:
    """A keyword ranking that answers with the keyword search's hits in an order the test picks, and
    records what it was asked."""

    search_of: KeywordSearch
    order: list[int] | None = None  # positions in the real ranking, in the order to return them
    calls: list[tuple[str, int, bool]] = field(default_factory=list)

    def search(self, query: str, limit: int, *, include_notes: bool = False) -> list[Hit]:
        self.calls.append((query, limit, include_notes))
        hits = self.search_of.search(query, limit, include_notes=include_notes)
        return hits if self.order is None else [hits[n] for n in self.order]


@pytest.fixture
def make_index(tmp_path: Path) -> Iterator[Callable[..., MemoryIndex]]:
    made: list[MemoryIndex] = []

    def make(store: MemoryStore, embedder: PinnedEmbedder | None, keywords: KeywordRanking | None,
             sources: tuple[str, ...] = ("memory",), **settings: object) -> MemoryIndex:
        config = IndexConfig(enabled=True, sources=list(sources),
                             embeddings=EmbeddingsConfig(provider="openai") if embedder else None, **settings)
        made.append(MemoryIndex(store, config, embedder, sessions_dir=tmp_path / "sessions", keywords=keywords))
        return made[-1]

    yield make
    for index in made:
        index.close()


def lines(hits: list[Hit]) -> list[str]:
    return [hit.block.text.split("\n")[1] for hit in hits]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_open_search_gives_the_index_the_keyword_search_as_its_keyword_side(tmp_path: Path, lang: str) -> None:
    entries, query = CASES[lang]
    store = long_term(tmp_path, entries)
    search = open_search(IndexConfig(enabled=True, sources=["memory", "notes"]), store, None,
                         sessions_dir=tmp_path / "sessions", policy=MemoryPolicy)
    try:
        index = index_of(search)
        assert index is not None and isinstance(index.keywords, KeywordSearch)
        # The index's answer before the standing re-order (tests/test_standing.py) is the keyword search's.
        assert isinstance(search, RerankedSearch)
        assert lines(search.inner.search(query, 5)) == lines(KeywordSearch(store).search(query, 5))
    finally:
        search.close()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_weighted_hybrid_scores_the_keyword_side_relative_to_the_best_keyword_hit(
        tmp_path: Path, make_index: Callable[..., MemoryIndex], lang: str) -> None:
    entries, query = CASES[lang]
    store = long_term(tmp_path, entries)
    plain = {line: hit.score for line, hit in zip(lines(KeywordSearch(store).search(query, 5)),
                                                   KeywordSearch(store).search(query, 5))}
    top = max(plain.values())
    hybrid = make_index(store, PinnedEmbedder({}), KeywordSearch(store))  # every vector orthogonal to the query
    got = {hit.block.text.split("\n")[1]: hit.score for hit in hybrid.search(query, 5)}
    assert got == pytest.approx({line: 0.16 * score / top for line, score in plain.items()})


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_reordered_keyword_list_carries_into_rrf_hybrid(
        tmp_path: Path, make_index: Callable[..., MemoryIndex], lang: str) -> None:
    entries, query = CASES[lang]
    store = long_term(tmp_path, entries)
    real = lines(KeywordSearch(store).search(query, 5))
    assert len(real) == 3
    reordered = ScriptedKeywords(KeywordSearch(store), order=[2, 1, 0])
    hybrid = make_index(store, PinnedEmbedder({}), reordered, fusion="rrf", rrf_keyword_weight=10.0)
    assert lines(hybrid.search(query, 3)) == real[::-1]
    assert reordered.calls and all(include is False for _, _, include in reordered.calls)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_keyword_search_is_not_asked_beyond_its_sources(
        tmp_path: Path, make_index: Callable[..., MemoryIndex], lang: str) -> None:
    entries, query = CASES[lang]
    store = long_term(tmp_path, entries)
    keywords = ScriptedKeywords(KeywordSearch(store))
    index = make_index(store, PinnedEmbedder({}), keywords, sources=("memory", "sessions"))
    assert set(lines(index.search(query, 5))) == set(lines(KeywordSearch(store).search(query, 5)))
    assert keywords.calls == []  # sessions searched too: FTS5's BM25 ranks, the keyword search cannot
    index.search(query, 5, frozenset({"memory"}))
    assert [(q, include) for q, _, include in keywords.calls] == [(query, False)]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_notes_are_searched_with_the_keyword_search_too(
        tmp_path: Path, make_index: Callable[..., MemoryIndex], lang: str) -> None:
    store = memory_store(tmp_path / "memory", UTC)
    texts = (["Mel: Where did you travel last summer?", "Caroline: Kyoto, with my sister.", "Lunch was fine."]
             if lang == "en" else ["小美：你去年夏天去哪里旅行了？", "卡罗琳：京都，和我妹妹一起。", "午饭不错。"])
    for hour, text in enumerate(texts, start=9):
        store.append_note(text, at=datetime(2024, 5, 2, hour, tzinfo=UTC))
    query = "travel last summer" if lang == "en" else "去年夏天旅行"
    keywords = ScriptedKeywords(KeywordSearch(store))
    index = make_index(store, PinnedEmbedder({}), keywords, sources=("notes",))
    got = lines(index.search(query, 5))
    assert got == lines(KeywordSearch(store).search(query, 5, include_notes=True))
    assert keywords.calls[-1][2] is True


class TinyEmbedder(PinnedEmbedder):
    """Chunks of at most 12 tokens: a longer block is several chunks."""

    def token_limit(self) -> TokenLimit:
        return TokenLimit("tiny", 12)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_chunk_cut_from_a_found_block_has_the_blocks_keyword_score(
        tmp_path: Path, make_index: Callable[..., MemoryIndex], lang: str) -> None:
    long_entry = ("The puppy sleeps a lot.\nIt eats twice a day.\nIt likes the park.\nIt barks at the mailman."
                  if lang == "en" else "那只小狗很爱睡觉。\n它一天吃两顿。\n它喜欢去公园。\n它会冲着邮递员叫。")
    query = "puppy" if lang == "en" else "小狗"
    store = long_term(tmp_path, [long_entry, "Nothing here." if lang == "en" else "这里没有别的。"])
    index = make_index(store, TinyEmbedder({}), KeywordSearch(store))
    hits = index.search(query, 10)
    assert len(hits) > 1 and all(hit.block.heading == "## 2024-01-01" for hit in hits)
    assert [hit.score for hit in hits] == pytest.approx([0.16] * len(hits))  # the only block found: the best


def test_an_index_file_made_before_the_lines_index_gains_it_and_keeps_its_chunks(
        tmp_path: Path, make_index: Callable[..., MemoryIndex]) -> None:
    entries, query = CASES["zh"]
    store = long_term(tmp_path, entries)
    index = make_index(store, None, KeywordSearch(store))
    index.sync()
    index.close()
    with sqlite3.connect(index.path) as conn:  # as picoclaw before it left the file
        conn.execute("DROP INDEX chunks_lines")
        conn.execute("INSERT INTO meta(key, value) VALUES ('kept', '留着')")  # gone if the file were rebuilt
        chunks = conn.execute("SELECT id FROM chunks ORDER BY id").fetchall()
    again = make_index(store, None, KeywordSearch(store))
    assert lines(again.search(query, 5)) == lines(KeywordSearch(store).search(query, 5))
    with sqlite3.connect(again.path) as conn:
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'chunks_lines'").fetchone()
        assert conn.execute("SELECT value FROM meta WHERE key = 'kept'").fetchone() == ("留着",)
        assert conn.execute("SELECT id FROM chunks ORDER BY id").fetchall() == chunks and len(chunks) == len(entries)
