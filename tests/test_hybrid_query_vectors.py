"""The query-vector cache of the index (QueryVectors): a question searched again costs no embedding call,
even while the endpoint is down; the cache is bounded and keyed by the embedder. Embeddings come from the
fake OpenAI-compatible server through the real `openai` client; questions in English and Chinese."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC
from pathlib import Path

import numpy as np
import pytest

from picoclaw.app import build_embedder
from picoclaw.memory.index import MemoryIndex
from picoclaw.memory.index.query_vectors import QUERY_CACHE_SIZE, QueryVectors
from tests.fakes import FakeOpenAIServer
from tests.stores import memory_store
from tests.test_index_backoff import ENTRIES, asked, fail_next_try, make_config

QUESTIONS = ["Which dog loves the park?", "谁喜欢在公园里追球？"]


def vector(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_a_kept_vector_is_returned_under_its_model_and_text_only() -> None:
    cache = QueryVectors()
    cache.put("model-a", "小狗", vector(1, 0))
    assert np.array_equal(cache.get("model-a", "小狗"), vector(1, 0))  # type: ignore[arg-type]
    assert cache.get("model-b", "小狗") is None  # another vector space
    assert cache.get("model-a", "小狗 ") is None and cache.get("model-a", "puppy") is None


def test_the_least_recently_used_vector_goes_first_when_full() -> None:
    cache = QueryVectors(size=2)
    cache.put("m", "puppy", vector(1, 0))
    cache.put("m", "小狗", vector(0, 1))
    assert cache.get("m", "puppy") is not None  # now the most recently used
    cache.put("m", "kitten", vector(1, 1))
    assert len(cache) == 2
    assert cache.get("m", "小狗") is None and cache.get("m", "puppy") is not None
    assert QueryVectors().size == QUERY_CACHE_SIZE


def test_a_kept_vector_cannot_be_changed_by_whoever_got_it() -> None:
    cache = QueryVectors()
    cache.put("m", "puppy", vector(1, 0))
    got = cache.get("m", "puppy")
    assert got is not None
    with pytest.raises(ValueError):
        got[0] = 5.0


@pytest.fixture
def index(tmp_path: Path, fake_openai: FakeOpenAIServer) -> Iterator[MemoryIndex]:
    config = make_config(fake_openai)
    embedder = build_embedder(config)
    assert embedder is not None
    store = memory_store(tmp_path / "memory", UTC)
    for entry in ENTRIES:
        store.append_long_term(entry)
    made = MemoryIndex(store, config.memory.index, embedder, sessions_dir=tmp_path / "sessions")
    yield made
    made.close()
    embedder.close()


def test_a_question_searched_again_is_not_embedded_again(index: MemoryIndex, fake_openai: FakeOpenAIServer) -> None:
    first = {question: index.search(question, 3) for question in QUESTIONS}
    before = asked(fake_openai)
    for question in QUESTIONS:
        assert index.search(question, 3) == first[question]  # the same vector, the same ranking
    assert asked(fake_openai) == before
    assert len(index.query_vectors) == len(QUESTIONS)
    index.search("Who meets Wang Fang on Friday?", 3)
    assert asked(fake_openai) == before + 1  # a new question is embedded


def test_a_kept_question_is_still_searched_by_meaning_while_the_endpoint_is_down(
        index: MemoryIndex, fake_openai: FakeOpenAIServer) -> None:
    by_meaning = {question: index.search(question, 3) for question in QUESTIONS}
    before = asked(fake_openai)
    fail_next_try(fake_openai)
    assert index.search("预算评审会是哪天？", 3) is not None
    assert index.last_notice is not None  # a new question: the endpoint failed, keywords answered
    failed = asked(fake_openai)
    assert failed > before
    for question in QUESTIONS:
        assert index.search(question, 3) == by_meaning[question]
        assert index.last_notice is None
    assert asked(fake_openai) == failed  # no call for a question whose vector is kept
