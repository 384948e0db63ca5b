"""Memory documents as rows: the Markdown a file would hold, and its versions.

`PostgresDocuments` is the documents port (storage/documents.py) on PostgreSQL: each write is one statement
(a replace checks the revision it expects in its WHERE clause), durable when it returns; each read asks the rows.
A reader that wants a file (`local`: the entry table of MEMORY.md, the large-file search, the index) gets this
machine's cache of the document under .picoclaw-work/documents/ (`LocalCopies`), rewritten only when the row's
revision moved. Nothing is ever read as memory from the workspace folder, or sent from the cache. Versions (the
files backend's memory/backups/) are rows of `document_versions` only.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from filelock import FileLock

from picoclaw import clock
from picoclaw.disk.atomic import atomic_write
from picoclaw.disk.file_identity import FileKey, file_key
from picoclaw.layout import MEMORY_DIR, USERS_DIR
from picoclaw.storage.documents import MISSING, Changes, Document, StaleRevision
from picoclaw.storage.errors import StorageError, StorageUnavailable
from picoclaw.storage.files_documents import VERSIONS_DIR, FilesDocuments
from picoclaw.storage.postgres.connection import storage_errors
from picoclaw.storage.read_round import ReadRound, current_round
from picoclaw.storage.stored_files import document_names
from picoclaw.storage.work import WORK_DIR

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

log = logging.getLogger(__name__)

# pg_advisory_xact_lock class for a scope's first content ("adop" in ASCII); the key is hashtext(scope).
ADOPT_LOCK_CLASS = 0x61646F70

DDL = """
create sequence document_revision;
-- A memory document: exactly the bytes the file would hold. `revision` grows with every change anywhere,
-- so a machine brings its copy up to date with the rows past the last revision it saw.
create table documents (
    scope      text not null,
    name       text not null,            -- the path under the scope's root, "/"-separated
    content    bytea,                    -- null: deleted (kept so other machines learn of it)
    revision   bigint not null default nextval('document_revision'),
    updated_at timestamptz not null default now(),
    primary key (scope, name)
);
create index documents_revision on documents (scope, revision);
-- What a document held before each replace (the backups of the files backend), pruned to backup_keep.
create table document_versions (
    id          bigserial primary key,
    scope       text not null,
    name        text not null,
    content     bytea not null,
    replaced_at timestamptz not null default now()
);
create index document_versions_name on document_versions (scope, name, id);
"""

# Versions get the label the files backend gives a backup (`<UTC stamp>_<id><suffix>`), so a copy's
# memory/backups/ and an export look as files would. The backups that earlier versions kept as document rows
# (memory/backups/<label>) become the versions, so the history is kept once; the versions those versions kept of
# every replace (the same history again, and of notes and bootstrap files too) stay unlabelled: never listed,
# copied or exported, and not deleted either.
DDL_V4 = r"""
alter table document_versions add column label text, add column suffix text;
insert into document_versions (scope, name, content, replaced_at, label, suffix)
    select scope, 'memory/' || substr(regexp_replace(name, '^memory/backups/\d{8}_\d{6}Z?(_\d+)?', ''), 2),
           content, updated_at, regexp_replace(name, '^.*/', ''),
           regexp_replace(name, '^memory/backups/\d{8}_\d{6}Z?(_\d+)?', '')
    from documents where name ~ '^memory/backups/\d{8}_\d{6}' and content is not null;
update documents set content = null, revision = nextval('document_revision'), updated_at = now()
    where name like 'memory/backups/%' and content is not null;
create index document_versions_suffix on document_versions (scope, suffix, id);
"""

LOCAL_LOCK = ".storage.lock"  # in a scope's cache folder: this machine's processes take the scope's lock in turn
CACHE_LOCK = ".cache.lock"  # beside it: held while a cached file is written
CACHE_DIR = "documents"  # under the work folder: this machine's cache of the rows, the files layout per scope


def scan_documents(scope_root: Path, *, shared: bool = True) -> dict[str, Path]:
    """The scope's document files by name (storage/stored_files.py's rule: the one place that says what is stored)."""
    return {name: scope_root / name for name in document_names(scope_root, shared=shared)}


_STAMPED = re.compile(r"^\d{8}_\d{6}Z?(_\d+)?_")


def is_version(name: str) -> bool:
    """Whether a file of the files layout is a version (memory/backups/<stamp>…), not a document."""
    return name.startswith(f"{VERSIONS_DIR}/")


def cache_root(workspace: Path, scope: str) -> Path:
    """Where this machine caches scope `scope`'s documents: .picoclaw-work/documents/[users/<scope>/]."""
    return scope_folder(workspace / WORK_DIR / CACHE_DIR, scope)


class LocalCopies:
    """This machine's cache of one scope's documents, for the readers that want a file: each file written from
    its row when read, and kept while the row's revision stays what it was fetched at.

    A cached file counts only while its stat is what this process wrote or fetched (`_known`): a file another
    process rewrote, a torn write, a hand edit, is fetched again. Each file is written and its stat taken under
    one lock (`_writing`: this process's threads, and this machine's processes), so a stat recorded is always
    that of the bytes written. It is a cache: never the truth, never sent.
    """

    def __init__(self, scope: str, root: Path, *, shared: bool):
        self.scope = scope
        self.files = FilesDocuments(scope, root, shared=shared)
        self._known: dict[str, tuple[int, FileKey]] = {}  # name -> (revision, the stat of its file then)
        self._guard = threading.Lock()
        self._file_lock = FileLock(str(root / CACHE_LOCK))

    @contextmanager
    def _writing(self) -> Iterator[None]:
        with self._guard:
            self.files.root.mkdir(parents=True, exist_ok=True)
            with self._file_lock:
                yield

    def _revision(self, name: str) -> int:
        """The revision the cached file of `name` holds (-1: none known, or the file changed since)."""
        known = self._known.get(name)
        if known is None or file_key(self.files.path(name)) != known[1]:
            return -1
        return known[0]

    def current(self, conn: psycopg.Connection, name: str, round_: ReadRound | None = None) -> Path:
        """The cached file of `name`, brought to its row: one statement, with the content only when it moved.
        In a read round, the scope's list (`listed`) says whether it moved; its content is fetched only then."""
        if round_ is None:
            self._check(conn, [name])
            return self.files.path(name)
        revision = self.listed(conn, round_).get(name)
        if revision is None:
            self._drop(name)
        elif self._revision(name) < revision:
            self._check(conn, [name])
        return self.files.path(name)

    def listed(self, conn: psycopg.Connection, round_: ReadRound) -> dict[str, int]:
        """The scope's documents and their revisions as round `round_` saw them (listed at its first read)."""
        found = round_.listed.get(self.scope)
        if found is None:
            rows = conn.execute("select name, revision from documents where scope = %s and content is not null",
                                (self.scope,)).fetchall()
            found = round_.listed[self.scope] = {name: int(revision) for name, revision in rows
                                                 if not is_version(name)}
            for name in [known for known in list(self._known) if known not in found]:
                self._drop(name)  # removed meanwhile: from now on a cached file not listed is one this round wrote
        return found

    def _check(self, conn: psycopg.Connection, names: list[str]) -> None:
        """Bring the cached files of `names` to their rows in one statement (content sent only for those whose
        revision moved); files of documents with no row removed."""
        rows = conn.execute(
            "select k.name, d.revision, case when d.revision = k.have then null else d.content end "
            "from unnest(%s::text[], %s::bigint[]) as k(name, have) join documents d on d.scope = %s "
            "and d.name = k.name and d.content is not null",
            (names, [self._revision(name) for name in names], self.scope)).fetchall()
        live = set()
        for name, revision, content in rows:
            live.add(name)
            if content is not None:
                self._take(name, int(revision), bytes(content))
        for name in names:
            if name not in live:
                self._drop(name)

    def fresh(self, round_: ReadRound, name: str) -> Path | None:
        """The cached file of `name` when round `round_` listed the scope and the file holds the listed revision
        or a later one this process wrote (or, for a document not listed, there is no file or this process
        wrote one since); None: it must be fetched."""
        listed = round_.listed.get(self.scope)
        if listed is None:
            return None
        revision, have, path = listed.get(name), self._revision(name), self.files.path(name)
        if revision is None:
            return path if have >= 0 or not os.path.lexists(path) else None
        return path if have >= revision else None

    def cached(self, name: str) -> Document | None:
        """The cached document `name` with the revision it holds (data None: no document); None: not known."""
        path = self.files.path(name)
        revision = self._revision(name)
        if revision < 0:
            return None if os.path.lexists(path) else Document(name, None, MISSING)
        try:
            return Document(name, path.read_bytes(), str(revision))
        except OSError:
            return None

    def current_folder(self, conn: psycopg.Connection, prefix: str, round_: ReadRound | None = None) -> Path:
        """The cache's folder `prefix`, every document under it brought to its row (one statement to list them,
        or the round's list; one to fetch those that moved); files of documents no longer there removed."""
        if round_ is None:
            rows = conn.execute("select name, revision from documents where scope = %s and content is not null "
                                "and name like %s", (self.scope, _like(prefix))).fetchall()
            live = {name: int(revision) for name, revision in rows if not is_version(name)}
        else:
            live = {name: revision for name, revision in self.listed(conn, round_).items() if name.startswith(prefix)}
        moved = [name for name, revision in live.items() if self._revision(name) < revision]
        if moved:
            for name, revision, content in conn.execute(
                    "select name, revision, content from documents where scope = %s and name = any(%s) "
                    "and content is not null", (self.scope, moved)):
                self._take(name, int(revision), bytes(content))
        for name in self.files.names(prefix):
            if name not in live:
                self._drop(name)
        if round_ is not None:
            round_.folders.add((self.scope, prefix))
        return self.files.local_folder(prefix)

    def fresh_folder(self, round_: ReadRound, prefix: str) -> Path | None:
        """The cache's folder `prefix` when round `round_` brought it to its list already and every document
        listed under it is still fresh."""
        listed = round_.listed.get(self.scope)
        if listed is None or (self.scope, prefix) not in round_.folders or any(
                self.fresh(round_, name) is None for name in listed if name.startswith(prefix)):
            return None
        return self.files.local_folder(prefix)

    def _take(self, name: str, revision: int, data: bytes) -> None:
        """Write `data` (the row at `revision`) as the cached file, unless a newer revision is there already."""
        with self._writing():
            if self._revision(name) >= revision:
                return  # a write of this process (or a faster reader) brought a newer one meanwhile
            # Another process of this machine may have written the same bytes: left as they are, its own record of
            # the file stays good (rewritten, each process would make the other's stale, and fetch again).
            if not _holds(self.files.path(name), data):
                self.files.replace(name, data, durable=False)
            self._note(name, revision)

    def _drop(self, name: str) -> None:
        if name not in self._known and not os.path.lexists(self.files.path(name)):
            return  # nothing cached: the usual case of a document not written yet, with no lock to take
        with self._writing():
            self.files.delete(name)
            self._known.pop(name, None)

    def _note(self, name: str, revision: int) -> None:
        key = file_key(self.files.path(name))
        if key is None:
            self._known.pop(name, None)
        else:
            self._known[name] = (revision, key)

    def wrote(self, name: str, revision: int, write: Callable[[FilesDocuments], object], *,
              based_on: int | None = None) -> None:
        """After this process wrote the row of `name` at `revision`: the same change made to the cached file by
        `write` (so a large document is not fetched again), only when it holds revision `based_on` (None: any);
        otherwise, or on failure, it is left to be fetched when next read."""
        with self._writing():
            if based_on is not None and self._revision(name) != based_on:
                self._known.pop(name, None)
                return
            try:
                write(self.files)
                self._note(name, revision)
            except OSError as exc:
                log.warning("%s: saved in PostgreSQL, but this machine's cache of it could not be written (%s); "
                            "it is fetched again when read", name, exc.strerror or exc)
                self._known.pop(name, None)


def adopt_folder(conn: psycopg.Connection, scope: str, scope_root: Path) -> None:
    """A scope the database holds nothing of (not even a removed document) takes the folder's documents as its
    first content: a workspace folder opened on an empty database keeps what it shows. Never afterwards: from
    then on the rows are the truth, and a file of the folder is not memory."""
    if _holds_any(conn, scope):
        return
    found = {name: path.read_bytes() for name, path in scan_documents(scope_root, shared=not scope).items()}
    if not found:
        return
    with conn.transaction():
        conn.execute("select pg_advisory_xact_lock(%s, hashtext(%s))", (ADOPT_LOCK_CLASS, scope))
        if _holds_any(conn, scope):
            return
        for name, data in found.items():
            if is_version(name):
                label, suffix, document = _version_row(name)
                conn.execute("insert into document_versions (scope, name, content, label, suffix) "
                             "values (%s, %s, %s, %s, %s)", (scope, document, data, label, suffix))
            else:
                conn.execute("insert into documents (scope, name, content) values (%s, %s, %s) "
                             "on conflict (scope, name) do nothing", (scope, name, data))
    log.info("%s: the database held no memory of this folder, so its %d files were stored as the first content "
             "(once; from now on the database is the truth)", scope_root, len(found))


def _holds_any(conn: psycopg.Connection, scope: str) -> bool:
    row = conn.execute("select exists (select 1 from documents where scope = %s) or exists "
                       "(select 1 from document_versions where scope = %s)", (scope, scope)).fetchone()
    return bool(row and row[0])


def _like(prefix: str) -> str:
    """A LIKE pattern for the names that start with `prefix`."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class PostgresDocuments:
    """The documents of one scope as rows: every write one statement, durable when it returns; every read one
    statement too (`local`: into this machine's cache, `copies`, only what moved). Writes hold the scope's lock."""

    def __init__(self, pool: ConnectionPool, dsn: str, scope: str, root: Path, copies: LocalCopies,
                 lock: Callable[[float | None], AbstractContextManager[object]],
                 held: Callable[[], psycopg.Connection], holding: Callable[[], bool], *, lease: float):
        self.pool = pool
        self.dsn = dsn
        self.scope = scope
        self.root = root  # the scope's folder in the workspace, for names only: nothing is read from it
        self.copies = copies
        self.lease = lease
        self._lock = lock
        self._held = held  # the connection holding the scope's lock, in the thread that holds it
        self._holding = holding  # whether this thread holds the scope's lock
        self._names = FilesDocuments(scope, root)  # names and paths of the workspace layout

    def path(self, name: str) -> Path:
        return self._names.path(name)

    def name(self, path: Path) -> str:
        return self._names.name(path)

    @contextmanager
    def _statement(self, what: str) -> Iterator[psycopg.Connection]:
        """A pool connection for a read."""
        with storage_errors(self.dsn, what), self.pool.connection() as conn:
            yield conn

    @contextmanager
    def _write(self, what: str) -> Iterator[psycopg.Connection]:
        """The scope's lock held, and the connection holding it for the write: a holder whose lease ran out while
        it was stopped finds its session ended, and its write fails in one line rather than landing late."""
        with self._lock(None):
            conn = self._held()
            try:
                with storage_errors(self.dsn, what):
                    yield conn
            except StorageUnavailable:
                if conn.closed or conn.broken:
                    raise StorageUnavailable(
                        f"the memory lock was lost before {what} (this process was stopped or cut off from "
                        f"PostgreSQL for longer than the lock's lease of {self.lease:g} s); nothing was written"
                    ) from None
                raise

    def _round(self) -> ReadRound | None:
        """The open read round, unless this thread holds the scope's lock: a read-modify-write reads the row."""
        return None if self._holding() else current_round()

    def local(self, name: str) -> Path:
        self.path(name)  # a name that leaves the scope is refused before any query
        round_ = self._round()
        found = None if round_ is None else self.copies.fresh(round_, name)
        if found is not None:
            return found
        with self._statement(f"reading {name}") as conn:
            return self.copies.current(conn, name, round_)

    def local_folder(self, prefix: str) -> Path:
        if prefix.strip("/"):
            self.path(prefix)
        round_ = self._round()
        found = None if round_ is None else self.copies.fresh_folder(round_, prefix)
        if found is not None:
            return found
        with self._statement(f"reading {prefix or 'the documents'}") as conn:
            return self.copies.current_folder(conn, prefix, round_)

    def read(self, name: str) -> Document:
        self.path(name)
        round_ = self._round()
        if round_ is not None:  # within a read round, from this machine's cache like `local`
            self.local(name)
            found = self.copies.cached(name)
            if found is not None:
                return found
        with self._statement(f"reading {name}") as conn:
            row = conn.execute("select content, revision from documents where scope = %s and name = %s",
                               (self.scope, name)).fetchone()
        if row is None or row[0] is None:
            return Document(name, None, MISSING)
        return Document(name, bytes(row[0]), str(row[1]))

    def replace(self, name: str, data: bytes | str, *, expect: str | None = None, durable: bool = True) -> str:
        payload = data.encode("utf-8") if isinstance(data, str) else data
        self.path(name)
        if is_version(name):  # kept once, as versions (keep_version): never also as a document
            raise StorageError(f"{name}: memory/backups/ holds versions, which are kept when a document is "
                               "rewritten, not written as documents")
        with self._write(f"a change of {name}") as conn:
            if expect is None:
                row = conn.execute(
                    "insert into documents (scope, name, content) values (%s, %s, %s) on conflict (scope, name) "
                    "do update set content = excluded.content, revision = nextval('document_revision'), "
                    "updated_at = now() returning revision", (self.scope, name, payload)).fetchone()
            elif expect == MISSING:
                row = conn.execute(
                    "insert into documents (scope, name, content) values (%s, %s, %s) on conflict (scope, name) "
                    "do update set content = excluded.content, revision = nextval('document_revision'), "
                    "updated_at = now() where documents.content is null returning revision",
                    (self.scope, name, payload)).fetchone()
            else:
                row = conn.execute(
                    "update documents set content = %s, revision = nextval('document_revision'), updated_at = now() "
                    "where scope = %s and name = %s and revision = %s and content is not null returning revision",
                    (payload, self.scope, name, _revision(expect))).fetchone()
            if row is None:
                raise StaleRevision(f"{name} was changed since it was read; nothing was written")
            revision = int(row[0])
        self.copies.wrote(name, revision, lambda files: files.replace(name, payload, durable=False))
        return str(revision)

    def create(self, name: str, data: bytes | str) -> bool:
        try:
            self.replace(name, data, expect=MISSING)
        except StaleRevision:
            return False
        return True

    def append(self, name: str, data: bytes) -> str:
        self.path(name)
        with self._write(f"an append to {name}") as conn:
            row = conn.execute(
                "with old as (select revision from documents where scope = %s and name = %s "
                "and content is not null for update) "
                "update documents set content = content || %s, revision = nextval('document_revision'), "
                "updated_at = now() from old where scope = %s and name = %s returning documents.revision, "
                "old.revision", (self.scope, name, data, self.scope, name)).fetchone()
            if row is None:
                raise StorageError(f"{name} does not exist: there is nothing to append to")
        # The cached file gets the append too when it held the row as it was (else it is fetched when next read).
        self.copies.wrote(name, int(row[0]), lambda files: files.append(name, data), based_on=int(row[1]))
        return str(row[0])

    def append_records(self, name: str, records: Sequence[dict[str, Any]], *, durable: bool = True) -> int:
        payload = b"".join(orjson.dumps(record) + b"\n" for record in records)
        self.path(name)
        with self._write(f"an append to {name}") as conn:
            # As on files (disk/appends.py: append_jsonl): records start on a line of their own after a torn last line.
            row = conn.execute(
                "insert into documents (scope, name, content) values (%s, %s, %s) on conflict (scope, name) "
                "do update set content = case when documents.content is null then excluded.content "
                "when octet_length(documents.content) = 0 or substring(documents.content from "
                "octet_length(documents.content)) = '\\x0a'::bytea then documents.content || excluded.content "
                "else documents.content || '\\x0a'::bytea || excluded.content end, "
                "revision = nextval('document_revision'), updated_at = now() "
                "returning revision, octet_length(content)", (self.scope, name, payload)).fetchone()
            assert row is not None  # the cached file, if any, is fetched again when next read
            return int(row[1])

    def delete(self, name: str) -> None:
        self.path(name)
        with self._write(f"removing {name}") as conn:
            conn.execute(
                "update documents set content = null, revision = nextval('document_revision'), updated_at = now() "
                "where scope = %s and name = %s and content is not null", (self.scope, name))
        self.copies.wrote(name, 0, lambda files: files.delete(name))

    def names(self, prefix: str = "") -> list[str]:
        with self._statement("the list of documents") as conn:
            return sorted(name for (name,) in conn.execute(
                "select name from documents where scope = %s and content is not null and name like %s",
                (self.scope, _like(prefix))))

    def changes_since(self, mark: str) -> Changes:
        """Documents written (or removed) after revision `mark`, from the rows."""
        with self._statement("the changed documents") as conn:
            rows = conn.execute("select name, revision from documents where scope = %s and revision > %s "
                                "order by revision", (self.scope, _revision(mark) if mark else 0)).fetchall()
        return Changes([name for name, _ in rows], str(rows[-1][1]) if rows else mark)

    def keep_version(self, name: str, data: bytes, suffix: str, keep: int) -> str:
        stamp = clock.stamp(clock.now(UTC))
        with self._write(f"a version of {name}") as conn, conn.transaction():
            # The id drawn first, so the label can carry it (a counter no other version of that second has).
            row = conn.execute(
                "with drawn as (select nextval('document_versions_id_seq') as id) "
                "insert into document_versions (id, scope, name, content, suffix, label) "
                "select id, %s, %s, %s, %s, %s || '_' || id || %s from drawn returning id, label",
                (self.scope, name, data, suffix, stamp, suffix)).fetchone()
            assert row is not None
            if keep > 0:
                conn.execute("delete from document_versions where scope = %s and suffix = %s and id not in "
                             "(select id from document_versions where scope = %s and suffix = %s "
                             "order by id desc limit %s)", (self.scope, suffix, self.scope, suffix, keep))
            return str(row[1])

    def versions(self, suffix: str) -> list[str]:
        return [label for label, _ in self.version_sizes(suffix)]

    def version_sizes(self, suffix: str) -> list[tuple[str, int]]:
        with self._statement("the list of versions") as conn:
            return [(label, int(size)) for label, size in conn.execute(
                "select label, octet_length(content) from document_versions where scope = %s and suffix = %s "
                "and label is not null order by id", (self.scope, suffix))]

    def read_version(self, label: str) -> bytes:
        with self._statement(f"the version {label}") as conn:
            row = conn.execute("select content from document_versions where scope = %s and label = %s",
                               (self.scope, label)).fetchone()
        if row is None:
            raise StorageError(f"no version named {label!r}")
        return bytes(row[0])

    def exclusive(self, timeout: float | None = None) -> AbstractContextManager[object]:
        """The scope's lock, held across machines."""
        return self._lock(timeout)


def _holds(path: Path, data: bytes) -> bool:
    """Whether the file at `path` holds exactly `data` (its size compared first)."""
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except OSError:
        return False


def _revision(text: str) -> int:
    """A revision given back by this port (a number); anything else matches no row."""
    try:
        return int(text)
    except ValueError:
        return -1


def scope_folder(dest_root: Path, scope: str) -> Path:
    """Where scope `scope`'s documents go in the files layout: the root, or users/<scope>/."""
    return dest_root / USERS_DIR / scope if scope else dest_root


def export_documents(conn: psycopg.Connection, dest_root: Path) -> int:
    """Write every live document and every version of every scope into the files layout under `dest_root`
    (versions as memory/backups/<label>); how many files."""
    count = 0
    with conn.transaction():
        with conn.cursor(name="picoclaw_export") as cursor:
            cursor.execute("select scope, name, content from documents where content is not null "
                           "order by scope, name")
            for scope, name, content in cursor:
                atomic_write(scope_folder(dest_root, scope) / name, bytes(content))
                count += 1
        with conn.cursor(name="picoclaw_export_versions") as cursor:
            cursor.execute("select scope, label, content from document_versions where label is not null "
                           "order by scope, id")
            for scope, label, content in cursor:
                atomic_write(scope_folder(dest_root, scope) / VERSIONS_DIR / label, bytes(content))
                count += 1
    return count


def workspace_documents(src_root: Path) -> dict[tuple[str, str], bytes]:
    """The documents and versions of a files workspace, by (scope, name): the shared scope's and each user's."""
    found = {("", name): path.read_bytes() for name, path in scan_documents(src_root).items()}
    users = src_root / USERS_DIR
    if users.is_dir():
        for folder in sorted(users.iterdir()):
            if folder.is_dir():
                found.update({(folder.name, name): path.read_bytes()
                              for name, path in scan_documents(folder, shared=False).items()})
    return found


def _version_row(name: str) -> tuple[str, str, str]:
    """(label, suffix, the document's name) of the version file `name` (memory/backups/<stamp><suffix>)."""
    label = name.rsplit("/", 1)[-1]
    match = _STAMPED.match(label)
    suffix = label[match.end() - 1:] if match else f"_{label}"
    return label, suffix, f"{MEMORY_DIR}/{suffix[1:]}"


def import_documents(conn: psycopg.Connection, found: dict[tuple[str, str], bytes], replace: bool) -> bool:
    """Load `found` (documents, and versions under memory/backups/) in one transaction (False, nothing done, when
    the table holds live documents and not `replace`); with `replace`, live rows not among them become tombstones
    and versions not among them go. Unchanged rows keep their revision: importing the same again changes nothing."""
    documents = {key: data for key, data in found.items() if not is_version(key[1])}
    versions = {(scope, _version_row(name)[0]): (name, data) for (scope, name), data in found.items()
                if is_version(name)}
    with conn.transaction():
        # Every scope's writers hold its advisory lock; one transaction lock keeps them all out meanwhile.
        conn.execute("lock table documents in share row exclusive mode")
        conn.execute("lock table document_versions in share row exclusive mode")
        row = conn.execute("select exists (select 1 from documents where content is not null)").fetchone()
        if row and row[0] and not replace:
            return False
        current = {(scope, name): bytes(content) for scope, name, content in
                   conn.execute("select scope, name, content from documents where content is not null")}
        for (scope, name), data in documents.items():
            if current.get((scope, name)) == data:
                continue
            conn.execute("insert into documents (scope, name, content) values (%s, %s, %s) "
                         "on conflict (scope, name) do update set content = excluded.content, "
                         "revision = nextval('document_revision'), updated_at = now()", (scope, name, data))
        for scope, name in current.keys() - documents.keys():
            conn.execute("update documents set content = null, revision = nextval('document_revision'), "
                         "updated_at = now() where scope = %s and name = %s", (scope, name))
        kept = {(scope, label): bytes(content) for scope, label, content in
                conn.execute("select scope, label, content from document_versions where label is not null")}
        for (scope, label), (name, data) in sorted(versions.items()):
            if kept.get((scope, label)) == data:
                continue
            _, suffix, document = _version_row(name)
            conn.execute("delete from document_versions where scope = %s and label = %s", (scope, label))
            conn.execute("insert into document_versions (scope, name, content, label, suffix) "
                         "values (%s, %s, %s, %s, %s)", (scope, document, data, label, suffix))
        if replace:
            for scope, label in kept.keys() - versions.keys():
                conn.execute("delete from document_versions where scope = %s and label = %s", (scope, label))
    return True


def document_counts(conn: psycopg.Connection) -> dict[str, int]:
    """Rows per table of the documents port (live documents and tombstones both count as rows)."""
    counts: dict[str, int] = {}
    for table in ("documents", "document_versions"):
        row = conn.execute(f"select count(*) from {table}").fetchone()  # noqa: S608 - our own table names
        counts[table] = int(row[0]) if row else 0
    return counts
