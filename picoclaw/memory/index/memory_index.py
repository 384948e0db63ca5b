"""MemoryIndex: the optional index of one memory folder (`memory/index/index.sqlite3`).

Fed by the same store: every search first syncs what changed, so the index never answers from text the
files no longer hold. Keyword search always works; with an embedder, search is hybrid (fusion.py), and a
failing embedder makes searches keyword-only until it is tried again after a pause (see `outage`), with the
reason kept for `picoclaw memory status`. A question searched again reuses its vector (query_vectors.py).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np

from picoclaw.config import IndexConfig
from picoclaw.layout import INDEX_DIR
from picoclaw.memory.index.chunks import DEFAULT_LIMIT, TokenLimit
from picoclaw.memory.index.embedders import Embedder, EmbeddingUnavailable
from picoclaw.memory.index.fusion import RankWeights, Weights, reciprocal_rank, weighted
from picoclaw.memory.index.keyword_scores import (
    CANDIDATE_CAP,
    KeywordQuery,
    best_in_context,
    in_context_units,
    keyword_matches,
    searched_chunks,
)
from picoclaw.memory.index.outage import Outage, outage_of
from picoclaw.memory.index.query_vectors import QueryVectors
from picoclaw.memory.index.schema import INDEX_FILE, file_identity, is_unusable, open_database, remove_files
from picoclaw.memory.index.status import IndexStatus, not_built, read_status
from picoclaw.memory.index.sync import (
    EMBED_BATCH,
    Progress,
    Syncer,
    SyncReport,
    files_base,
    finish_embedding,
    forget_everything,
    get_meta,
    missing_texts,
    record_embed_failure,
    set_meta,
    source_files,
    store_vectors,
    transaction,
)
from picoclaw.memory.index.vectors import VectorMatrix
from picoclaw.memory.search.blocks import Block, Hit
from picoclaw.memory.store import MemoryStore

log = logging.getLogger(__name__)

# The sources the keyword search (KeywordSearch) reads: where a search stays within them, hybrid fuses the
# keyword search's own ranking with the vectors, so whatever improves it improves hybrid alike.
KEYWORD_SEARCH_SOURCES = frozenset({"memory", "notes"})

T = TypeVar("T")


class IndexClosed(Exception):
    """The index was closed under work that began before (a backfill), which then stops."""


def _log_backfill_failure(task: asyncio.Task[tuple[int, str | None]]) -> None:
    # A backfill nobody waits for any more (its search gave up waiting) must not fail unheard.
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("memory index: making embeddings failed: %s: %s", type(exc).__name__, exc)


class KeywordRanking(Protocol):
    """The keyword search whose ranking hybrid fuses with vectors (KeywordSearch)."""

    def search(self, query: str, limit: int, *, include_notes: bool = False) -> list[Hit]: ...


class MemoryIndex:
    """SQLite FTS5 + vector index over a memory folder's files; safe to share between threads.

    With `keywords` (the workspace's keyword search), a search within MEMORY.md and the daily notes takes
    its keyword ranking from it, hybrid or not; FTS5's BM25 then ranks only where it does not reach."""

    def __init__(self, store: MemoryStore, settings: IndexConfig, embedder: Embedder | None = None, *,
                 sessions_dir: Path, keywords: KeywordRanking | None = None):
        self.store = store
        self.keywords = keywords
        self.sessions_dir = sessions_dir
        self.settings = settings
        self.embedder = embedder
        self.path = store.memory_dir / INDEX_DIR / INDEX_FILE
        self.weights = Weights(settings.vector_weight, settings.text_weight, settings.min_score)
        self.rank_weights = RankWeights(settings.rrf_k, settings.rrf_keyword_weight)
        self.query_vectors = QueryVectors()
        self.last_notice: str | None = None  # why the last search fell back to keywords, if it did
        self._base = files_base(store, sessions_dir)
        self._lock = threading.RLock()
        self._dirty_lock = threading.Lock()  # apart, so a store write never waits for a running sync
        self._dirty: set[str] = set()
        self._conn: sqlite3.Connection | None = None
        self._stamped = False  # the open database has its last_sync
        self._identity: tuple[int, int] | None = None
        self._vectors = VectorMatrix()
        self._limit: TokenLimit | None = None
        self._backfill: asyncio.Task[tuple[int, str | None]] | None = None
        self._backfilling = False  # the backfill task found texts to embed and is embedding them
        self._outage = outage_of(embedder) if embedder is not None else Outage()  # shared by the embedder's indexes
        self._noted: datetime | None = None  # the outage this index's status already records
        self._closes = 0  # close() calls: a backfill started before one must not reopen the database

    # -- the database ------------------------------------------------------------------------------

    def mark_changed(self, path: Path) -> None:
        """Note that the store wrote `path`: the next sync re-reads it whatever its stat says."""
        try:
            key = Path(path).relative_to(self._base).as_posix()
        except ValueError:
            return
        with self._dirty_lock:
            self._dirty.add(key)

    @property
    def embedding(self) -> bool:
        """Whether a backfill (embedding new chunks, perhaps after its search stopped waiting) is under way."""
        return self._backfill is not None and not self._backfill.done()

    def close(self) -> None:
        """Close the database (the embedder belongs to whoever made it, and may serve other indexes). A
        backfill still under way stops at its next step instead of opening the database again."""
        with self._lock:
            self._closes += 1
            self._close_db()

    def _close_db(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._identity = None
        self._stamped = False
        self._vectors.clear()

    def _db(self) -> sqlite3.Connection:
        if self._conn is not None and file_identity(self.path) != self._identity:
            # The file was deleted or replaced (someone removed memory/index/): start a new one.
            log.info("memory index %s is gone; rebuilding it", self.path)
            self._close_db()
        if self._conn is None:
            self._conn = open_database(self.path)
            self._identity = file_identity(self.path)
        return self._conn

    def _run(self, operation: Callable[[sqlite3.Connection], T], opened: int | None = None) -> T:
        """Run `operation` on the database; a damaged database is rebuilt and the operation run again.
        With `opened` (the close count when the work began), IndexClosed if the index was closed since."""
        with self._lock:
            if opened is not None and opened != self._closes:
                raise IndexClosed(f"memory index {self.path} was closed")
            try:
                return operation(self._db())
            except sqlite3.DatabaseError as exc:
                if not is_unusable(exc):
                    raise
                log.warning("memory index %s is damaged (%s); rebuilding it from the memory files", self.path, exc)
                self._close_db()
                remove_files(self.path)
                return operation(self._db())

    # -- sync ----------------------------------------------------------------------------------------

    def sync(self, progress: Progress | None = None) -> SyncReport:
        """Bring the index up to date with the files (only what changed), embeddings included (sync code)."""
        return asyncio.run(self.sync_async(progress))

    def reindex(self, progress: Progress | None = None) -> SyncReport:
        """Rebuild every file's chunks from scratch (cached embeddings are reused, nothing else)."""
        def forget(conn: sqlite3.Connection) -> None:
            with transaction(conn):
                forget_everything(conn)
        self._run(forget)
        return self.sync(progress)

    async def sync_async(self, progress: Progress | None = None, *, wait: float | None = None) -> SyncReport:
        """Bring the index up to date; new chunks' embeddings are waited for at most `wait` s (None: until made).

        SQLite work runs in a worker thread and the embedder is awaited, so the caller's event loop serves
        others meanwhile. Embeddings not made in time go on being made in the background.
        """
        report = await self._in_thread(lambda conn: self._sync_files(conn, progress))
        if self.embedder is not None and report.embed_error is None:
            await self._wait_for_vectors(report, progress, wait)
        if report.changed or not self._stamped:  # an unchanged index, stamped before, needs no trip to it
            await self._in_thread(lambda conn: self._stamp(conn, report))
        return report

    def _token_limit(self, conn: sqlite3.Connection, report: SyncReport) -> TokenLimit:
        if self.embedder is None:
            return DEFAULT_LIMIT
        if self._limit is None:
            # Not a probe of the outage: a remote embedder's limit is known without asking the endpoint.
            refusal = self._outage.refusal(probe=False)
            if refusal is not None:
                report.embed_error = refusal
                self._record_failure(conn, refusal, refused=True)
                return DEFAULT_LIMIT
            try:
                self._limit = self.embedder.token_limit()
            except EmbeddingUnavailable as exc:
                report.embed_error = str(exc)
                self._outage.failed(report.embed_error)
                self._record_failure(conn, report.embed_error)
                return DEFAULT_LIMIT
        return self._limit

    def _sync_files(self, conn: sqlite3.Connection, progress: Progress | None) -> SyncReport:
        report = SyncReport()
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
        try:
            syncer = Syncer(conn, self._token_limit(conn, report), progress)
            syncer.sync_files(source_files(self.store, self.sessions_dir, self.settings.sources), dirty, report)
        except BaseException:
            with self._dirty_lock:
                self._dirty |= dirty
            raise
        return report

    def _stamp(self, conn: sqlite3.Connection, report: SyncReport) -> None:
        if report.changed or get_meta(conn, "last_sync") is None:
            with transaction(conn):
                set_meta(conn, "last_sync", str(time.time_ns()))
        self._stamped = conn is self._conn

    async def _wait_for_vectors(self, report: SyncReport, progress: Progress | None, wait: float | None) -> None:
        # One backfill per index at a time: two turns arriving together must not embed the same texts twice.
        task = self._backfill
        if task is None or task.done() or task.get_loop() is not asyncio.get_running_loop():
            task = self._backfill = asyncio.ensure_future(self._embed_missing(progress))
            task.add_done_callback(_log_backfill_failure)
        elif wait is not None and self._backfilling:
            # Another search started embedding new memory and waits for it. Waiting here too would let one
            # slow endpoint hold up every chat; this search answers from keywords now, as after a timeout.
            report.embed_error = "new memory is still being embedded for an earlier search"
            log.info("memory index: %s; this search uses keywords only", report.embed_error)
            return
        done, _ = await asyncio.wait({task}, timeout=wait)
        if not done:
            report.embed_error = f"embedding new memory took longer than {wait:g} s (it goes on in the background)"
            log.info("memory index: %s; this search uses keywords only", report.embed_error)
            return
        report.embedded, report.embed_error = task.result()

    async def _embed_missing(self, progress: Progress | None) -> tuple[int, str | None]:
        """Embed every chunk text without a cached vector, batch by batch; (texts embedded, failure if any)."""
        try:
            return await self._embed_missing_while_open(progress, self._closes)
        except IndexClosed:
            # Its scope was closed (a per-user agent evicted, the app stopping): what was embedded is kept.
            log.info("memory index %s was closed while embedding; the rest is embedded when it is next used",
                     self.path)
            return 0, "the index was closed while embedding"

    async def _embed_missing_while_open(self, progress: Progress | None, opened: int) -> tuple[int, str | None]:
        embedder = self.embedder
        assert embedder is not None
        missing = await self._in_thread(lambda conn: self._texts_to_embed(conn, embedder.key), opened)
        if missing is None:
            return 0, None
        refusal = self._outage.refusal() if missing else None
        if refusal is not None:  # the embedder is known to be down: not asked, nothing waited for
            await self._in_thread(lambda conn: self._record_failure(conn, refusal, refused=True), opened)
            return 0, refusal
        done = 0
        self._backfilling = bool(missing)
        try:
            for start in range(0, len(missing), EMBED_BATCH):
                batch = missing[start:start + EMBED_BATCH]
                vectors = await embedder.embed([text for _, text in batch])
                hashes = [digest for digest, _ in batch]
                await self._in_thread(lambda conn: self._keep_vectors(conn, embedder.key, hashes, vectors), opened)
                done += len(batch)
                if progress is not None:
                    progress("embeddings", done, len(missing))
        except EmbeddingUnavailable as exc:
            reason = str(exc)
            self._outage.failed(reason)
            await self._in_thread(lambda conn: self._record_failure(conn, reason), opened)
            return done, reason
        finally:
            self._backfilling = False
        if missing:
            self._outage.succeeded()
        await self._in_thread(lambda conn: self._embedding_done(conn, embedder.key), opened)
        return done, None

    # What a backfill does to the index's storage; TableMemoryIndex does the same on its chunk table.
    def _texts_to_embed(self, conn: sqlite3.Connection, model: str) -> list[tuple[str, str]] | None:
        return missing_texts(conn, model)

    def _keep_vectors(self, conn: sqlite3.Connection, model: str, hashes: list[str], vectors: np.ndarray) -> None:
        store_vectors(conn, model, hashes, vectors)

    def _embedding_done(self, conn: sqlite3.Connection, model: str) -> None:
        finish_embedding(conn, model)

    def _record_failure(self, conn: sqlite3.Connection, reason: str, *, refused: bool = False) -> None:
        """Keep why embeddings failed, for `picoclaw memory status` (the outage itself logs it). A search
        refused during an outage records it only if this index has not recorded the outage yet."""
        if refused and self._noted is not None and self._noted == self._outage.since:
            return
        self._noted = self._outage.since
        record_embed_failure(conn, reason)

    async def _in_thread(self, operation: Callable[[sqlite3.Connection], T], opened: int | None = None) -> T:
        """`operation` on the database, in a worker thread (SQLite waits for disk and for other writers)."""
        return await asyncio.to_thread(self._run, operation, opened)

    # -- search ------------------------------------------------------------------------------------

    def search(self, query: str, limit: int, sources: frozenset[str] | None = None) -> list[Hit]:
        """The best `limit` chunks for `query`, best first; `sources` restricts to memory / notes / sessions.

        For sync code (the CLI): waits for every embedding it needs.
        """
        return asyncio.run(self.search_async(query, limit, sources))

    async def search_async(self, query: str, limit: int, sources: frozenset[str] | None = None, *,
                           wait: float | None = None, below_floor: list[Hit] | None = None) -> list[Hit]:
        """`search` for async code: embeddings (new chunks', then the query's) are waited for at most `wait`
        seconds in all; past that, or when they fail, the results come from keywords alone. `below_floor`, when
        given, receives the chunks the hybrid score floor (`min_score`) dropped that would have been results."""
        if limit <= 0 or not query.strip():
            return []
        clock = asyncio.get_running_loop().time
        deadline = None if wait is None else clock() + wait
        report = await self.sync_async(wait=wait)
        self.last_notice = report.embed_error
        vector = None
        if self.embedder is not None and report.embed_error is None and (
                self.settings.fusion == "rrf" or self.weights.vector > 0):
            vector = await self._query_vector(query, None if deadline is None else max(0.0, deadline - clock()),
                                              wait)
        return await self._in_thread(lambda conn: self._ranked(conn, query, limit, sources, vector, below_floor))

    async def _query_vector(self, query: str, left: float | None, wait: float | None) -> np.ndarray | None:
        """The query's embedding, or None (with the reason in `last_notice`) when it cannot be had in time."""
        assert self.embedder is not None
        vector = self.query_vectors.get(self.embedder.key, query)
        if vector is not None:  # asked before: no model call, whatever the embedder's state
            return vector
        self.last_notice = self._outage.refusal()
        if self.last_notice is not None:
            return None
        try:
            vector = (await asyncio.wait_for(self.embedder.embed([query], query=True), left))[0]
        except (EmbeddingUnavailable, TimeoutError) as exc:
            # No answer in time counts as a failure too: an endpoint that hangs must not cost every turn the wait.
            reason = self.last_notice = str(exc) or f"embedding the query took longer than {wait:g} s"
            self._outage.failed(reason)
            await self._in_thread(lambda conn: self._record_failure(conn, reason))
            return None
        self._outage.succeeded()
        self.query_vectors.put(self.embedder.key, query, vector)
        return vector

    def _ranked(self, conn: sqlite3.Connection, query: str, limit: int, sources: frozenset[str] | None,
                vector: np.ndarray | None, below_floor: list[Hit] | None = None) -> list[Hit]:
        if vector is None:
            scores, _ = self._keyword_side(conn, query, limit, sources)
            return self._hits(conn, [(score, i) for i, score in scores.items()])
        floored: list[tuple[float, int]] = []
        ranked = self._hybrid(conn, query, vector, limit, sources, floored)[:limit]
        if below_floor is not None:
            below_floor.extend(self._hits(conn, floored[:limit - len(ranked)]))
        return self._hits(conn, ranked)

    def _wanted(self, limit: int) -> int:
        """How many candidates to take from each side of a hybrid search for `limit` results."""
        return max(limit, min(limit * self.settings.candidate_multiplier, CANDIDATE_CAP))

    def _keyword_side(self, conn: sqlite3.Connection, query: str, wanted: int, sources: frozenset[str] | None
                      ) -> tuple[dict[int, float], tuple[KeywordQuery, dict[int, float]] | None]:
        """The best `wanted` chunks by keywords, best first, with 0–1 scores: the keyword search's ranking
        where it covers the sources searched, else FTS5's in context (then also the prepared query and every
        chunk's BM25, which score other chunks the same way)."""
        searched = self.settings.sources if sources is None else sources
        if self.keywords is not None and KEYWORD_SEARCH_SOURCES.issuperset(searched):
            hits = self.keywords.search(query, wanted, include_notes="notes" in searched)
            return searched_chunks(conn, self._base, hits, sources), None
        keyword_query = KeywordQuery.prepare(conn, query)
        if keyword_query is None:
            return {}, None
        matches = keyword_matches(conn, keyword_query, sources)
        return best_in_context(conn, keyword_query, matches, wanted), (keyword_query, matches)

    def _hybrid(self, conn: sqlite3.Connection, query: str, query_vector: np.ndarray, limit: int,
                sources: frozenset[str] | None, below: list[tuple[float, int]] | None = None
                ) -> list[tuple[float, int]]:
        assert self.embedder is not None
        wanted = self._wanted(limit)
        keyword, fts = self._keyword_side(conn, query, wanted, sources)
        self._vectors.refresh(conn, self.embedder.key, get_meta(conn, "generation") or "0")
        ids, similarity = self._vectors.cosine(query_vector, sources)
        if len(ids) > wanted:
            best = np.argpartition(-similarity, wanted - 1)[:wanted]
        else:
            best = np.arange(len(ids))
        vector = {int(ids[n]): float(similarity[n]) for n in best}
        if self.settings.fusion == "rrf":  # only the order of each list counts
            return reciprocal_rank(list(keyword), sorted(vector, key=lambda i: (vector[i], i), reverse=True),
                                   self.rank_weights)
        # Every chunk of the union gets its real score on both sides, not 0 for the list it missed (the
        # keyword search's list is ranked as a whole: a chunk beyond it has no keyword score to give).
        positions = np.searchsorted(ids, list(keyword)) if len(ids) else np.zeros(0, dtype=np.int64)
        for chunk_id, position in zip(keyword, positions):
            if position < len(ids) and ids[position] == chunk_id:
                vector[chunk_id] = float(similarity[position])
        if fts is not None:
            keyword.update(in_context_units(conn, *fts, {i for i in vector if i not in keyword}))
        return weighted(keyword, vector, self.weights, below)

    def _hits(self, conn: sqlite3.Connection, ranked: list[tuple[float, int]]) -> list[Hit]:
        if not ranked:
            return []
        marks = ",".join("?" * len(ranked))
        rows = {row[0]: row[1:] for row in conn.execute(
            f"SELECT id, path, heading, text, start_line, end_line FROM chunks WHERE id IN ({marks})",
            [chunk_id for _, chunk_id in ranked])}
        hits = []
        for score, chunk_id in ranked:
            path, heading, text, start, end = rows[chunk_id]
            hits.append(Hit(Block(self._base / path, heading, text, start, end), score))
        return hits

    # -- status ------------------------------------------------------------------------------------

    def status(self) -> IndexStatus:
        """Counts, model, last sync, stale files and the last embedding failure; never syncs."""
        files = source_files(self.store, self.sessions_dir, self.settings.sources)
        model = self.embedder.label if self.embedder is not None else None
        if not self.path.exists():
            return not_built(self.path, self.settings.sources, model, files)
        key = self.embedder.key if self.embedder is not None else None
        return self._run(lambda conn: read_status(conn, self.path, self.settings.sources, model, key, files,
                                                  self._dirty_keys(), self.store.tz))

    def _dirty_keys(self) -> set[str]:
        with self._dirty_lock:
            return set(self._dirty)
