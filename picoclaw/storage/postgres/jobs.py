"""Scheduled jobs on PostgreSQL: one row a job, due rows claimed with FOR UPDATE SKIP LOCKED.

A row holds the job exactly as jobs.json holds it (a `json` column keeps its keys in their order, so an
export writes the file byte for byte), its place in the file, and `due`, its next run while enabled, so
"what is due" is an indexed query. A change locks the scope (an advisory lock: inserts too are serialised)
and then only the rows it writes, starting again if a claim changed one of them since it read it; a claim
locks one due row and skips it when another scheduler, on any machine, holds it.
"""

from __future__ import annotations

import os
from collections.abc import Hashable
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from picoclaw.disk.atomic import atomic_write
from picoclaw.storage.errors import StorageError
from picoclaw.storage.jobs import (
    DocumentEdit,
    FilesJobTable,
    JobRecord,
    JobsDocument,
    Take,
    document_bytes,
    document_of,
    due_of,
    records_of,
)
from picoclaw.storage.postgres.connection import transaction as _transaction

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

T = TypeVar("T")

DDL = """
create sequence job_revision;
-- Scheduled jobs: one row a job, as jobs.json holds it; due rows are claimed with FOR UPDATE SKIP LOCKED.
create table jobs (
    scope      text not null,
    id         text not null,
    job        json not null,            -- json, not jsonb: the keys keep their order (export byte for byte)
    due        timestamptz,              -- the next run of an enabled job; null: nothing to run
    position   bigint not null,          -- the job's place in jobs.json
    revision   bigint not null default nextval('job_revision'),  -- grows with every change: cheap polling
    primary key (scope, id)
);
create index jobs_due on jobs (scope, due) where due is not null;
"""

# pg_advisory_xact_lock(JOBS_LOCK, hashtext(scope)): one scope's changes one at a time ("jobs" in ASCII).
JOBS_LOCK = 0x6A6F6273
CHANGE_ATTEMPTS = 5  # a change overtaken by claims this often takes every row's lock on its last try
JOBS_DIR, JOBS_FILE, USERS_DIR = "cron", "jobs.json", "users"


def scope_of(root: Path, path: Path) -> str:
    """The scope of the jobs.json at `path` under `root`: "" for root/cron/jobs.json, the key for users/<key>/."""
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        parts = ()
    if parts == (JOBS_DIR, JOBS_FILE):
        return ""
    if len(parts) == 4 and parts[0] == USERS_DIR and parts[2:] == (JOBS_DIR, JOBS_FILE):
        return parts[1]
    raise StorageError(f"{path} is not a jobs file of the workspace at {root} (cron/jobs.json)")


def path_of(root: Path, scope: str) -> Path:
    """Where the files backend keeps the jobs of `scope` under `root`."""
    return (root / USERS_DIR / scope if scope else root) / JOBS_DIR / JOBS_FILE


def transaction(pool: ConnectionPool, dsn: str) -> AbstractContextManager[psycopg.Connection]:
    """A connection in a transaction, its failures worded as the jobs' (connection.transaction)."""
    return _transaction(pool, dsn, "jobs")


def _lock_scope(conn: psycopg.Connection, scope: str) -> None:
    conn.execute("select pg_advisory_xact_lock(%s, hashtext(%s))", (JOBS_LOCK, scope))


def _text(record: JobRecord) -> str:
    return orjson.dumps(record).decode()


def _document(texts: list[str]) -> JobsDocument | None:
    return document_of([orjson.loads(text) for text in texts]) if texts else None


class _Overtaken(Exception):
    """A row the change would write was changed by a claim since it was read: the change starts again."""


def _store(conn: psycopg.Connection, scope: str, stored: dict[str, tuple[str, int, int]],
           records: list[JobRecord]) -> None:
    """Make the scope's rows hold `records`, locking and writing only the rows that differ from `stored`
    (id → text, place, revision as read), so claims of the other rows go on meanwhile; _Overtaken when one
    of those rows changed since it was read."""
    ids = [record["id"] for record in records]
    if len(set(ids)) != len(ids):
        raise StorageError("two jobs have the same id; nothing was changed")
    kept_order = [job_id for job_id in stored if job_id in set(ids)]  # `stored` is in the table's order
    renumber = kept_order != [job_id for job_id in ids if job_id in stored]
    last = max((place for _, place, _ in stored.values()), default=-1)
    texts = {record["id"]: _text(record) for record in records}
    changed = [job_id for position, job_id in enumerate(ids) if job_id in stored
               and (stored[job_id][0] != texts[job_id] or (renumber and stored[job_id][1] != position))]
    gone = [job_id for job_id in stored if job_id not in texts]
    if changed or gone:
        locked = conn.execute("select id, revision from jobs where scope = %s and id = any(%s) for update",
                              (scope, changed + gone)).fetchall()
        if any(stored[job_id][2] != revision for job_id, revision in locked) or len(locked) != len(changed + gone):
            raise _Overtaken
    if gone:
        conn.execute("delete from jobs where scope = %s and id = any(%s)", (scope, gone))
    for position, record in enumerate(records):
        job_id = record["id"]
        due = due_of(record)
        if job_id not in stored:
            last += 1
            conn.execute("insert into jobs (scope, id, job, due, position) values (%s, %s, %s::json, %s, %s)",
                         (scope, job_id, texts[job_id], due, position if renumber else last))
        elif job_id in changed:
            place = position if renumber else stored[job_id][1]
            conn.execute("update jobs set job = %s::json, due = %s, position = %s, "
                         "revision = nextval('job_revision') where scope = %s and id = %s",
                         (texts[job_id], due, place, scope, job_id))


class PostgresJobTable:
    """The jobs of one scope as rows of `jobs` (see the module's docstring)."""

    def __init__(self, pool: ConnectionPool, dsn: str, path: Path, scope: str):
        self.pool = pool
        self.dsn = dsn
        self.path = path
        self.scope = scope
        self.where = f"the PostgreSQL jobs table (scope {scope!r})" if scope else "the PostgreSQL jobs table"

    def read(self) -> Any:
        with transaction(self.pool, self.dsn) as conn:
            rows = conn.execute("select job::text from jobs where scope = %s order by position, id",
                                (self.scope,)).fetchall()
        return _document([row[0] for row in rows])

    def stamp(self) -> Hashable | None:
        with transaction(self.pool, self.dsn) as conn:
            row = conn.execute("select count(*), max(revision) from jobs where scope = %s", (self.scope,)).fetchone()
        return None if row is None or not row[0] else (int(row[0]), int(row[1]))

    def exists(self) -> bool:
        with transaction(self.pool, self.dsn) as conn:
            row = conn.execute("select exists (select 1 from jobs where scope = %s)", (self.scope,)).fetchone()
        return bool(row and row[0])

    def change(self, edit: DocumentEdit[T]) -> T:
        for _ in range(CHANGE_ATTEMPTS - 1):
            try:
                return self._change(edit)
            except _Overtaken:
                continue
        return self._change(edit, lock_all=True)

    def _change(self, edit: DocumentEdit[T], lock_all: bool = False) -> T:
        # The scope's advisory lock serialises changes (inserts too); the rows are read without a lock, so
        # claims of rows this change leaves alone are not held up. `lock_all`: the last attempt locks every
        # row first, waiting out the claims under way, so it cannot be overtaken.
        with transaction(self.pool, self.dsn) as conn:
            _lock_scope(conn, self.scope)
            rows = conn.execute("select id, job::text, position, revision from jobs where scope = %s "
                                "order by position, id" + (" for update" if lock_all else ""),
                                (self.scope,)).fetchall()
            written, result = edit(_document([row[1] for row in rows]))
            if written is not None:
                stored = {row[0]: (row[1], int(row[2]), int(row[3])) for row in rows}
                _store(conn, self.scope, stored, records_of(written, self.where))
        return result

    def claim(self, job_id: str, now: datetime, take: Take) -> JobRecord | None:
        with transaction(self.pool, self.dsn) as conn:
            # SKIP LOCKED: a row another scheduler is claiming (or a change is rewriting) is not waited for;
            # when it comes free its next run has moved on, so this run is that scheduler's.
            row = conn.execute("select job::text from jobs where scope = %s and id = %s and due <= %s "
                               "for update skip locked", (self.scope, job_id, now)).fetchone()
            if row is None:
                return None
            taken = take(orjson.loads(row[0]))
            if taken is None:
                return None
            if taken.get("id") != job_id:
                raise StorageError(f"a claim of job {job_id[:40]!r} cannot change its id; nothing was changed")
            conn.execute("update jobs set job = %s::json, due = %s, revision = nextval('job_revision') "
                         "where scope = %s and id = %s", (_text(taken), due_of(taken), self.scope, job_id))
        return taken


# -- moving between backends -------------------------------------------------------------------------------

def _all_rows(conn: psycopg.Connection) -> dict[str, list[str]]:
    scopes: dict[str, list[str]] = {}
    for scope, text in conn.execute("select scope, job::text from jobs order by scope, position, id"):
        scopes.setdefault(scope, []).append(text)
    return scopes


def export_jobs(pool: ConnectionPool, dsn: str, dest_root: Path) -> list[Path]:
    """Write every scope's jobs under `dest_root` as the files backend would hold them; the files written."""
    with transaction(pool, dsn) as conn:
        scopes = _all_rows(conn)
    written = []
    for scope, texts in scopes.items():
        document = _document(texts)
        assert document is not None
        path = path_of(dest_root, scope)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, document_bytes(document))
        written.append(path)
    return written


def _source_scopes(src_root: Path) -> dict[str, list[JobRecord]]:
    """The jobs files of a files workspace: "" for cron/jobs.json, each user key for users/<key>/cron/."""
    paths = [path_of(src_root, "")]
    users = src_root / USERS_DIR
    if users.is_dir():
        paths += sorted(path_of(src_root, folder.name) for folder in users.iterdir() if folder.is_dir())
    scopes = {}
    for path in paths:
        table = FilesJobTable(path)
        document = table.read()
        if document is not None:
            records = records_of(document, table.where)
            for record in records:
                due_of(record)  # an unreadable next run is refused before anything is written
            if records:
                scopes["" if path == paths[0] else path.parent.parent.name] = records
    return scopes


def import_jobs(pool: ConnectionPool, dsn: str, src_root: Path, replace: bool) -> int:
    """Load the jobs files under `src_root` into the table, in one transaction; the number of jobs.

    A table holding other jobs is refused (StorageError) unless `replace`; one holding exactly these is left
    as it is, so importing twice is the same as once.
    """
    scopes = _source_scopes(src_root)
    wanted = {scope: [_text(record) for record in records] for scope, records in scopes.items()}
    with transaction(pool, dsn) as conn:
        for scope in sorted(set(wanted) | {""}):
            _lock_scope(conn, scope)
        present = _all_rows(conn)
        normalised = {scope: [_text(orjson.loads(text)) for text in texts] for scope, texts in present.items()}
        if normalised == wanted:
            return sum(map(len, wanted.values()))
        if present and not replace:
            raise StorageError(f"the PostgreSQL jobs table already holds {sum(map(len, present.values()))} jobs: "
                               "import with replace (--replace) to overwrite them")
        conn.execute("delete from jobs")
        for scope, records in scopes.items():
            _store(conn, scope, {}, records)
    return sum(map(len, wanted.values()))


def job_counts(pool: ConnectionPool, dsn: str) -> dict[str, int]:
    """Rows of the jobs table, and how many of them are still to run."""
    with transaction(pool, dsn) as conn:
        row = conn.execute("select count(*), count(due) from jobs").fetchone()
    total, due = (int(row[0]), int(row[1])) if row else (0, 0)
    return {"jobs": total, "jobs_to_run": due}


def table_for(pool: ConnectionPool, dsn: str, root: Path, path: Path) -> PostgresJobTable:
    """The table standing for the jobs.json at `path` under the workspace `root`."""
    root, path = Path(os.path.abspath(root)), Path(os.path.abspath(path))
    return PostgresJobTable(pool, dsn, path, scope_of(root, path))

