"""A CJK word outranks entries that share only one of its characters (护照 above 护士 and 照片), on every search
path: the keyword search as `picoclaw memory search` runs it, the index's keyword search (the keyword search's
ranking, and FTS5 / PostgreSQL BM25 where sessions are indexed too), hybrid, and a turn's memory selection;
on both storage backends for the index. An English case is the control: it never failed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path

import pytest

from picoclaw.config import IndexConfig
from picoclaw.memory.index import E5Embedder
from picoclaw.memory.search import Hit, MemorySearch, open_search, select_turn_memory
from picoclaw.memory.store import MemoryStore
from picoclaw.policy_schema import MemoryPolicy
from picoclaw.storage import FilesStorage, Storage
from tests.test_storage_index import TermEmbedder, storage  # noqa: F401  (storage: a fixture, used by name)

PASSPORT = "用户的护照号码是 E1234567，有效期到 2030 年。"
LIBRARY = "用户常去市图书馆借书，最近在读《三体》。"
NURSE = "用户的妹妹住在杭州，是一名护士，常上夜班。"  # 护 of 护照
PHOTOS = "用户的照片都存在 Google Photos 里，每月整理一次。"  # 照 of 护照
READING = "用户周末喜欢在家看书，也常去博物馆。"  # 书 and 馆 of 图书馆, never the word
GYM = "用户每周三去健身房，请了私人教练。"
PASSPORT_EN = "User's passport is in the top drawer of the desk."
SISTER_EN = "User's sister is a nurse; she passed her exams and often passes through Shanghai."

# Oldest first: the entries holding the words are the older ones, so nothing but relevance keeps them first
# (a newer entry taken for an update of an older one moves above it).
MEMORY = [("2025-03-02", PASSPORT), ("2025-03-20", LIBRARY), ("2025-04-11", NURSE), ("2025-05-20", PHOTOS),
          ("2025-06-08", READING), ("2025-07-15", GYM), ("2025-08-01", PASSPORT_EN), ("2025-09-09", SISTER_EN)]

# (query, the entries holding what it asks for, entries sharing only part of a word of it)
CASES = [
    pytest.param("护照", {PASSPORT}, {NURSE, PHOTOS}, id="zh-2-chars"),
    pytest.param("图书馆", {LIBRARY}, {READING}, id="zh-3-chars"),
    pytest.param("我的护照放在哪里了？", {PASSPORT}, {NURSE, PHOTOS}, id="zh-word-among-words"),
    pytest.param("我的护照号码", {PASSPORT}, {NURSE, PHOTOS}, id="zh-my-passport-number"),
    pytest.param("passport 护照号码", {PASSPORT}, {NURSE, PHOTOS}, id="mixed"),
    pytest.param("Where is my passport?", {PASSPORT_EN}, {SISTER_EN}, id="en-control"),
]

NO_PRIORS = MemoryPolicy(memory_recency_boost_percent=0, memory_access_boost_percent=0)


def filled(backend: Storage) -> MemoryStore:
    store = MemoryStore(backend.root / "memory", UTC, storage=backend)
    store.rewrite_long_term("# Memory\n\n" + "\n".join(f"## {day}\n{text}\n" for day, text in MEMORY))
    return store


def assert_words_first(hits: list[Hit], wanted: set[str], partial: set[str]) -> None:
    """Every entry holding the words is found, and ranks and scores above every entry sharing only a part."""
    order = [hit.block.text.split("\n")[1] for hit in hits]
    scores = dict(zip(order, (hit.score for hit in hits)))
    assert wanted <= scores.keys(), order
    for entry in partial & scores.keys():
        assert all(order.index(good) < order.index(entry) and scores[good] > scores[entry] for good in wanted), scores


@pytest.fixture(params=[MemoryPolicy(), NO_PRIORS], ids=["default-policy", "no-priors"])
def policy(request: pytest.FixtureRequest) -> MemoryPolicy:
    return request.param  # type: ignore[no-any-return]


def searcher(root: Path, store: MemoryStore, policy: MemoryPolicy, **index: object) -> MemorySearch:
    """The search a workspace builds (app.py → open_search), the index on when `index` says so."""
    embedder = TermEmbedder() if index.pop("hybrid", False) else None
    settings = IndexConfig(**index)  # type: ignore[arg-type]
    return open_search(settings, store, embedder, sessions_dir=root / "sessions", policy=lambda: policy)


@pytest.mark.parametrize(("query", "wanted", "partial"), CASES)
def test_memory_search_ranks_the_word_above_its_characters(tmp_path: Path, policy: MemoryPolicy, query: str,
                                                           wanted: set[str], partial: set[str]) -> None:
    store = filled(FilesStorage(tmp_path))
    search = searcher(tmp_path, store, policy)
    try:
        assert_words_first(search.search(query, 10, include_notes=True), wanted, partial)  # as the CLI asks
    finally:
        search.close()


@pytest.mark.parametrize(("query", "wanted", "partial"), CASES)
def test_a_turn_carries_the_entry_with_the_word_first(tmp_path: Path, policy: MemoryPolicy, query: str,
                                                      wanted: set[str], partial: set[str]) -> None:
    store = filled(FilesStorage(tmp_path))
    search = searcher(tmp_path, store, policy)
    try:
        memory = asyncio.run(select_turn_memory(search, store, policy, query, count_use=False))
    finally:
        search.close()
    assert memory.ranked
    assert_words_first(memory.blocks, wanted, partial)


@pytest.fixture(params=[("memory", "notes"), ("memory", "notes", "sessions")], ids=["keyword-search", "bm25"])
def sources(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """What the index covers: within the keyword search's files it ranks by the keyword search; with session
    transcripts too, by its own BM25 (FTS5 on SQLite, SQL on PostgreSQL)."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def indexed_store(storage: Storage) -> Iterator[tuple[Path, MemoryStore]]:  # noqa: F811
    yield storage.root, filled(storage)


@pytest.mark.parametrize("hybrid", [False, True], ids=["keyword", "hybrid"])
@pytest.mark.parametrize(("query", "wanted", "partial"), CASES)
def test_the_index_ranks_the_word_above_its_characters(indexed_store: tuple[Path, MemoryStore],
                                                        sources: tuple[str, ...], hybrid: bool, query: str,
                                                        wanted: set[str], partial: set[str]) -> None:
    root, store = indexed_store
    search = searcher(root, store, MemoryPolicy(), enabled=True, sources=list(sources), hybrid=hybrid)
    try:
        assert_words_first(search.search(query, 10, include_notes=True), wanted, partial)
        memory = asyncio.run(select_turn_memory(search, store, MemoryPolicy(), query, count_use=False))
        assert_words_first(memory.blocks, wanted, partial)
    finally:
        search.close()


@pytest.mark.local
@pytest.mark.parametrize(("query", "wanted", "partial"), CASES)
def test_hybrid_with_the_local_model_ranks_the_word_above_its_characters(tmp_path: Path, query: str,
                                                                         wanted: set[str], partial: set[str]) -> None:
    # A real multilingual model on the vector side (the toy embedder above only proves the plumbing).
    store = filled(FilesStorage(tmp_path))
    embedder = E5Embedder()
    search = open_search(IndexConfig(enabled=True), store, embedder, sessions_dir=tmp_path / "sessions",
                         policy=MemoryPolicy)
    try:
        assert_words_first(search.search(query, 10, include_notes=True), wanted, partial)
    finally:
        search.close()
        embedder.close()
