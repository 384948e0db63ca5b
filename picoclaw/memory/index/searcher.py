"""The searcher the agent, the tools and the CLI use: the index when enabled, the plain retriever otherwise."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Protocol

from picoclaw.config import IndexConfig
from picoclaw.memory.index.embedders import Embedder
from picoclaw.memory.index.index import MemoryIndex
from picoclaw.memory.retrieval import Block, Hit, MemoryRetriever

log = logging.getLogger(__name__)

_LONG_TERM_ONLY = frozenset({"memory"})


class Searcher(Protocol):
    """search(query, limit) → hits, best first; MEMORY.md only unless include_notes."""

    def search(self, query: str, limit: int, *, include_notes: bool = False) -> list[Hit]: ...

    def long_term_blocks(self) -> list[Block]: ...

    def close(self) -> None: ...


class IndexedRetriever:
    """Answers from the index; from the plain retriever when the index cannot (locked, unwritable disk)."""

    def __init__(self, plain: MemoryRetriever, index: MemoryIndex):
        self.plain = plain
        self.index = index
        plain.store.on_change(index.mark_changed)

    def long_term_blocks(self) -> list[Block]:
        """MEMORY.md's blocks in file order (for the no-hit fallback of the context builder)."""
        return self.plain.long_term_blocks()

    def search(self, query: str, limit: int, *, include_notes: bool = False) -> list[Hit]:
        """The best `limit` chunks; MEMORY.md only, or every indexed source with `include_notes`."""
        if not include_notes and "memory" not in self.index.settings.sources:
            return self.plain.search(query, limit)
        try:
            return self.index.search(query, limit, None if include_notes else _LONG_TERM_ONLY)
        except (sqlite3.Error, OSError) as exc:
            log.warning("memory index %s cannot be used (%s); searching the memory files directly",
                        self.index.path, exc)
            return self.plain.search(query, limit, include_notes=include_notes)

    def close(self) -> None:
        self.index.close()


def open_searcher(settings: IndexConfig, plain: MemoryRetriever, embedder: Embedder | None, *,
                  sessions_dir: Path) -> MemoryRetriever | IndexedRetriever:
    """The index-backed searcher when `memory.index.enabled`, else `plain` itself."""
    if not settings.enabled:
        return plain
    return IndexedRetriever(plain, MemoryIndex(plain.store, settings, embedder, sessions_dir=sessions_dir))


def index_of(searcher: object) -> MemoryIndex | None:
    """The index behind a workspace's searcher, or None when it searches the files directly."""
    return searcher.index if isinstance(searcher, IndexedRetriever) else None
