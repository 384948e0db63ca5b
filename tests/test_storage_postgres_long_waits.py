"""PostgreSQL waits that outlast storage.lock_wait_seconds on purpose: start-up migrations and the memory index's
writes, HNSW builds and VACUUM wait for another process's build, backfill or migration (minutes), while the
pool's other lock waits stay bounded; an index-table error reaches the caller as one StorageError line.

Each test holds a lock from a second connection for ~2 s longer than a lock_wait_seconds of 1 and lets go
from a timer thread: the wait must end in success, not LockNotAvailable. No test asserts a duration.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC
from pathlib import Path

import psycopg
import pytest

from picoclaw.config import IndexConfig
from picoclaw.memory.index.pg_index import index_for
from picoclaw.memory.search.indexed import IndexedSearch
from picoclaw.memory.search.keyword import KeywordSearch
from picoclaw.memory.store import MemoryStore
from picoclaw.storage import StorageError
from picoclaw.storage.postgres.index import INDEX_LOCK, PostgresIndexTable
from picoclaw.storage.postgres.schema import MIGRATION_LOCK, SCHEMA_VERSION, STEPS, schema_version
from picoclaw.storage.postgres.storage import PostgresStorage
from picoclaw.storage.waits import LockWaitExpired

LOCK_WAIT = 1.0
HELD = LOCK_WAIT + 2.0  # how long the other connection holds its lock: past the bound


@contextmanager
def held(dsn: str, *statements: str, seconds: float = HELD) -> Iterator[None]:
    """A second connection whose transaction runs `statements` (taking its locks) and rolls back after
    `seconds`, from a timer thread, while the body waits for those locks."""
    conn = psycopg.connect(dsn)
    for statement in statements:
        conn.execute(statement.encode())
    timer = threading.Timer(seconds, conn.rollback)
    timer.start()
    try:
        yield
    finally:
        timer.join()
        conn.close()


@pytest.fixture
def storage(postgres_dsn: str, tmp_path: Path) -> Iterator[PostgresStorage]:
    opened = PostgresStorage(tmp_path, postgres_dsn, pool_size=2, lock_wait=LOCK_WAIT)
    try:
        yield opened
    finally:
        opened.close()


def _table(storage: PostgresStorage) -> PostgresIndexTable:
    return storage.index_table(storage.root / "memory")


def _chunk(text: str) -> tuple[int, int, str, str, str, str]:
    return 1, 2, "## 2024-05-01", text, f"hash of {text}", " ".join(text.lower().split())


def _assert_pool_bound_kept(storage: PostgresStorage) -> None:
    """Both pool connections still end their lock waits after LOCK_WAIT, and are in autocommit as opened."""
    with storage.pool.connection() as first, storage.pool.connection() as second:
        for conn in (first, second):
            row = conn.execute("select current_setting('lock_timeout')").fetchone()
            assert row == ("1s",) and conn.autocommit


# -- start-up migrations -----------------------------------------------------------------------------------


def test_start_up_waits_for_another_process_holding_the_migration_lock(postgres_dsn: str, tmp_path: Path) -> None:
    with held(postgres_dsn, f"select pg_advisory_xact_lock({MIGRATION_LOCK})"):
        opened = PostgresStorage(tmp_path, postgres_dsn, pool_size=2, lock_wait=LOCK_WAIT)
    try:
        with opened.pool.connection() as conn:
            assert schema_version(conn) == SCHEMA_VERSION
        _assert_pool_bound_kept(opened)  # SET LOCAL: the migration's wait without a bound ended with it
    finally:
        opened.close()


def test_an_upgrade_waits_behind_a_long_transaction_reading_the_table_it_alters(
        postgres_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("create table picoclaw_schema (version int primary key, applied_at timestamptz default now())")
        conn.execute(STEPS[0][1].encode())
        conn.execute("insert into picoclaw_schema (version) values (1)")
    # Version 2 alters index_terms: an ACCESS EXCLUSIVE lock, behind this transaction's read.
    with held(postgres_dsn, "select count(*) from index_terms"):
        opened = PostgresStorage(tmp_path, postgres_dsn, pool_size=2, lock_wait=LOCK_WAIT)
    try:
        with opened.pool.connection() as conn:
            assert schema_version(conn) == SCHEMA_VERSION
    finally:
        opened.close()


# -- the memory index's writes, build and vacuum -----------------------------------------------------------


def test_an_index_write_waits_out_another_process_building_the_vector_index(storage: PostgresStorage) -> None:
    table = _table(storage)
    # CREATE INDEX (another process's HNSW build) holds a SHARE lock on index_chunks: every write waits.
    with held(storage.dsn, "lock table index_chunks in share mode"):
        table.replace_file("memory/MEMORY.md", "memory", "digest", (1, 2, 3, 4), [_chunk("My dog Bob 柯基")])
    assert table.counts(None) == (1, 1, 0)
    with held(storage.dsn, "lock table index_chunks in share mode"):
        table.store_vectors("model", ["hash of My dog Bob 柯基"], [[1.0, 0.0, 0.0]], 1)
    assert table.counts("model") == (1, 1, 1)
    with held(storage.dsn, "lock table index_chunks in share mode"):
        table.forget_file("memory/MEMORY.md")
    assert table.counts(None) == (0, 0, 0)
    _assert_pool_bound_kept(storage)


def test_a_vector_index_build_waits_out_another_processs_build(storage: PostgresStorage) -> None:
    table = _table(storage)
    table.replace_file("memory/MEMORY.md", "memory", "digest", (1, 2, 3, 4), [_chunk("My dog Bob 柯基")])
    table.store_vectors("model", ["hash of My dog Bob 柯基"], [[1.0, 0.0, 0.0]], 1)
    # The other process's build holds the build's advisory lock (and its SHARE lock) until it commits.
    with held(storage.dsn, f"select pg_advisory_xact_lock({INDEX_LOCK}, hashtext('index_chunks_hnsw_3'))",
              "lock table index_chunks in share mode"):
        table.finish_embedding("model", keep_unused=0)
    with storage.pool.connection() as conn:
        built = conn.execute("select 1 from pg_indexes where indexname = 'index_chunks_hnsw_3'").fetchone()
    assert built == (1,)
    _assert_pool_bound_kept(storage)


def test_the_vacuum_after_a_bulk_write_waits_out_another_processs_build(storage: PostgresStorage) -> None:
    table = _table(storage)
    chunks = [_chunk(f"entry {n} word{n}") for n in range(1000)]  # the bulk-write threshold: a VACUUM follows
    table._replace_file("memory/MEMORY.md", "memory", "digest", (1, 2, 3, 4), chunks)
    # VACUUM's SHARE UPDATE EXCLUSIVE lock conflicts with the build's SHARE lock.
    with held(storage.dsn, "lock table index_chunks in share mode"):
        table._wrote(len(chunks))
    assert table._written == 0  # vacuumed
    _assert_pool_bound_kept(storage)  # the VACUUM's connection has its bound (and autocommit) back


# -- errors from the index table ---------------------------------------------------------------------------


def test_an_index_table_error_is_one_storage_error_line(storage: PostgresStorage) -> None:
    table = _table(storage)
    with storage.pool.connection() as conn:
        conn.execute("alter table index_chunks rename to index_chunks_gone")
    try:
        for call in (lambda: table.counts(None), lambda: table.replace_file(
                "memory/MEMORY.md", "memory", "digest", (1, 2, 3, 4), [_chunk("text")])):
            with pytest.raises(StorageError) as caught:
                call()
            assert not isinstance(caught.value, psycopg.Error)
            message = str(caught.value)
            assert "\n" not in message and "index_chunks" in message, message
    finally:
        with storage.pool.connection() as conn:
            conn.execute("alter table index_chunks_gone rename to index_chunks")


def test_a_read_past_the_bound_is_lock_wait_expired_and_a_search_falls_back_to_the_files(
        storage: PostgresStorage) -> None:
    store = MemoryStore(storage.root / "memory", UTC, storage=storage)
    store.documents.replace("memory/MEMORY.md", "## 2024-05-01\nMy dog Bob loves chasing balls in the park.\n")
    index = index_for(store, IndexConfig(enabled=True, sources=["memory"]), None,  # type: ignore[arg-type]
                      sessions_dir=storage.root / "sessions")
    search = IndexedSearch(KeywordSearch(store), index)
    try:
        # ACCESS EXCLUSIVE (an `alter table` of a migration): reads keep the pool's bound and end in one line.
        with held(storage.dsn, "lock table index_files, index_chunks in access exclusive mode"):
            with pytest.raises(LockWaitExpired) as caught:
                _table(storage).known_files()
            assert "\n" not in str(caught.value)
            hits = search.search("dog park", 1)  # the index cannot answer: the memory files do
        assert "Bob" in hits[0].block.text
        assert "Bob" in search.search("dog park", 1)[0].block.text  # and the index again, once it is free
        assert index.status().files == 1
    finally:
        search.close()
