"""The optional memory index: chunking, sync, keyword/vector/hybrid search, recovery, and its wiring.

Embeddings come from the fake OpenAI-compatible server (`fake_openai`) through the real `openai` client;
its request log shows exactly which texts were embedded. The real local model is in test_index_local.py.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time

from picoclaw.agent.context import ContextBuilder
from picoclaw.app import App, build_embedder
from picoclaw.cli import main
from picoclaw.config import Config, parse_config
from picoclaw.errors import ConfigError
from picoclaw.memory.index import MemoryIndex
from picoclaw.memory.index.chunks import DEFAULT_LIMIT, TokenLimit, markdown_chunks, session_chunks
from picoclaw.memory.index.outage import BACKOFF_FIRST
from picoclaw.memory.index.schema import SCHEMA_VERSION
from picoclaw.memory.search import IndexedSearch, KeywordSearch, RerankedSearch, split_blocks
from picoclaw.memory.store import MemoryStore
from picoclaw.memory.workspace import Workspace
from picoclaw.tools.registry import build_tools
from tests.fakes import FakeOpenAIServer
from tests.homes import edit_config
from tests.stores import memory_store

KEY = "sk-index-test-0123456789"
FAST_RETRY = {"retry-after-ms": "5"}
UTC = UTC

ENTRIES = [
    "我养了一只柯基，叫豆豆，最喜欢在公园里追球。",
    "My dog Bob loves chasing balls in the park.",
    "Fixed handleWebSocketReconnect not retrying on ECONNREFUSED; see ticket OPS-1234.",
    "周五下午三点和王芳开季度预算评审会。",
]


def make_config(server: FakeOpenAIServer | None = None, **index: Any) -> Config:
    """A config with the index on; embeddings from `server` when given, keyword-only otherwise."""
    data: dict[str, Any] = {"memory": {"index": {"enabled": True, **index}}}
    if server is not None:
        data["providers"] = {"openai": {"api_key": KEY, "api_base": server.base_url}}
        data["memory"]["index"].setdefault("embeddings", {"provider": "openai", "model": "text-embedding-3-small"})
    return parse_config(data, "test-config.json")


@pytest.fixture
def store(tmp_path: Path) -> MemoryStore:
    store = memory_store(tmp_path / "memory", UTC)
    for entry in ENTRIES:
        store.append_long_term(entry)
    store.append_note("Dentist appointment on Thursday, 看牙医", at=datetime(2024, 5, 2, 9, 30, tzinfo=UTC))
    return store


@pytest.fixture
def open_index(store: MemoryStore) -> Iterator[Callable[..., MemoryIndex]]:
    """Make indexes over `store` (closed after the test): open_index(config)."""
    made: list[MemoryIndex] = []

    def make(config: Config, on: MemoryStore = store) -> MemoryIndex:
        index = MemoryIndex(on, config.memory.index, build_embedder(config),
                            sessions_dir=on.memory_dir.parent / "sessions")
        on.on_change(index.mark_changed)
        made.append(index)
        return index

    yield make
    for index in made:
        index.close()
        if index.embedder is not None:
            index.embedder.close()


def texts(hits: list[Any]) -> list[str]:
    return [hit.block.text for hit in hits]


def embedded_inputs(server: FakeOpenAIServer) -> list[list[str]]:
    return [list(request["input"]) for request in server.embedding_requests()]


def lines_of(path: Path, start: int, end: int) -> str:
    return "\n".join(path.read_text(encoding="utf-8").split("\n")[start - 1:end])


# -- chunks ------------------------------------------------------------------------------------------------


def test_chunks_are_the_stores_blocks_with_their_date_headings(store: MemoryStore) -> None:
    text = store.long_term_path.read_text(encoding="utf-8")
    chunks = markdown_chunks(text, store.long_term_path, DEFAULT_LIMIT)
    blocks = split_blocks(text, store.long_term_path)
    assert [(c.start_line, c.end_line, c.text) for c in chunks] == [(b.start_line, b.end_line, b.text) for b in blocks]
    assert all(c.text.startswith("## ") and c.heading == c.text.split("\n")[0] for c in chunks)
    assert any("柯基" in c.text for c in chunks) and any("Bob" in c.text for c in chunks)


def test_a_note_files_title_line_is_not_a_chunk(store: MemoryStore) -> None:
    path = store.note_files()[0]
    chunks = markdown_chunks(path.read_text(encoding="utf-8"), path, DEFAULT_LIMIT)
    assert [c.text for c in chunks] == ["## 09:30\nDentist appointment on Thursday, 看牙医"]


@pytest.mark.parametrize("sentence", ["The quarterly roadmap review covers hiring and budgets. ",
                                      "季度路线图评审涉及招聘和预算。"])
def test_a_block_longer_than_the_limit_is_cut_into_pieces_that_keep_the_heading(
        tmp_path: Path, sentence: str) -> None:
    limit = TokenLimit("test", 40)
    lines = [sentence * 3 for _ in range(12)] + [sentence * 30]  # the last line alone is over the limit
    text = "# Title\n\n## 2024-05-01\n" + "\n".join(lines) + "\n\n## 2024-05-02\nshort\n"
    path = tmp_path / "MEMORY.md"
    path.write_text(text, encoding="utf-8")
    chunks = markdown_chunks(text, path, limit)
    long_pieces = [c for c in chunks if c.heading == "## 2024-05-01"]
    assert len(long_pieces) > 5
    assert all(limit.count(c.text) <= limit.limit for c in chunks)
    assert all(c.text.startswith("## 2024-05-01\n") for c in long_pieces)
    assert long_pieces[0].start_line == 3 and long_pieces[-1].end_line == 16
    # Every piece's body is text of its own lines, and together the pieces hold the whole block.
    for piece in long_pieces:
        body = piece.text.split("\n", 1)[1]
        assert all(part in lines_of(path, piece.start_line, piece.end_line) for part in body.split("\n"))
    assert "".join(p.text.split("\n", 1)[1].replace("\n", "") for p in long_pieces) == "".join(lines)
    assert chunks[-1].text == "## 2024-05-02\nshort" and chunks[-1].start_line == 18


def test_session_chunks_are_turns_with_jsonl_line_ranges(tmp_path: Path) -> None:
    records = [
        {"type": "message", "id": 1, "message": {"role": "user", "content": "我的狗叫什么？"}},
        {"type": "message", "id": 2, "message": {"role": "assistant", "content": None,
                                                 "tool_calls": [{"id": "c1", "type": "function"}]}},
        {"type": "message", "id": 3, "message": {"role": "tool", "content": "1 match", "tool_call_id": "c1"}},
        {"type": "message", "id": 4, "message": {"role": "assistant", "content": "它叫豆豆 (Doudou)."}},
        {"type": "compaction", "through": 4, "summary": "s"},
        {"type": "message", "id": 5, "message": {"role": "user", "content": "Remind me about the dentist"}},
    ]
    text = "\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n{torn"
    chunks = session_chunks(text, tmp_path / "s.jsonl", DEFAULT_LIMIT)
    assert [(c.start_line, c.end_line, c.text) for c in chunks] == [
        (1, 4, "user: 我的狗叫什么？\nassistant: 它叫豆豆 (Doudou)."),
        (6, 6, "user: Remind me about the dentist"),
    ]


# -- keyword search ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("query", "expected"), [
    ("柯基", "柯基"), ("豆豆", "豆豆"), ("预算", "预算"), ("王芳", "王芳"),  # two-character Chinese words
    ("牙医", "看牙医"), ("dog", "Bob"), ("ECONNREFUSED", "ECONNREFUSED"), ("OPS-1234", "OPS-1234"),
    ("handleWebSocketReconnect", "handleWebSocketReconnect"), ("dentist Thursday", "Dentist"),
])
def test_keyword_search_finds_english_chinese_and_identifiers(
        open_index: Callable[..., MemoryIndex], query: str, expected: str) -> None:
    hits = open_index(make_config()).search(query, 5)
    assert hits and expected in hits[0].block.text
    assert 0 < hits[0].score <= 1


def test_hits_carry_the_file_and_the_line_range_of_their_text(
        store: MemoryStore, open_index: Callable[..., MemoryIndex]) -> None:
    hits = open_index(make_config()).search("柯基 Bob 牙医 ECONNREFUSED 预算", 10)
    assert len(hits) == 5
    for hit in hits:
        assert hit.block.path.is_absolute() and hit.block.path.exists()
        assert lines_of(hit.block.path, hit.block.start_line, hit.block.end_line) == hit.block.text


def test_bm25_becomes_a_0_to_1_score_in_bm25_order(
        store: MemoryStore, open_index: Callable[..., MemoryIndex]) -> None:
    for n in range(8):
        store.append_long_term(f"dog walk number {n}" + " dog" * n + (" park" if n % 3 == 0 else ""))
    index = open_index(make_config())
    hits = index.search("park dog", 20)  # no chunk holds the phrase "park dog": BM25 alone decides
    assert len(hits) == 9 and all(0 < h.score < 1 for h in hits)
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)
    conn = sqlite3.connect(index.path)
    try:
        raw = dict(conn.execute("SELECT c.id, -bm25(chunks_fts) FROM chunks_fts JOIN chunks c "
                                "ON c.id = chunks_fts.rowid WHERE chunks_fts MATCH '\"dog\" OR \"park\"'"))
        chunks = conn.execute("SELECT id, text FROM chunks WHERE path = 'memory/MEMORY.md' ORDER BY id").fetchall()
    finally:
        conn.close()
    # BM25 plus a quarter of the adjacent blocks' BM25, as the plain retriever ranks MEMORY.md blocks.
    in_context = {i: raw[i] + 0.25 * (raw.get(i - 1, 0.0) + raw.get(i + 1, 0.0)) for i, _ in chunks if i in raw}
    text_of = dict(chunks)
    assert [text_of[i] for i in sorted(in_context, key=in_context.__getitem__, reverse=True)] == texts(hits)


def test_queries_without_terms_and_bad_limits_find_nothing(open_index: Callable[..., MemoryIndex]) -> None:
    index = open_index(make_config())
    assert index.search("what is it?", 5) == []
    assert index.search("   ", 5) == []
    assert index.search("dog", 0) == []
    assert index.search("zebra 斑马", 5) == []


# -- sync ------------------------------------------------------------------------------------------------


def test_incremental_sync_embeds_only_changed_chunks(
        store: MemoryStore, open_index: Callable[..., MemoryIndex], fake_openai: FakeOpenAIServer) -> None:
    index = open_index(make_config(fake_openai))
    index.search("dog", 3)
    first = embedded_inputs(fake_openai)
    assert sorted(first[0]) == sorted(c for c in _all_chunk_texts(index))
    assert first[1:] == [["dog"]]

    store.append_long_term("新添的一条：豆豆学会了握手。")
    index.search("握手", 3)
    assert embedded_inputs(fake_openai)[2:] == [["## " + store.today().isoformat() + "\n新添的一条：豆豆学会了握手。"],
                                               ["握手"]]

    # An edit in an editor (in place, same inode) of one entry re-embeds that entry only.
    text = store.long_term_path.read_text(encoding="utf-8")
    with open(store.long_term_path, "r+", encoding="utf-8") as fh:
        fh.write(text.replace("My dog Bob", "My dog Rex"))
    index.search("Rex", 3)
    assert embedded_inputs(fake_openai)[4:] == [[f"## {store.today().isoformat()}\n"
                                                 "My dog Rex loves chasing balls in the park."], ["Rex"]]

    # A touched file whose content did not change embeds nothing.
    note = store.note_files()[0]
    os.utime(note, ns=(note.stat().st_atime_ns, note.stat().st_mtime_ns + 5_000_000_000))
    report = index.sync()
    assert report.embedded == 0 and report.files_changed == []
    assert len(embedded_inputs(fake_openai)) == 6


def _all_chunk_texts(index: MemoryIndex) -> list[str]:
    conn = sqlite3.connect(index.path)
    try:
        return [row[0] for row in conn.execute("SELECT text FROM chunks ORDER BY id")]
    finally:
        conn.close()


def test_same_size_edit_in_the_same_clock_tick_is_still_seen(
        store: MemoryStore, open_index: Callable[..., MemoryIndex]) -> None:
    index = open_index(make_config())
    assert "柯基" in index.search("柯基", 1)[0].block.text
    path = store.long_term_path
    before = path.stat()
    with open(path, "r+", encoding="utf-8") as fh:  # what an editor saving in place does
        fh.write(path.read_text(encoding="utf-8").replace("柯基", "柴犬"))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    assert index.search("柯基", 1) == []
    assert "柴犬" in index.search("柴犬", 1)[0].block.text


def test_the_index_never_holds_text_the_store_does_not(
        store: MemoryStore, open_index: Callable[..., MemoryIndex], fake_openai: FakeOpenAIServer) -> None:
    index = open_index(make_config(fake_openai, sources=["memory", "notes"]))
    assert index.search("牙医", 3) and index.search("ECONNREFUSED", 3)
    # Outside the sources: backups (taken by the rewrite below), session files, other Markdown files.
    (store.memory_dir / "ideas.md").write_text("## x\nzeppelin secret\n", encoding="utf-8")
    sessions = store.memory_dir.parent / "sessions"
    sessions.mkdir()
    (sessions / "cli.jsonl").write_text(json.dumps({"type": "message", "id": 1, "message": {
        "role": "user", "content": "zeppelin in the session"}}) + "\n", encoding="utf-8")
    current = store.read_long_term()
    store.rewrite_long_term(current.replace(ENTRIES[2], "Rewrote the reconnect fix note."))
    store.note_files()[0].unlink()
    # Hybrid search still returns its nearest vectors, but none of them holds the removed text.
    for gone in ("ECONNREFUSED", "牙医", "zeppelin"):
        assert all(gone not in text for text in texts(index.search(gone, 10)))
    sources = {p: p.read_text(encoding="utf-8") for p in [store.long_term_path]}
    conn = sqlite3.connect(index.path)
    try:
        rows = conn.execute("SELECT path, text FROM chunks").fetchall()
        fts_rows = conn.execute("SELECT count(*) FROM chunks_fts").fetchone()[0]
        paths = {row[0] for row in conn.execute("SELECT path FROM files")}
    finally:
        conn.close()
    assert paths == {"memory/MEMORY.md"} and fts_rows == len(rows)
    assert all(text in sources[store.memory_dir.parent / path] for path, text in rows)


def test_a_deleted_index_folder_is_rebuilt_on_the_next_search(
        store: MemoryStore, open_index: Callable[..., MemoryIndex]) -> None:
    index = open_index(make_config())
    assert index.search("豆豆", 1)
    folder = index.path.parent
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    hits = index.search("豆豆", 1)
    assert hits and "豆豆" in hits[0].block.text
    assert index.path.exists() and index.status().chunks == len(ENTRIES) + 1


@pytest.mark.parametrize("damage", ["garbage", "truncated", "old_schema", "foreign_sqlite"])
def test_a_corrupt_or_foreign_index_file_is_rebuilt_not_a_crash(
        store: MemoryStore, open_index: Callable[..., MemoryIndex], damage: str) -> None:
    first = open_index(make_config())
    assert first.search("dog", 1)
    first.close()
    path = first.path
    if damage == "garbage":
        path.write_bytes(b"this is not a database" * 500)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:3000])
    else:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE chunks (id INTEGER, text TEXT)")
        conn.execute("INSERT INTO chunks VALUES (1, 'stale text no store holds')")
        if damage == "old_schema":
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        conn.commit()
        conn.close()
    index = open_index(make_config())
    hits = index.search("柯基", 3)
    assert hits and "柯基" in hits[0].block.text
    assert index.search("stale", 3) == []
    assert index.status().files == 2


def test_a_file_corrupted_under_an_open_index_is_rebuilt(
        store: MemoryStore, open_index: Callable[..., MemoryIndex]) -> None:
    index = open_index(make_config())
    assert index.search("dog", 1)
    index._close_db()  # as if another process held it: the file changes under us, then we reopen
    index.path.write_bytes(b"\0garbage" * 1000)
    assert "Bob" in index.search("dog", 1)[0].block.text


def test_two_index_objects_on_one_file_see_each_others_changes(
        store: MemoryStore, open_index: Callable[..., MemoryIndex], fake_openai: FakeOpenAIServer) -> None:
    """Like the bot and the CLI in two processes: one file, each with its own connection and vectors."""
    config = make_config(fake_openai)
    bot, cli = open_index(config), open_index(config, memory_store(store.memory_dir, UTC))
    assert bot.search("dog", 2) and cli.search("dog", 2)
    cli.store.append_long_term("The cat is called Mimi.")
    assert "Mimi" in bot.search("cat Mimi", 1)[0].block.text
    assert "Mimi" in cli.search("cat Mimi", 1)[0].block.text
    entry = f"## {store.today().isoformat()}\nThe cat is called Mimi."
    assert [text for batch in embedded_inputs(fake_openai) for text in batch if "Mimi" in text] == [
        entry, "cat Mimi", "cat Mimi"]  # the entry once, whichever index saw it first; each query


def test_concurrent_searches_and_writes_from_threads(
        store: MemoryStore, open_index: Callable[..., MemoryIndex]) -> None:
    index = open_index(make_config())
    errors: list[BaseException] = []

    def search() -> None:
        try:
            for _ in range(20):
                index.search("dog 柯基", 5)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=search) for _ in range(3)]
    for thread in threads:
        thread.start()
    for n in range(10):
        store.append_long_term(f"thread entry {n} 线程")
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(index.search("线程", 50)) == 10


# -- embeddings and hybrid -------------------------------------------------------------------------------


def test_endpoint_down_gives_keyword_results_and_a_status_warning(
        store: MemoryStore, open_index: Callable[..., MemoryIndex], fake_openai: FakeOpenAIServer) -> None:
    index = open_index(make_config(fake_openai))
    for _ in range(2):  # the first try and the client's one retry
        fake_openai.reply_error(503, "embedding backend overloaded", headers=FAST_RETRY, endpoint="embeddings")
    with freeze_time("2026-03-01 09:00:00", real_asyncio=True) as clock:
        hits = index.search("柯基", 3)
        assert hits and "柯基" in hits[0].block.text
        assert "overloaded" in (index.last_notice or "")
        status = index.status()
        assert status.warning and "unavailable (HTTP 503): embedding backend overloaded" in status.warning
        assert status.vectors == 0 and status.chunks == len(ENTRIES) + 1
        # The endpoint is back, and the pause after the failure is over (test_index_backoff.py has the pause):
        # the next search embeds what was missing, and the warning goes away.
        clock.tick(BACKOFF_FIRST)
        assert index.search("柯基", 3)
    status = index.status()
    assert status.warning is None and status.vectors == status.chunks and index.last_notice is None


def test_query_embedding_failure_falls_back_for_that_call(
        store: MemoryStore, open_index: Callable[..., MemoryIndex], fake_openai: FakeOpenAIServer) -> None:
    index = open_index(make_config(fake_openai))
    index.sync()
    fake_openai.reply_garbage(endpoint="embeddings")
    hits = index.search("ECONNREFUSED", 3)
    assert "ECONNREFUSED" in hits[0].block.text and "cannot read" in (index.last_notice or "")
    assert index.status().warning is not None


def test_missing_api_key_is_a_warning_not_a_crash(
        store: MemoryStore, open_index: Callable[..., MemoryIndex], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config = parse_config({"memory": {"index": {"enabled": True, "embeddings": {"provider": "openai"}}}}, "c")
    index = open_index(config)
    assert "柯基" in index.search("柯基", 1)[0].block.text
    assert "no API key" in (index.status().warning or "")


def _pinned_vectors(mapping: dict[str, int]) -> Callable[[str, int], list[float]]:
    """A fake embedder: a text containing a key gets that axis; anything else the last axis."""
    def embed(text: str, dimensions: int) -> list[float]:
        axis = next((a for k, a in mapping.items() if k in text), dimensions - 1)
        return [1.0 if i == axis else 0.0 for i in range(dimensions)]
    return embed


def test_hybrid_finds_by_meaning_and_keeps_a_strong_keyword_only_hit(
        store: MemoryStore, open_index: Callable[..., MemoryIndex], fake_openai: FakeOpenAIServer) -> None:
    # "beverage" shares no word with the tea entry; only the vector side can find it. ECONNREFUSED has a
    # vector orthogonal to the query, so it can only come in through the keyword side.
    store.append_long_term("I prefer green tea over coffee in the morning.")
    fake_openai.embedder = _pinned_vectors({"beverage": 0, "green tea": 0, "ECONNREFUSED": 1})
    index = open_index(make_config(fake_openai))
    hits = index.search("beverage ECONNREFUSED", 5)
    by_text = {hit.block.text.split("\n")[1]: hit.score for hit in hits}
    tea = "I prefer green tea over coffee in the morning."
    assert set(by_text) == {tea, ENTRIES[2]}  # the others: neither side, so below min_score
    assert math.isclose(by_text[tea], 0.84, rel_tol=1e-6)  # cosine 1 × 0.84, no keyword
    assert 0.08 <= by_text[ENTRIES[2]] <= 0.16  # keyword only: ≤ text_weight, still over min_score
    assert texts(hits)[0].endswith(tea)


def test_min_score_and_weights_come_from_config(
        store: MemoryStore, open_index: Callable[..., MemoryIndex], fake_openai: FakeOpenAIServer) -> None:
    fake_openai.embedder = _pinned_vectors({"please": 2, "Fixed": 1})  # the query is orthogonal to every chunk
    strict = open_index(make_config(fake_openai, min_score=0.5))
    assert strict.search("ECONNREFUSED please", 5) == []  # 0.16 × keyword score can never reach 0.5
    default = open_index(make_config(fake_openai))
    assert len(default.search("ECONNREFUSED please", 5)) == 1
    text_only = open_index(make_config(fake_openai, vector_weight=0.0, text_weight=1.0, min_score=0.5))
    hits = text_only.search("ECONNREFUSED please", 5)
    assert len(hits) == 1 and hits[0].score > 0.5


def test_reindex_reuses_cached_embeddings_and_reports_progress(
        store: MemoryStore, open_index: Callable[..., MemoryIndex], fake_openai: FakeOpenAIServer) -> None:
    index = open_index(make_config(fake_openai))
    index.sync()
    requests = len(fake_openai.embedding_requests())
    seen: list[tuple[str, int, int]] = []
    report = index.reindex(lambda phase, done, total: seen.append((phase, done, total)))
    assert report.embedded == 0 and len(fake_openai.embedding_requests()) == requests
    assert sorted(report.files_changed) == ["memory/202405/20240502.md", "memory/MEMORY.md"]
    assert seen[-1] == ("files", 2, 2)
    assert index.status().vectors == len(ENTRIES) + 1


def test_sessions_are_searchable_when_configured(
        store: MemoryStore, open_index: Callable[..., MemoryIndex]) -> None:
    sessions = store.memory_dir.parent / "sessions"
    sessions.mkdir()
    path = sessions / "telegram%3A42.jsonl"
    path.write_text("\n".join(json.dumps({"type": "message", "id": n, "message": m}, ensure_ascii=False) for n, m in [
        (1, {"role": "user", "content": "推荐一本科幻小说"}),
        (2, {"role": "assistant", "content": "《三体》 by Liu Cixin"}),
    ]) + "\n", encoding="utf-8")
    index = open_index(make_config(sources=["memory", "sessions"]))
    hits = index.search("科幻 Cixin", 3)
    assert hits[0].block.path == path and (hits[0].block.start_line, hits[0].block.end_line) == (1, 2)
    assert index.search("牙医", 3) == []  # notes are not a source here


# -- config ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("index", "message"), [
    ({"embeddings": {"provider": "nosuch"}}, "memory.index.embeddings.provider 'nosuch' is not \"local\""),
    ({"embeddings": {"provider": "local", "dimension": 8}}, "memory.index.embeddings.dimension: unknown key"),
    ({"embeddings": {"provider": "openai", "dimensions": 0}}, "memory.index.embeddings.dimensions"),
    ({"vector_weight": 0, "text_weight": 0}, "vector_weight and text_weight cannot both be 0"),
    ({"min_score": 1.5}, "memory.index.min_score"),
    ({"sources": []}, "memory.index.sources"),
    ({"sources": ["memory", "backups"]}, "memory.index.sources"),
    ({"candidate_multiplier": 0}, "memory.index.candidate_multiplier"),
])
def test_bad_index_config_is_one_clear_line(index: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"memory": {"index": {"enabled": True, **index}}}, "cfg.json")
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith("cfg.json: ")


def test_defaults_keep_the_index_off_and_keyword_only() -> None:
    settings = parse_config({}, "c").memory.index
    assert (settings.enabled, settings.embeddings, settings.vector_weight, settings.text_weight) == (
        False, None, 0.84, 0.16)
    assert (settings.candidate_multiplier, settings.min_score) == (4, 0.08)


# -- wiring: workspace, tools, context builder, CLI -----------------------------------------------------------


def enable_index(home: Path, server: FakeOpenAIServer | None = None, **index: Any) -> None:
    with edit_config(home) as data:
        data["memory"]["index"] = {"enabled": True, **index}
        if server is not None:
            data["providers"]["openai"] = {"api_key": KEY, "api_base": server.base_url}
            data["memory"]["index"]["embeddings"] = {"provider": "openai", "model": "text-embedding-3-small"}


@pytest.fixture
def indexed_workspace(home: Path, fake_openai: FakeOpenAIServer) -> Iterator[Workspace]:
    enable_index(home, fake_openai)
    fake_openai.embedder = _pinned_vectors({"beverage": 0, "drink": 0, "green tea": 0})
    ws = App.open(home).workspace
    ws.store.append_long_term("I prefer green tea over coffee in the morning.")
    ws.store.append_long_term("我养了一只柯基，叫豆豆。")
    yield ws
    assert isinstance(ws.searcher, RerankedSearch) and isinstance(ws.searcher.inner, IndexedSearch)
    ws.searcher.close()


def test_workspace_uses_the_keyword_search_unless_the_index_is_enabled(home: Path) -> None:
    ws = App.open(home).workspace
    assert isinstance(ws.searcher, RerankedSearch) and isinstance(ws.searcher.inner, KeywordSearch)
    assert ws.searcher.store is ws.store
    ws.store.append_long_term("我养了一只柯基")
    assert ws.searcher.search("柯基", 3)
    assert not (ws.memory_dir / "index").exists()


def test_memory_search_tool_uses_the_index(indexed_workspace: Workspace) -> None:
    tools = build_tools(indexed_workspace)
    result = asyncio.run(tools.execute("memory_search", json.dumps({"query": "what beverage do I like"})))
    assert result.startswith("1 match") and "green tea" in result and "memory/MEMORY.md:" in result
    chinese = asyncio.run(tools.execute("memory_search", json.dumps({"query": "柯基"})))
    assert "豆豆" in chinese and (indexed_workspace.memory_dir / "index" / "index.sqlite3").exists()


def test_context_builder_injects_what_the_index_finds(indexed_workspace: Workspace) -> None:
    policy = indexed_workspace.policy.current()
    memory = asyncio.run(ContextBuilder(indexed_workspace).select_memory(policy, "any drink recommendations?"))
    assert memory.ranked and [h.block.text.split("\n")[1] for h in memory.blocks] == [
        "I prefer green tea over coffee in the morning."]
    plain = KeywordSearch(indexed_workspace.store).search("any drink recommendations?", 10)
    assert plain == []  # no shared word: only the index's vector side finds it


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_status_and_reindex(home: Path, fake_openai: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "memory", "status")
    assert code == 0 and out.startswith("the memory index is disabled")
    code, _, err = run_cli(capsys, "memory", "reindex")
    assert code == 1 and err.strip() == ("picoclaw: error: the memory index is disabled (set memory.index.enabled "
                                         "to true in config.json to use it)")
    enable_index(home, fake_openai)
    run_cli(capsys, "memory", "append", "我养了一只柯基，叫豆豆")
    code, out, _ = run_cli(capsys, "memory", "status")
    assert code == 0 and "not built yet" in out and "stale:      1 file(s)" in out and "memory/MEMORY.md" in out
    code, out, err = run_cli(capsys, "memory", "reindex")
    assert code == 0
    assert err.splitlines() == ["files      [##############################] 1/1",
                                "embeddings [##############################] 1/1"]
    # MEMORY.md's title and intro are not a chunk: only the entry is.
    assert "into 1 chunk(s)" in out and "vectors: 1 (1 embedded now, 0 from the cache)" in out
    code, out, _ = run_cli(capsys, "memory", "search", "柯基")
    assert code == 0 and "豆豆" in out and "memory/MEMORY.md:" in out
    for _ in range(2):
        fake_openai.reply_error(503, "no capacity", headers=FAST_RETRY, endpoint="embeddings")
    run_cli(capsys, "memory", "append", "Green tea in the morning")
    code, out, _ = run_cli(capsys, "memory", "search", "green tea")
    assert code == 0 and "Green tea in the morning" in out
    code, out, _ = run_cli(capsys, "memory", "status")
    assert "warning:    embeddings failed" in out and "no capacity" in out and "vectors:    1 (1 chunks" in out
