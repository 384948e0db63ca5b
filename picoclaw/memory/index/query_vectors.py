"""QueryVectors: the embeddings of the last questions searched, so a question searched again costs no
model call (a turn's memory and the memory tool often search the same text; a retried turn repeats it)."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

QUERY_CACHE_SIZE = 256  # 384 float32 each (e5-small): 0.4 MB at most


class QueryVectors:
    """A least-recently-used map (embedder key, query text) → query vector; safe to share between threads."""

    def __init__(self, size: int = QUERY_CACHE_SIZE):
        self.size = size
        self._vectors: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, model: str, query: str) -> np.ndarray | None:
        """The vector kept for `query` under embedder key `model`, or None."""
        with self._lock:
            vector = self._vectors.get((model, query))
            if vector is not None:
                self._vectors.move_to_end((model, query))
            return vector

    def put(self, model: str, query: str, vector: np.ndarray) -> None:
        """Keep `vector` (read-only from now on); the least recently used one goes when full."""
        vector.setflags(write=False)  # handed to every later search of the same text: nobody may change it
        with self._lock:
            self._vectors[(model, query)] = vector
            self._vectors.move_to_end((model, query))
            while len(self._vectors) > self.size:
                self._vectors.popitem(last=False)

    def __len__(self) -> int:
        return len(self._vectors)
