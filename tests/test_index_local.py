"""The `local` embedder with the real packaged all-MiniLM-L6-v2 (the `local` extra; CI installs it).

The model is loaded once for the module (a few seconds on a CPU); it never touches the network.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path

import numpy as np
import pytest

from picoclaw.app import build_embedder
from picoclaw.config import parse_config
from picoclaw.memory.index import EmbeddingUnavailable, LocalEmbedder, MemoryIndex
from picoclaw.memory.index.chunks import markdown_chunks
from picoclaw.memory.store import MemoryStore

# Skipped by conftest.py when the extra is not installed; CI installs it, so there these run.
pytestmark = pytest.mark.local

FACTS = [
    "I prefer green tea over coffee in the morning.",
    "My dog Bob loves chasing balls in the park.",
    "The quarterly budget review is on Friday at 3pm with Wang Fang.",
    "我养了一只柯基，叫豆豆。",
    "Fixed handleWebSocketReconnect not retrying on ECONNREFUSED.",
]


@pytest.fixture(scope="module")
def embedder() -> Iterator[LocalEmbedder]:
    model = LocalEmbedder()
    yield model
    model.close()


def test_the_packaged_model_embeds_unit_vectors_and_ranks_by_meaning(embedder: LocalEmbedder) -> None:
    vectors = asyncio.run(embedder.embed(FACTS))
    assert vectors.shape == (len(FACTS), 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    for query, expected in [("what do I like to drink?", 0), ("tell me about my puppy", 1),
                            ("when is the finance meeting", 2), ("connection refused bug", 4)]:
        similarity = vectors @ asyncio.run(embedder.embed([query]))[0]
        assert int(np.argmax(similarity)) == expected, (query, similarity)


def test_the_token_limit_is_the_models_own(embedder: LocalEmbedder, tmp_path: Path) -> None:
    limit = embedder.token_limit()
    assert limit.limit == 254  # max_seq_length 256 minus [CLS] and [SEP]
    assert limit.count("hello world") == 2 and limit.count("柯基") == 2
    text = "## 2024-05-01\n" + "\n".join(["The roadmap review covers hiring, budgets and the launch plan."] * 80)
    chunks = markdown_chunks(text, tmp_path / "MEMORY.md", limit)
    assert len(chunks) > 1 and all(limit.count(chunk.text) <= 254 for chunk in chunks)
    assert all(chunk.text.startswith("## 2024-05-01\n") for chunk in chunks)


def test_hybrid_search_with_the_local_model(embedder: LocalEmbedder, tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "memory", UTC)
    for fact in FACTS:
        store.append_long_term(fact)
    config = parse_config({"memory": {"index": {"enabled": True, "embeddings": {"provider": "local"}}}}, "c")
    index = MemoryIndex(store, config.memory.index, embedder, sessions_dir=tmp_path / "sessions")
    try:
        hits = index.search("what beverage do I enjoy", 3)
        assert hits[0].block.text.endswith(FACTS[0])  # no shared word: found by meaning
        assert "豆豆" in index.search("柯基", 3)[0].block.text  # Chinese through the keyword side
        assert "ECONNREFUSED" in index.search("ECONNREFUSED", 3)[0].block.text
        status = index.status()
        assert (status.chunks, status.vectors, status.warning) == (len(FACTS), len(FACTS), None)
        assert status.model == "local sentence-transformers model all-MiniLM-L6-v2"
    finally:
        index.close()


def test_a_model_that_is_not_on_disk_is_a_clear_warning(tmp_path: Path) -> None:
    missing = LocalEmbedder(str(tmp_path / "no-such-model"))
    with pytest.raises(EmbeddingUnavailable, match="neither a packaged model .* nor a sentence-transformers"):
        asyncio.run(missing.embed(["x"]))
    store = MemoryStore(tmp_path / "memory", UTC)
    store.append_long_term("我养了一只柯基")
    config = parse_config({"memory": {"index": {"enabled": True, "embeddings": {
        "provider": "local", "model": str(tmp_path / "no-such-model")}}}}, "c")
    index = MemoryIndex(store, config.memory.index, build_embedder(config), sessions_dir=tmp_path / "sessions")
    try:
        assert "柯基" in index.search("柯基", 1)[0].block.text
        assert "no-such-model" in (index.status().warning or "")
    finally:
        index.close()
