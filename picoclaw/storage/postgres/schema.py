"""The database schema: created and upgraded at start, once, under a lock every process shares.

`picoclaw_schema` holds the version each step brought the database to. A database set up by a newer
picoclaw is refused with one line rather than written in a layout this version does not know.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from picoclaw.storage.errors import SchemaTooNew
from picoclaw.storage.postgres import documents, inbox, index, jobs, sessions, telegram_replies, work

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

# pg_advisory_xact_lock key for migrations: any constant no other lock of ours uses ("pico" in ASCII).
MIGRATION_LOCK = 0x7069636F

# Every row is keyed by `scope`: "" for the shared workspace, else the user key of a per-user scope
# (users/<user_key>/), so one user's rows never reach another's prompt or tools. Each module owns its tables.
STEPS: list[tuple[int, str]] = [
    (1, "create extension if not exists vector;\n" + documents.DDL + sessions.DDL + jobs.DDL + index.DDL),
    (2, index.TOTALS_V2),
    (3, inbox.DDL + work.DDL),
    (4, documents.DDL_V4),
    (5, telegram_replies.DDL),
    (6, inbox.ASKS_DDL),
]
SCHEMA_VERSION = STEPS[-1][0]


def schema_version(conn: psycopg.Connection) -> int | None:
    """The database's schema version, None before the first start."""
    row = conn.execute("select to_regclass('picoclaw_schema') is not null").fetchone()
    if not row or not row[0]:
        return None
    found = conn.execute("select max(version) from picoclaw_schema").fetchone()
    return int(found[0]) if found and found[0] is not None else None


def ensure_schema(conn: psycopg.Connection) -> int:
    """Create or upgrade the schema to SCHEMA_VERSION, in one transaction under the migration lock."""
    with conn.transaction():
        # No bound on this transaction's lock waits (the pool's connections end theirs after
        # storage.lock_wait_seconds): a process starting while another holds MIGRATION_LOCK waits for that
        # migration, and an `alter table` waits behind a long transaction, as long as either takes (an upgrade
        # of a large index rewrites every term row: minutes). Cut off, the process would not start at all, for
        # a wait that ends on its own; a longer fixed bound would only move that failure to larger databases.
        # SET LOCAL: the connection's own bound is back when the transaction ends.
        conn.execute("set local lock_timeout = 0")
        conn.execute("select pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute("create table if not exists picoclaw_schema "
                     "(version int primary key, applied_at timestamptz not null default now())")
        current = schema_version(conn) or 0
        if current > SCHEMA_VERSION:
            raise SchemaTooNew(f"the database's schema is version {current}, newer than this picoclaw's "
                               f"{SCHEMA_VERSION}: upgrade picoclaw (pip install -U picoclaw)")
        for version, ddl in STEPS:
            if version > current:
                log.info("PostgreSQL schema: upgrading to version %d", version)
                conn.execute(ddl.encode())  # our own constant text, not user input
                conn.execute("insert into picoclaw_schema (version) values (%s)", (version,))
    return SCHEMA_VERSION
