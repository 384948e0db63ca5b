"""What the agent, the tools and the CLI search memory with: the Searcher interface, and FileSearcher,
which searches the memory files directly (the index-backed one is in `memory/index/searcher.py`).

Async callers (a turn, a tool) use `search_async`, which never blocks their event loop: file reads and
scoring run in a worker thread. Sync callers (the CLI) use `search`.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Protocol

from picoclaw.memory.retrieval import Block, Hit, MemoryRetriever


class Searcher(Protocol):
    """search(query, limit) → hits, best first; MEMORY.md only unless include_notes."""

    def search(self, query: str, limit: int, *, include_notes: bool = False) -> list[Hit]: ...

    async def search_async(self, query: str, limit: int, *, include_notes: bool = False) -> list[Hit]: ...

    def long_term_blocks(self) -> list[Block]: ...

    def neighbours(self, block: Block, before: int, after: int) -> list[Block]: ...

    def close(self) -> None: ...


class FileSearcher:
    """The plain retriever behind the Searcher interface (no index configured)."""

    def __init__(self, plain: MemoryRetriever):
        self.plain = plain
        self._lock = threading.Lock()  # the retriever's caches are filled by whichever thread searches first

    def long_term_blocks(self) -> list[Block]:
        with self._lock:
            return self.plain.long_term_blocks()

    def neighbours(self, block: Block, before: int, after: int) -> list[Block]:
        """`block` with up to `before` blocks above and `after` below it in its file, in file order."""
        with self._lock:
            return self.plain.neighbours(block, before, after)

    def search(self, query: str, limit: int, *, include_notes: bool = False) -> list[Hit]:
        with self._lock:
            return self.plain.search(query, limit, include_notes=include_notes)

    async def search_async(self, query: str, limit: int, *, include_notes: bool = False) -> list[Hit]:
        return await asyncio.to_thread(self.search, query, limit, include_notes=include_notes)

    def close(self) -> None:
        """Nothing to close: the retriever's caches are plain memory."""
