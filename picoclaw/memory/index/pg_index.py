"""The memory index on PostgreSQL: MemoryIndex with its SQLite file replaced by the storage's chunk table.

The seam is `ChunkTable` (storage/postgres/index.py implements it): files bookkeeping, chunks in and out
by file, keyword candidates (BM25 over the terms this side computes with picoclaw.memory.terms, so CJK
bigrams rank as in SQLite), vector candidates (HNSW) and the vector cache. Chunking, the in-context keyword
scores, the phrase bonus and fusion are MemoryIndex's own, so both backends rank by the same rules.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from picoclaw.memory.index.keyword_scores import (
    _IDF_FLOOR,
    CANDIDATE_CAP,
    Adjacency,
    KeywordQuery,
    _with_bonus,
    in_context,
)
from picoclaw.memory.index.memory_index import IndexClosed, MemoryIndex
from picoclaw.memory.index.status import IndexStatus
from picoclaw.memory.index.sync import (
    CACHE_SPARE,
    Progress,
    SourceFile,
    SyncReport,
    _chunks_of,
    files_base,
    source_files,
)
from picoclaw.memory.search.blocks import Block, Hit
from picoclaw.memory.search.bm25 import NEIGHBOUR_WEIGHT, PHRASE_BONUS
from picoclaw.memory.terms import phrases, query_terms
from picoclaw.storage import SessionLog

T = TypeVar("T")
RACY_NS = 2_000_000_000


class ChunkTable(Protocol):
    """One scope's indexed chunks in the storage backend (storage/postgres/index.py: PostgresIndexTable)."""

    def get_meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str | None) -> None: ...
    def known_files(self) -> dict[str, tuple[str, int, int, int, int]]: ...
    def restamp_file(self, path: str, mtime_ns: int, size: int, inode: int, checked_ns: int) -> None: ...
    def forget_file(self, path: str) -> None: ...
    def forget_everything(self) -> None: ...
    def replace_file(self, path: str, source: str, digest: str, stat: tuple[int, int, int, int],
                     chunks: Sequence[tuple[int, int, str, str, str, str]]) -> None: ...
    def counts(self, model: str | None) -> tuple[int, int, int]: ...
    def term_stats(self, terms: Sequence[str]) -> tuple[int, dict[str, int]]: ...
    def bm25(self, total: int, doc_freq: dict[str, int], sources: Iterable[str] | None, *,
             best: int | None = None, among: Iterable[int] | None = None) -> dict[int, float]: ...
    def texts(self, ids: Iterable[int]) -> dict[int, str]: ...
    def neighbourhood(self, ids: Iterable[int]) -> tuple[dict[int, str], dict[int, int]]: ...
    def chunks_within(self, path: str, start: int, end: int, sources: Iterable[str] | None) -> list[int]: ...
    def rows(self, ids: Iterable[int]) -> dict[int, tuple[str, str, str, int, int]]: ...
    def missing_texts(self, model: str) -> list[tuple[str, str]]: ...
    def store_vectors(self, model: str, hashes: Sequence[str], vectors: Sequence[Sequence[float]],
                      now_ns: int) -> None: ...
    def finish_embedding(self, model: str, keep_unused: int) -> None: ...
    def nearest(self, model: str, vector: Sequence[float], wanted: int,
                sources: Iterable[str] | None) -> list[tuple[int, float]]: ...
    def similarities(self, model: str, vector: Sequence[float], ids: Iterable[int]) -> list[tuple[int, float]]: ...


class Bm25Scores:
    """One query's BM25 over a table, read as far as a search needs it: the best chunks, then the few
    around them (a common term matches most chunks, and reading all their scores was most of a search)."""

    def __init__(self, table: ChunkTable, total: int, doc_freq: dict[str, int], sources: Iterable[str] | None):
        self.table, self.total, self.doc_freq, self.sources = table, total, doc_freq, sources
        self.known: dict[int, float] = {}
        self.asked: set[int] = set()

    def best(self, count: int) -> dict[int, float]:
        """The `count` best-scoring chunks, best first."""
        found = self.table.bm25(self.total, self.doc_freq, self.sources, best=count)
        self.known.update(found)
        self.asked.update(found)
        return found

    def of(self, ids: Iterable[int]) -> dict[int, float]:
        """The scores of those of `ids` that match (the rest have none)."""
        wanted = set(ids)
        missing = wanted - self.asked
        if missing:
            self.known.update(self.table.bm25(self.total, self.doc_freq, self.sources, among=missing))
            self.asked |= missing
        return {i: self.known[i] for i in wanted if i in self.known}


class TableMemoryIndex(MemoryIndex):
    """MemoryIndex over a storage backend's ChunkTable instead of its own SQLite file."""

    def __init__(self, *args: Any, table: ChunkTable, transcripts: SessionLog | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.table = table
        # Transcripts kept as rows (PostgreSQL) are indexed from the session log, each version named by its
        # revision; without a log, sessions are files in sessions_dir as on the files backend.
        self.transcripts = transcripts

    def _source_files(self) -> list[SourceFile]:
        sources = self.settings.sources
        if self.transcripts is None or "sessions" not in sources:
            return source_files(self.store, self.sessions_dir, sources)
        base = files_base(self.store, self.sessions_dir)
        return [*source_files(self.store, self.sessions_dir, [s for s in sources if s != "sessions"]),
                *(SourceFile(path, path.relative_to(base).as_posix(), "sessions")
                  for path in self.transcripts.transcripts())]

    def _logged(self, file: SourceFile) -> bool:
        return self.transcripts is not None and file.source == "sessions"

    def _version(self, file: SourceFile) -> tuple[int, int, int] | None:
        """What tells a file's versions apart without reading it: (mtime_ns, size, inode) on disk, (0, the
        transcript's revision, 0) for a logged transcript; None when it is gone."""
        if self._logged(file):
            assert self.transcripts is not None
            marker = self.transcripts.marker(file.path)
            return None if marker is None else (0, int(marker), 0)  # type: ignore[call-overload]
        try:
            st = os.stat(file.file)
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _read(self, file: SourceFile) -> tuple[bytes, tuple[int, int, int]] | None:
        """The file's bytes and the version they are (a logged transcript read as the JSONL file it exports)."""
        if self._logged(file):
            assert self.transcripts is not None
            transcript = self.transcripts.read(file.path)
            if transcript.marker is None:
                return None
            revision = int(transcript.marker)  # type: ignore[call-overload]
            return b"".join(line + b"\n" for line in transcript.lines), (0, revision, 0)
        version = self._version(file)
        return None if version is None else (file.file.read_bytes(), version)

    def _run(self, operation: Callable[[Any], T], opened: int | None = None) -> T:
        with self._lock:
            if opened is not None and opened != self._closes:
                raise IndexClosed(f"memory index {self.path} was closed")
            return operation(self.table)

    # -- sync --------------------------------------------------------------------------------------

    def reindex(self, progress: Progress | None = None) -> SyncReport:
        """Rebuild every file's chunks from scratch (cached embeddings are reused, nothing else)."""
        self._run(lambda table: table.forget_everything())
        return self.sync(progress)

    def _sync_files(self, table: ChunkTable, progress: Progress | None) -> SyncReport:  # type: ignore[override]
        report = SyncReport()
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
        try:
            limit = self._token_limit(table, report)  # type: ignore[arg-type]
            if table.get_meta("chunking") != limit.key:
                table.forget_everything()  # chunk boundaries depend on the limit: every file is re-chunked
                table.set_meta("chunking", limit.key)
            files = self._source_files()
            known = table.known_files()
            for key in sorted(set(known) - {file.key for file in files}):
                table.forget_file(key)
                report.files_removed.append(key)
            for done, file in enumerate(files, start=1):
                self._sync_file(table, file, known.get(file.key), file.key in dirty, limit, report)
                if progress is not None:
                    progress("files", done, len(files))
            report.files_checked = len(files)
        except BaseException:
            with self._dirty_lock:
                self._dirty |= dirty
            raise
        return report

    def _sync_file(self, table: ChunkTable, file: SourceFile, known: tuple[str, int, int, int, int] | None,
                   dirty: bool, limit: Any, report: SyncReport) -> None:
        version = self._version(file)
        if version is None:
            return
        if known is not None and not dirty:
            _, mtime_ns, size, inode, checked_ns = known
            # As sync.Syncer: a same-tick edit could hide behind an unchanged stat (a revision cannot)
            racy = not self._logged(file) and checked_ns - version[0] < RACY_NS
            if version == (mtime_ns, size, inode) and not racy:
                return
        read = self._read(file)
        if read is None:
            return
        data, version = read
        digest = hashlib.sha256(data).hexdigest()
        stat = (*version, time.time_ns())
        if known is not None and known[0] == digest:
            table.restamp_file(file.key, *stat)
            return
        chunks = _chunks_of(file, data.decode("utf-8", errors="replace"), limit)
        table.replace_file(file.key, file.source, digest, stat,
                           [(c.start_line, c.end_line, c.heading, c.text, c.hash, c.terms) for c in chunks])
        report.files_changed.append(file.key)
        report.chunks_written += len(chunks)

    def _stamp(self, table: ChunkTable, report: SyncReport) -> None:  # type: ignore[override]
        if report.changed or table.get_meta("last_sync") is None:
            table.set_meta("last_sync", str(time.time_ns()))
        self._stamped = True

    def _texts_to_embed(self, table: ChunkTable, model: str) -> list[tuple[str, str]] | None:  # type: ignore[override]
        missing = table.missing_texts(model)
        # None (as SQLite's "embedded" mark): nothing new since the last backfill of this model finished, so
        # its clean-up (pruning the cache, the HNSW build) is not run again at every search.
        return None if not missing and table.get_meta("embedded") == model else missing

    def _keep_vectors(self, table: ChunkTable, model: str, hashes: list[str],  # type: ignore[override]
                      vectors: np.ndarray) -> None:
        from picoclaw.memory.index.embedders import EmbeddingUnavailable

        if len(vectors) != len(hashes):
            raise EmbeddingUnavailable(f"asked for {len(hashes)} embeddings, got {len(vectors)}")
        table.store_vectors(model, hashes, [row.astype(np.float32).tolist() for row in vectors], time.time_ns())

    def _embedding_done(self, table: ChunkTable, model: str) -> None:  # type: ignore[override]
        table.finish_embedding(model, CACHE_SPARE)
        table.set_meta("embedded", model)

    def _record_failure(self, table: ChunkTable, reason: str, *, refused: bool = False) -> None:  # type: ignore[override]
        if refused and self._noted is not None and self._noted == self._outage.since:
            return
        self._noted = self._outage.since
        table.set_meta("embedded", None)  # the next backfill that succeeds clears the failure
        table.set_meta("embed_error", reason)
        table.set_meta("embed_error_at", str(time.time_ns()))

    # -- search ------------------------------------------------------------------------------------

    def _ranked(self, table: ChunkTable, query: str, limit: int,  # type: ignore[override]
                sources: frozenset[str] | None, vector: np.ndarray | None,
                below_floor: list[Hit] | None = None) -> list[Hit]:
        if vector is None:
            scores, _ = self._keyword_candidates(table, query, limit, sources)
            return self._rows_as_hits(table, [(score, i) for i, score in scores.items()])
        floored: list[tuple[float, int]] = []
        ranked = self._fused(table, query, vector, limit, sources, floored)[:limit]
        if below_floor is not None:
            below_floor.extend(self._rows_as_hits(table, floored[:limit - len(ranked)]))
        return self._rows_as_hits(table, ranked)

    def _keyword_candidates(self, table: ChunkTable, query: str, wanted: int, sources: frozenset[str] | None
                            ) -> tuple[dict[int, float], tuple[KeywordQuery, Bm25Scores] | None]:
        """As MemoryIndex._keyword_side: the keyword search's ranking where it covers the sources, else BM25."""
        from picoclaw.memory.index.memory_index import KEYWORD_SEARCH_SOURCES

        searched = self.settings.sources if sources is None else sources
        if self.keywords is not None and KEYWORD_SEARCH_SOURCES.issuperset(searched):
            hits = self.keywords.search(query, wanted, include_notes="notes" in searched)
            return self._searched_chunks(table, hits, sources), None
        terms = query_terms(query)
        if not terms:
            return {}, None
        total, docs = table.term_stats(terms)
        reference = sum(max(math.log((total - n + 0.5) / (n + 0.5)), _IDF_FLOOR) for n in docs.values())
        prepared = KeywordQuery("", tuple(phrases(query)), reference or _IDF_FLOOR)
        scores = Bm25Scores(table, total, docs, sources)
        return self._best_in_context(table, prepared, scores, wanted), (prepared, scores)

    def _searched_chunks(self, table: ChunkTable, hits: Sequence[Hit], sources: frozenset[str] | None
                         ) -> dict[int, float]:
        top = max((hit.score for hit in hits), default=0.0) or 1.0
        out: dict[int, float] = {}
        for hit in hits:
            try:
                path = hit.block.path.relative_to(self._base).as_posix()
            except ValueError:
                continue
            for chunk_id in table.chunks_within(path, hit.block.start_line, hit.block.end_line, sources):
                out.setdefault(chunk_id, hit.score / top)
        return out

    @staticmethod
    def _adjacency(table: ChunkTable, ids: Iterable[int]) -> tuple[Adjacency, set[int]]:
        """The adjacency of the chunks around `ids`, and which chunks those are."""
        sources, previous = table.neighbourhood(ids)
        return (Adjacency(previous, {before: after for after, before in previous.items()},
                          frozenset(i for i, source in sources.items() if source == "notes")), set(sources))

    @staticmethod
    def _boosted(table: ChunkTable, query: KeywordQuery, scores: dict[int, float], ids: Iterable[int]
                 ) -> dict[int, float]:
        wanted = [i for i in ids if i in scores]
        if not query.phrases:
            return {i: scores[i] for i in wanted}
        return {i: _with_bonus(query, scores[i], text) for i, text in table.texts(wanted).items()}

    def _best_in_context(self, table: ChunkTable, query: KeywordQuery, scores: Bm25Scores,
                         wanted: int) -> dict[int, float]:
        """scoring.best_in_context over the table, reading the BM25 of the pool and its neighbours only."""
        pool = list(scores.best(max(wanted, CANDIDATE_CAP)))
        around, window = self._adjacency(table, pool)
        matches = scores.of(window)
        candidates = set(pool) | {after for i, after in around.next.items() if i in matches and after in around.notes}
        context = in_context(matches, around, NEIGHBOUR_WEIGHT, candidates)
        floor = heapq.nlargest(wanted, context.values())[-1] if len(context) >= wanted else 0.0
        boosted = {**context, **self._boosted(table, query, context,
                                              [i for i, s in context.items() if s * (1 + PHRASE_BONUS) >= floor])}
        best = heapq.nlargest(wanted, boosted.items(), key=lambda item: (item[1], item[0]))
        return {i: query.unit(score) for i, score in best}

    def _fused(self, table: ChunkTable, query: str, query_vector: np.ndarray, limit: int,
               sources: frozenset[str] | None, below: list[tuple[float, int]] | None = None
               ) -> list[tuple[float, int]]:
        from picoclaw.memory.index.fusion import reciprocal_rank, weighted

        assert self.embedder is not None
        wanted = self._wanted(limit)
        keyword, bm25 = self._keyword_candidates(table, query, wanted, sources)
        nearest = table.nearest(self.embedder.key, query_vector.astype(np.float32).tolist(), wanted, sources)
        vector = dict(nearest)
        if self.settings.fusion == "rrf":
            return reciprocal_rank(list(keyword), sorted(vector, key=lambda i: (vector[i], i), reverse=True),
                                   self.rank_weights)
        # As MemoryIndex._hybrid: each chunk of the union gets its real score on both sides.
        missing = [i for i in keyword if i not in vector]
        if missing:
            texts_vectors = self._vectors_of(table, missing, query_vector)
            vector.update(texts_vectors)
        if bm25 is not None:
            prepared, scores = bm25
            ids = {i for i in vector if i not in keyword}
            around, window = self._adjacency(table, ids)
            context = in_context(scores.of(window), around, NEIGHBOUR_WEIGHT, ids)
            keyword.update({i: prepared.unit(s) for i, s in self._boosted(table, prepared, context, context).items()})
        return weighted(keyword, vector, self.weights, below)

    def _vectors_of(self, table: ChunkTable, ids: list[int], query_vector: np.ndarray) -> dict[int, float]:
        """Cosine similarity with the query of the chunks `ids` that have a vector (exact, by id)."""
        assert self.embedder is not None
        return dict(table.similarities(self.embedder.key, query_vector.astype(np.float32).tolist(), ids))

    def _rows_as_hits(self, table: ChunkTable, ranked: list[tuple[float, int]]) -> list[Hit]:
        if not ranked:
            return []
        rows = table.rows(chunk_id for _, chunk_id in ranked)
        hits = []
        for score, chunk_id in ranked:
            if chunk_id not in rows:
                continue  # the file was re-indexed between the two queries
            path, heading, text, start, end = rows[chunk_id]
            hits.append(Hit(Block(self._base / path, heading, text, start, end), score))
        return hits

    # -- status ------------------------------------------------------------------------------------

    def status(self) -> IndexStatus:
        """Counts, model, last sync, stale files and the last embedding failure; never syncs."""
        from picoclaw.memory.index.status import _when

        files = self._source_files()
        model = self.embedder.label if self.embedder is not None else None
        key = self.embedder.key if self.embedder is not None else None
        known = self.table.known_files()
        stale = sorted(set(known) - {file.key for file in files})
        dirty = self._dirty_keys()
        for file in files:
            version = self._version(file)
            if version is not None and (file.key in dirty or known.get(file.key, ("", 0, 0, 0, 0))[1:4] != version):
                stale.append(file.key)
        count_files, chunks, vectors = self.table.counts(key)
        warning = self.table.get_meta("embed_error")
        if warning is not None:
            warning = f"{_when(self.table.get_meta('embed_error_at'), self.store.tz)}: {warning}"
        return IndexStatus(self.path, bool(known) or self.table.get_meta("last_sync") is not None,
                           list(self.settings.sources), model, count_files, chunks, vectors,
                           _when(self.table.get_meta("last_sync"), self.store.tz), sorted(stale), warning)


def index_for(store: Any, settings: Any, embedder: Any, *, sessions_dir: Path, keywords: Any = None) -> MemoryIndex:
    """The memory index of `store`: on its storage's chunk table when it has one (PostgreSQL), else SQLite."""
    storage = store.storage
    table = storage.index_table(store.memory_dir)
    if table is None:
        return MemoryIndex(store, settings, embedder, sessions_dir=sessions_dir, keywords=keywords)
    return TableMemoryIndex(store, settings, embedder, sessions_dir=sessions_dir, keywords=keywords, table=table,
                            transcripts=storage.session_log(sessions_dir))
