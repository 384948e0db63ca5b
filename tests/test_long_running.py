"""A bot that runs for months: a slow embedding endpoint holds up only the turn that waits for it, and what
the process keeps per chat (loaded sessions, locks, per-user agents) stays bounded without losing a message."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import picoclaw.agent.loop as agent_loop
from picoclaw.agent.loop import AgentLoop
from picoclaw.app import App
from picoclaw.config import load_config
from picoclaw.memory.search import index_of
from picoclaw.storage import FilesStorage
from picoclaw.tools.registry import build_tools
from picoclaw.transcripts.session_store import KEPT_COMPACTED, SessionStore, StoredMessage
from tests.agent_helpers import API_KEY, make_provider, said
from tests.fakes import FakeOpenAIServer
from tests.homes import edit_config
from tests.waiting import wait_until

FACT = "I prefer green tea over coffee in the morning. 我早上喜欢喝绿茶，不喝咖啡。"


def configure(home: Path, server: FakeOpenAIServer, **embeddings: Any) -> None:
    """The model and the index's embeddings both from the fake server."""
    with edit_config(home) as data:
        data["providers"]["openai"] = {"api_key": API_KEY, "api_base": server.base_url}
        data["memory"]["index"] = {"enabled": True, "embeddings": {
            "provider": "openai", "model": "text-embedding-3-small", **embeddings}}


def embedded(server: FakeOpenAIServer, marker: str) -> bool:
    return any(marker in json.dumps(r["input"], ensure_ascii=False) for r in server.embedding_requests())


def user_text(request: dict[str, Any]) -> str:
    """The last user message as sent: its data block (retrieved memory) and its text."""
    return str(request["messages"][-1]["content"])


# -- a slow embedding endpoint ---------------------------------------------------------------------------


def test_a_slow_embedding_endpoint_holds_up_only_the_turn_that_waits_for_it(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai, max_wait_seconds=60)
    App.open(home).workspace.store.append_long_term(FACT)
    fake_openai.responder = lambda body: "ok"
    fake_openai.hold_embeddings = lambda inputs: any("慢" in text for text in inputs)

    async def main() -> tuple[str, bool, str]:
        async with App.open(home) as app:
            agent = app.agent()
            slow = asyncio.create_task(agent.handle("telegram:1", "慢 slow: what do I drink in the morning?"))
            await wait_until(lambda: embedded(fake_openai, "慢"), what="the slow chat's query embedding")
            # Another chat asks meanwhile: its turn (search, embeddings, model, session append) completes.
            fast = await asyncio.wait_for(agent.handle("telegram:2", "which tea do I like? 我喜欢什么茶"), 30)
            slow_still_waiting = not slow.done()
            fake_openai.release_embeddings()
            return fast.text, slow_still_waiting, (await asyncio.wait_for(slow, 30)).text

    fast, slow_still_waiting, slow = asyncio.run(main())
    assert (fast, slow_still_waiting, slow) == ("ok", True, "ok")
    first, second = fake_openai.chat_requests()
    assert "我喜欢什么茶" in user_text(first) and "green tea" in user_text(first)  # found with its embeddings
    assert "慢 slow" in user_text(second) and "green tea" in user_text(second)


def test_new_memory_stuck_on_a_slow_endpoint_holds_up_only_the_search_that_started_embedding_it(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    """Chat 1's search starts embedding a new entry and waits for it; chat 2, asking meanwhile, must not
    wait for that too: it answers from keywords at once."""
    configure(home, fake_openai, max_wait_seconds=60)
    App.open(home).workspace.store.append_long_term(FACT)
    fake_openai.responder = lambda body: "ok"

    async def main() -> tuple[bool, str | None]:
        async with App.open(home) as app:
            agent = app.agent()
            await agent.handle("telegram:1", "warm up: tea?")  # the index is built and every entry embedded
            fake_openai.hold_embeddings = lambda inputs: any("Mimi" in text for text in inputs)
            app.workspace.store.append_long_term("My cat is called Mimi. 我的猫叫咪咪。")
            slow = asyncio.create_task(agent.handle("telegram:1", "what is my cat called?"))
            await wait_until(lambda: embedded(fake_openai, "Mimi"), what="the new entry's embedding request")
            try:
                await asyncio.wait_for(agent.handle("telegram:2", "which tea do I like? 我喜欢什么茶"), 30)
                slow_still_waiting = not slow.done()
            finally:
                fake_openai.release_embeddings()
            await asyncio.wait_for(slow, 30)
            index = index_of(agent.workspace.searcher)
            assert index is not None
            return slow_still_waiting, index.last_notice

    slow_still_waiting, notice = asyncio.run(main())
    assert slow_still_waiting
    other = next(r for r in fake_openai.chat_requests() if "我喜欢什么茶" in user_text(r))
    assert "green tea" in user_text(other)  # found by its keywords
    assert notice is None  # the slow chat's own search got its vectors once they came


def test_a_dead_embedding_endpoint_costs_a_turn_max_wait_seconds_then_keywords_answer(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai, max_wait_seconds=0.3)
    App.open(home).workspace.store.append_long_term("My gym locker code is 7319. 健身房柜子密码是 7319。")
    fake_openai.responder = lambda body: "ok"
    fake_openai.hold_embeddings = lambda inputs: True  # never answers while the test runs

    async def main() -> tuple[str, str | None]:
        async with App.open(home) as app:
            agent = app.agent()
            try:
                reply = await asyncio.wait_for(agent.handle("cli:test", "locker code 柜子密码"), 30)
            finally:
                fake_openai.release_embeddings()
            index = index_of(agent.workspace.searcher)
            assert index is not None
            return reply.text, index.last_notice

    reply, notice = asyncio.run(main())
    assert reply == "ok"
    assert "7319" in user_text(fake_openai.chat_requests()[0])  # the keyword hit was injected
    assert notice is not None and "took longer than 0.3 s" in notice


# -- bounded state -----------------------------------------------------------------------------------------


def test_sessions_beyond_the_cache_are_evicted_and_reloaded_without_losing_a_message(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai)
    fake_openai.responder = lambda body: f"re: {said(body['messages'][-1]).rsplit(chr(10), 1)[-1]}"
    workspace = App.open(home).workspace
    chats = [f"telegram:{n}" for n in range(5)]

    async def main() -> tuple[int, int]:
        async with make_provider(workspace, fake_openai) as provider:
            loop = AgentLoop(workspace, provider, build_tools(workspace), session_cache_size=2)
            most = 0
            for round_ in range(3):
                for n, key in enumerate(chats):
                    await loop.handle(key, f"round {round_} chat {n} 第{round_}轮")
                    most = max(most, len(loop._loaded))
            await loop.wait_background()
            return most, len(loop._locks)

    most_loaded, locks = asyncio.run(main())
    assert most_loaded == 2 and locks == 0
    requests = fake_openai.chat_requests()
    for round_ in range(3):
        for n in range(5):
            history = [said(m) for m in requests[round_ * 5 + n]["messages"][1:-1]]
            earlier = [part for r in range(round_) for part in (f"round {r} chat {n} 第{r}轮",
                                                                  f"re: round {r} chat {n} 第{r}轮")]
            assert [text.rsplit("\n", 1)[-1] for text in history] == earlier
    store = workspace.sessions()
    for key in chats:
        assert [m.id for m in store.load(key).messages] == [1, 2, 3, 4, 5, 6]


def test_per_session_locks_exist_only_while_turns_run(home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai)
    fake_openai.responder = lambda body: "ok"
    workspace = App.open(home).workspace

    async def main() -> tuple[int, int, bool]:
        async with make_provider(workspace, fake_openai) as provider:
            loop = AgentLoop(workspace, provider, build_tools(workspace))
            turns = [asyncio.create_task(loop.handle(f"telegram:{n}", "hello 你好")) for n in range(3)]
            await wait_until(lambda: len(loop._locks) == 3, what="three turns holding their locks")
            during = len(loop._locks)
            await asyncio.gather(*turns)
            await loop.wait_background()
            return during, len(loop._locks), loop.idle()

    assert asyncio.run(main()) == (3, 0, True)


def test_a_long_session_keeps_only_its_recent_compacted_messages_in_memory(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions", storage=FilesStorage(tmp_path))
    session = store.load("telegram:7")
    store.append_messages(session, [StoredMessage(0, {"role": "user", "content": f"消息 {n}"}) for n in range(300)])
    store.add_compaction(session, 290, "summary 摘要", "summary")
    again = store.load("telegram:7")
    for loaded in (session, again):
        assert len(loaded.messages) == 10 + KEPT_COMPACTED
        assert loaded.last_id == 300 and loaded.messages_since_reflection() == 300
        assert [m.message["content"] for m in loaded.active()] == [f"消息 {n}" for n in range(290, 300)]


def test_per_user_agents_beyond_the_cache_are_closed_and_made_again(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai)
    fake_openai.responder = lambda body: "ok"

    async def main() -> tuple[int, bool, bool, str]:
        async with App(load_config(home), home, agent_cache_size=2) as app:
            first = app.agent("user-0")
            first.workspace.store.append_long_term("My room is 512. 我的房间号是 512。")
            await first.handle("telegram:100", "what is my room? 我的房间号是多少")
            for n in range(1, 5):
                await app.agent(f"user-{n}").handle(f"telegram:{100 + n}", "hello 你好")
            kept = len(app._agents)
            index = index_of(first.workspace.searcher)
            closed = index is not None and index._conn is None  # its database was closed when it fell out
            again = app.agent("user-0")
            hits = await again.workspace.searcher.search_async("room 房间号", 3)
            return kept, again is first, closed, hits[0].block.text

    kept, same, closed, found = asyncio.run(main())
    assert (kept, same, closed) == (2, False, True) and "512" in found


def test_a_per_user_agent_whose_metrics_line_waits_is_kept_until_it_is_written(
        home: Path, fake_openai: FakeOpenAIServer, monkeypatch: Any) -> None:
    # A line waits for its shared write by a timer (1 s); an agent let go of meanwhile is never flushed at close,
    # and the timer's thread dies with the process. Here the wait outlasts the test: only the close writes it.
    monkeypatch.setattr(agent_loop, "METRICS_SETTLE_SECONDS", 3600.0)
    with edit_config(home) as data:  # no index: an agent still embedding is kept for that alone
        data["providers"]["openai"] = {"api_key": API_KEY, "api_base": fake_openai.base_url}
    fake_openai.responder = lambda body: "ok"

    async def main() -> tuple[AgentLoop, bool, int]:
        async with App(load_config(home), home, agent_cache_size=1) as app:
            first = app.agent("user-0")
            await first.handle("telegram:100", "hello")
            await first.wait_background()  # the first line is written at once
            await first.handle("telegram:100", "我的房间号是多少")  # this one waits for the timer
            while first._background:  # the work after the reply (not the line: the timer's), done
                await asyncio.gather(*list(first._background), return_exceptions=True)
            waiting = len(first.metrics.read().turns)
            await app.agent("user-1").handle("telegram:101", "hi 你好")  # one agent fits: user-0 would go
            return first, app._agents.peek("user-0") is first, waiting

    first, kept, waiting = asyncio.run(main())
    assert (waiting, kept) == (1, True)
    assert len(first.metrics.read().turns) == 2  # written as the app closed
