"""Sessions on PostgreSQL: a `sessions` row a transcript, a `messages` row each of its records.

A transcript is named as the files layout names it, by its path under the scope's sessions folder
(`telegram%3A42.jsonl`; archived by /new: `archive/<stamp>_telegram%3A42.jsonl`), so archive and rename
change one row's name and its records stay where they are. A record is kept as the exact JSONL line the
files backend writes (orjson, no options), so `export_sessions` writes the files byte for byte.

An append is one statement: `last_seq` of the session row moves by the number of records and their
`seq` follow it (1, 2, 3 … per transcript, no gap, never reused: the row's update orders concurrent appends),
and a message record's id must follow the last one (`last_message_id`), so two writers can never number two
messages alike. Writers of one scope also share a transaction-scoped advisory lock (`lock()`), under which
transcripts/session_store.py reads what others appended and numbers its messages; an append of a session read
since the last write skips it when the statement finds it free (`APPEND_UNCHANGED`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Hashable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from picoclaw.disk.atomic import atomic_write
from picoclaw.layout import SESSIONS_DIR, USERS_DIR
from picoclaw.storage.errors import StorageError
from picoclaw.storage.postgres.connection import storage_errors as driver_errors
from picoclaw.storage.sessions import ARCHIVE_DIR, Transcript, record_lines, transcript_files

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

DDL = """
-- Conversations: a row a transcript, named by its path under the scope's sessions folder as the files layout
-- names it ("telegram%3A42.jsonl", archived: "archive/<stamp>_telegram%3A42.jsonl"). `revision` changes with
-- every append, archive and rename: a process compares it with the one it read to learn of another writer.
create sequence session_revision;
create table sessions (
    id              bigserial primary key,
    scope           text not null,
    name            text not null,
    last_seq        bigint not null default 0,
    last_message_id bigint not null default 0,
    revision        bigint not null default nextval('session_revision'),
    updated_at      timestamptz not null default now(),
    unique (scope, name)
);
-- A record of a transcript (message, compaction, reflection, undelivered mark): its JSONL line byte for byte.
create table messages (
    session_id bigint not null references sessions (id) on delete cascade,
    seq        bigint not null,   -- 1, 2, 3 … per transcript: the record's line in the file
    line       bytea not null,    -- the JSONL line without its newline
    message_id bigint,            -- a message record's id; null for the other records
    primary key (session_id, seq)
);
"""

# pg_advisory_xact_lock(class, key) of one scope's sessions: "sess" in ASCII, then hashtext(scope).
LOCK_CLASS = 0x73657373


# One statement an append: the session row moves its last_seq (and last message id) and the records take the seqs
# it made room for. A row whose last message id is not below the first one given is left alone, and then nothing
# is inserted and no row returned: the appender numbered its messages without another writer's.
APPEND = """
with moved as (
    insert into sessions as s (scope, name, last_seq, last_message_id)
    values (%(scope)s, %(name)s, %(count)s, coalesce(%(last)s, 0))
    on conflict (scope, name) do update set last_seq = s.last_seq + excluded.last_seq,
        last_message_id = coalesce(%(last)s, s.last_message_id), revision = nextval('session_revision'),
        updated_at = now()
    where %(first)s::bigint is null or s.last_message_id < %(first)s
    returning id, last_seq, revision
), added as (
    insert into messages (session_id, seq, line, message_id)
    select moved.id, moved.last_seq - %(count)s + r.n, r.line, r.message_id
    from moved, unnest(%(lines)s::bytea[], %(ids)s::bigint[]) with ordinality as r(line, message_id, n)
)
select revision from moved
"""

# An append without the lock: only while no writer holds it (tried, not waited for; let go as the statement ends)
# and while the row is still at the revision the appender read (checked on the row's newest version, as an
# UPDATE does under READ COMMITTED). Else nothing is written and no row returned.
APPEND_UNCHANGED = """
with free as (select pg_try_advisory_xact_lock(%(class)s, hashtext(%(scope)s)) as ok),
moved as (
    update sessions as s set last_seq = s.last_seq + %(count)s,
        last_message_id = coalesce(%(last)s, s.last_message_id), revision = nextval('session_revision'),
        updated_at = now()
    from free
    where free.ok and s.scope = %(scope)s and s.name = %(name)s and s.revision = %(revision)s
      and (%(first)s::bigint is null or s.last_message_id < %(first)s)
    returning s.id, s.last_seq, s.revision
), added as (
    insert into messages (session_id, seq, line, message_id)
    select moved.id, moved.last_seq - %(count)s + r.n, r.line, r.message_id
    from moved, unnest(%(lines)s::bytea[], %(ids)s::bigint[]) with ordinality as r(line, message_id, n)
)
select revision from moved
"""


def scope_of(root: Path, folder: Path) -> str:
    """The scope of sessions folder `folder` under workspace `root`: `users/<key>/sessions` → key, else ""."""
    parts = Path(os.path.relpath(os.path.abspath(folder), os.path.abspath(root))).parts
    if len(parts) == 3 and parts[0] == USERS_DIR and parts[2] == SESSIONS_DIR:
        return parts[1]
    return ""


def sessions_folder(root: Path, scope: str) -> Path:
    """Where the files layout keeps the transcripts of `scope` under `root`."""
    if not scope:
        return root / SESSIONS_DIR
    if scope in (".", "..") or "/" in scope or "\\" in scope:
        raise StorageError(f"a session scope is not a folder name: {scope!r}")
    return root / USERS_DIR / scope / SESSIONS_DIR


def message_id(line: bytes) -> int | None:
    """The id of the message a record line holds, None for another record (or a line that does not parse)."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if isinstance(record, dict) and record.get("type") == "message":
        found = record.get("id")
        return found if isinstance(found, int) and not isinstance(found, bool) else None
    return None


def _out_of_order(name: str, given: int, previous: int) -> StorageError:
    return StorageError(f"session {name}: message id {given} does not follow {previous} "
                        "(another writer numbered its messages first); nothing was written")


def storage_errors(dsn: str) -> AbstractContextManager[None]:
    """Driver errors of a sessions change as one line (connection.storage_errors)."""
    return driver_errors(dsn, "a sessions change")


class PostgresSessionLog:
    """The transcripts of one scope as rows; `lock()` is an advisory lock held by this thread's transaction."""

    def __init__(self, pool: ConnectionPool, dsn: str, root: Path, folder: Path):
        self.folder = Path(folder)
        self._pool, self._dsn, self._root = pool, dsn, Path(root)
        self.scope = scope_of(self._root, self.folder)
        # The connection whose transaction holds the lock, per thread: reads and appends under the lock run in
        # it (so a waiter never holds the pool connection the holder needs) and commit when the lock is let go.
        self._held = threading.local()

    @contextmanager
    def lock(self) -> Iterator[None]:
        if getattr(self._held, "conn", None) is not None:  # reentrant: the transaction already holds it
            yield
            return
        with storage_errors(self._dsn), self._pool.connection() as conn, conn.transaction():
            conn.execute("select pg_advisory_xact_lock(%s, hashtext(%s))", (LOCK_CLASS, self.scope))
            self._held.conn = conn
            try:
                yield
            finally:
                self._held.conn = None

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A transaction of its own, or the lock's when this thread holds it: a failed step then fails the lock's
        whole block (nothing of it is kept), so no savepoint is needed, and none is paid for."""
        with self._connection(own_transaction=True) as conn:
            yield conn

    @contextmanager
    def _reading(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection for one read statement (atomic by itself): the lock's, or a pool connection without BEGIN
        and COMMIT."""
        with self._connection(own_transaction=False) as conn:
            yield conn

    @contextmanager
    def _connection(self, *, own_transaction: bool) -> Iterator[psycopg.Connection[Any]]:
        held = getattr(self._held, "conn", None)
        with storage_errors(self._dsn):
            if held is not None:
                yield held
            elif own_transaction:
                with self._pool.connection() as conn, conn.transaction():
                    yield conn
            else:
                with self._pool.connection() as conn:
                    yield conn

    def _locate(self, path: Path) -> tuple[str, str]:
        """(scope, name) of the transcript at `path` (in this folder, its archive, or another scope's folder)."""
        folder, name = path.parent, path.name
        if folder.name == ARCHIVE_DIR:
            folder, name = folder.parent, f"{ARCHIVE_DIR}/{name}"
        return scope_of(self._root, folder), name

    def read(self, path: Path) -> Transcript:
        with self._reading() as conn:
            rows = conn.execute(
                "select s.revision, m.line from sessions s left join messages m on m.session_id = s.id "
                "where s.scope = %s and s.name = %s order by m.seq", self._locate(path)).fetchall()
        if not rows:
            return Transcript([], None)
        return Transcript([bytes(line) for _, line in rows if line is not None], rows[0][0])

    def marker(self, path: Path) -> Hashable | None:
        with self._reading() as conn:
            row = conn.execute("select revision from sessions where scope = %s and name = %s",
                               self._locate(path)).fetchone()
        return row[0] if row else None

    def _append_params(self, path: Path, lines: list[bytes]) -> dict[str, Any]:
        """APPEND's (and APPEND_UNCHANGED's) parameters; StorageError for message ids out of order in `lines`."""
        scope, name = self._locate(path)
        ids = [message_id(line) for line in lines]
        given = [found for found in ids if found is not None]
        for before, after in zip([0, *given], given):
            if after <= before:
                raise _out_of_order(name, after, before)
        return {"scope": scope, "name": name, "count": len(lines), "lines": lines, "ids": ids,
                "first": given[0] if given else None, "last": given[-1] if given else None}

    def append(self, path: Path, records: list[dict[str, Any]]) -> Hashable | None:
        lines = record_lines(records)
        if not lines:
            return self.marker(path)
        params = self._append_params(path, lines)
        with self._transaction() as conn:
            row = conn.execute(APPEND, params).fetchone()
            if row is None:  # the row holds a later message id: raised inside the transaction, so nothing is kept
                last = conn.execute("select last_message_id from sessions where scope = %s and name = %s",
                                    (params["scope"], params["name"])).fetchone()
                raise _out_of_order(params["name"], params["first"], last[0] if last else 0)
        return row[0]

    def append_unchanged(self, path: Path, records: list[dict[str, Any]], marker: Hashable) -> Hashable | None:
        if getattr(self._held, "conn", None) is not None:  # this thread holds the lock: `append` under it
            return None
        lines = record_lines(records)
        if not lines:
            return None
        params = {**self._append_params(path, lines), "class": LOCK_CLASS, "revision": marker}
        with self._reading() as conn:  # one statement: atomic by itself
            row = conn.execute(APPEND_UNCHANGED, params).fetchone()
        return None if row is None else row[0]

    def exists(self, path: Path) -> bool:
        return self.marker(path) is not None

    def move(self, old: Path, new: Path) -> bool:
        with self._transaction() as conn:
            if conn.execute("select 1 from sessions where scope = %s and name = %s", self._locate(new)).fetchone():
                return False
            moved = conn.execute("update sessions set scope = %s, name = %s, revision = nextval('session_revision'), "
                                 "updated_at = now() where scope = %s and name = %s",
                                 (*self._locate(new), *self._locate(old)))
            return moved.rowcount == 1

    def archive(self, path: Path, stamp: str) -> Path | None:
        scope, name = self._locate(path)
        prefix = f"{ARCHIVE_DIR}/{stamp}"
        with self._transaction() as conn:
            taken = {row[0] for row in conn.execute(
                "select name from sessions where scope = %s and starts_with(name, %s)", (scope, prefix))}
            counter = 0  # as disk/stamped.py names them: <stamp>_<name>, then <stamp>_1_<name> …
            while (target := f"{prefix}{f'_{counter}' if counter else ''}_{name}") in taken:
                counter += 1
            moved = conn.execute("update sessions set name = %s, revision = nextval('session_revision'), "
                                 "updated_at = now() where scope = %s and name = %s", (target, scope, name))
            if moved.rowcount != 1:
                return None
        return self.folder / target

    def transcripts(self) -> list[Path]:
        with self._reading() as conn:
            names = [row[0] for row in conn.execute("select name from sessions where scope = %s", (self.scope,))]
        return sorted(self.folder / name for name in names)

    def modified(self, path: Path) -> float:
        with self._reading() as conn:
            row = conn.execute("select extract(epoch from updated_at)::float8 from sessions "
                               "where scope = %s and name = %s", self._locate(path)).fetchone()
        return float(row[0]) if row else 0.0


def export_sessions(pool: ConnectionPool, dsn: str, dest_root: Path) -> int:
    """Write every transcript to `dest_root` as the files backend holds it (one snapshot); how many."""
    with storage_errors(dsn), pool.connection() as conn, conn.transaction():
        conn.execute("set transaction isolation level repeatable read")
        sessions = conn.execute("select id, scope, name from sessions order by scope, name").fetchall()
        for session_id, scope, name in sessions:
            lines = conn.execute("select line from messages where session_id = %s order by seq", (session_id,))
            atomic_write(sessions_folder(dest_root, scope) / name, [bytes(row[0]) + b"\n" for row in lines])
    return len(sessions)


def _transcripts_under(src_root: Path) -> Iterator[tuple[str, str, Path]]:
    """(scope, name, file) of every transcript in the files layout under `src_root`."""
    folders = [("", src_root / SESSIONS_DIR)]
    users = src_root / USERS_DIR
    if users.is_dir():
        folders += [(user.name, user / SESSIONS_DIR) for user in sorted(users.iterdir()) if user.is_dir()]
    for scope, folder in folders:
        for path in transcript_files(folder):
            yield scope, path.relative_to(folder).as_posix(), path


def import_sessions(pool: ConnectionPool, dsn: str, src_root: Path, replace: bool) -> int:
    """Load the transcripts of the files layout under `src_root`, in one transaction; how many.

    A database that holds sessions already is refused (StorageError) unless `replace`, which drops them
    first: importing the same folder again gives the same rows. A torn last line is not a record: left out.
    """
    found = []
    for scope, name, path in _transcripts_under(src_root):
        lines = path.read_bytes().split(b"\n")[:-1]
        found.append((scope, name, lines))
    with storage_errors(dsn), pool.connection() as conn, conn.transaction():
        # Appenders wait until the import is done, and see none of it before.
        conn.execute("lock table sessions, messages in exclusive mode")
        held = conn.execute("select count(*) from sessions").fetchone()
        if held and held[0] and not replace:
            raise StorageError(f"the database holds {held[0]} session transcripts already: import with "
                               "--replace to overwrite them")
        conn.execute("delete from sessions")
        for scope, name, lines in found:
            ids = [message_id(line) for line in lines]
            row = conn.execute(
                "insert into sessions (scope, name, last_seq, last_message_id) values (%s, %s, %s, %s) returning id",
                (scope, name, len(lines), max((given for given in ids if given is not None), default=0))).fetchone()
            assert row is not None
            with conn.cursor() as cur, cur.copy("copy messages (session_id, seq, line, message_id) from stdin") as copy:
                copy.set_types(["int8", "int8", "bytea", "int8"])
                for seq, (line, given) in enumerate(zip(lines, ids, strict=True), start=1):
                    copy.write_row((row[0], seq, line, given))
    return len(found)


def session_counts(pool: ConnectionPool, dsn: str) -> dict[str, int]:
    """Rows per sessions table."""
    with storage_errors(dsn), pool.connection() as conn:
        row = conn.execute("select (select count(*) from sessions), (select count(*) from messages)").fetchone()
    assert row is not None
    return {"sessions": int(row[0]), "messages": int(row[1])}
