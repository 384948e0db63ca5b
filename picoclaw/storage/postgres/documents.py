"""Memory documents as rows: the Markdown a file would hold, its versions, and this machine's read copy.

`PostgresDocuments` is the documents port (storage/documents.py) on PostgreSQL: each write is one statement
(a replace checks the revision it expects in its WHERE clause), durable when it returns, and then written into
this machine's copy of the scope's folder, which the memory layer reads. `ScopeCopy.pull` brings that copy up
to the rows' newest revision (at every hold of the scope's lock and every refresh); nothing is ever sent from
the folder. Versions (the files backend's memory/backups/) are rows of `document_versions` only.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from picoclaw import clock
from picoclaw.fsutil import atomic_write
from picoclaw.layout import MEMORY_DIR, USERS_DIR
from picoclaw.storage.documents import MISSING, Changes, Document, StaleRevision
from picoclaw.storage.errors import StorageError, StorageUnavailable
from picoclaw.storage.files_documents import VERSIONS_DIR, FilesDocuments
from picoclaw.storage.postgres.connection import storage_errors
from picoclaw.storage.stored_files import COPY_MARK, document_names
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

# This backend's own files in the memory folder (".storage.*": never stored, see storage/stored_files.py).
STALE_MARK = ".storage.stale"
LOCAL_LOCK = ".storage.lock"
SET_ASIDE_DIR = "before-postgres"  # under the work folder: the folder's own files a first pull replaced
# An in-place append's journal (memory/in_place_append.py journal_path): ".<name>.append" beside the file.
JOURNAL_SUFFIX = ".append"


def scan_documents(scope_root: Path, *, shared: bool = True) -> dict[str, Path]:
    """The scope's document files by name (storage/stored_files.py's rule: the one place that says what is stored)."""
    return {name: scope_root / name for name in document_names(scope_root, shared=shared)}


_STAMPED = re.compile(r"^\d{8}_\d{6}Z?(_\d+)?_")


def is_version(name: str) -> bool:
    """Whether a file of the files layout is a version (memory/backups/<stamp>…), not a document."""
    return name.startswith(f"{VERSIONS_DIR}/")


def _journal(path: Path) -> Path:
    return path.with_name(f".{path.name}{JOURNAL_SUFFIX}")


@dataclass
class ScopeCopy:
    """This machine's read copy of one scope: the newest revision (and version id) brought into the folder.

    Nothing is ever sent from the folder: every write goes through `PostgresDocuments`, row first, then file.
    """

    scope: str
    root: Path
    revision: int = 0
    version_id: int = 0
    own: dict[str, int] = field(default_factory=dict)  # name -> the revision this process wrote into the folder
    adoption_checked: bool = False  # whether the first pull asked if the database holds anything of the scope

    @property
    def stale_mark(self) -> Path:
        return self.root / MEMORY_DIR / STALE_MARK

    def mark_stale(self) -> None:
        """Forget what was brought in, on disk too, so the next pull (of any process here) takes the rows' truth."""
        self.revision = self.version_id = 0
        self.own.clear()
        try:
            self.stale_mark.parent.mkdir(parents=True, exist_ok=True)
            self.stale_mark.touch()
        except OSError as exc:
            log.warning("could not mark %s stale: %s", self.root, exc)

    def pull(self, conn: psycopg.Connection) -> None:
        """Write the rows changed since the last revision seen into the folder (a full re-read when stale), and
        the versions kept since into memory/backups/."""
        stale = self.stale_mark.exists()
        if not self.adoption_checked and not stale:
            self._adopt(conn)
            self.adoption_checked = True
        # A folder that never was this database's copy (a files workspace whose config moved to PostgreSQL) may
        # hold what the rows do not: each file of it the rows would replace or drop is set aside first.
        first = not self.copy_mark.exists()
        since = 0 if stale or first else self.revision
        changed = conn.execute("select name, revision from documents where scope = %s and revision > %s",
                               (self.scope, since)).fetchall()
        # A document this process wrote itself is in the folder already: only others' writes are fetched. A
        # version's file (memory/backups/) is the versions' business, whatever a row of that name says.
        wanted = [name for name, revision in changed if self.own.get(name) != int(revision) and not is_version(name)]
        aside: list[str] = []
        if wanted:
            for name, content in conn.execute("select name, content from documents where scope = %s and "
                                              "name = any(%s)", (self.scope, wanted)):
                path = self.root / name
                if first and path.is_file() and (content is None or not _holds(path, bytes(content))):
                    aside.append(self._set_aside(name, path))
                if content is None:
                    path.unlink(missing_ok=True)
                elif not _holds(path, bytes(content)):
                    _journal(path).unlink(missing_ok=True)  # the row is the truth: no append is left to undo
                    atomic_write(path, bytes(content))
        for _, revision in changed:
            self.revision = max(self.revision, int(revision))
        if stale or first:
            # Files that are not rows give way to the rows' truth: a copy left by a failed write, a hand edit, or
            # (first) what the folder held before it became the copy, which is set aside.
            live = {name for (name,) in conn.execute(
                "select name from documents where scope = %s and content is not null", (self.scope,))}
            labels = {label for (label,) in conn.execute(
                "select label from document_versions where scope = %s and label is not null", (self.scope,))}
            for name, path in scan_documents(self.root, shared=not self.scope).items():
                if is_version(name):
                    if first and path.name not in labels:
                        aside.append(self._set_aside(name, path))
                elif name not in live:
                    if first:
                        aside.append(self._set_aside(name, path))
                    path.unlink(missing_ok=True)
        self._pull_versions(conn, 0 if stale or first else self.version_id)
        if stale:
            self.stale_mark.unlink(missing_ok=True)
        if first:
            self.copy_mark.parent.mkdir(parents=True, exist_ok=True)
            self.copy_mark.touch()
        if aside:
            log.warning("%s held %d files the PostgreSQL database does not (this folder's memory from before it "
                        "was the database's copy); they were kept under %s: `picoclaw memory import` brings a files "
                        "workspace into the database", self.root, len(aside), self.root / WORK_DIR / SET_ASIDE_DIR)

    @property
    def copy_mark(self) -> Path:
        return self.root / MEMORY_DIR / COPY_MARK

    def _set_aside(self, name: str, path: Path) -> str:
        """Keep the folder's own `name` under .picoclaw-work/before-postgres/ before the rows replace it."""
        kept = self.root / WORK_DIR / SET_ASIDE_DIR / name
        try:
            atomic_write(kept, path.read_bytes())
        except OSError as exc:
            raise StorageError(f"{path} differs from the database's copy and could not be set aside before it is "
                               f"replaced ({exc.strerror or exc}); nothing was changed") from None
        return name

    def _adopt(self, conn: psycopg.Connection) -> None:
        """A scope the database holds nothing of (not even a removed document) takes the folder's documents as
        its first content: a workspace folder opened on an empty database keeps what it shows. Never afterwards:
        a file that is not a row is then a copy gone stale, replaced by the rows' truth."""
        if self._holds_any(conn):
            return
        found = {(self.scope, name): path.read_bytes()
                 for name, path in scan_documents(self.root, shared=not self.scope).items()}
        if not found:
            return
        with conn.transaction():
            conn.execute("select pg_advisory_xact_lock(%s, hashtext(%s))", (ADOPT_LOCK_CLASS, self.scope))
            if self._holds_any(conn):
                return
            for (scope, name), data in found.items():
                if is_version(name):
                    label, suffix, document = _version_row(name)
                    conn.execute("insert into document_versions (scope, name, content, label, suffix) "
                                 "values (%s, %s, %s, %s, %s)", (scope, document, data, label, suffix))
                else:
                    conn.execute("insert into documents (scope, name, content) values (%s, %s, %s) "
                                 "on conflict (scope, name) do nothing", (scope, name, data))
        log.info("%s: the database held no memory of this folder, so its %d files were stored as the first "
                 "content (once; from now on the database is the truth)", self.root, len(found))

    def _holds_any(self, conn: psycopg.Connection) -> bool:
        row = conn.execute("select exists (select 1 from documents where scope = %s) or exists "
                           "(select 1 from document_versions where scope = %s)", (self.scope, self.scope)).fetchone()
        return bool(row and row[0])

    def _pull_versions(self, conn: psycopg.Connection, since: int) -> None:
        rows = conn.execute("select id, label, content from document_versions where scope = %s and id > %s "
                            "and label is not null order by id", (self.scope, since)).fetchall()
        for version_id, label, content in rows:
            path = self.root / VERSIONS_DIR / label
            if not _holds(path, bytes(content)):
                atomic_write(path, bytes(content))
            self.version_id = max(self.version_id, int(version_id))
        if rows:
            self.prune_versions(conn)

    def prune_versions(self, conn: psycopg.Connection) -> None:
        """Remove the version files of the folder that are no longer rows (pruned to memory.backup_keep)."""
        folder = self.root / VERSIONS_DIR
        if not folder.is_dir():
            return
        kept = {label for (label,) in conn.execute(
            "select label from document_versions where scope = %s and label is not null", (self.scope,))}
        for path in folder.iterdir():
            if _STAMPED.match(path.name) and path.name not in kept and path.is_file():
                path.unlink(missing_ok=True)

    def wrote(self, name: str, revision: int) -> None:
        """Note that this process wrote `name` at `revision` into the folder itself (the pull skips it)."""
        self.own[name] = revision


class PostgresDocuments:
    """The documents of one scope as rows: every write one statement, durable when it returns, then copied into
    this machine's folder (`copy`), which readers read. Writes hold the scope's lock, so no pull of this machine
    can put an older row over the file just written."""

    def __init__(self, pool: ConnectionPool, dsn: str, copy: ScopeCopy,
                 lock: Callable[[float | None], AbstractContextManager[object]],
                 held: Callable[[], psycopg.Connection], *, lease: float, shared: bool = True):
        self.pool = pool
        self.dsn = dsn
        self.copy = copy
        self.scope = copy.scope
        self.root = copy.root
        self.lease = lease
        self._lock = lock
        self._held = held  # the connection holding the scope's lock, in the thread that holds it
        self.files = FilesDocuments(copy.scope, copy.root, shared=shared)  # the copy's files, written after the row

    def path(self, name: str) -> Path:
        return self.files.path(name)

    def name(self, path: Path) -> str:
        return self.files.name(path)

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

    def _copied(self, name: str, revision: int, write: Callable[[], object]) -> str:
        """Bring the copy's file up to the row just written; if that fails, the copy is marked stale (the next
        pull rewrites it from the rows): the write itself is done."""
        try:
            write()
        except OSError as exc:
            log.warning("%s: the document was saved in PostgreSQL, but this machine's copy could not be written "
                        "(%s); it is read again from the database", self.path(name), exc.strerror or exc)
            self.copy.mark_stale()
        else:
            self.copy.wrote(name, revision)
        return str(revision)

    def read(self, name: str) -> Document:
        self.files.path(name)  # a name that leaves the scope is refused before any query
        with self._statement(f"reading {name}") as conn:
            row = conn.execute("select content, revision from documents where scope = %s and name = %s",
                               (self.scope, name)).fetchone()
        if row is None or row[0] is None:
            return Document(name, None, MISSING)
        return Document(name, bytes(row[0]), str(row[1]))

    def replace(self, name: str, data: bytes | str, *, expect: str | None = None, durable: bool = True) -> str:
        payload = data.encode("utf-8") if isinstance(data, str) else data
        self.files.path(name)
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
            return self._copied(name, revision, lambda: self.files.replace(name, payload, durable=durable))

    def create(self, name: str, data: bytes | str) -> bool:
        try:
            self.replace(name, data, expect=MISSING)
        except StaleRevision:
            return False
        return True

    def append(self, name: str, data: bytes) -> str:
        self.files.path(name)
        with self._write(f"an append to {name}") as conn:
            row = conn.execute(
                "update documents set content = content || %s, revision = nextval('document_revision'), "
                "updated_at = now() where scope = %s and name = %s and content is not null "
                "returning revision, octet_length(content)", (data, self.scope, name)).fetchone()
            if row is None:
                raise StorageError(f"{name} does not exist: there is nothing to append to")
            return self._copied(name, int(row[0]), lambda: self._append_copy(conn, name, data, int(row[1])))

    def append_records(self, name: str, records: Sequence[dict[str, Any]], *, durable: bool = True) -> None:
        payload = b"".join(orjson.dumps(record) + b"\n" for record in records)
        self.files.path(name)
        with self._write(f"an append to {name}") as conn:
            # As on files (fsutil.append_jsonl): records start on a line of their own after a torn last line.
            row = conn.execute(
                "insert into documents (scope, name, content) values (%s, %s, %s) on conflict (scope, name) "
                "do update set content = case when documents.content is null then excluded.content "
                "when octet_length(documents.content) = 0 or substring(documents.content from "
                "octet_length(documents.content)) = '\\x0a'::bytea then documents.content || excluded.content "
                "else documents.content || '\\x0a'::bytea || excluded.content end, "
                "revision = nextval('document_revision'), updated_at = now() "
                "returning revision, octet_length(content)", (self.scope, name, payload)).fetchone()
            assert row is not None
            self._copied(name, int(row[0]), lambda: self._append_copy(conn, name, payload, int(row[1])))

    def _append_copy(self, conn: psycopg.Connection, name: str, data: bytes, length: int) -> None:
        """Append to the copy's file when it holds what the row held before; else write the row's content."""
        path = self.path(name)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = -1
        if size >= 0 and size + len(data) == length:
            self.files.append(name, data)
            return
        row = conn.execute("select content from documents where scope = %s and name = %s",
                           (self.scope, name)).fetchone()
        if row is not None and row[0] is not None:
            self.files.replace(name, bytes(row[0]))

    def delete(self, name: str) -> None:
        self.files.path(name)
        with self._write(f"removing {name}") as conn:
            row = conn.execute(
                "update documents set content = null, revision = nextval('document_revision'), updated_at = now() "
                "where scope = %s and name = %s and content is not null returning revision",
                (self.scope, name)).fetchone()
            if row is not None:
                self._copied(name, int(row[0]), lambda: self.files.delete(name))

    def names(self, prefix: str = "") -> list[str]:
        like = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        with self._statement("the list of documents") as conn:
            return sorted(name for (name,) in conn.execute(
                "select name from documents where scope = %s and content is not null and name like %s",
                (self.scope, like)))

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
            label = str(row[1])
            try:
                atomic_write(self.path(f"{VERSIONS_DIR}/{label}"), data)
                self.copy.prune_versions(conn)
            except OSError as exc:
                log.warning("%s: a version was saved in PostgreSQL but not copied here (%s)", label,
                            exc.strerror or exc)
            return label

    def versions(self, suffix: str) -> list[str]:
        with self._statement("the list of versions") as conn:
            return [label for (label,) in conn.execute(
                "select label from document_versions where scope = %s and suffix = %s and label is not null "
                "order by id", (self.scope, suffix))]

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


def _revision(text: str) -> int:
    """A revision given back by this port (a number); anything else matches no row."""
    try:
        return int(text)
    except ValueError:
        return -1


def _holds(path: Path, data: bytes) -> bool:
    try:
        return path.read_bytes() == data
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return False


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
