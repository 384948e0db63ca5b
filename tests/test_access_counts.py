"""Access counts (memory/search/access_counts.py): how often a block was injected, kept outside MEMORY.md,
recorded by the turn's memory selection, bounded, and never able to break a turn."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from datetime import UTC, date
from pathlib import Path

import pytest

from picoclaw.memory.search.access_counts import ACCESS_COUNTS_FILE, AccessCounts
from picoclaw.memory.search.keyword import KeywordSearch
from picoclaw.memory.search.reranking import RerankedSearch
from picoclaw.memory.search.turn_memory import block_key, record_use, select_turn_memory
from picoclaw.memory.store import MemoryStore
from picoclaw.policy_schema import MemoryPolicy
from picoclaw.storage import FilesStorage
from tests.stores import memory_store
from tests.test_storage_documents import Backend, _open, backend  # noqa: F401 - the fixture, on both backends

DAY = date(2025, 3, 10)
MEMORY = ("# Memory\n\n## 2025-03-01\nMy cat is called Mimi.\n\n## 2025-03-02\n我的猫叫咪咪，是一只橘猫。\n\n"
          "## 2025-03-03\nI like green tea.\n")


def standing(tmp_path: Path) -> tuple[MemoryStore, RerankedSearch]:
    store = memory_store(tmp_path / "memory", UTC)
    store.rewrite_long_term(MEMORY)
    return store, RerankedSearch(KeywordSearch(store), store, MemoryPolicy)


def test_counts_are_recorded_and_read_back_by_another_instance(tmp_path: Path) -> None:
    counts = AccessCounts(tmp_path, storage=FilesStorage(tmp_path))
    counts.record(["a", "b", "a"], DAY)  # a key named twice in one turn counts once
    counts.record(["a"], DAY)
    assert dict(AccessCounts(tmp_path, storage=FilesStorage(tmp_path)).counts()) == {"a": 2, "b": 1}
    assert dict(counts.counts()) == {"a": 2, "b": 1}


def test_the_file_is_read_again_only_when_someone_else_changed_it(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # A full counts file took milliseconds to parse: after this process's own write, the next turn's ranking and
    # the next count take what it wrote; another writer's change (or a hand edit) is read.
    ours, theirs = (AccessCounts(tmp_path, storage=FilesStorage(tmp_path)) for _ in range(2))
    reads = []
    real_read = AccessCounts.read
    monkeypatch.setattr(AccessCounts, "read", lambda self: reads.append(self) or real_read(self))
    ours.record(["猫", "cat"], DAY)
    assert dict(ours.counts()) == {"猫": 1, "cat": 1}
    ours.record(["cat"], DAY)
    assert dict(ours.counts()) == {"猫": 1, "cat": 2}
    assert reads.count(ours) == 1  # the first record's, from a missing file
    theirs.record(["猫"], DAY)
    assert dict(ours.counts()) == {"猫": 2, "cat": 2} and reads.count(ours) == 2
    (tmp_path / ACCESS_COUNTS_FILE).write_text('{"version": 1, "blocks": {"tea 茶": [7, "2025-03-09"]}}')
    ours.record(["cat"], DAY)
    assert dict(ours.counts()) == {"tea 茶": 7, "cat": 1}


def test_what_another_machine_counted_is_seen_after_our_own_writes(backend: Backend) -> None:  # noqa: F811
    # On PostgreSQL each machine keeps its own copy of the file: ours must not stand for theirs once they wrote.
    other = _open(backend.kind, backend.folder(1), backend.dsn)
    try:
        ours = AccessCounts(backend.root / "memory", storage=backend.storage)
        theirs = AccessCounts(backend.folder(1) / "memory", storage=other)
        ours.record(["猫", "cat"], DAY)
        ours.record(["cat"], DAY)
        assert dict(ours.counts()) == {"猫": 1, "cat": 2}
        theirs.record(["猫", "tea 茶"], DAY)
        assert dict(ours.counts()) == {"猫": 2, "cat": 2, "tea 茶": 1}
        ours.record(["cat"], DAY)
        assert dict(theirs.counts()) == {"猫": 2, "cat": 3, "tea 茶": 1}
    finally:
        other.close()


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'{"version": 99, "blocks": {}}', b"\xff\xfe"])
def test_a_corrupt_file_is_logged_once_and_counting_starts_afresh(tmp_path: Path, content: bytes,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / ACCESS_COUNTS_FILE).write_bytes(content)
    counts = AccessCounts(tmp_path, storage=FilesStorage(tmp_path))
    with caplog.at_level(logging.WARNING):
        assert dict(counts.counts()) == {}
        assert dict(counts.counts()) == {}
        counts.record(["a"], DAY)
    assert len([r for r in caplog.records if "access counts" in r.getMessage()]) == 1
    assert dict(AccessCounts(tmp_path, storage=FilesStorage(tmp_path)).counts()) == {"a": 1}  # the file is whole again


def test_a_damaged_entry_costs_only_its_own_count(tmp_path: Path) -> None:
    (tmp_path / ACCESS_COUNTS_FILE).write_text(
        '{"version": 1, "blocks": {"a": [3, "2025-03-01"], "b": ["x", 1], "c": [true, "2025-03-01"]}}')
    assert dict(AccessCounts(tmp_path, storage=FilesStorage(tmp_path)).counts()) == {"a": 3}


def test_an_unwritable_folder_never_breaks_a_turn(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    # A folder that cannot exist: every operation fails.
    counts = AccessCounts(blocked / "memory", storage=FilesStorage(blocked))
    with caplog.at_level(logging.WARNING):
        counts.record(["a"], DAY)
        counts.record(["a"], DAY)
        assert dict(counts.counts()) == {}
    assert len([r for r in caplog.records if "access counts" in r.getMessage()]) == 1


def test_the_file_is_bounded_dropping_the_blocks_used_longest_ago(tmp_path: Path) -> None:
    counts = AccessCounts(tmp_path, storage=FilesStorage(tmp_path), max_keys=3)
    counts.record(["old"], date(2025, 1, 1))
    for key in ("a", "b", "c"):
        counts.record([key], DAY)
    counts.record(["a"], DAY)
    assert dict(counts.counts()) == {"a": 2, "b": 1, "c": 1}


def _record(folder: str, key: str) -> None:
    # A wait no busy machine runs out of: what is tested is that the lock serialises, not how fast.
    for _ in range(20):
        AccessCounts(Path(folder), lock_wait=600, storage=FilesStorage(Path(folder))).record([key], DAY)


@pytest.mark.slow
def test_processes_recording_at_once_lose_no_count(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_record, args=(str(tmp_path), key)) for key in ("a", "b")]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert [worker.exitcode for worker in workers] == [0, 0]
    assert dict(AccessCounts(tmp_path, storage=FilesStorage(tmp_path)).counts()) == {"a": 20, "b": 20}


@pytest.mark.parametrize(("query", "found"), [("what is my cat called?", "Mimi"), ("我的猫叫什么？", "咪咪")])
def test_a_turn_counts_the_blocks_its_prompt_carries(tmp_path: Path, query: str, found: str) -> None:
    store, search = standing(tmp_path)
    memory = asyncio.run(select_turn_memory(search, store, MemoryPolicy(), query))
    injected = [hit.block for hit in memory.blocks]
    assert any(found in block.text for block in injected)
    assert dict(search.counts.counts()) == {}  # the agent counts them beside the model call (record_use)
    record_use(search, memory)
    assert dict(search.counts.counts()) == {block_key(block): 1 for block in injected}
    record_use(search, asyncio.run(select_turn_memory(search, store, MemoryPolicy(), query)))
    assert set(search.counts.counts().values()) == {2}
    assert "Mimi" in store.read_long_term() and ACCESS_COUNTS_FILE not in store.read_long_term()


def test_a_present_block_or_the_no_hit_fallback_is_not_counted(tmp_path: Path) -> None:
    store, search = standing(tmp_path)
    policy = MemoryPolicy(memory_fallback_blocks=2)
    memory = asyncio.run(select_turn_memory(search, store, policy, "quantum chromodynamics"))
    assert not memory.ranked and memory.blocks  # the newest blocks came, but nothing was found
    assert memory.used == ()
    record_use(search, memory)
    assert dict(search.counts.counts()) == {}
    first = asyncio.run(select_turn_memory(search, store, policy, "my cat Mimi"))
    record_use(search, first)
    again = asyncio.run(select_turn_memory(search, store, policy, "my cat Mimi", frozenset(first.keys())))
    record_use(search, again)
    assert not again.blocks and again.used == ()  # already in the conversation: not injected, not counted again
    assert set(search.counts.counts().values()) == {1}


@pytest.mark.parametrize("query", ["what is my cat called?", "我的猫叫什么？"])
def test_a_selection_that_is_not_a_use_is_not_counted(tmp_path: Path, query: str) -> None:
    store, search = standing(tmp_path)
    memory = asyncio.run(select_turn_memory(search, store, MemoryPolicy(), query, count_use=False))
    record_use(search, memory)
    assert memory.blocks and memory.used == () and dict(search.counts.counts()) == {}
