"""The memory index and an embedding endpoint that is down: after a failure it is not asked
again for a while (a pause that doubles while it keeps failing), so later turns answer from keywords at once
instead of each waiting for it; the outage is logged once, and it ends when the endpoint answers again.

Also: a per-user agent whose index is still embedding is not evicted from the app's cache, and an index
closed under a running backfill is not opened again by it.

Embeddings come from the fake OpenAI-compatible server through the real `openai` client; the clock is frozen
(freezegun, asyncio left real) and moved past the pauses, so nothing waits in real time for a pause to end.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from datetime import UTC
from pathlib import Path

import pytest
from freezegun import freeze_time

from picoclaw.app import App, build_embedder
from picoclaw.config import Config, load_config, parse_config
from picoclaw.memory.index import MemoryIndex
from picoclaw.memory.index.embedders import Embedder
from picoclaw.memory.search import index_of
from tests.fakes import FakeOpenAIServer
from tests.stores import memory_store
from tests.test_long_running import configure
from tests.waiting import wait_until

KEY = "sk-backoff-test-0123456789"
FAST_RETRY = {"retry-after-ms": "5"}  # the client's one retry comes at once
START = "2026-03-01 09:00:00"
BACKOFF_FIRST, BACKOFF_MAX = 30, 600  # seconds: the documented first and longest pause after a failure
ENTRIES = ["我养了一只柯基，叫豆豆，最喜欢在公园里追球。", "My dog Bob loves chasing balls in the park.",
           "周五下午三点和王芳开季度预算评审会。"]
LOGGER = "picoclaw.memory.index"


def make_config(server: FakeOpenAIServer) -> Config:
    return parse_config({"providers": {"openai": {"api_key": KEY, "api_base": server.base_url}},
                         "memory": {"index": {"enabled": True, "embeddings": {
                             "provider": "openai", "model": "text-embedding-3-small"}}}}, "test-config.json")


@pytest.fixture
def indexes(tmp_path: Path, fake_openai: FakeOpenAIServer) -> Iterator[Callable[..., MemoryIndex]]:
    """indexes(name, embedder=None): an index over a memory of its own holding ENTRIES (one scope each, as
    per-user memories are); given no embedder, a new one for the fake server. Closed after the test."""
    config = make_config(fake_openai)
    made: list[MemoryIndex] = []
    embedders: list[Embedder] = []

    def make(name: str, embedder: Embedder | None = None) -> MemoryIndex:
        if embedder is None:
            embedder = build_embedder(config)
            assert embedder is not None
            embedders.append(embedder)
        store = memory_store(tmp_path / name / "memory", UTC)
        for entry in ENTRIES:
            store.append_long_term(entry)
        index = MemoryIndex(store, config.memory.index, embedder, sessions_dir=tmp_path / name / "sessions")
        store.on_change(index.mark_changed)
        made.append(index)
        return index

    yield make
    for index in made:
        index.close()
    for embedder in embedders:
        embedder.close()


def fail_next_try(server: FakeOpenAIServer) -> None:
    """The endpoint answers the next embeddings request, and the client's one retry, with a 503."""
    for _ in range(2):
        server.reply_error(503, "embedding backend overloaded / 向量服务过载", headers=FAST_RETRY,
                           endpoint="embeddings")


def asked(server: FakeOpenAIServer) -> int:
    return len(server.embedding_requests())


def embedded(server: FakeOpenAIServer, marker: str) -> bool:
    """Whether an embeddings request with `marker` in its input has come (answered or held)."""
    return any(marker in json.dumps(r["input"], ensure_ascii=False) for r in server.embedding_requests())


def messages(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


def test_after_a_failure_later_searches_do_not_ask_the_endpoint_until_the_pause_ends(
        indexes: Callable[..., MemoryIndex], fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    index = indexes("shared")
    fail_next_try(fake_openai)
    with caplog.at_level(logging.INFO, logger=LOGGER), freeze_time(START, real_asyncio=True) as clock:
        assert "豆豆" in index.search("柯基", 3)[0].block.text  # keywords answer
        assert asked(fake_openai) == 2 and "overloaded" in (index.last_notice or "")
        # Turns during the pause: keyword results at once, and the endpoint is not asked (nothing to wait for).
        for seconds, query, found in [(10, "Bob the dog", "Bob"), (19, "预算评审", "王芳")]:
            clock.tick(seconds)
            hits = index.search(query, 3)
            assert asked(fake_openai) == 2, f"asked again {seconds} s after the failure"
            assert found in hits[0].block.text
            assert index.last_notice is not None and "paused after a failure" in index.last_notice
            assert "overloaded" in index.last_notice
        status = index.status()
        assert status.vectors == 0 and status.warning is not None and "overloaded" in status.warning
        # The pause is over and the endpoint is back: the next search embeds everything it lacked.
        clock.tick(BACKOFF_FIRST - 29)
        assert "Bob" in index.search("dog in the park", 3)[0].block.text
        status = index.status()
        assert (status.vectors, status.warning, index.last_notice) == (len(ENTRIES), None, None)
        assert asked(fake_openai) == 4  # the missing vectors, then the query

    said = messages(caplog)
    assert len(said) == 2, said  # the outage once, its end once: not a line per search
    assert said[0].startswith("memory index: embeddings unavailable, searching with keywords only (next try in 30 s")
    assert said[1].startswith("memory index: embeddings work again")


def test_the_pause_doubles_while_the_endpoint_keeps_failing_up_to_its_cap(
        indexes: Callable[..., MemoryIndex], fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    index = indexes("shared")
    pauses: list[float] = []
    with caplog.at_level(logging.INFO, logger=LOGGER), freeze_time(START, real_asyncio=True) as clock:
        fail_next_try(fake_openai)
        index.search("柯基", 3)
        pause = BACKOFF_FIRST
        while len(pauses) < 7:
            clock.tick(pause - 1)
            index.search("dog 狗", 3)
            assert asked(fake_openai) == 2 * (len(pauses) + 1), f"asked before the pause of {pause:g} s ended"
            fail_next_try(fake_openai)
            clock.tick(1)
            index.search("dog 狗", 3)
            assert asked(fake_openai) == 2 * (len(pauses) + 2), f"not asked when the pause of {pause:g} s ended"
            pauses.append(pause)
            pause = min(pause * 2, BACKOFF_MAX)

    assert pauses == [30, 60, 120, 240, 480, 600, 600]
    assert len(messages(caplog)) == 1  # one warning for the whole outage; each new try is an INFO line
    assert len(messages(caplog, logging.INFO)) == 1 + len(pauses)


def test_indexes_sharing_an_embedder_share_its_outage(
        indexes: Callable[..., MemoryIndex], fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    alice = indexes("alice")
    assert alice.embedder is not None
    bob = indexes("bob", alice.embedder)  # per-user scopes: one embedder for all
    fail_next_try(fake_openai)
    with caplog.at_level(logging.WARNING, logger=LOGGER), freeze_time(START, real_asyncio=True) as clock:
        alice.search("柯基", 3)
        assert "Bob" in bob.search("Bob", 3)[0].block.text
        assert asked(fake_openai) == 2  # Bob's search did not ask the endpoint Alice's found down
        warning = bob.status().warning
        assert warning is not None and "paused after a failure" in warning and "overloaded" in warning
        clock.tick(BACKOFF_FIRST)
        bob.search("Bob", 3)
        assert bob.status().vectors == len(ENTRIES) and bob.status().warning is None
        alice.search("柯基", 3)  # the endpoint works again for everyone
        assert alice.status().vectors == len(ENTRIES)
    assert [m.split(" (")[0] for m in messages(caplog)] == [
        "memory index: embeddings unavailable, searching with keywords only", "memory index: embeddings work again"]


def test_a_query_embedding_that_fails_or_never_comes_pauses_embedding_too(
        indexes: Callable[..., MemoryIndex], fake_openai: FakeOpenAIServer) -> None:
    index = indexes("shared")
    index.sync()  # every entry embedded: only queries are embedded from now on
    fake_openai.hold_embeddings = lambda inputs: inputs == ["柯基在哪里"]  # an endpoint that hangs

    def search(query: str) -> str:
        async def run() -> str:
            return "\n".join(hit.block.text for hit in await index.search_async(query, 3, wait=0.2))
        return asyncio.run(run())

    def asked_for(query: str) -> int:
        return sum(request["input"] == [query] for request in fake_openai.embedding_requests())

    try:
        with freeze_time(START, real_asyncio=True) as clock:
            assert "豆豆" in search("柯基在哪里")  # waited 0.2 s for the query's vector, then keywords
            assert "took longer than 0.2 s" in (index.last_notice or "")
            assert "王芳" in search("预算评审")  # no wait: the endpoint is not asked
            assert asked_for("预算评审") == 0 and "paused after a failure" in (index.last_notice or "")
            clock.tick(BACKOFF_FIRST)
            fail_next_try(fake_openai)
            search("Bob 在公园")  # tried again: it fails, and the pause doubles
            assert asked_for("Bob 在公园") == 2 and "overloaded" in (index.last_notice or "")
            clock.tick(2 * BACKOFF_FIRST - 1)
            search("Bob 的球")
            assert asked_for("Bob 的球") == 0
            clock.tick(1)
            assert "Bob" in search("Bob the dog")
            assert asked_for("Bob the dog") == 1 and index.last_notice is None
    finally:
        fake_openai.release_embeddings()


# -- per-user agents ---------------------------------------------------------------------------------------


def test_turns_while_the_endpoint_is_down_ask_it_once_and_log_it_once(
        home: Path, fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    configure(home, fake_openai)
    fake_openai.responder = lambda body: "ok"
    fail_next_try(fake_openai)

    async def main() -> None:
        async with App.open(home) as app:
            for n, text in enumerate(["locker code?", "柜子密码是多少", "what is my locker code again?"]):
                agent = app.agent(f"user-{n}")  # per-user memories, one embedder
                agent.workspace.store.append_long_term("My gym locker code is 7319. 健身房柜子密码是 7319。")
                assert (await agent.handle(f"telegram:{n}", text)).text == "ok"

    with caplog.at_level(logging.WARNING), freeze_time(START, real_asyncio=True):
        asyncio.run(main())

    assert asked(fake_openai) == 2  # the first turn's try and the client's retry; none since
    assert all("7319" in str(request["messages"][-1]["content"]) for request in fake_openai.chat_requests())
    assert [m for m in messages(caplog) if "embeddings" in m] == [
        "memory index: embeddings unavailable, searching with keywords only (next try in 30 s, then less often "
        "while it fails): the model provider 'openai' is unavailable (HTTP 503): embedding backend overloaded / "
        "向量服务过载"]


def test_a_per_user_agent_still_embedding_is_not_evicted_and_its_index_stays_closed_after(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    # A turn waits 0.2 s for new memory's embeddings, then answers from keywords; the embedding goes on.
    configure(home, fake_openai, max_wait_seconds=0.2)
    fake_openai.responder = lambda body: "ok"

    async def main() -> tuple[bool, bool, bool, int, str]:
        async with App(load_config(home), home, agent_cache_size=1) as app:
            first = app.agent("user-0")
            index = index_of(first.workspace.searcher)
            assert index is not None
            first.workspace.store.append_long_term("My cat is called Mimi. 我的猫叫咪咪。")
            fake_openai.hold_embeddings = lambda inputs: any("Mimi" in text for text in inputs)
            try:
                await first.handle("telegram:100", "what is my cat called? 我的猫叫什么")
                await first.wait_background()
                # The turn is over; its embedding is not (the endpoint holds it).
                await wait_until(lambda: embedded(fake_openai, "Mimi"), what="the new entry's embedding request")
                assert first.idle()
                app.agent("user-1")  # the cache is full: user-0 would be the one to go
                assert "user-0" in app._agents, "user-0 was evicted while its index was still embedding"
                kept_while_embedding = index.embedding and index._conn is not None
            finally:
                fake_openai.release_embeddings()
            await wait_until(lambda: not index.embedding, what="user-0's embedding to finish")
            app.agent("user-2")  # now user-0 is idle through and through: evicted and closed
            evicted = "user-0" not in app._agents
            # Back again: what the kept agent embedded is there, and nothing is embedded twice.
            again = index_of(app.agent("user-0").workspace.searcher)
            assert again is not None
            hits = await again.search_async("cat 猫", 3)
            return kept_while_embedding, evicted, index._conn is None, again.status().vectors, hits[0].block.text

    kept, evicted, closed, vectors, found = asyncio.run(main())
    assert (kept, evicted, closed) == (True, True, True)
    assert vectors == 1 and "Mimi" in found
    assert sum("Mimi" in json.dumps(r["input"]) for r in fake_openai.embedding_requests()) == 1


def test_an_index_closed_under_its_backfill_is_not_opened_again_by_it(
        indexes: Callable[..., MemoryIndex], fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    index = indexes("shared")
    fake_openai.hold_embeddings = lambda inputs: True

    def stopped() -> bool:
        return any("was closed while embedding" in m for m in messages(caplog, logging.INFO))

    async def main() -> None:
        try:
            await index.search_async("柯基", 3, wait=0.1)  # the backfill goes on after the search
            await wait_until(lambda: embedded(fake_openai, "柯基"), what="the backfill's embedding request")
            assert index._conn is not None
            await asyncio.to_thread(index.close)  # as an evicted agent's, or the app's at exit
        finally:
            fake_openai.release_embeddings()
        # The vectors come: the backfill either stops (and says so) or stores them, opening the database.
        await wait_until(lambda: stopped() or index._conn is not None, what="the backfill to end")

    with caplog.at_level(logging.INFO, logger=LOGGER):
        asyncio.run(main())
    assert index._conn is None, "the backfill opened the closed index again"
    assert stopped() and not index.embedding
    assert not any(r.levelno >= logging.ERROR for r in caplog.records)
    assert index.status().vectors == 0  # nothing stored after the close; the next search embeds it all
    assert index.search("柯基", 3) and index.status().vectors == len(ENTRIES)
