"""Opening the PostgreSQL backend: schema created once, a newer schema refused, a wrong DSN one clear line, and
the pool's check of the connections it hands out."""

from __future__ import annotations

import select
import time
from pathlib import Path

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from picoclaw.storage import SchemaTooNew, StorageError, StorageUnavailable
from picoclaw.storage.postgres import connection
from picoclaw.storage.postgres.connection import open_pool
from picoclaw.storage.postgres.schema import SCHEMA_VERSION, STEPS, ensure_schema
from picoclaw.storage.postgres.storage import PostgresStorage


def test_first_start_creates_the_schema_and_a_second_start_keeps_it(postgres_dsn: str, tmp_path: Path) -> None:
    first = PostgresStorage(tmp_path, postgres_dsn)
    first.close()
    second = PostgresStorage(tmp_path, postgres_dsn)
    second.close()
    with psycopg.connect(postgres_dsn) as conn:
        versions = [row[0] for row in conn.execute("select version from picoclaw_schema order by version")]
        extension = conn.execute("select extversion from pg_extension where extname = 'vector'").fetchone()
    assert versions == list(range(1, SCHEMA_VERSION + 1))
    assert extension is not None


def test_a_version_1_index_is_upgraded_with_its_terms_and_totals_filled_in(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("create table picoclaw_schema (version int primary key, applied_at timestamptz default now())")
        conn.execute(STEPS[0][1].encode())
        conn.execute("insert into picoclaw_schema (version) values (1)")
        conn.execute("insert into index_files values ('', 'memory/MEMORY.md', 'memory', 'h', 0, 0, 0, 0)")
        conn.execute("insert into index_chunks (id, scope, path, ordinal, source, start_line, end_line, heading, "
                     "text, hash, length) values (1, '', 'memory/MEMORY.md', 0, 'memory', 1, 2, '', '柯基 dog', "
                     "'t1', 3), (2, '', 'memory/MEMORY.md', 1, 'memory', 3, 4, '', 'park', 't2', 1)")
        conn.execute("insert into index_terms values ('', '柯基', 1, 1), ('', 'dog', 1, 2), ('', 'park', 2, 1)")
        assert ensure_schema(conn) == SCHEMA_VERSION
        terms = conn.execute("select term, length, source from index_terms order by term").fetchall()
        totals = conn.execute("select scope, chunks, length from index_totals").fetchall()
    assert terms == [("dog", 3, "memory"), ("park", 1, "memory"), ("柯基", 3, "memory")]
    assert totals == [("", 2, 4)]


def test_a_newer_schema_is_refused_with_one_line(postgres_dsn: str, tmp_path: Path) -> None:
    PostgresStorage(tmp_path, postgres_dsn).close()
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("insert into picoclaw_schema (version) values (%s)", (SCHEMA_VERSION + 1,))
    with pytest.raises(SchemaTooNew, match=f"version {SCHEMA_VERSION + 1}, newer"):
        PostgresStorage(tmp_path, postgres_dsn)


def test_a_wrong_password_names_host_and_port_but_not_the_password(postgres_dsn: str, tmp_path: Path) -> None:
    dsn = "postgresql://picoclaw:hunter2-secret@127.0.0.1:1/picoclaw"
    with pytest.raises(StorageUnavailable) as raised:
        PostgresStorage(tmp_path, dsn)
    message = str(raised.value)
    assert "127.0.0.1:1" in message and "cannot be reached" in message
    assert "hunter2" not in message and "\n" not in message


@pytest.mark.parametrize("refusal", ["nothing listening", "no such database / 没有这个库"])
def test_a_server_that_refuses_is_said_at_once_not_after_the_connect_timeout(
        postgres_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusal: str) -> None:
    """The pool would try again until its connect timeout (here 600 s): its first failure is asked about directly,
    and a refusal is one line at once, with the server's reason."""
    monkeypatch.setattr(connection, "CONNECT_TIMEOUT_SECONDS", 600)
    info = psycopg.conninfo.conninfo_to_dict(postgres_dsn)
    if refusal == "nothing listening":
        dsn, reason = "postgresql://picoclaw:hunter2-secret@127.0.0.1:1/picoclaw", "127.0.0.1:1"
    else:
        dsn = psycopg.conninfo.make_conninfo(postgres_dsn, dbname="picoclaw_没有这个库")
        reason = f"{info.get('host', '')}:{info.get('port', '')}"
    started = time.monotonic()
    with pytest.raises(StorageUnavailable) as raised:
        PostgresStorage(tmp_path, dsn)
    assert time.monotonic() - started < 60  # not the 600 s: a bound on a hang, not a measure of speed
    message = str(raised.value)
    assert reason in message and "cannot be reached" in message and "\n" not in message
    assert "hunter2" not in message
    if refusal != "nothing listening":
        assert "does not exist" in message  # the server's own reason, from the direct attempt


def test_no_dsn_says_where_to_write_one(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="PICOCLAW_POSTGRES_DSN"):
        PostgresStorage(tmp_path, "")


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The backends the pool asks about (a round trip) as it hands their connections out, in order."""
    backends: list[int] = []
    check = ConnectionPool.check_connection

    def counted(conn: psycopg.Connection) -> None:
        backends.append(conn.info.backend_pid)
        check(conn)

    monkeypatch.setattr(ConnectionPool, "check_connection", counted)
    monkeypatch.setattr(connection, "QUIET_CHECK_SECONDS", 3600.0)  # however slow the machine, none sits that long
    return backends


def test_the_pool_asks_the_server_only_about_a_connection_that_heard_from_it(postgres_dsn: str,
                                                                             asked: list[int]) -> None:
    pool = open_pool(postgres_dsn, 2)  # one connection made; used one at a time, the pool keeps to it
    try:
        for _ in range(3):  # idle and quiet: handed out again without a round trip
            with pool.connection() as conn:
                kept, backend = conn, conn.info.backend_pid
        assert asked == []
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute("select pg_terminate_backend(%s, 30000)", (backend,))  # returns once it ended
        poller = select.poll()
        poller.register(kept.fileno(), select.POLLIN)
        assert poller.poll(30_000), "the server's goodbye never arrived"
        with pool.connection() as conn:  # the dead one was asked about, dropped, and replaced
            assert conn.execute("select 1").fetchone() == (1,)
            assert conn.info.backend_pid != backend
        assert asked == [backend]
    finally:
        pool.close()


def test_the_pool_asks_about_a_connection_that_sat_unused_though_its_socket_is_quiet(postgres_dsn: str,
                                                                                     asked: list[int]) -> None:
    # A server gone without a word (a failover to another host) leaves the socket quiet: only a round trip tells.
    pool = open_pool(postgres_dsn, 2)
    try:
        with pool.connection() as conn:
            kept, backend = conn, conn.info.backend_pid
        assert asked == []
        connection._taken[kept] = time.monotonic() - 7200  # as if it sat unused for two hours
        with pool.connection() as conn:
            assert conn is kept and conn.execute("select 1").fetchone() == (1,)
        assert asked == [backend]
        with pool.connection() as conn:  # taken just now: not asked again
            assert conn is kept
        assert asked == [backend]
    finally:
        pool.close()
