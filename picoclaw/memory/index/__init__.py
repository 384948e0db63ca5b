"""The optional memory index: SQLite FTS5 + vectors, hybrid search, fed by the same store.

Derived data only (`memory/index/index.sqlite3`): it can be deleted at any time and is rebuilt from the
Markdown files (and session files) on the next search or by `picoclaw memory reindex`. A workspace searches
it through IndexedSearch (picoclaw/memory/search/indexed.py).
"""

from __future__ import annotations

from picoclaw.memory.index.embedders import E5Embedder, EmbeddingUnavailable, LocalEmbedder, OpenAICompatEmbedder
from picoclaw.memory.index.memory_index import MemoryIndex
from picoclaw.memory.index.status import IndexStatus

__all__ = ["E5Embedder", "EmbeddingUnavailable", "IndexStatus", "LocalEmbedder", "MemoryIndex", "OpenAICompatEmbedder"]
