"""Sessions: they survive a restart, run in parallel without mixing, and run one turn at a time each."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from picoclaw.agent.loop import AgentLoop
from picoclaw.app import App
from picoclaw.memory.workspace import Workspace
from picoclaw.transcripts.session_store import Session, SessionStore, StoredMessage
from tests.agent_helpers import (
    SESSION,
    SUMMARY_ZH,
    chat,
    contents,
    history,
    is_summary_request,
    records_of,
    said,
    session_path,
    set_policy,
    summary_sent,
    turn_requests,
    with_agent,
)
from tests.fakes import FakeOpenAIServer, Text
from tests.test_repl import configure


def last_user(body: dict[str, Any]) -> str:
    return said(body["messages"][-1])


def test_restart_mid_conversation_keeps_the_session(home: Path, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = lambda body: f"re: {last_user(body)}"
    chat(App.open(home).workspace, fake_openai, ["my name is 李雷", "my locker is number 42"])

    # A new process: config read again, a new provider, a new AgentLoop on the same workspace.
    assert chat(App.open(home).workspace, fake_openai, ["what is my locker? 我的柜子是几号？"]) == [
        "re: what is my locker? 我的柜子是几号？"]

    after_restart = fake_openai.chat_requests()[-1]
    assert contents(history(after_restart)) == [
        "my name is 李雷", "re: my name is 李雷", "my locker is number 42", "re: my locker is number 42",
        "what is my locker? 我的柜子是几号？"]
    assert [r["id"] for r in records_of(App.open(home).workspace, "message")] == [1, 2, 3, 4, 5, 6]


def test_the_checks_after_a_reply_ask_storage_nothing_and_still_find_a_summary_due(
        workspace: Workspace, fake_openai: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Whether a summary or a reflection is due is first looked at on the session as this process just wrote it;
    # only work found due reads it again, under its lock (on PostgreSQL each read is a round trip).
    set_policy(workspace, session_summary_message_threshold=5)
    fake_openai.responder = lambda body: SUMMARY_ZH if is_summary_request(body) else f"好的：{last_user(body)}"
    reads: list[str] = []
    refresh, jobs = SessionStore.refresh, AgentLoop._after_turn_jobs

    def counted(self: SessionStore, session: Session) -> bool:
        reads.append(session.key)
        return refresh(self, session)

    after_reply: list[int] = []

    async def watched(self: AgentLoop, *args: Any) -> None:
        before = len(reads)
        await jobs(self, *args)
        after_reply.append(len(reads) - before)

    monkeypatch.setattr(SessionStore, "refresh", counted)
    monkeypatch.setattr(AgentLoop, "_after_turn_jobs", watched)
    chat(workspace, fake_openai, ["first 第一", "second 第二", "third 第三"])

    assert after_reply[:2] == [0, 0]  # nothing due: no read
    assert after_reply[2] >= 1  # the third turn passed the threshold: the summary read the session again
    assert sum(map(is_summary_request, fake_openai.chat_requests())) == 1
    chat(workspace, fake_openai, ["fourth 第四"])
    assert summary_sent(turn_requests(fake_openai)[-1]) == SUMMARY_ZH


def test_an_open_chat_takes_in_what_another_process_appended_before_its_next_turn(
        workspace: Workspace, fake_openai: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Files: the loop looks whether the transcript changed with one stat on the event loop, and reads it again
    # (in a worker thread) only when it did; `chat -m` in another process appends to the same file.
    fake_openai.responder = lambda body: f"re: {last_user(body)}"
    reads: list[Session] = []
    read = SessionStore._read

    def counted(self: SessionStore, session: Session) -> None:
        reads.append(session)
        read(self, session)

    monkeypatch.setattr(SessionStore, "_read", counted)

    async def body(loop: AgentLoop) -> None:
        await loop.handle(SESSION, "first 第一")
        await loop.handle(SESSION, "second 第二")
        mine = await loop.session(SESSION)
        assert [session is mine for session in reads] == [True]  # loaded once; only this loop wrote since
        other = workspace.sessions()  # as another process's store
        other.append_messages(other.load(SESSION), [StoredMessage(0, {"role": "user", "content": "from -m 另一个"}),
                                                    StoredMessage(0, {"role": "assistant", "content": "noted 记下了"})])
        await loop.handle(SESSION, "third 第三")
        assert sum(session is mine for session in reads) == 2

    with_agent(workspace, fake_openai, body)
    assert contents(history(turn_requests(fake_openai)[-1]))[-3:] == ["from -m 另一个", "noted 记下了", "third 第三"]


def test_restart_after_a_summary_continues_from_the_summary(home: Path, fake_openai: FakeOpenAIServer) -> None:
    workspace = App.open(home).workspace
    set_policy(workspace, session_summary_message_threshold=5)
    fake_openai.responder = lambda body: SUMMARY_ZH if is_summary_request(body) else f"好的：{last_user(body)}"
    chat(workspace, fake_openai, ["第一", "第二", "第三"])

    chat(App.open(home).workspace, fake_openai, ["第四"])

    after_restart = turn_requests(fake_openai)[-1]
    assert summary_sent(after_restart) == SUMMARY_ZH
    assert contents(history(after_restart)) == ["第二", "好的：第二", "第三", "好的：第三", "第四"]


def test_a_torn_last_line_is_dropped_and_the_session_goes_on(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = lambda body: f"re: {last_user(body)}"
    chat(workspace, fake_openai, ["hello 你好"])
    path = session_path(workspace)
    with open(path, "ab") as fh:
        fh.write(b'{"type": "message", "id": 3, "message": {"role": "user", "content": "half')  # crash mid-append

    assert chat(workspace, fake_openai, ["again 再来"]) == ["re: again 再来"]

    assert contents(history(fake_openai.chat_requests()[-1])) == ["hello 你好", "re: hello 你好", "again 再来"]
    assert [r["id"] for r in records_of(workspace, "message")] == [1, 2, 3, 4]


def test_two_sessions_in_parallel_do_not_mix(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    slow, fast = "telegram:1", "telegram:2"
    fast_done = threading.Event()  # the fast session's second question has reached the model

    def answer(body: dict[str, Any]) -> Text:
        text = last_user(body)
        if text == "快 二":
            fast_done.set()
        # The slow session's first answer waits for that, however long the fast turns take on a busy machine.
        return Text(f"re: {text}", until=fast_done if text == "slow one" else None)
    fake_openai.responder = answer

    async def body(loop: AgentLoop) -> list[list[str]]:
        async def talk(key: str, texts: list[str]) -> list[str]:
            return [(await loop.handle(key, text)).text for text in texts]
        return list(await asyncio.gather(talk(slow, ["slow one", "slow two"]), talk(fast, ["快 一", "快 二"])))

    assert with_agent(workspace, fake_openai, body) == [["re: slow one", "re: slow two"], ["re: 快 一", "re: 快 二"]]

    order = [last_user(b) for b in fake_openai.chat_requests()]
    assert order.index("快 二") < order.index("slow two")  # the fast session did not wait for the slow one
    for request in fake_openai.chat_requests():
        said = contents(history(request))
        own = "slow" if said[-1].startswith("slow") else "快"
        assert all(text.removeprefix("re: ").startswith(own) for text in said), said
    assert contents(history(fake_openai.chat_requests()[order.index("slow two")])) == [
        "slow one", "re: slow one", "slow two"]
    assert [r["message"]["content"] for r in records_of(workspace, "message", fast)] == [
        "快 一", "re: 快 一", "快 二", "re: 快 二"]


def test_turns_of_one_session_run_one_at_a_time(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = lambda body: Text(f"re: {last_user(body)}", delay=0.05)

    async def body(loop: AgentLoop) -> list[str]:
        replies = await asyncio.gather(loop.handle(SESSION, "first 第一"), loop.handle(SESSION, "second 第二"))
        return [reply.text for reply in replies]

    assert with_agent(workspace, fake_openai, body) == ["re: first 第一", "re: second 第二"]
    second = fake_openai.chat_requests()[1]
    assert contents(history(second)) == ["first 第一", "re: first 第一", "second 第二"]


def test_session_keys_become_safe_file_names(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    keys = ["telegram:42", "user/../../etc", "微信:张三"]
    for key in keys:
        chat(workspace, fake_openai, [f"hi from {key}"], key=key)

    files = sorted(p.name for p in (workspace.root / "sessions").iterdir())
    assert files == sorted(session_path(workspace, key).name for key in keys)
    assert all(session_path(workspace, key).parent == workspace.root / "sessions" for key in keys)
    assert "telegram%3A42.jsonl" in files and "user%2F..%2F..%2Fetc.jsonl" in files


def test_two_processes_on_one_session_take_turns_without_reusing_ids(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    # An open `chat` and a `chat -m` on the same session: two Apps on one home, each with its own
    # SessionStore and AgentLoop, as two processes have. Each turn must see what the other appended.
    configure(home, fake_openai)
    fake_openai.responder = lambda body: f"re: {last_user(body)}"
    key = "cli:default"
    script = [(0, "first from the open chat 开着的"), (1, "one-off message 一次性"), (0, "back in the open chat"),
              (1, "another one-off 又一次"), (0, "last word 最后")]

    async def main() -> None:
        apps = (App.open(home), App.open(home))
        try:
            for turn, (which, text) in enumerate(script):
                await apps[which].agent().handle(key, text)
                if turn == 0:
                    await apps[1].agent().session(key)  # the second process loaded the session early on
        finally:
            for app in apps:
                await app.aclose()

    asyncio.run(main())

    records = records_of(App.open(home).workspace, "message", key)
    assert [r["id"] for r in records] == list(range(1, 2 * len(script) + 1))
    expected = [part for _, text in script for part in (text, f"re: {text}")]
    assert [r["message"]["content"] for r in records] == expected
    requests = fake_openai.chat_requests()
    for index, request in enumerate(requests):  # each prompt carries every earlier message, either process's
        assert contents(history(request)) == expected[: 2 * index] + [script[index][1]]


def test_a_compaction_record_whose_summary_is_not_text_is_skipped(
        workspace: Workspace, fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    fake_openai.responder = lambda body: f"re: {last_user(body)}"
    chat(workspace, fake_openai, ["hello 你好"])
    with open(session_path(workspace), "ab") as fh:  # a hand-edited (or foreign) file: an object as summary
        fh.write(b'{"type": "compaction", "through": 2, "summary": {"goal": "x"}, "reason": "summary"}\n')

    assert chat(workspace, fake_openai, ["again 再来"]) == ["re: again 再来"]
    assert chat(workspace, fake_openai, ["and again 又来"]) == ["re: and again 又来"]

    # The record is skipped as a whole: nothing it claimed to cover goes missing from the prompt.
    assert contents(history(fake_openai.chat_requests()[-1]))[:2] == ["hello 你好", "re: hello 你好"]
    assert "summary is not text" in caplog.text


def test_a_lone_surrogate_in_the_text_is_replaced_not_fatal(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    # `picoclaw chat -m $'\udcff'`: Python hands a byte that is not UTF-8 over as a lone surrogate.
    fake_openai.responder = lambda body: f"re: {last_user(body)}"
    assert chat(workspace, fake_openai, ["bad byte \udcff 坏字节"]) == ["re: bad byte \ufffd 坏字节"]
    assert [r["message"]["content"] for r in records_of(workspace, "message")] == [
        "bad byte \ufffd 坏字节", "re: bad byte \ufffd 坏字节"]
