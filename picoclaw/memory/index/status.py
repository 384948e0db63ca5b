"""What `picoclaw memory status` shows of an index (IndexStatus), read from its database without a sync."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass
from datetime import datetime, tzinfo
from pathlib import Path

from picoclaw.memory.index.sync import SourceFile, get_meta


@dataclass(frozen=True)
class IndexStatus:
    """What `picoclaw memory status` shows."""

    path: Path
    built: bool
    sources: list[str]
    model: str | None  # the embedder's label; None for keyword-only
    files: int
    chunks: int
    vectors: int
    last_sync: str | None
    stale: list[str]  # files changed, added or removed since the last sync
    warning: str | None  # the last embedding failure, if the last attempt failed


def not_built(path: Path, sources: Sequence[str], model: str | None, files: Iterable[SourceFile]) -> IndexStatus:
    """The status of an index whose database does not exist yet: every source file is stale."""
    return IndexStatus(path, False, list(sources), model, 0, 0, 0, None, [file.key for file in files], None)


def read_status(conn: sqlite3.Connection, path: Path, sources: Sequence[str], model: str | None,
                embedder_key: str | None, files: Iterable[SourceFile], dirty: Set[str], tz: tzinfo) -> IndexStatus:
    """The status of the index open as `conn`: `files` are the source files as they are now, `dirty` the
    keys of those the store wrote since the last sync, `tz` the zone times are shown in."""
    files = list(files)
    known = {row[0]: row[1:] for row in conn.execute("SELECT path, mtime_ns, size, inode FROM files")}
    stale = sorted(set(known) - {file.key for file in files})
    for file in files:
        try:
            st = os.stat(file.file)
        except FileNotFoundError:
            continue
        if file.key in dirty or known.get(file.key) != (st.st_mtime_ns, st.st_size, st.st_ino):
            stale.append(file.key)
    vectors = 0
    if embedder_key is not None:
        vectors = conn.execute("SELECT count(*) FROM chunks c JOIN embedding_cache e ON e.model = ? "
                               "AND e.text_hash = c.hash", (embedder_key,)).fetchone()[0]
    warning = get_meta(conn, "embed_error")
    if warning is not None:
        warning = f"{_when(get_meta(conn, 'embed_error_at'), tz)}: {warning}"
    return IndexStatus(path, True, list(sources), model, len(known),
                       conn.execute("SELECT count(*) FROM chunks").fetchone()[0], vectors,
                       _when(get_meta(conn, "last_sync"), tz), sorted(stale), warning)


def _when(stamp_ns: str | None, tz: tzinfo) -> str | None:
    if stamp_ns is None:
        return None
    return datetime.fromtimestamp(int(stamp_ns) / 1e9, tz=tz).isoformat(timespec="seconds")
