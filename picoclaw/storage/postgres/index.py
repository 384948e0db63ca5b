"""The memory index on pgvector: chunks with their vectors and keyword terms, rows keyed by scope.

The memory side (memory/index/pg_index.py) chunks the files and tokenises the text with its own CJK-aware
terms; this module only stores what it is given and ranks it. Keyword ranking is BM25 computed in SQL over a
table of (term, chunk, tf), with FTS5's formula (k1 1.2, b 0.75, idf floored at 1e-6, document length =
number of terms), so the PostgreSQL index ranks exactly as the SQLite index's FTS5 does; a `tsvector` with
the `simple` configuration would re-tokenise the terms and its ts_rank is not BM25.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from picoclaw.storage.postgres.connection import storage_errors

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

K1 = 1.2
B = 0.75
IDF_FLOOR = 1e-6  # what FTS5's bm25() uses for a term in half the chunks or more
INDEX_LOCK = 0x696E6478  # pg_advisory_xact_lock(INDEX_LOCK, hashtext(index name)) around a build ("indx")
WHAT = "a memory index statement"  # what a driver error says PostgreSQL refused

# The index's writes, its HNSW builds and its VACUUM wait for their locks with no bound (lock_timeout 0), not
# the pool's storage.lock_wait_seconds: what they wait for is another process's build of an HNSW index (a
# SHARE lock on index_chunks, which blocks every write to it), backfill or vacuum, each legitimately minutes,
# and ending on its own. They waited so until every pool connection got a bound; cut off after it, a reindex
# failed halfway and a turn's search lost its sync. A longer fixed bound would only move that failure to
# larger indexes. Reads never wait for a build or a vacuum, and keep the pool's bound.
NO_BOUND = "set local lock_timeout = 0"

# Vectors of any size live in one untyped `vector` column; HNSW needs a fixed dimension, so each dimension
# met gets its own partial expression index (`embedding::vector(n)` where dims = n), made on first use. One
# table with a partial index per dimension keeps every query and delete on one table, and a model change
# (another dimension) needs no migration.
DDL = """
create table if not exists index_files (
    scope text not null,
    path text not null,              -- relative to the scope folder, '/'-separated
    source text not null,            -- memory | notes | sessions
    hash text not null,              -- sha256 of the file's bytes
    mtime_ns bigint not null,
    size bigint not null,
    inode bigint not null,
    checked_ns bigint not null,
    primary key (scope, path)
);
create table if not exists index_chunks (
    id bigserial primary key,
    scope text not null,
    path text not null,
    ordinal int not null,            -- position in its file: neighbours are ordinal ± 1
    source text not null,
    start_line int not null,
    end_line int not null,
    heading text not null,
    text text not null,
    hash text not null,              -- sha256 of text: the embedding cache key
    length int not null,             -- number of terms, BM25's document length
    model text,                      -- the embedder key of `embedding`
    dims int,
    embedding vector,
    foreign key (scope, path) references index_files (scope, path) on delete cascade
);
create index if not exists index_chunks_file on index_chunks (scope, path, ordinal);
create index if not exists index_chunks_hash on index_chunks (scope, hash);
create table if not exists index_terms (
    scope text not null,
    term text not null,
    chunk_id bigint not null references index_chunks (id) on delete cascade,
    tf int not null,
    primary key (scope, term, chunk_id)
);
create index if not exists index_terms_chunk on index_terms (chunk_id);
create table if not exists index_meta (
    scope text not null,
    key text not null,
    value text not null,
    primary key (scope, key)
);
create table if not exists index_embeddings (
    scope text not null,
    model text not null,
    text_hash text not null,
    dims int not null,
    embedding vector not null,
    used_ns bigint not null,
    primary key (scope, model, text_hash)
);
"""

# Version 2: BM25 read every matching term's chunk row for its length and source and counted the scope's
# chunks at each query (31 ms at 10,000 chunks). Terms now carry both, and `index_totals` keeps each scope's
# chunk count and total length, kept in step by the same transactions that change chunks.
TOTALS_V2 = """
alter table index_terms add column if not exists length int, add column if not exists source text;
update index_terms t set length = c.length, source = c.source from index_chunks c where c.id = t.chunk_id;
alter table index_terms alter column length set not null, alter column source set not null;
-- Terms are written chunk by chunk and read term by term: with what BM25 reads inside the key's index, a
-- query reads that index alone (an index-only scan) instead of a heap page a posting (400 ms to 80 ms for
-- a common term at 100,000 chunks).
alter table index_terms drop constraint index_terms_pkey,
    add primary key (scope, term, chunk_id) include (tf, length, source);
create table if not exists index_totals (
    scope text primary key,
    chunks bigint not null,
    length bigint not null           -- the sum of the chunks' lengths: BM25's average document length
);
create index if not exists index_chunks_model on index_chunks (scope, model);
insert into index_totals (scope, chunks, length)
    select scope, count(*), coalesce(sum(length), 0) from index_chunks group by scope;
"""

ChunkRow = tuple[int, int, str, str, str, str]  # start_line, end_line, heading, text, hash, terms (space-joined)


def _vector_text(values: Iterable[float]) -> str:
    return "[" + ",".join(repr(float(v)) for v in values) + "]"


class PostgresIndexTable:
    """One scope's chunks: files bookkeeping, keyword (BM25) and vector (HNSW) candidates, the vector cache."""

    backend = "postgres"

    def __init__(self, pool: ConnectionPool[Any], dsn: str, scope: str):
        self.pool = pool
        self.dsn = dsn  # for errors naming the server (never its password)
        self.scope = scope
        self._written = 0  # chunk rows written since this table last refreshed the planner's statistics

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pool connection; a driver error is one line (StorageUnavailable, LockWaitExpired, StorageError),
        never psycopg's exception: the memory search falls back to the files on it, the CLI prints it."""
        with storage_errors(self.dsn, WHAT), self.pool.connection() as conn:
            yield conn

    @contextmanager
    def _writing(self) -> Iterator[psycopg.Connection[Any]]:
        """A pool connection in a transaction whose lock waits have no bound (NO_BOUND)."""
        with self._connection() as conn, conn.transaction():
            conn.execute(NO_BOUND)
            yield conn

    def _wrote(self, rows: int) -> None:
        """Vacuum and analyse the index tables after a bulk write, so searches use the indexes at once.

        Autovacuum would, within a minute; until then a just-built index is searched from stale estimates
        (a sequential scan instead of HNSW) and its terms' visibility is unknown (a heap read a posting
        instead of an index-only scan). The threshold grows with the table, so building N chunks vacuums
        O(log N) times.
        """
        self._written += rows
        if self._written < 1000:
            return
        with self._connection() as conn:
            total = conn.execute("select coalesce(sum(chunks), 0) from index_totals").fetchone()
            if self._written < 0.2 * int(total[0] if total else 0):
                return
            conn.commit()
            autocommit = conn.autocommit
            conn.autocommit = True  # VACUUM cannot run inside a transaction, so no SET LOCAL: no bound (as
            # NO_BOUND) is set on the connection, and the pool's bound put back before the connection returns
            bound = conn.execute("select current_setting('lock_timeout')").fetchone()
            conn.execute("set lock_timeout = 0")
            try:
                conn.execute("vacuum (analyze) index_chunks, index_terms")
            finally:
                conn.execute("select set_config('lock_timeout', %s, false)", (bound[0] if bound else "0",))
                conn.autocommit = autocommit  # as the pool gave it (autocommit), not left in transactions
        self._written = 0

    # -- bookkeeping -------------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        with self._connection() as conn:
            row = conn.execute("select value from index_meta where scope = %s and key = %s",
                               (self.scope, key)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str | None) -> None:
        with self._writing() as conn:
            if value is None:
                conn.execute("delete from index_meta where scope = %s and key = %s", (self.scope, key))
            else:
                conn.execute("insert into index_meta (scope, key, value) values (%s, %s, %s) "
                             "on conflict (scope, key) do update set value = excluded.value", (self.scope, key, value))

    def known_files(self) -> dict[str, tuple[str, int, int, int, int]]:
        """path → (hash, mtime_ns, size, inode, checked_ns) of every indexed file."""
        with self._connection() as conn:
            rows = conn.execute("select path, hash, mtime_ns, size, inode, checked_ns from index_files "
                                "where scope = %s", (self.scope,)).fetchall()
        return {row[0]: (row[1], row[2], row[3], row[4], row[5]) for row in rows}

    def restamp_file(self, path: str, mtime_ns: int, size: int, inode: int, checked_ns: int) -> None:
        """Record a file's new stat when its bytes are unchanged."""
        with self._writing() as conn:
            conn.execute("update index_files set mtime_ns = %s, size = %s, inode = %s, checked_ns = %s "
                         "where scope = %s and path = %s", (mtime_ns, size, inode, checked_ns, self.scope, path))

    def forget_file(self, path: str) -> None:
        """Remove a file's chunks, terms and record."""
        with self._writing() as conn:
            self._drop_file(conn, path)

    def forget_everything(self) -> None:
        """Drop every file and chunk of the scope (cached vectors stay: a rebuild embeds nothing it had)."""
        with self._writing() as conn:
            conn.execute("delete from index_files where scope = %s", (self.scope,))
            conn.execute("delete from index_totals where scope = %s", (self.scope,))

    def _drop_file(self, conn: psycopg.Connection[Any], path: str) -> None:
        """Delete a file's record (its chunks and terms cascade) and take them off the scope's totals."""
        row = conn.execute("select count(*), coalesce(sum(length), 0) from index_chunks where scope = %s and path = %s",
                           (self.scope, path)).fetchone()
        conn.execute("delete from index_files where scope = %s and path = %s", (self.scope, path))
        if row and row[0]:
            self._add_totals(conn, -int(row[0]), -int(row[1]))

    def _add_totals(self, conn: psycopg.Connection[Any], chunks: int, length: int) -> None:
        conn.execute("insert into index_totals (scope, chunks, length) values (%s, %s, %s) on conflict (scope) "
                     "do update set chunks = index_totals.chunks + excluded.chunks, "
                     "length = index_totals.length + excluded.length", (self.scope, chunks, length))

    def replace_file(self, path: str, source: str, digest: str, stat: tuple[int, int, int, int],
                     chunks: Sequence[ChunkRow]) -> None:
        """Put `chunks` (in file order) in place of the file's old ones, in one transaction; chunks whose
        text has a cached vector get it at once."""
        self._replace_file(path, source, digest, stat, chunks)
        self._wrote(len(chunks))

    def _replace_file(self, path: str, source: str, digest: str, stat: tuple[int, int, int, int],
                      chunks: Sequence[ChunkRow]) -> None:
        with self._writing() as conn:
            self._drop_file(conn, path)
            conn.execute("insert into index_files (scope, path, source, hash, mtime_ns, size, inode, checked_ns) "
                         "values (%s, %s, %s, %s, %s, %s, %s, %s)", (self.scope, path, source, digest, *stat))
            if chunks:
                self._add_totals(conn, len(chunks), _copy_chunks(conn, self.scope, path, source, chunks))
            conn.execute("update index_chunks c set model = e.model, dims = e.dims, embedding = e.embedding "
                         "from (select distinct on (text_hash) text_hash, model, dims, embedding from index_embeddings "
                         "where scope = %s order by text_hash, used_ns desc) e "
                         "where c.scope = %s and c.path = %s and e.text_hash = c.hash",
                         (self.scope, self.scope, path))

    def counts(self, model: str | None) -> tuple[int, int, int]:
        """(files, chunks, chunks with a vector of `model`)."""
        with self._connection() as conn:
            row = conn.execute("select (select count(*) from index_files where scope = %s), "
                               "(select count(*) from index_chunks where scope = %s), "
                               "(select count(*) from index_chunks where scope = %s and model = %s)",
                               (self.scope, self.scope, self.scope, model)).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    # -- keyword candidates --------------------------------------------------------------------------

    def term_stats(self, terms: Sequence[str]) -> tuple[int, dict[str, int]]:
        """(number of chunks, term → chunks holding it) for BM25's idf."""
        with self._connection() as conn:
            total = conn.execute("select chunks from index_totals where scope = %s", (self.scope,)).fetchone()
            docs = conn.execute("select term, count(*) from index_terms where scope = %s and term = any(%s) "
                                "group by term", (self.scope, list(terms))).fetchall()
        return int(total[0]) if total else 0, {term: int(n) for term, n in docs}

    def bm25(self, total: int, doc_freq: dict[str, int], sources: Iterable[str] | None, *,
             best: int | None = None, among: Iterable[int] | None = None) -> dict[int, float]:
        """BM25 (FTS5's formula) of the chunks holding any term of `doc_freq` (term → chunks holding it, of
        `total`, as term_stats gave them): chunk id → value. `best`: only that many, best first (ties: the
        newer chunk); `among`: only those chunks."""
        if not doc_freq:
            return {}
        where = "" if sources is None else " and t.source = any(%(sources)s)"
        if among is not None:
            where += " and t.chunk_id = any(%(among)s)"
        # idf is computed here, from the counts given: the query reads postings only (an index-only scan)
        terms = list(doc_freq)
        idf = [max(math.log((total - doc_freq[t] + 0.5) / (doc_freq[t] + 0.5)), IDF_FLOOR) for t in terms]
        sql = f"""
            with idf (term, value) as (select * from unnest(%(terms)s::text[], %(idf)s::float8[])),
            stats as (select length::float8 / greatest(chunks, 1) as avgdl from index_totals where scope = %(scope)s)
            select t.chunk_id,
                   sum(idf.value * t.tf * (%(k1)s + 1)
                       / (t.tf + %(k1)s * (1 - %(b)s + %(b)s * t.length / greatest(stats.avgdl, 1e-9)))) as score
            from index_terms t join idf on idf.term = t.term, stats
            where t.scope = %(scope)s and t.term = any(%(terms)s){where}
            group by t.chunk_id"""
        if best is not None:
            sql += " order by score desc, t.chunk_id desc limit %(best)s"
        params = {"scope": self.scope, "terms": terms, "idf": idf, "k1": K1, "b": B, "best": best,
                  "among": None if among is None else list(among),
                  "sources": None if sources is None else sorted(sources)}
        with self._connection() as conn:
            return {int(i): float(v) for i, v in conn.execute(sql.encode(), params).fetchall()}

    def texts(self, ids: Iterable[int]) -> dict[int, str]:
        """Chunk id → its text."""
        with self._connection() as conn:
            return dict(conn.execute("select id, text from index_chunks where scope = %s and id = any(%s)",
                                     (self.scope, list(ids))).fetchall())

    def neighbourhood(self, ids: Iterable[int]) -> tuple[dict[int, str], dict[int, int]]:
        """For the chunks up to two before and one after each of `ids` in its file: (chunk id → source,
        chunk id → the id of the chunk just before it in its file)."""
        sql = """
            with wanted as (select path, ordinal from index_chunks where scope = %(scope)s and id = any(%(ids)s)),
            around as (select distinct path, ordinal + step as ordinal from wanted, generate_series(-2, 1) step),
            window_rows as (
                -- exact (scope, path, ordinal) lookups: with a range join the planner read the whole scope
                -- once all chunks shared one path (100 ms at 10,000 chunks of MEMORY.md)
                select c.id, c.path, c.ordinal, c.source from around a join index_chunks c
                on c.scope = %(scope)s and c.path = a.path and c.ordinal = a.ordinal)
            select id, source, lag(id) over (partition by path order by ordinal),
                   lag(ordinal) over (partition by path order by ordinal), ordinal
            from window_rows"""
        with self._connection() as conn:
            rows = conn.execute(sql.encode(), {"scope": self.scope, "ids": list(ids)}).fetchall()
        sources = {int(r[0]): r[1] for r in rows}
        previous = {int(r[0]): int(r[2]) for r in rows if r[2] is not None and r[3] == r[4] - 1}
        return sources, previous

    def chunks_within(self, path: str, start: int, end: int, sources: Iterable[str] | None) -> list[int]:
        """Ids of the chunks of `path` within lines start..end, in file order."""
        where = "" if sources is None else " and source = any(%s)"
        params: tuple[object, ...] = (self.scope, path, start, end, end)
        if sources is not None:
            params += (sorted(sources),)
        with self._connection() as conn:
            return [int(r[0]) for r in conn.execute(
                f"select id from index_chunks where scope = %s and path = %s and start_line between %s and %s "
                f"and end_line <= %s{where} order by ordinal".encode(), params).fetchall()]

    def rows(self, ids: Iterable[int]) -> dict[int, tuple[str, str, str, int, int]]:
        """Chunk id → (path, heading, text, start_line, end_line)."""
        with self._connection() as conn:
            return {int(r[0]): (r[1], r[2], r[3], r[4], r[5]) for r in conn.execute(
                "select id, path, heading, text, start_line, end_line from index_chunks "
                "where scope = %s and id = any(%s)", (self.scope, list(ids))).fetchall()}

    # -- vectors ---------------------------------------------------------------------------------------

    def missing_texts(self, model: str) -> list[tuple[str, str]]:
        """(hash, text) of every chunk text with no vector of `model`."""
        with self._connection() as conn:
            return [(r[0], r[1]) for r in conn.execute(
                # `model <> %s` spelled as two ranges, so the (scope, model) index answers it: this runs
                # before every search and must not read every chunk.
                "select hash, min(text) from index_chunks where scope = %s "
                "and (model is null or model < %s or model > %s) group by hash", (self.scope, model, model)).fetchall()]

    def store_vectors(self, model: str, hashes: Sequence[str], vectors: Sequence[Sequence[float]],
                      now_ns: int) -> None:
        """Cache `vectors` (one per text hash) for `model` and set them on the chunks of those texts."""
        rows = [(digest, len(vector), _vector_text(vector)) for digest, vector in zip(hashes, vectors)]
        if not rows:
            return
        with self._writing() as conn:
            # One COPY into a scratch table, then one statement each for the cache and the chunks: a
            # statement a vector took minutes for a 100,000-chunk index.
            conn.execute("create temp table new_vectors (text_hash text primary key, dims int not null, "
                         "embedding vector not null) on commit drop")
            with conn.cursor().copy("copy new_vectors (text_hash, dims, embedding) from stdin") as copy:
                for row in dict((r[0], r) for r in rows).values():
                    copy.write_row(row)
            conn.execute("insert into index_embeddings (scope, model, text_hash, dims, embedding, used_ns) "
                         "select %s, %s, text_hash, dims, embedding, %s from new_vectors "
                         "on conflict (scope, model, text_hash) do update set dims = excluded.dims, "
                         "embedding = excluded.embedding, used_ns = excluded.used_ns", (self.scope, model, now_ns))
            conn.execute("update index_chunks c set model = %s, dims = v.dims, embedding = v.embedding "
                         "from new_vectors v where c.scope = %s and c.hash = v.text_hash", (model, self.scope))
        self._wrote(len(rows))

    def finish_embedding(self, model: str, keep_unused: int) -> None:
        """After a backfill: clear the last failure, keep at most `keep_unused` cached vectors no chunk uses
        (newest first), and build the HNSW index of each dimension in use that has none yet.

        Built here, once the vectors are in, rather than grown vector by vector while they arrive: one build
        of a 100,000-chunk graph takes a fraction of the time of as many single inserts.
        """
        with self._writing() as conn:
            conn.execute("delete from index_meta where scope = %s and key in ('embed_error', 'embed_error_at')",
                         (self.scope,))
            conn.execute(b"""
                delete from index_embeddings where scope = %(scope)s and (model, text_hash) in (
                    select e.model, e.text_hash from index_embeddings e
                    where e.scope = %(scope)s and not (e.model = %(model)s and exists (
                        select 1 from index_chunks c where c.scope = %(scope)s and c.hash = e.text_hash))
                    order by e.used_ns desc offset %(keep)s)""",
                         {"scope": self.scope, "model": model, "keep": keep_unused})
        with self._connection() as conn:
            dims = [int(r[0]) for r in conn.execute(
                "select distinct dims from index_chunks where scope = %s and model = %s and dims is not null",
                (self.scope, model)).fetchall()]
        for size in dims:
            with self._writing() as conn:
                _ensure_hnsw(conn, size)

    def nearest(self, model: str, vector: Sequence[float], wanted: int,
                sources: Iterable[str] | None) -> list[tuple[int, float]]:
        """The `wanted` chunks nearest `vector` by cosine (HNSW), as (chunk id, cosine similarity)."""
        dims = int(len(vector))  # an int we computed: safe to put in the SQL text, as the index needs it
        where = "" if sources is None else " and source = any(%(sources)s)"
        sql = (f"select id, 1 - (embedding::vector({dims}) <=> %(q)s::vector({dims})) from index_chunks "
               f"where dims = {dims} and scope = %(scope)s and model = %(model)s{where} "
               f"order by embedding::vector({dims}) <=> %(q)s::vector({dims}) limit %(wanted)s")
        params = {"q": _vector_text(vector), "scope": self.scope, "model": model, "wanted": wanted,
                  "sources": None if sources is None else sorted(sources)}
        with self._connection() as conn, conn.transaction():
            # The scope and source filters are applied to what the graph walk yields: iterative scans keep
            # walking until `wanted` rows pass them, and a wider ef_search keeps recall near exact search.
            conn.execute(f"set local hnsw.ef_search = {max(100, 2 * int(wanted))}".encode())
            conn.execute(b"set local hnsw.iterative_scan = relaxed_order")
            rows = conn.execute(sql.encode(), params).fetchall()
        return [(int(i), float(s)) for i, s in rows]

    def similarities(self, model: str, vector: Sequence[float], ids: Iterable[int]) -> list[tuple[int, float]]:
        """Exact cosine similarity with `vector` of the chunks `ids` that have a vector of `model`."""
        dims = int(len(vector))
        with self._connection() as conn:
            rows = conn.execute(
                f"select id, 1 - (embedding::vector({dims}) <=> %s::vector({dims})) from index_chunks "
                f"where scope = %s and model = %s and dims = {dims} and id = any(%s)".encode(),
                (_vector_text(vector), self.scope, model, list(ids))).fetchall()
        return [(int(i), float(s)) for i, s in rows]


def _copy_chunks(conn: psycopg.Connection[Any], scope: str, path: str, source: str,
                 chunks: Sequence[ChunkRow]) -> int:
    """Insert a file's chunks and their terms with COPY, the ids drawn from the sequence beforehand (a
    statement per chunk and per term took a minute for 10,000 chunks); returns their total length."""
    ids = [int(r[0]) for r in conn.execute(
        "select nextval(pg_get_serial_sequence('index_chunks', 'id')) from generate_series(1, %s)",
        (len(chunks),)).fetchall()]
    words = [chunk[5].split() for chunk in chunks]
    with conn.cursor() as cur:
        with cur.copy("copy index_chunks (id, scope, path, ordinal, source, start_line, end_line, heading, text, "
                      "hash, length) from stdin") as copy:
            for ordinal, (chunk_id, (start, end, heading, text, text_hash, _), terms) in enumerate(
                    zip(ids, chunks, words)):
                copy.write_row((chunk_id, scope, path, ordinal, source, start, end, heading, text, text_hash,
                                len(terms)))
        with cur.copy("copy index_terms (scope, term, chunk_id, tf, length, source) from stdin") as copy:
            for chunk_id, terms in zip(ids, words):
                for term, tf in Counter(terms).items():
                    copy.write_row((scope, term, chunk_id, tf, len(terms), source))
    return sum(len(terms) for terms in words)


def _ensure_hnsw(conn: psycopg.Connection[Any], dims: int) -> None:
    """The HNSW index of vectors with `dims` dimensions, built once, after the first backfill of that size.

    Under a transaction-scoped advisory lock named after the index: two processes finishing a backfill at
    once would otherwise both start the build, and the second fail on the name the first took. In a
    transaction whose lock waits have no bound (NO_BOUND): the other's build takes minutes.
    """
    name = f"index_chunks_hnsw_{int(dims)}"
    conn.execute("select pg_advisory_xact_lock(%s, hashtext(%s))", (INDEX_LOCK, name))
    found = conn.execute("select to_regclass(%s) is not null", (name,)).fetchone()
    if found and found[0]:
        return
    # The graph is built in memory when it fits (100,000 vectors of 384 dimensions need ~200 MB); past
    # maintenance_work_mem (64 MB by default) the build spills and takes several times longer.
    conn.execute("set local maintenance_work_mem = '512MB'")
    conn.execute(f"create index if not exists {name} on index_chunks using hnsw "
                 f"((embedding::vector({int(dims)})) vector_cosine_ops) where dims = {int(dims)}".encode())
