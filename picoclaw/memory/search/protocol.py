"""MemorySearch: what the agent, the tools and the CLI search memory with (`Workspace.searcher`).

Two implementations: KeywordSearch (search/keyword.py, BM25 over the files as they are) and IndexedSearch
(search/indexed.py, the optional index, falling back to the keyword search); `open_search` picks one.
"""

from __future__ import annotations

from typing import Protocol

from picoclaw.memory.search.blocks import Block, Hit


class MemorySearch(Protocol):
    """search(query, limit) → hits, best first; MEMORY.md only unless include_notes. Lessons (LEARNINGS.md)
    are searched apart, with search_learnings: they are not facts, and have their own share of a prompt."""

    @property
    def blocking(self) -> bool:
        """True when search_async only runs search in a worker thread (nothing else is awaited): a caller may then
        run search together with its other blocking work in one thread, one hand-over instead of several."""
        ...

    def search(self, query: str, limit: int, *, include_notes: bool = False) -> list[Hit]: ...

    async def search_async(self, query: str, limit: int, *, include_notes: bool = False,
                           below_floor: list[Hit] | None = None) -> list[Hit]:
        """`below_floor`, when given, receives what a score floor dropped that would have been a result."""
        ...

    def search_learnings(self, query: str, limit: int, *, standing: bool = False) -> list[Hit]: ...

    async def search_learnings_async(self, query: str, limit: int, *, standing: bool = False) -> list[Hit]: ...

    def long_term_blocks(self) -> list[Block]: ...

    def neighbours(self, block: Block, before: int, after: int) -> list[Block]: ...

    def close(self) -> None: ...
