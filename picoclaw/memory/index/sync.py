"""Bringing the index up to date with the memory files: only what changed, found by stat and hash.

A file is re-read when its (mtime, size, inode) differs from what the index recorded, when the store
marked it changed, or when it was modified so shortly before it was last hashed that a same-size edit in
the same clock tick could hide (as git does for "racily clean" files). It is re-chunked only when its
hash differs. Chunks without a vector are then embedded (the index awaits the embedder between the
steps here, each of which is plain SQLite work); the embedding cache, keyed by (model, text hash), means
only new or changed chunk texts reach the embedder.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from picoclaw.memory.index.chunks import Chunk, TokenLimit, markdown_chunks, session_chunks
from picoclaw.memory.index.embedders import EmbeddingUnavailable
from picoclaw.memory.store import MemoryStore
from picoclaw.transcripts import transcript_files

log = logging.getLogger(__name__)

RACY_NS = 2_000_000_000
EMBED_BATCH = 64
CACHE_SPARE = 2_000  # cached vectors kept beyond the ones in use, so an undo or a reindex embeds nothing

Progress = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass(frozen=True)
class SourceFile:
    """A file the index covers: its place in the workspace, its key in the index, which source it belongs to,
    and the file on this machine that holds it now (`MemoryStore.local`; None: `path` itself)."""

    path: Path
    key: str
    source: str
    local: Path | None = None

    @property
    def file(self) -> Path:
        """The file to stat and read."""
        return self.local or self.path


def files_base(store: MemoryStore, sessions_dir: Path) -> Path:
    """The folder index keys are relative to: the scope folder holding `memory/` and `sessions/`."""
    return Path(os.path.commonpath([store.memory_dir.parent, sessions_dir.parent]))


def source_files(store: MemoryStore, sessions_dir: Path, sources: Sequence[str]) -> list[SourceFile]:
    """Every file of the configured sources, as they are now (keys relative to `files_base`): the memory
    documents through the store's port (on PostgreSQL, this machine's cache brought up to the rows)."""
    base = files_base(store, sessions_dir)
    found: list[tuple[Path, str, Path | None]] = []
    if "memory" in sources:
        local = store.local(store.long_term_path)
        if local.exists():
            found.append((store.long_term_path, "memory", local))
    if "notes" in sources:
        found.extend((path, "notes", local) for path, local in store.notes())
    if "sessions" in sources:
        found.extend((path, "sessions", None) for path in transcript_files(sessions_dir))
    return [SourceFile(path, path.relative_to(base).as_posix(), source, local) for path, source, local in found]


@dataclass
class SyncReport:
    """What one sync did."""

    files_checked: int = 0
    files_changed: list[str] = field(default_factory=list)
    files_removed: list[str] = field(default_factory=list)
    chunks_written: int = 0
    embedded: int = 0  # chunk texts sent to the embedder
    embed_error: str | None = None

    @property
    def changed(self) -> bool:
        return bool(self.files_changed or self.files_removed or self.embedded)


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE … COMMIT (ROLLBACK on error): one writer at a time across processes."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def get_meta(conn: sqlite3.Connection, key: str) -> str | None:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return row[0] if row else None


def set_meta(conn: sqlite3.Connection, key: str, value: str | None) -> None:
    if value is None:
        conn.execute("DELETE FROM meta WHERE key = ?", (key,))
    else:
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))


def bump_generation(conn: sqlite3.Connection) -> None:
    """Record that chunks or vectors changed (readers in any process reload what they hold in memory)."""
    conn.execute("INSERT INTO meta(key, value) VALUES ('generation', '1') "
                 "ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + 1")


def forget_file(conn: sqlite3.Connection, key: str) -> None:
    """Remove a file's chunks (FTS rows included) and its record."""
    conn.execute("DELETE FROM chunks_fts WHERE rowid IN (SELECT id FROM chunks WHERE path = ?)", (key,))
    conn.execute("DELETE FROM chunks WHERE path = ?", (key,))
    conn.execute("DELETE FROM files WHERE path = ?", (key,))


def forget_everything(conn: sqlite3.Connection) -> None:
    """Drop every file and chunk (the embedding cache stays: a rebuild then embeds nothing it had)."""
    conn.execute("DELETE FROM chunks_fts")
    conn.execute("DELETE FROM chunks")
    conn.execute("DELETE FROM files")
    bump_generation(conn)


def _chunks_of(file: SourceFile, text: str, limit: TokenLimit) -> list[Chunk]:
    if file.source == "sessions":
        return session_chunks(text, file.path, limit)
    return markdown_chunks(text, file.path, limit, entries_only=file.source == "memory")


class Syncer:
    """One pass over the source files, writing what changed into the index."""

    def __init__(self, conn: sqlite3.Connection, limit: TokenLimit, progress: Progress | None = None):
        self.conn = conn
        self.limit = limit
        self.progress = progress or (lambda phase, done, total: None)

    def sync_files(self, files: list[SourceFile], dirty: set[str], report: SyncReport) -> None:
        """Re-index the files that changed; forget the ones that are gone."""
        conn = self.conn
        if get_meta(conn, "chunking") != self.limit.key:
            with transaction(conn):  # chunk boundaries depend on the limit: every file is re-chunked
                forget_everything(conn)
                set_meta(conn, "chunking", self.limit.key)
        known = {row[0]: row[1:] for row in conn.execute(
            "SELECT path, hash, mtime_ns, size, inode, checked_ns FROM files")}
        present = {file.key for file in files}
        for key in sorted(set(known) - present):
            with transaction(conn):
                forget_file(conn, key)
                bump_generation(conn)
            report.files_removed.append(key)
        for done, file in enumerate(files, start=1):
            self._sync_file(file, known.get(file.key), file.key in dirty, report)
            self.progress("files", done, len(files))
        report.files_checked = len(files)

    def _sync_file(self, file: SourceFile, known: tuple[str, int, int, int, int] | None, dirty: bool,
                   report: SyncReport) -> None:
        try:
            st = os.stat(file.file)
        except FileNotFoundError:
            return  # deleted since it was listed; the next sync forgets it
        if known is not None and not dirty:
            _, mtime_ns, size, inode, checked_ns = known
            racy = checked_ns - st.st_mtime_ns < RACY_NS
            if (st.st_mtime_ns, st.st_size, st.st_ino) == (mtime_ns, size, inode) and not racy:
                return
        data = file.file.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        now = time.time_ns()
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino, now, file.key)
        if known is not None and known[0] == digest:
            with transaction(self.conn):
                self.conn.execute("UPDATE files SET mtime_ns = ?, size = ?, inode = ?, checked_ns = ? "
                                  "WHERE path = ?", stamp)
            return
        chunks = _chunks_of(file, data.decode("utf-8", errors="replace"), self.limit)
        with transaction(self.conn):
            forget_file(self.conn, file.key)
            self.conn.execute("INSERT INTO files(path, source, hash, mtime_ns, size, inode, checked_ns) "
                              "VALUES (?, ?, ?, ?, ?, ?, ?)", (file.key, file.source, digest, *stamp[:4]))
            for chunk in chunks:
                cursor = self.conn.execute(
                    "INSERT INTO chunks(path, source, start_line, end_line, heading, text, hash) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (file.key, file.source, chunk.start_line, chunk.end_line, chunk.heading, chunk.text, chunk.hash))
                self.conn.execute("INSERT INTO chunks_fts(rowid, terms) VALUES (?, ?)", (cursor.lastrowid, chunk.terms))
            bump_generation(self.conn)
        report.files_changed.append(file.key)
        report.chunks_written += len(chunks)


# -- the embedding cache: plain SQLite steps; the index awaits the embedder between them ------------------


def missing_texts(conn: sqlite3.Connection, model: str) -> list[tuple[str, str]] | None:
    """(hash, text) of every chunk text with no cached vector for `model`; None when all had one at the
    last check and nothing changed since."""
    if get_meta(conn, "embedded") == f"{model}@{get_meta(conn, 'generation')}":
        return None
    return conn.execute(
        "SELECT c.hash, min(c.text) FROM chunks c LEFT JOIN embedding_cache e "
        "ON e.model = ? AND e.text_hash = c.hash WHERE e.text_hash IS NULL GROUP BY c.hash",
        (model,)).fetchall()


def record_embed_failure(conn: sqlite3.Connection, reason: str) -> None:
    """Keep why embeddings failed, for `picoclaw memory status`."""
    with transaction(conn):
        set_meta(conn, "embed_error", reason)
        set_meta(conn, "embed_error_at", str(time.time_ns()))


def finish_embedding(conn: sqlite3.Connection, model: str) -> bool:
    """After a backfill: mark the index fully embedded if no chunk still lacks a vector (a file may have
    changed while the vectors were being made); clear the last failure and prune the cache."""
    with transaction(conn):
        set_meta(conn, "embed_error", None)
        set_meta(conn, "embed_error_at", None)
        if conn.execute("SELECT 1 FROM chunks c WHERE NOT EXISTS (SELECT 1 FROM embedding_cache e "
                        "WHERE e.model = ? AND e.text_hash = c.hash) LIMIT 1", (model,)).fetchone():
            return False
        _prune_cache(conn, model)
        set_meta(conn, "embedded", f"{model}@{get_meta(conn, 'generation')}")
    return True


def store_vectors(conn: sqlite3.Connection, model: str, hashes: list[str], vectors: np.ndarray) -> None:
    """Cache `vectors` (one row per hash) for `model`."""
    if len(vectors) != len(hashes):
        raise EmbeddingUnavailable(f"asked for {len(hashes)} embeddings, got {len(vectors)}")
    now = time.time_ns()
    with transaction(conn):
        conn.executemany(
            "INSERT OR REPLACE INTO embedding_cache(model, text_hash, dims, vector, used_ns) "
            "VALUES (?, ?, ?, ?, ?)",
            [(model, digest, int(row.shape[0]), row.astype(np.float32).tobytes(), now)
             for digest, row in zip(hashes, vectors)])
        bump_generation(conn)


def _prune_cache(conn: sqlite3.Connection, model: str) -> None:
    # Vectors no chunk uses (old texts, other models) are kept up to CACHE_SPARE, newest first.
    conn.execute(
        "DELETE FROM embedding_cache WHERE rowid IN (SELECT e.rowid FROM embedding_cache e "
        "WHERE NOT (e.model = ? AND EXISTS (SELECT 1 FROM chunks c WHERE c.hash = e.text_hash)) "
        "ORDER BY e.used_ns DESC LIMIT -1 OFFSET ?)", (model, CACHE_SPARE))
