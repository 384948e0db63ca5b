"""Memory documents as rows: the Markdown a file would hold, its versions, and this machine's copy.

The memory layer keeps working on files; on PostgreSQL the scope's folder is this machine's working copy of
the rows. `ScopeCopy.pull` brings the folder up to the rows' newest revision, `ScopeCopy.push` writes the
files changed since back in one transaction. Both run under the scope's lock (storage/postgres/locks.py).
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from picoclaw.fsutil import atomic_write
from picoclaw.layout import BOOTSTRAP_FILES, HEARTBEAT_FILE, INDEX_DIR, MEMORY_DIR, USERS_DIR

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

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

# Files at a scope's root that are documents: the bootstrap files (layout.py) and the heartbeat's tasks.
ROOT_DOCUMENTS = (*BOOTSTRAP_FILES, HEARTBEAT_FILE)
# This backend's own files in the memory folder (the local lock, the stale mark): never documents.
OWN_PREFIX = ".storage."
STALE_MARK = ".storage.stale"
LOCAL_LOCK = ".storage.lock"
# The entry table of MEMORY.md (memory/entry_table.py ENTRIES_FILE, ".MEMORY.md.entries"): derived per machine.
DERIVED_SUFFIX = ".entries"
# An in-place append's journal (memory/in_place_append.py journal_path): ".<name>.append" beside the file.
JOURNAL_SUFFIX = ".append"


def is_document_file(filename: str) -> bool:
    """Whether a file of the memory folder with this name is a document (not a lock, temp file, journal...)."""
    if filename.startswith(OWN_PREFIX) or filename.endswith(".lock"):
        return False
    if filename.startswith(".") and filename.endswith((".tmp", DERIVED_SUFFIX, JOURNAL_SUFFIX)):
        return False
    return True


def scan_documents(scope_root: Path) -> dict[str, Path]:
    """The scope's document files by name: the root documents and everything under memory/ but index/."""
    found: dict[str, Path] = {}
    for name in ROOT_DOCUMENTS:
        path = scope_root / name
        if path.is_file():
            found[name] = path
    memory = scope_root / MEMORY_DIR
    for folder, dirs, files in os.walk(memory):
        if Path(folder) == memory and INDEX_DIR in dirs:
            dirs.remove(INDEX_DIR)  # derived data, rebuilt from the documents on each machine
        for filename in files:
            path = Path(folder) / filename
            if is_document_file(filename) and path.is_file():
                found[path.relative_to(scope_root).as_posix()] = path
    return found


def keeps_versions(name: str) -> bool:
    """Whether replacing this document keeps its old content as a version.

    Dot files are counters and caches (.model_usage.json, .access_counts.json): rewritten every turn, their old
    content is of no use to anyone, and keeping 50 copies of each would only grow the table.
    """
    return not Path(name).name.startswith(".")


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _journal(path: Path) -> Path:
    return path.with_name(f".{path.name}{JOURNAL_SUFFIX}")


@dataclass
class ScopeCopy:
    """This process's knowledge of one scope's working copy: the newest revision seen, and each file as synced."""

    scope: str
    root: Path
    versions_keep: int
    revision: int = 0
    synced: dict[str, tuple[int, int, bytes]] = field(default_factory=dict)  # name -> (mtime_ns, size, sha256)

    @property
    def stale_mark(self) -> Path:
        return self.root / MEMORY_DIR / STALE_MARK

    def mark_stale(self) -> None:
        """Forget what was synced, on disk too, so the next pull (of any process here) takes the rows' truth."""
        self.revision = 0
        self.synced.clear()
        try:
            self.stale_mark.parent.mkdir(parents=True, exist_ok=True)
            self.stale_mark.touch()
        except OSError as exc:
            log.warning("could not mark %s stale: %s", self.root, exc)

    def pull(self, conn: psycopg.Connection) -> None:
        """Write the rows changed since the last revision seen into the folder (a full re-read when stale)."""
        stale = self.stale_mark.exists()
        since = 0 if stale else self.revision
        rows = conn.execute("select name, content, revision from documents where scope = %s and revision > %s "
                            "order by revision", (self.scope, since)).fetchall()
        live: set[str] = set()
        for name, content, revision in rows:
            path = self.root / name
            if content is None:
                path.unlink(missing_ok=True)
                self.synced.pop(name, None)
            else:
                data = bytes(content)
                live.add(name)
                if not _holds(path, data):
                    _journal(path).unlink(missing_ok=True)  # the row is the truth: no append is left to undo
                    atomic_write(path, data)
                self._record(name, path, data)
            self.revision = max(self.revision, int(revision))
        if stale:
            # Local changes that never reached the database are replaced by its truth: new files go too.
            for name, path in scan_documents(self.root).items():
                if name not in live:
                    path.unlink(missing_ok=True)
                    self.synced.pop(name, None)
            self.stale_mark.unlink(missing_ok=True)

    def push(self, conn: psycopg.Connection) -> None:
        """Upsert the document files changed since they were last synced, and tombstone removed ones: one
        transaction, so the rows are all of it or none of it."""
        files = scan_documents(self.root)
        changed: list[tuple[str, bytes, tuple[int, int, bytes]]] = []
        for name, path in files.items():
            if _journal(path).exists():
                continue  # an append under way or cut off: the file is pushed once whole (repaired or done)
            try:
                info = path.stat()
                known = self.synced.get(name)
                if known is not None and known[:2] == (info.st_mtime_ns, info.st_size):
                    continue
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            state = (info.st_mtime_ns, info.st_size, _digest(data))
            if known is not None and known[2] == state[2]:
                self.synced[name] = state
                continue
            changed.append((name, data, state))
        removed = [name for name in self.synced if name not in files]
        if not changed and not removed:
            return
        revisions: list[int] = []
        with conn.transaction():
            for name, data, _ in changed:
                self._keep_version(conn, name, data)
                row = conn.execute(
                    "insert into documents (scope, name, content) values (%s, %s, %s) "
                    "on conflict (scope, name) do update set content = excluded.content, "
                    "revision = nextval('document_revision'), updated_at = now() returning revision",
                    (self.scope, name, data)).fetchone()
                assert row is not None
                revisions.append(int(row[0]))
            for name in removed:
                row = conn.execute(
                    "update documents set content = null, revision = nextval('document_revision'), "
                    "updated_at = now() where scope = %s and name = %s and content is not null returning revision",
                    (self.scope, name)).fetchone()
                if row is not None:
                    revisions.append(int(row[0]))
        for name, _, state in changed:
            self.synced[name] = state
        for name in removed:
            del self.synced[name]
        # Every writer of this scope holds its lock, pulled first: no revision between ours was missed.
        self.revision = max([self.revision, *revisions])

    def _keep_version(self, conn: psycopg.Connection, name: str, data: bytes) -> None:
        """Keep the row's current content as a version when `data` replaces it (an append keeps none: the
        old content is the start of the new one), pruned to the newest `versions_keep`."""
        if not keeps_versions(name):
            return
        row = conn.execute("select content from documents where scope = %s and name = %s for update",
                           (self.scope, name)).fetchone()
        if row is None or row[0] is None:
            return
        old = bytes(row[0])
        if data.startswith(old):
            return
        conn.execute("insert into document_versions (scope, name, content) values (%s, %s, %s)",
                     (self.scope, name, old))
        conn.execute("delete from document_versions where scope = %s and name = %s and id not in "
                     "(select id from document_versions where scope = %s and name = %s order by id desc limit %s)",
                     (self.scope, name, self.scope, name, self.versions_keep))

    def _record(self, name: str, path: Path, data: bytes) -> None:
        info = path.stat()
        self.synced[name] = (info.st_mtime_ns, info.st_size, _digest(data))


def _holds(path: Path, data: bytes) -> bool:
    try:
        return path.read_bytes() == data
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return False


def scope_folder(dest_root: Path, scope: str) -> Path:
    """Where scope `scope`'s documents go in the files layout: the root, or users/<scope>/."""
    return dest_root / USERS_DIR / scope if scope else dest_root


def export_documents(conn: psycopg.Connection, dest_root: Path) -> int:
    """Write every live document of every scope into the files layout under `dest_root`; how many."""
    count = 0
    with conn.cursor(name="picoclaw_export") as cursor, conn.transaction():
        cursor.execute("select scope, name, content from documents where content is not null order by scope, name")
        for scope, name, content in cursor:
            atomic_write(scope_folder(dest_root, scope) / name, bytes(content))
            count += 1
    return count


def workspace_documents(src_root: Path) -> dict[tuple[str, str], bytes]:
    """The documents of a files workspace, by (scope, name): the shared scope's and each user's."""
    found = {("", name): path.read_bytes() for name, path in scan_documents(src_root).items()}
    users = src_root / USERS_DIR
    if users.is_dir():
        for folder in sorted(users.iterdir()):
            if folder.is_dir():
                found.update({(folder.name, name): path.read_bytes()
                              for name, path in scan_documents(folder).items()})
    return found


def import_documents(conn: psycopg.Connection, documents: dict[tuple[str, str], bytes], replace: bool) -> bool:
    """Load `documents` in one transaction (False, nothing done, when the table holds live documents and not
    `replace`); with `replace`, live rows not among them become tombstones. Unchanged rows keep their revision,
    so importing the same workspace again changes nothing."""
    with conn.transaction():
        # Every scope's writers hold its advisory lock; one transaction lock keeps them all out meanwhile.
        conn.execute("lock table documents in share row exclusive mode")
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
    return True


def document_counts(conn: psycopg.Connection) -> dict[str, int]:
    """Rows per table of the documents port (live documents and tombstones both count as rows)."""
    counts: dict[str, int] = {}
    for table in ("documents", "document_versions"):
        row = conn.execute(f"select count(*) from {table}").fetchone()  # noqa: S608 - our own table names
        counts[table] = int(row[0]) if row else 0
    return counts
