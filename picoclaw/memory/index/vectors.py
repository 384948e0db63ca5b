"""The chunk vectors in memory as one numpy matrix, refreshed from SQLite only where the index changed.

Vectors live in the embedding cache (model, text hash) → float32 BLOB; a chunk's vector is the cache row
of its text hash. Chunk ids are never reused, so after a sync only the rows of new chunk ids are read.
"""

from __future__ import annotations

import sqlite3

import numpy as np

_BATCH = 900  # ids per IN (...) query, under SQLite's variable limit


class VectorMatrix:
    """Unit vectors of the indexed chunks, with their ids and sources, for cosine search with numpy."""

    def __init__(self) -> None:
        self.ids = np.zeros(0, dtype=np.int64)
        self.sources = np.zeros(0, dtype=object)
        self.matrix = np.zeros((0, 0), dtype=np.float32)
        self._state: tuple[str, str] | None = None

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]  # same empty state as a new matrix

    def refresh(self, conn: sqlite3.Connection, model: str, generation: str) -> None:
        """Bring the matrix up to date with the index at `generation` for vectors of `model`."""
        if self._state == (model, generation):
            return
        if self._state is not None and self._state[0] != model:
            self.clear()
        rows = conn.execute("SELECT c.id, c.source FROM chunks c JOIN embedding_cache e "
                            "ON e.model = ? AND e.text_hash = c.hash ORDER BY c.id", (model,)).fetchall()
        current = np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))
        keep = np.isin(self.ids, current)
        known = set(self.ids[keep].tolist())
        dims = self.matrix.shape[1] if len(self.ids) else None
        new_ids, new_sources, new_rows = self._read(conn, model, [i for i in current.tolist() if i not in known],
                                                    dims)
        if len(new_ids) and dims is None:
            dims = new_rows.shape[1]
        kept = self.matrix[keep] if len(self.ids) else np.zeros((0, dims or 0), dtype=np.float32)
        ids = np.concatenate([self.ids[keep], new_ids])
        order = np.argsort(ids, kind="stable")
        self.ids = ids[order]
        self.sources = np.concatenate([self.sources[keep], new_sources])[order]
        self.matrix = (np.concatenate([kept, new_rows]) if len(new_ids) else kept)[order]
        self._state = (model, generation)

    @staticmethod
    def _read(conn: sqlite3.Connection, model: str, ids: list[int],
              dims: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        got_ids: list[int] = []
        got_sources: list[str] = []
        blobs: list[bytes] = []
        for start in range(0, len(ids), _BATCH):
            part = ids[start:start + _BATCH]
            marks = ",".join("?" * len(part))
            # CROSS JOIN keeps chunks the outer loop: left to itself SQLite scans the whole cache (and
            # reads every vector) once per batch, which made the first search of 100,000 chunks take minutes.
            for chunk_id, source, size, blob in conn.execute(
                    f"SELECT c.id, c.source, e.dims, e.vector FROM chunks c CROSS JOIN embedding_cache e "
                    f"ON e.model = ? AND e.text_hash = c.hash WHERE c.id IN ({marks})", (model, *part)):
                dims = dims or size
                if size != dims or len(blob) != 4 * size:
                    continue  # a vector of another size cannot be compared with the query's
                got_ids.append(chunk_id)
                got_sources.append(source)
                blobs.append(blob)
        matrix = (np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), dims)
                  if blobs and dims else np.zeros((0, 0), dtype=np.float32))
        return np.array(got_ids, dtype=np.int64), np.array(got_sources, dtype=object), matrix

    def cosine(self, query: np.ndarray, sources: frozenset[str] | None) -> tuple[np.ndarray, np.ndarray]:
        """(chunk ids, cosine similarities) of every vector of the wanted sources with the same dimensions."""
        if not self.matrix.size or self.matrix.shape[1] != query.shape[0]:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        if sources is None:
            return self.ids, self.matrix @ query
        mask = np.isin(self.sources, list(sources))
        return self.ids[mask], self.matrix[mask] @ query

    def __len__(self) -> int:
        return int(self.ids.shape[0])
