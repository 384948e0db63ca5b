"""The composition root: what App builds for each memory scope, and where each scope keeps its files."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from picoclaw.agent.context import ChosenMemory, ContextBuilder
from picoclaw.app import App, executor_threads
from picoclaw.errors import ConfigError
from picoclaw.jobs import make_schedule
from picoclaw.transcripts.session_store import StoredMessage, session_filename
from tests.agent_helpers import contents, is_flush_request, turn_context, turn_requests
from tests.fakes import FakeOpenAIServer
from tests.homes import edit_config
from tests.test_repl import configure
from tests.zones import onboard_in_shanghai

T = TypeVar("T")
OWNER, FRIEND = "1001", "1002"
KEY = f"telegram:{OWNER}"


def with_sessions_indexed(home: Path, server: FakeOpenAIServer) -> None:
    """The fake model, and the keyword index over memory, notes and conversation transcripts."""
    configure(home, server, index={"enabled": True, "sources": ["memory", "notes", "sessions"]})


def run(home: Path, body: Callable[[App], Awaitable[T]]) -> T:
    async def main() -> T:
        async with App.open(home) as app:
            return await body(app)
    return asyncio.run(main())


def test_per_user_scopes_index_their_own_conversations(home: Path, fake_openai: FakeOpenAIServer) -> None:
    # Before the layout had one place for paths, a user's index looked for transcripts in
    # users/<id>/sessions while the loop wrote them to the shared sessions/: nothing was indexed.
    with_sessions_indexed(home, fake_openai)
    fake_openai.reply_text("Noted: locker 7319.")

    async def body(app: App) -> tuple[list[str], list[str]]:
        await app.agent(OWNER).handle(KEY, "my gym locker code is 7319 / 健身房柜子密码是 7319")
        mine = await app.agent(OWNER).workspace.searcher.search_async("locker code 柜子密码", 5, include_notes=True)
        theirs = await app.agent(FRIEND).workspace.searcher.search_async("locker code 柜子密码", 5, include_notes=True)
        return [hit.block.text for hit in mine], [hit.block.text for hit in theirs]

    mine, theirs = run(home, body)

    assert any("7319" in text and "user:" in text for text in mine)  # the transcript's chunk
    assert theirs == []  # another user's scope never sees it
    transcript = home / "workspace" / "users" / OWNER / "sessions" / session_filename(KEY)
    assert transcript.exists() and not (home / "workspace" / "sessions" / session_filename(KEY)).exists()


def test_a_per_user_transcript_left_in_the_shared_folder_moves_to_its_scope(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai)
    old = home / "workspace" / "sessions" / session_filename(KEY)
    old.parent.mkdir(parents=True, exist_ok=True)
    record = {"type": "message", "id": 1, "time": "2025-03-10T02:00:00+00:00",
              "message": {"role": "user", "content": "我叫阿达 / my name is Ada"}}
    old.write_text(json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
    fake_openai.reply_text("Hello again, Ada.")

    async def body(app: App) -> str:
        return (await app.agent(OWNER).handle(KEY, "what is my name?")).text

    assert run(home, body) == "Hello again, Ada."
    sent = contents(fake_openai.chat_requests()[-1]["messages"][1:])
    assert sent == ["我叫阿达 / my name is Ada", "what is my name?"]  # the conversation went on
    assert not old.exists()
    moved = home / "workspace" / "users" / OWNER / "sessions" / session_filename(KEY)
    assert moved.read_text(encoding="utf-8").startswith(json.dumps(record, ensure_ascii=False))


def test_one_agent_per_scope_and_each_scope_its_own_memory(home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai)

    async def body(app: App) -> None:
        shared, owner = app.agent(), app.agent(OWNER)
        assert app.agent() is shared and app.agent(OWNER) is owner and app.agent(FRIEND) is not owner
        assert shared.workspace is app.workspace
        assert owner.workspace.memory_dir == home / "workspace" / "users" / OWNER / "memory"
        assert owner.provider is shared.provider is app.provider()  # one client, one connection pool

    run(home, body)


def test_an_unsafe_user_key_is_refused(home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai)

    async def body(app: App) -> None:
        with pytest.raises(ValueError, match="unsafe user key"):
            app.agent("../shared")

    run(home, body)
    assert not (home / "shared").exists()


def test_a_missing_key_is_a_config_error_when_the_model_is_first_needed(home: Path) -> None:
    app = App.open(home)  # commands that do not talk to the model need no key
    try:
        with pytest.raises(ConfigError, match="provider 'openai' has no API key"):
            app.provider()
    finally:
        app.close()


def test_new_archives_a_transcript_still_in_the_shared_folder(home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai)
    old = home / "workspace" / "sessions" / session_filename(KEY)
    old.parent.mkdir(parents=True, exist_ok=True)
    old.write_text(json.dumps({"type": "message", "id": 1, "time": "2025-03-10T02:00:00+00:00",
                               "message": {"role": "user", "content": "旧的对话 / the old talk"}}) + "\n",
                   encoding="utf-8")
    # /new flushes the old conversation's facts in the background: answer that call apart from the turn's.
    fake_openai.responder = lambda body: "NONE" if is_flush_request(body) else "A fresh start."

    async def body(app: App) -> list[str]:
        return [(await app.agent(OWNER).handle(KEY, text)).text for text in ("/new", "hello")]

    archived, reply = run(home, body)

    assert archived.startswith("Started a new conversation. The previous one is archived as ")
    assert reply == "A fresh start." and not old.exists()
    sent = contents(turn_requests(fake_openai)[-1]["messages"][1:])
    assert sent == ["hello"]  # the old conversation did not come back
    archive = home / "workspace" / "users" / OWNER / "sessions" / "archive"
    assert [p.name.endswith(session_filename(KEY)) for p in archive.iterdir()] == [True]


# -- two Apps in one process -----------------------------------------------------------------------------------


def _opened(home: Path, backend: str, request: pytest.FixtureRequest) -> App:
    """The App of a new home onboarded on `backend` (a PostgreSQL database of the test's own)."""
    onboard_in_shanghai(home)
    if backend == "postgres":
        with edit_config(home) as config:
            config["storage"] = {"backend": "postgres", "postgres": {"dsn": request.getfixturevalue("postgres_dsn")}}
        onboard_in_shanghai(home)  # the templates go up to the database
    return App.open(home)


def _keeps_working(app: App, fact: str, query: str) -> None:
    """A memory append, a search, a job and a transcript through `app`, each read back."""
    workspace = app.workspace
    workspace.store.append_long_term(fact)
    assert fact in workspace.store.read_long_term()
    assert any(fact in hit.block.text for hit in workspace.searcher.search(query, 5, include_notes=True))
    app.jobs().add(make_schedule(in_="1 hour", tz=workspace.tz), "message", fact, KEY)
    assert [job.text for job in app.jobs().load()] == [fact]
    sessions = workspace.sessions()
    sessions.append_messages(sessions.load(KEY), [StoredMessage(0, {"role": "user", "content": fact})])
    assert [m.message["content"] for m in workspace.sessions().load(KEY).messages] == [fact]


@pytest.mark.parametrize("backends", [("files", "files"), ("postgres", "files"), ("files", "postgres")],
                         ids="-".join)
def test_two_apps_in_one_process_never_share_state(tmp_path: Path, backends: tuple[str, str],
                                                   request: pytest.FixtureRequest) -> None:
    # Each App hands its own storage to everything it builds: nothing is looked up in a process-wide table,
    # so neither App's writes, reads or closing reach the other's workspace.
    opened: list[App] = []
    try:
        first = _opened(tmp_path / "first", backends[0], request)
        opened.append(first)
        second = _opened(tmp_path / "second", backends[1], request)
        opened.append(second)
        assert first.storage is not second.storage
        assert first.workspace.store.storage is first.storage and second.workspace.store.storage is second.storage
        _keeps_working(first, "The office door code is 4711. 门禁密码是 4711。", "door code 门禁密码")
        assert "4711" not in second.workspace.store.read_long_term()
        assert second.workspace.searcher.search("door code 门禁密码", 5, include_notes=True) == []
        assert second.jobs().load() == [] and second.workspace.sessions().load(KEY).messages == []

        opened.remove(first)
        first.close()
        # The first App is closed (on PostgreSQL, its pool too): the second goes on as before.
        _keeps_working(second, "The gym locker is 7319. 健身房柜子是 7319。", "gym locker 柜子")
        assert "7319" not in (tmp_path / "first" / "workspace" / "memory" / "MEMORY.md").read_text(encoding="utf-8")
    finally:
        for app in opened:
            app.close()


def test_storage_calls_run_on_the_apps_own_threads_and_a_stuck_lock_cannot_take_them_all(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    import threading

    configure(home, fake_openai)
    app = App.open(home)
    stuck = threading.Event()  # a lock whose holder is stuck: every call waiting for it waits on this

    async def main() -> str:
        async with app:
            # Every turn a full worker answers at once, and a background job of each, waiting for that lock.
            waiting = [asyncio.ensure_future(asyncio.to_thread(stuck.wait, 120))
                       for _ in range(2 * app.config.channels.telegram.webhook.max_parallel)]
            try:
                # Another chat's storage call and a reply's DNS lookup still find a thread (Python's own default
                # executor has 6 on a 2-core machine: both waited for the stuck ones).
                name = await asyncio.wait_for(asyncio.to_thread(lambda: threading.current_thread().name), 60)
                await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo("localhost", 80), 60)
            finally:
                stuck.set()
                await asyncio.gather(*waiting)
            return name
    try:
        name = asyncio.run(main())
        executor = app.executor
        assert executor is not None
    finally:
        app.close()
    assert name.startswith("picoclaw-worker")
    assert app.executor is None
    with pytest.raises(RuntimeError):  # App.close shut it down
        executor.submit(print)


@pytest.mark.parametrize(("fact", "question"), [("The office door code is 4711.", "What is the office door code?"),
                                                ("办公室门禁密码是 4711。", "办公室门禁密码是多少？")],
                         ids=["english", "chinese"])
def test_a_postgres_turn_reads_its_session_policy_and_memory_in_one_thread_call(
        tmp_path: Path, fake_openai: FakeOpenAIServer, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch, fact: str, question: str) -> None:
    # Each thread call costs a turn far more than its work under load (it waits for the GIL and the event loop):
    # the memory the prompt carries is chosen in the call that reads the session and the policy.
    home = tmp_path / "home"
    onboard_in_shanghai(home)
    configure(home, fake_openai)
    with edit_config(home) as config:
        config["storage"] = {"backend": "postgres", "postgres": {"dsn": request.getfixturevalue("postgres_dsn")}}
    onboard_in_shanghai(home)
    fake_openai.responder = lambda body: "NONE" if is_flush_request(body) else "4711."
    called: list[str] = []
    to_thread = asyncio.to_thread

    async def counted(func: Callable[..., T], /, *args: object, **kwargs: object) -> T:
        if not fake_openai.chat_requests():  # the turn's calls before its model call
            called.append(getattr(func, "__name__", repr(func)))
        return await to_thread(func, *args, **kwargs)

    real_select = ContextBuilder.select_memory_now

    def slow_select(builder: ContextBuilder, *args: Any, **kwargs: Any) -> ChosenMemory | None:
        chosen = real_select(builder, *args, **kwargs)  # as if choosing had taken a minute
        return None if chosen is None else dataclasses.replace(chosen, seconds=chosen.seconds + 60)

    monkeypatch.setattr(ContextBuilder, "select_memory_now", slow_select)

    async def body(app: App) -> tuple[str, list[float]]:
        agent = app.agent(OWNER)
        agent.workspace.store.append_long_term(fact)
        monkeypatch.setattr(asyncio, "to_thread", counted)
        answer = (await agent.handle(KEY, question)).text
        await agent.wait_background()  # the turn's metrics written
        return answer, [turn.retrieval_ms for turn in agent.metrics.read().turns]

    answer, retrieval = run(home, body)
    assert answer == "4711."
    # The session, the policy and the memory in the first call; then none for memory (only the model client's
    # own, and the count of the blocks' use set off beside the model call).
    assert [name for name in called if name not in ("get_platform", "record_use")] == ["read"], called
    assert fact in turn_context(turn_requests(fake_openai)[0])
    assert len(retrieval) == 1 and retrieval[0] >= 60_000  # the time memory took to choose counts as retrieval


@pytest.mark.parametrize(("max_parallel", "threads"), [(1, 32), (16, 80), (256, 1280)])
def test_the_executor_has_four_threads_for_each_turn_a_webhook_worker_holds(home: Path, max_parallel: int,
                                                                           threads: int) -> None:
    """Turns held (max_parallel and a quarter more) each waiting on a stuck lock leave threads for the rest."""
    with edit_config(home) as config:
        config["channels"]["telegram"]["webhook"] = {"max_parallel": max_parallel}
    assert executor_threads(App.open(home).config) == threads
