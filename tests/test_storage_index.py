"""The memory index's contract on both backends: SQLite ("files") and the pgvector chunk table ("postgres").

The same tests run on each: keyword and hybrid search in English and Chinese, a file replaced or deleted,
a reindex, and per-user scopes that never see each other's chunks.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from picoclaw.config import IndexConfig
from picoclaw.memory.index import MemoryIndex
from picoclaw.memory.index.chunks import DEFAULT_LIMIT, TokenLimit
from picoclaw.memory.index.pg_index import TableMemoryIndex, index_for
from picoclaw.memory.search.blocks import Hit
from picoclaw.memory.search.indexed import IndexedSearch
from picoclaw.memory.search.keyword import KeywordSearch
from picoclaw.memory.search.reranking import RerankedSearch
from picoclaw.memory.search.turn_memory import block_key, select_turn_memory
from picoclaw.memory.store import MemoryStore
from picoclaw.memory.terms import terms
from picoclaw.policy_schema import MemoryPolicy
from picoclaw.storage import FilesStorage, Storage
from picoclaw.transcripts.session_store import SessionStore, StoredMessage

ENTRIES = [
    "我养了一只柯基，叫豆豆，最喜欢在公园里追球。",
    "My dog Bob loves chasing balls in the park.",
    "Fixed handleWebSocketReconnect not retrying on ECONNREFUSED; see ticket OPS-1234.",
    "周五下午三点和王芳开季度预算评审会。",
]


class TermEmbedder:
    """Deterministic vectors: each term hashed into one of 32 dimensions, so shared words mean nearness."""

    key = "test-terms-32"
    label = "test terms (32)"

    def token_limit(self) -> TokenLimit:
        return DEFAULT_LIMIT

    async def embed(self, texts: list[str], *, query: bool = False) -> np.ndarray:
        rows = np.zeros((len(texts), 32), dtype=np.float32)
        for n, text in enumerate(texts):
            rows[n, 31] = 0.01  # never all zero: a zero vector has no cosine
            for term in terms(text):
                rows[n, int(hashlib.sha256(term.encode()).hexdigest(), 16) % 31] += 1.0
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    def close(self) -> None:
        pass


@pytest.fixture(params=["files", "postgres"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    """The backend of a workspace at `tmp_path` (files: the index keeps its SQLite file)."""
    if request.param == "files":
        yield FilesStorage(tmp_path)
        return
    from picoclaw.storage.postgres.storage import PostgresStorage

    opened = PostgresStorage(tmp_path, request.getfixturevalue("postgres_dsn"), pool_size=4)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def open_index(storage: Storage) -> Iterator[Callable[..., tuple[MemoryStore, MemoryIndex]]]:
    """open_index(scope, hybrid=False): a store under `scope` (relative to the workspace) and its index."""
    made: list[MemoryIndex] = []

    def make(scope: str = "", hybrid: bool = False, sources: tuple[str, ...] = ("memory", "notes")
             ) -> tuple[MemoryStore, MemoryIndex]:
        store = MemoryStore(storage.root / scope / "memory", UTC, storage=storage)
        settings = IndexConfig(enabled=True, sources=list(sources))  # type: ignore[arg-type]
        index = index_for(store, settings, TermEmbedder() if hybrid else None,
                          sessions_dir=storage.root / scope / "sessions")
        store.on_change(index.mark_changed)
        made.append(index)
        return store, index

    yield make
    for index in made:
        index.close()


def _filled(store: MemoryStore) -> None:
    for entry in ENTRIES:
        store.append_long_term(entry)
    store.append_note("Dentist appointment on Thursday, 看牙医", at=datetime(2024, 5, 2, 9, 30, tzinfo=UTC))


def test_the_backend_decides_which_index_is_used(open_index: Callable[..., tuple[MemoryStore, MemoryIndex]],
                                                 request: pytest.FixtureRequest) -> None:
    _, index = open_index()
    on_postgres = isinstance(index, TableMemoryIndex)
    assert on_postgres == ("postgres" in request.node.callspec.id)


@pytest.mark.parametrize("hybrid", [False, True], ids=["keyword", "hybrid"])
def test_english_and_chinese_text_is_found(open_index: Callable[..., tuple[MemoryStore, MemoryIndex]],
                                           hybrid: bool) -> None:
    store, index = open_index(hybrid=hybrid)
    _filled(store)
    assert "豆豆" in index.search("柯基豆豆", 1)[0].block.text
    assert "Bob" in index.search("dog chasing balls", 1)[0].block.text
    assert "OPS-1234" in index.search("ECONNREFUSED", 1)[0].block.text
    assert "看牙医" in index.search("看牙医", 3, frozenset({"notes"}))[0].block.text
    assert "王芳" in index.search("王芳预算", 1)[0].block.text
    status = index.status()
    assert status.files == 2 and status.chunks >= 5
    assert status.vectors == (status.chunks if hybrid else 0)


def _written_elsewhere(store: MemoryStore, text: str | None) -> None:
    """MEMORY.md changed (None: removed) by someone else than `store`, which tells its index nothing: on files a
    hand edit of the file, on PostgreSQL another machine's write of the row."""
    if store.storage.backend == "files":
        store.long_term_path.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            store.long_term_path.unlink()
        else:
            store.long_term_path.write_text(text, encoding="utf-8")
    elif text is None:
        store.documents.delete("memory/MEMORY.md")
    else:
        store.documents.replace("memory/MEMORY.md", text)


def test_a_replaced_or_deleted_file_is_forgotten(open_index: Callable[..., tuple[MemoryStore, MemoryIndex]]) -> None:
    store, index = open_index()
    _filled(store)
    assert index.search("柯基", 3)
    text = store.read_long_term()
    text = text.replace("一只柯基，叫豆豆", "一只猫，叫咪咪").replace("My dog Bob", "I moved to Lisbon; my dog Bob")
    _written_elsewhere(store, text)
    assert not index.search("柯基", 3)
    assert "咪咪" in index.search("咪咪", 1)[0].block.text
    assert "Lisbon" in index.search("Lisbon", 1)[0].block.text
    _written_elsewhere(store, None)
    assert not index.search("Lisbon", 3)
    assert index.status().files == 1  # the note is left


def test_reindex_rebuilds_the_same_chunks(open_index: Callable[..., tuple[MemoryStore, MemoryIndex]]) -> None:
    store, index = open_index(hybrid=True)
    _filled(store)
    before = [hit.block.text for hit in index.search("豆豆 park", 5)]
    chunks = index.status().chunks
    report = index.reindex()
    assert len(report.files_changed) == 2 and report.embedded == 0  # cached vectors reused
    assert index.status().chunks == chunks
    assert [hit.block.text for hit in index.search("豆豆 park", 5)] == before


def test_a_users_chunks_are_never_found_from_another_scope(
        open_index: Callable[..., tuple[MemoryStore, MemoryIndex]]) -> None:
    alice, alice_index = open_index("users/alice", hybrid=True)
    bob, bob_index = open_index("users/bob", hybrid=True)
    alice.append_long_term("Alice's locker code is 4711, 储物柜密码")
    bob.append_long_term("Bob keeps his bike in the garage, 自行车在车库")
    assert "4711" in alice_index.search("locker code 储物柜", 3)[0].block.text
    assert all("4711" not in hit.block.text for hit in bob_index.search("locker code 储物柜 4711", 10))
    assert all("garage" not in hit.block.text for hit in alice_index.search("bike garage 自行车", 10))
    alice_index.reindex()
    assert bob_index.status().chunks == 1 and alice_index.status().chunks == 1


def test_transcripts_are_indexed_where_the_backend_keeps_them(
        open_index: Callable[..., tuple[MemoryStore, MemoryIndex]], storage: Storage) -> None:
    _, index = open_index(sources=("memory", "sessions"))
    sessions = SessionStore(storage.root / "sessions", storage=storage)
    session = sessions.load("telegram:42")
    sessions.append_messages(session, [StoredMessage(0, {"role": "user", "content": "我的护照号码以 E12 开头"}),
                                       StoredMessage(0, {"role": "assistant", "content": "Noted: passport E12."})])
    hit = index.search("护照号码", 1, frozenset({"sessions"}))[0]
    assert "E12" in hit.block.text and hit.block.path.name == "telegram%3A42.jsonl"
    sessions.append_messages(session, [StoredMessage(0, {"role": "user", "content": "The gate code is 9090"})])
    assert "9090" in index.search("gate code", 1, frozenset({"sessions"}))[0].block.text
    assert index.status().stale == []
    archived = sessions.archive("telegram:42")  # /new: the transcript moves to the archive, found there
    assert archived is not None and index.status().stale == sorted(["sessions/telegram%3A42.jsonl",
                                                                      f"sessions/archive/{archived.name}"])
    hit = index.search("护照号码", 1, frozenset({"sessions"}))[0]
    assert hit.block.path == archived and index.status().files == 1


def test_postgres_builds_the_vector_index_once_the_vectors_are_in_and_prunes_unused_ones(
        postgres_dsn: str, tmp_path: Path) -> None:
    import psycopg

    from picoclaw.storage.postgres.index import PostgresIndexTable
    from picoclaw.storage.postgres.storage import PostgresStorage

    storage = PostgresStorage(tmp_path, postgres_dsn, pool_size=2)
    store = MemoryStore(tmp_path / "memory", UTC, storage=storage)
    index = index_for(store, IndexConfig(enabled=True, sources=["memory"]), TermEmbedder(),
                      sessions_dir=tmp_path / "sessions")
    try:
        _filled(store)
        assert "豆豆" in index.search("柯基", 1)[0].block.text
        with psycopg.connect(postgres_dsn) as conn:
            built = conn.execute("select indexdef from pg_indexes where indexname = 'index_chunks_hnsw_32'").fetchone()
            assert built is not None and "hnsw" in built[0]
            _written_elsewhere(store, "## 2024-05-01\nA new text: 新的内容\n")
            assert "新的内容" in index.search("新的内容", 1)[0].block.text
            cached = conn.execute("select count(*) from index_embeddings").fetchone()
            PostgresIndexTable(storage.pool, postgres_dsn, "").finish_embedding(TermEmbedder.key, keep_unused=1)
            kept = conn.execute("select count(*) from index_embeddings").fetchone()
        assert cached is not None and cached[0] == len(ENTRIES) + 1  # the old texts' vectors stay cached …
        assert kept == (2,)  # … up to keep_unused of them besides the one in use
    finally:
        index.close()
        storage.close()


def test_a_large_memory_is_written_in_bulk_and_searched(open_index: Callable[..., tuple[MemoryStore, MemoryIndex]]
                                                        ) -> None:
    store, index = open_index(hybrid=True)
    entries = [f"## 2024-05-{1 + n % 28:02d}\nentry {n}: {'柯基豆豆在公园' if n == 777 else '小猫在家'} word{n}\n"
               for n in range(1500)]  # past the bulk-write threshold, where PostgreSQL vacuums and analyses
    _written_elsewhere(store, "\n".join(entries))
    assert "entry 777:" in index.search("柯基 公园", 1)[0].block.text
    assert "entry 1234:" in index.search("word1234", 1)[0].block.text
    status = index.status()
    assert status.chunks == 1500 and status.vectors == 1500


class FlakyEmbedder(TermEmbedder):
    """TermEmbedder that fails while `down` is set."""

    down = True

    async def embed(self, texts: list[str], *, query: bool = False) -> np.ndarray:
        from picoclaw.memory.index.embedders import EmbeddingUnavailable

        if self.down:
            raise EmbeddingUnavailable("connection refused (test)")
        return await super().embed(texts, query=query)


def test_an_embedding_failure_is_reported_until_a_backfill_succeeds(storage: Storage) -> None:
    from freezegun import freeze_time

    store = MemoryStore(storage.root / "memory", UTC, storage=storage)
    embedder = FlakyEmbedder()
    index = index_for(store, IndexConfig(enabled=True, sources=["memory"]), embedder,
                      sessions_dir=storage.root / "sessions")
    store.on_change(index.mark_changed)
    try:
        with freeze_time("2026-11-26 12:00:00") as frozen:
            _filled(store)
            assert "豆豆" in index.search("柯基", 1)[0].block.text  # from keywords while the embedder is down
            status = index.status()
            assert status.vectors == 0 and status.warning is not None and "connection refused" in status.warning
            embedder.down = False
            frozen.tick(3600)  # past the pause after a failure
            assert "Bob" in index.search("dog chasing balls", 1)[0].block.text
            status = index.status()
            assert status.vectors == status.chunks and status.warning is None
            assert "王芳" in index.search("王芳预算", 1)[0].block.text  # settled: searching again changes nothing
            assert index.status() == status
    finally:
        index.close()


@pytest.mark.parametrize("query", ["dog chasing balls", "王芳的预算评审会"])
def test_what_the_score_floor_drops_is_told_to_the_turns_record(
        open_index: Callable[..., tuple[MemoryStore, MemoryIndex]], query: str) -> None:
    store, index = open_index(hybrid=True)
    _filled(store)
    index.weights = replace(index.weights, min_score=0.0)
    ranked = asyncio.run(index.search_async(query, 4))
    assert len(ranked) == 4 and ranked[1].score > ranked[2].score
    floor = (ranked[1].score + ranked[2].score) / 2  # between the second result and the third
    index.weights = replace(index.weights, min_score=floor)

    floored: list[Hit] = []
    kept = asyncio.run(index.search_async(query, 4, below_floor=floored))
    assert [hit.block.text for hit in kept] == [hit.block.text for hit in ranked[:2]]
    assert [hit.block.text for hit in floored] == [hit.block.text for hit in ranked[2:]]
    assert all(hit.score < floor for hit in floored)

    # Through the turn's search (re-ranked by standing), the turn's record names them with their reason.
    policy = MemoryPolicy(retrieve_limit=4, recent_days=0)
    search = RerankedSearch(IndexedSearch(KeywordSearch(store), index), store, lambda: policy)
    memory = asyncio.run(select_turn_memory(search, store, policy, query))
    why = memory.explained(store.memory_dir.parent, policy, "hybrid")
    below = [item["text"] for item in why["left_out"] if item["reason"] == "below_floor"]
    assert below == [hit.block.text[:len(item)] for hit, item in zip(floored, below)] and len(below) == 2
    assert not {block_key(hit.block) for hit in memory.blocks} & {block_key(hit.block) for hit in floored}
