"""Memory search: one interface, MemorySearch, and its two implementations.

- blocks.py: Block and Hit, what every search returns, and how a memory file splits into blocks.
- keyword.py: KeywordSearch, BM25 over the memory files read directly (bm25.py ranks; large_files.py
  streams a MEMORY.md too large to index whole).
- query_expansion.py: the matching blocks ranked again with terms of the best hits (pseudo-relevance
  feedback).
- indexed.py: IndexedSearch, the optional index (memory/index/) with the keyword search as its fallback;
  `open_search` picks the one a workspace uses. The index and numpy are imported only when it is enabled.
- reranking.py: RerankedSearch, around either: a superseded entry below its replacement, mild recency and
  use priors (access_counts.py keeps how often each block was injected, outside MEMORY.md).
- turn_memory.py: which blocks a turn's prompt carries (`select_turn_memory`).
"""

from __future__ import annotations

from picoclaw.memory.search.blocks import Block, Hit, split_blocks
from picoclaw.memory.search.bm25 import rank_blocks
from picoclaw.memory.search.indexed import IndexedSearch, index_of, open_search, search_method
from picoclaw.memory.search.keyword import KeywordSearch
from picoclaw.memory.search.protocol import MemorySearch
from picoclaw.memory.search.reranking import RerankedSearch
from picoclaw.memory.search.turn_memory import (
    InjectedMemory,
    record_use,
    select_turn_memory,
    select_turn_memory_now,
    standing_lessons,
)

__all__ = ["Block", "Hit", "IndexedSearch", "InjectedMemory", "KeywordSearch", "MemorySearch", "index_of",
           "search_method",
           "RerankedSearch", "open_search", "rank_blocks", "record_use", "select_turn_memory", "select_turn_memory_now",
           "split_blocks", "standing_lessons"]
