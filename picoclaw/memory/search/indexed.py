"""IndexedSearch: the optional index when it can answer, the memory files directly (KeywordSearch) when it
cannot; and `open_search`, which picks the search a workspace uses.

The index brings numpy (and, for local embeddings, torch) with it, so it is imported only when
`memory.index.enabled`: importing this module costs nothing more than the keyword search.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from picoclaw.memory.search.blocks import Block, Hit
from picoclaw.memory.search.keyword import KeywordSearch
from picoclaw.memory.search.protocol import MemorySearch
from picoclaw.memory.search.reranking import RerankedSearch
from picoclaw.memory.store import MemoryStore
from picoclaw.storage import StorageError

if TYPE_CHECKING:
    from picoclaw.config import IndexConfig
    from picoclaw.memory.index.embedders import Embedder
    from picoclaw.memory.index.memory_index import MemoryIndex
    from picoclaw.policy_schema import MemoryPolicy

log = logging.getLogger(__name__)

_LONG_TERM_ONLY = frozenset({"memory"})


class IndexedSearch:
    """Answers from the index; from the keyword search when the index cannot (locked, unwritable disk, its
    PostgreSQL table out of reach)."""

    blocking = False  # a search may wait for the query's embedding

    def __init__(self, files: KeywordSearch, index: MemoryIndex):
        self.files = files
        self.index = index
        embeddings = index.settings.embeddings
        # How long a turn waits for embeddings before it searches by keywords alone.
        self.wait = embeddings.max_wait_seconds if embeddings is not None else None
        files.store.on_change(index.mark_changed)

    def long_term_blocks(self) -> list[Block]:
        """MEMORY.md's blocks in file order (for the no-hit fallback of the turn's memory)."""
        return self.files.long_term_blocks()

    def neighbours(self, block: Block, before: int, after: int) -> list[Block]:
        """From the files, as they are now (a chunk cut from a longer block has none)."""
        return self.files.neighbours(block, before, after)

    def search(self, query: str, limit: int, *, include_notes: bool = False) -> list[Hit]:
        """The best `limit` chunks; MEMORY.md only, or every indexed source with `include_notes`."""
        if not include_notes and "memory" not in self.index.settings.sources:
            return self.files.search(query, limit)
        try:
            return self.index.search(query, limit, None if include_notes else _LONG_TERM_ONLY)
        except (sqlite3.Error, OSError, StorageError) as exc:
            self._unusable(exc)
            return self.files.search(query, limit, include_notes=include_notes)

    async def search_async(self, query: str, limit: int, *, include_notes: bool = False,
                           below_floor: list[Hit] | None = None) -> list[Hit]:
        """`search` without blocking the event loop; embeddings are waited for at most `max_wait_seconds`; the
        hybrid score floor's drops go to `below_floor`."""
        if not include_notes and "memory" not in self.index.settings.sources:
            return await self.files.search_async(query, limit)
        try:
            return await self.index.search_async(query, limit, None if include_notes else _LONG_TERM_ONLY,
                                                 wait=self.wait, below_floor=below_floor)
        except (sqlite3.Error, OSError, StorageError) as exc:
            self._unusable(exc)
            return await self.files.search_async(query, limit, include_notes=include_notes)

    def search_learnings(self, query: str, limit: int, *, standing: bool = False) -> list[Hit]:
        """Lessons are read from LEARNINGS.md directly: a small file, which keywords search in a millisecond."""
        return self.files.search_learnings(query, limit, standing=standing)

    async def search_learnings_async(self, query: str, limit: int, *, standing: bool = False) -> list[Hit]:
        return await self.files.search_learnings_async(query, limit, standing=standing)

    def _unusable(self, exc: Exception) -> None:
        log.warning("memory index %s cannot be used (%s); searching the memory files directly", self.index.path, exc)

    def close(self) -> None:
        self.index.close()


def open_search(settings: IndexConfig, store: MemoryStore, embedder: Embedder | None, *,
                sessions_dir: Path, policy: Callable[[], MemoryPolicy]) -> MemorySearch:
    """The index-backed search when `memory.index.enabled`, else the memory files searched directly; either
    re-ranked by standing (supersession, recency, use) under the policy in force."""
    files = KeywordSearch(store)
    if not settings.enabled:
        return RerankedSearch(files, store, policy)
    from picoclaw.memory.index.pg_index import index_for  # only now: it imports numpy

    # The index fuses the keyword search's own ranking with vectors, so hybrid gains what keywords gain;
    # its chunks are in the storage backend's table when it has one (PostgreSQL), else in SQLite.
    index = index_for(store, settings, embedder, sessions_dir=sessions_dir, keywords=files)
    return RerankedSearch(IndexedSearch(files, index), store, policy)


def index_of(search: MemorySearch) -> MemoryIndex | None:
    """The index behind a workspace's search, or None when it searches the files directly."""
    inner = search.inner if isinstance(search, RerankedSearch) else search
    return inner.index if isinstance(inner, IndexedSearch) else None


def search_method(search: MemorySearch) -> str:
    """What a workspace's search ranks with, in words, for a turn's record of why it remembered what it did."""
    index = index_of(search)
    if index is None:
        return "keywords (BM25 over the memory files), re-ranked by standing"
    if index.embedder is None:
        return "memory index: keywords, re-ranked by standing"
    return f"memory index: keywords + vectors ({index.embedder.label}), re-ranked by standing"
