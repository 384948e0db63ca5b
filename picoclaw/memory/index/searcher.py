"""The index-backed searcher: the index when it can answer, the memory files directly when it cannot."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from picoclaw.config import IndexConfig
from picoclaw.memory.index.embedders import Embedder
from picoclaw.memory.index.index import MemoryIndex
from picoclaw.memory.retrieval import Block, Hit, MemoryRetriever
from picoclaw.memory.search import FileSearcher

log = logging.getLogger(__name__)

_LONG_TERM_ONLY = frozenset({"memory"})


class IndexedRetriever:
    """Answers from the index; from the plain retriever when the index cannot (locked, unwritable disk)."""

    def __init__(self, plain: MemoryRetriever, index: MemoryIndex):
        self.files = FileSearcher(plain)
        self.index = index
        embeddings = index.settings.embeddings
        # How long a turn waits for embeddings before it searches by keywords alone.
        self.wait = embeddings.max_wait_seconds if embeddings is not None else None
        plain.store.on_change(index.mark_changed)

    def long_term_blocks(self) -> list[Block]:
        """MEMORY.md's blocks in file order (for the no-hit fallback of the context builder)."""
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
        except (sqlite3.Error, OSError) as exc:
            self._unusable(exc)
            return self.files.search(query, limit, include_notes=include_notes)

    async def search_async(self, query: str, limit: int, *, include_notes: bool = False) -> list[Hit]:
        """`search` without blocking the event loop; embeddings are waited for at most `max_wait_seconds`."""
        if not include_notes and "memory" not in self.index.settings.sources:
            return await self.files.search_async(query, limit)
        try:
            return await self.index.search_async(query, limit, None if include_notes else _LONG_TERM_ONLY,
                                                 wait=self.wait)
        except (sqlite3.Error, OSError) as exc:
            self._unusable(exc)
            return await self.files.search_async(query, limit, include_notes=include_notes)

    def _unusable(self, exc: Exception) -> None:
        log.warning("memory index %s cannot be used (%s); searching the memory files directly", self.index.path, exc)

    def close(self) -> None:
        self.index.close()


def open_searcher(settings: IndexConfig, plain: MemoryRetriever, embedder: Embedder | None, *,
                  sessions_dir: Path) -> FileSearcher | IndexedRetriever:
    """The index-backed searcher when `memory.index.enabled`, else the memory files searched directly."""
    if not settings.enabled:
        return FileSearcher(plain)
    return IndexedRetriever(plain, MemoryIndex(plain.store, settings, embedder, sessions_dir=sessions_dir))


def index_of(searcher: object) -> MemoryIndex | None:
    """The index behind a workspace's searcher, or None when it searches the files directly."""
    return searcher.index if isinstance(searcher, IndexedRetriever) else None
