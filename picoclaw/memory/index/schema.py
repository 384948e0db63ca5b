"""The index's SQLite file: its tables, its schema version, and opening it (rebuilt when unusable).

The index is derived data, so a missing, unreadable or old-schema file is never an error: it is moved
out of the way and a new, empty one created; the next sync fills it from the store.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
INDEX_FILE = "index.sqlite3"
_SIDE_FILES = ("-wal", "-shm", "-journal")
BUSY_TIMEOUT_MS = 10_000

# Chunks are indexed as pre-tokenised text: the terms of picoclaw.memory.terms joined by spaces, so CJK
# bigrams and single characters are whole FTS tokens (a trigram tokenizer cannot find a two-character
# word). The token characters keep e-mail addresses, paths and dotted identifiers whole, as terms() does.
_FTS_TOKENIZER = "unicode61 remove_diacritics 0 tokenchars '._@/:-'"

# A block found by the keyword search is looked up by its file and lines (scoring.searched_chunks).
_LINES_INDEX = "CREATE INDEX IF NOT EXISTS chunks_lines ON chunks(path, start_line)"

SCHEMA = f"""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE files (
    path TEXT PRIMARY KEY,          -- relative to the memory folder's parent, '/'-separated
    source TEXT NOT NULL,           -- memory | notes | sessions
    hash TEXT NOT NULL,             -- sha256 of the file's bytes
    mtime_ns INTEGER NOT NULL,
    size INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    checked_ns INTEGER NOT NULL     -- wall clock when the hash was last compared
);
CREATE TABLE chunks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,   -- never reused, so cached vector rows can be matched by id
    path TEXT NOT NULL REFERENCES files(path) ON DELETE CASCADE,
    source TEXT NOT NULL,
    start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL,
    heading TEXT NOT NULL,
    text TEXT NOT NULL,
    hash TEXT NOT NULL              -- sha256 of text: the embedding cache key
);
CREATE INDEX chunks_path ON chunks(path);
{_LINES_INDEX};
CREATE INDEX chunks_hash ON chunks(hash);
CREATE VIRTUAL TABLE chunks_fts USING fts5(terms, tokenize="{_FTS_TOKENIZER}");
CREATE VIRTUAL TABLE chunks_vocab USING fts5vocab(chunks_fts, row);
CREATE TABLE embedding_cache (
    model TEXT NOT NULL,            -- embedder key: kind, model and dimensions
    text_hash TEXT NOT NULL,
    dims INTEGER NOT NULL,
    vector BLOB NOT NULL,           -- float32, unit length
    used_ns INTEGER NOT NULL,
    PRIMARY KEY (model, text_hash)
);
PRAGMA user_version = {SCHEMA_VERSION};
"""


class StaleSchema(sqlite3.DatabaseError):
    """The file is an index of another schema version."""


def is_unusable(exc: BaseException) -> bool:
    """True for errors that mean the file itself is bad (corrupt, not a database, tables missing).

    A busy or locked database is not one of them: another process is using it, and deleting it then
    would throw away good work.
    """
    if isinstance(exc, StaleSchema):
        return True
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name in ("SQLITE_CORRUPT", "SQLITE_NOTADB"):
        return True
    text = str(exc).lower()
    return any(sign in text for sign in ("malformed", "not a database", "no such table", "no such column",
                                         "no such module"))


def remove_files(path: Path) -> None:
    """Delete the index file and SQLite's side files next to it."""
    for suffix in ("", *_SIDE_FILES):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _connect(path: Path) -> sqlite3.Connection:
    # check_same_thread off: the index guards its connection with its own lock, and tools run searches
    # in worker threads while the agent loop searches on the event loop thread.
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False,
                           isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def _prepare(conn: sqlite3.Connection) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == SCHEMA_VERSION:
        conn.execute("SELECT 1 FROM chunks_fts LIMIT 1").fetchall()  # proves the FTS table is readable
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'chunks_lines'").fetchone() is None:
            conn.execute(_LINES_INDEX)  # an index file made before it: added, the file kept
        return
    tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    if version != 0 or tables:
        raise StaleSchema(f"schema version {version}, this picoclaw uses {SCHEMA_VERSION}")
    conn.execute("PRAGMA journal_mode = WAL")  # readers never wait for a sync in another process
    conn.executescript(f"BEGIN IMMEDIATE; {SCHEMA} COMMIT;")


def open_database(path: Path) -> sqlite3.Connection:
    """Open the index at `path`, creating it, or rebuilding it when it is corrupt or of another schema."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = _connect(path)
    try:
        _prepare(conn)
        return conn
    except sqlite3.DatabaseError as exc:
        conn.close()
        if not is_unusable(exc):
            raise
        log.warning("memory index %s is unusable (%s); rebuilding it from the memory files", path, exc)
    remove_files(path)
    conn = _connect(path)
    _prepare(conn)
    return conn


def file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the index file, to notice that it was deleted or replaced under an open handle."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino
