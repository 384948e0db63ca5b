"""The inbox contract (storage/inbox.py) on both backends, and the work that runs once across workers: claims in
each chat's order, leases that run out, replies recorded, a summary and a heartbeat taken by one worker only."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time

from picoclaw import clock
from picoclaw.app import App
from picoclaw.storage import FilesStorage, Inbox, Storage
from picoclaw.storage.inbox import DONE_KEEP
from picoclaw.storage.postgres.storage import PostgresStorage
from tests.agent_helpers import SUMMARY_EN, is_flush_request, is_summary_request, set_policy
from tests.fakes import FakeOpenAIServer, Text
from tests.homes import edit_config
from tests.test_scheduler import open_app
from tests.waiting import wait_until, wait_until_sync
from tests.zones import onboard_in_shanghai

BOT = 123456


@pytest.fixture(params=["files", "postgres"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    if request.param == "files":
        yield FilesStorage(tmp_path)
        return
    dsn = request.getfixturevalue("postgres_dsn")
    opened = PostgresStorage(tmp_path, dsn)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def inbox(storage: Storage) -> Iterator[Inbox]:
    opened = storage.telegram_inbox(BOT)
    try:
        yield opened
    finally:
        opened.close()


def stored(inbox: Inbox, *updates: tuple[int, str]) -> None:
    for update_id, chat in updates:
        body = f'{{"update_id": {update_id}, "chat": "{chat}", "text": "你好 {update_id}"}}'
        assert inbox.store(update_id, chat, body)


def ids(claimed: list[Any]) -> list[int]:
    return [update.update_id for update in claimed]


def test_an_update_is_stored_once_and_kept_as_sent(inbox: Inbox) -> None:
    body = '{"update_id": 5, "message": {"text": "只存一次 stored once"}}'
    assert inbox.store(5, "42", body) is True
    assert inbox.store(5, "42", '{"update_id": 5, "something": "else"}') is False
    [claimed] = inbox.claim("w1", 30, 10)
    assert (claimed.update_id, claimed.chat, claimed.body, claimed.attempts, claimed.replied) == (5, "42", body, 1,
                                                                                                  False)
    assert inbox.counts() == {"open": 0, "claimed": 1, "done": 0}


def test_each_chat_is_claimed_oldest_first_and_one_at_a_time(inbox: Inbox) -> None:
    stored(inbox, (1, "a"), (2, "b"), (3, "a"), (4, "c"), (5, "b"), (6, "a"))
    assert ids(inbox.claim("w1", 30, 10)) == [1, 2, 4]  # the head of each chat
    assert inbox.claim("w2", 30, 10) == []  # the heads are leased; the rest wait behind them
    inbox.finish("w2", 1)  # not w2's claim: nothing happens
    assert inbox.claim("w2", 30, 10) == []
    inbox.finish("w1", 1)
    assert ids(inbox.claim("w2", 30, 10)) == [3]  # chat a's next, to whichever worker asks
    inbox.finish("w1", 2)
    inbox.finish("w1", 4)
    assert ids(inbox.claim("w1", 30, 1)) == [5]  # the limit holds
    assert inbox.counts() == {"open": 1, "claimed": 2, "done": 3}


def test_a_claim_that_runs_out_is_taken_over_and_says_whether_it_was_answered(inbox: Inbox) -> None:
    stored(inbox, (1, "a"), (2, "b"))
    assert ids(inbox.claim("dead", 0, 10)) == [1, 2]  # a lease of 0 s has run out by the next transaction
    inbox.mark_replied(2)  # "dead" sent chat b's answer, then died before calling it done
    taken = inbox.claim("w2", 30, 10)
    assert [(u.update_id, u.attempts, u.replied) for u in taken] == [(1, 2, False), (2, 2, True)]
    assert inbox.renew("dead", [1, 2], 30) == set()  # no longer its own
    inbox.finish("dead", 1)  # nor is finishing it: w2 holds it now
    assert inbox.counts() == {"open": 0, "claimed": 2, "done": 0}
    assert inbox.renew("w2", [1, 2, 99], 30) == {1, 2}
    inbox.finish("w2", 1)
    assert inbox.renew("w2", [1, 2], 30) == {2}


def test_a_claim_given_back_is_taken_at_once_and_not_counted_as_an_attempt(inbox: Inbox) -> None:
    stored(inbox, (1, "a"), (2, "a"))
    assert ids(inbox.claim("stopping", 30, 10)) == [1]
    assert inbox.claim("w2", 30, 10) == []
    inbox.release("w2", [1])  # not w2's to give back
    assert inbox.claim("w2", 30, 10) == []
    inbox.release("stopping", [1])
    assert [(u.update_id, u.attempts) for u in inbox.claim("w2", 30, 10)] == [(1, 1)]


def test_an_update_stored_late_waits_for_the_chats_update_under_way(inbox: Inbox) -> None:
    # Telegram retried update 10 after a failed store, and 11 of the same chat came through first.
    stored(inbox, (11, "a"), (20, "b"))
    assert ids(inbox.claim("w1", 30, 10)) == [11, 20]
    stored(inbox, (10, "a"))
    assert inbox.claim("w2", 30, 10) == []  # chat a has 11 under way: 10 waits, however old it is
    inbox.finish("w1", 11)
    assert ids(inbox.claim("w2", 30, 10)) == [10]


@pytest.mark.slow
def test_workers_claiming_at_once_take_each_update_once_and_one_per_chat_at_a_time(inbox: Inbox,
                                                                                   storage: Storage) -> None:
    stored(inbox, *((n, f"chat{n % 40}") for n in range(1, 401)))
    taken: dict[str, list[int]] = {"w1": [], "w2": [], "w3": []}
    under_way: dict[str, int] = {}  # chat → the update a worker holds now
    overlaps: list[tuple[str, int, int]] = []
    guard = threading.Lock()

    def work(worker: str) -> None:
        mine = storage.telegram_inbox(BOT)
        try:
            while claimed := mine.claim(worker, 30, 5):
                with guard:
                    for update in claimed:
                        if update.chat in under_way:
                            overlaps.append((update.chat, under_way[update.chat], update.update_id))
                        under_way[update.chat] = update.update_id
                for update in claimed:
                    taken[worker].append(update.update_id)
                    with guard:  # before the finish commits: the chat's next claim may come right after it
                        del under_way[update.chat]
                    mine.finish(worker, update.update_id)
        finally:
            mine.close()
    threads = [threading.Thread(target=work, args=(name,)) for name in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    everything = [update_id for claimed in taken.values() for update_id in claimed]
    assert sorted(everything) == list(range(1, 401))  # each once
    assert overlaps == []  # never two updates of one chat at once
    for claimed in taken.values():  # and each chat's in order, whichever worker took them
        for chat in range(40):
            mine = [update_id for update_id in claimed if update_id % 40 == chat]
            assert mine == sorted(mine)
    assert inbox.counts() == {"open": 0, "claimed": 0, "done": 400}


def test_finished_rows_are_pruned_only_after_telegram_can_no_longer_resend_them(inbox: Inbox,
                                                                               storage: Storage) -> None:
    stored(inbox, (1, "a"), (2, "a"))
    inbox.claim("w1", 30, 10)
    inbox.finish("w1", 1)
    assert inbox.prune() == 0  # a retry of update 1 may still come: it must be recognised
    if isinstance(storage, FilesStorage):  # the files inbox keeps picoclaw's clock, which a test can move
        with freeze_time(clock.now() + DONE_KEEP + timedelta(minutes=1)):
            assert inbox.prune() == 1
    else:  # PostgreSQL keeps the server's: the row is made older instead
        assert isinstance(storage, PostgresStorage)
        with storage.pool.connection() as conn:
            conn.execute("update telegram_inbox set done_at = done_at - %s", (DONE_KEEP + timedelta(minutes=1),))
        assert inbox.prune() == 1
    assert inbox.counts() == {"open": 1, "claimed": 0, "done": 0}


def test_a_claim_given_back_after_a_failed_attempt_counts_it_and_a_lease_says_when_it_ends(inbox: Inbox) -> None:
    stored(inbox, (1, "a"), (2, "b"))
    assert inbox.next_lease_end(30) is None  # nothing claimed: no lease to wait for
    assert ids(inbox.claim("w1", 30, 1)) == [1]
    assert 20 < (inbox.next_lease_end(30) or 0) <= 30  # when a worker may take it over, if w1 dies
    inbox.release("w1", [1], attempted=True)  # its turn could not reach the storage: the attempt counts
    assert [(u.update_id, u.attempts) for u in inbox.claim("w2", 30, 10)] == [(1, 2), (2, 1)]


def test_another_workers_store_wakes_a_listening_worker_at_once(storage: Storage, inbox: Inbox) -> None:
    async def run() -> None:
        woken = asyncio.Event()
        listening = asyncio.create_task(inbox.listen(woken.set))
        if isinstance(storage, FilesStorage):  # the one worker of a files workspace wakes itself
            await asyncio.wait_for(listening, 60)
            return
        try:
            await wait_until(woken.is_set, what="the wake-up once listening")  # for what came before
            woken.clear()
            other = storage.telegram_inbox(BOT)  # another worker's
            await asyncio.to_thread(other.store, 7, "c", '{"update_id": 7, "text": "醒醒 wake up"}')
            await wait_until(woken.is_set, what="the NOTIFY of another worker's store")
        finally:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)
    asyncio.run(run())


# -- work done once -----------------------------------------------------------------------------------------------


def test_a_work_lock_is_held_by_one_holder_across_connections_until_let_go(storage: Storage) -> None:
    first, second = storage.work_lock("summary:telegram:42"), storage.work_lock("summary:telegram:42")
    other = storage.work_lock("summary:telegram:43")
    assert first.try_acquire() is True
    assert second.try_acquire() is False  # another process (or worker machine) finds it taken
    assert other.try_acquire() is True  # another session's work is not held up
    # Let go from another thread than the one that took it: the agent does both off the event loop.
    releasing = threading.Thread(target=first.release)
    releasing.start()
    releasing.join(30)
    assert second.try_acquire() is True
    second.release()
    other.release()


def test_an_interval_is_claimed_once_however_many_ask(storage: Storage) -> None:
    with freeze_time("2026-11-26 10:00:00"):
        results = [storage.claim_interval("heartbeat", 1800) for _ in range(3)]
    assert results == [True, False, False]
    assert storage.claim_interval("another job", 1800) is True
    if isinstance(storage, FilesStorage):  # picoclaw's clock, moved on by the test
        with freeze_time("2026-11-26 10:31:00"):
            assert storage.claim_interval("heartbeat", 1800) is True
    else:  # the server's clock, which a test cannot move: an interval that has passed
        assert storage.claim_interval("heartbeat", 0) is True


@pytest.fixture(params=["files", "postgres"])
def worker_homes(request: pytest.FixtureRequest, home: Path, tmp_path: Path) -> list[Path]:
    """Two workers' homes on one storage: one home twice on files (two processes on one machine), two homes
    with their own workspace folders on one database (two machines) on PostgreSQL."""
    if request.param == "files":
        return [home, home]
    dsn = request.getfixturevalue("postgres_dsn")
    second = tmp_path / "home2"
    onboard_in_shanghai(second)  # the same zone as the first worker
    for each in (home, second):
        with edit_config(each) as config:
            config["storage"] = {"backend": "postgres", "postgres": {"dsn": dsn, "pool_size": 4}}
    return [home, second]


def test_a_summary_due_on_two_workers_at_once_is_written_by_one(worker_homes: list[Path],
                                                                fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = lambda body: (Text(SUMMARY_EN, delay=0.5) if is_summary_request(body)
                                          else "[]" if is_flush_request(body) else "好的 ok")
    workers = [open_app(home, fake_openai) for home in worker_homes]
    set_policy(workers[0].workspace, session_summary_message_threshold=4, session_summary_keep_count=2,
               memory_flush_enabled=False)

    async def run() -> None:
        first, second = workers[0].agent(), workers[1].agent()
        for n in range(2):
            await first.handle("telegram:42", f"第{n}条 message {n}")
        # Both find the summary due after their turn: one writes it, the other finds it under way or done.
        await asyncio.gather(first.handle("telegram:42", "three / 三"), second.handle("telegram:42", "four / 四"))
        for app in workers:
            await app.aclose()
    asyncio.run(run())
    assert len([body for body in fake_openai.chat_requests() if is_summary_request(body)]) == 1
    app = App.open(worker_homes[1])
    try:
        assert app.workspace.sessions().load("telegram:42").summary == SUMMARY_EN  # seen from the other worker
    finally:
        app.close()


def test_a_claim_that_waited_for_a_finish_does_not_take_the_finished_update(postgres_dsn: str, tmp_path: Path) -> None:
    # w1's lease ran out while it still answered; its finish is under way as w2 claims. Under READ COMMITTED the
    # claim waits for the row, and must then see it done, not take it from its older snapshot.
    import psycopg

    storage = PostgresStorage(tmp_path, postgres_dsn)
    try:
        inbox = storage.telegram_inbox(BOT)
        stored(inbox, (1, "a"), (2, "a"))
        inbox.claim("w1", 0, 10)  # run out at once, still w1's
        finishing = psycopg.connect(postgres_dsn)
        finishing.execute("update telegram_inbox set done_at = now(), lease_until = null where update_id = 1")
        claimed: list[list[int]] = []
        claiming = threading.Thread(target=lambda: claimed.append(ids(inbox.claim("w2", 30, 10))))
        claiming.start()
        claiming.join(1.0)  # it waits on the row w1's finish holds (a bound, not a race: both outcomes are checked)
        finishing.commit()
        finishing.close()
        claiming.join(60)
        assert claimed in ([[]], [[2]])  # never update 1 again; chat a's next only if w2 saw the finish first
        assert inbox.counts()["done"] == 1
    finally:
        storage.close()


def test_a_claim_that_waited_for_another_sees_the_lease_it_took(postgres_dsn: str, tmp_path: Path) -> None:
    # Another worker's claim holds the bot's claim lock and is taking update 11 of chat a. Update 10 of chat a,
    # stored late (Telegram retried it), was committed before this claim began. Once the other commits, this
    # claim must see 11 under way and leave 10 waiting: a snapshot taken before the lock was granted would not.
    import psycopg

    from picoclaw.storage.postgres.inbox import CLAIM_LOCK

    storage = PostgresStorage(tmp_path, postgres_dsn)
    try:
        inbox = storage.telegram_inbox(BOT)
        stored(inbox, (11, "a"), (20, "b"))
        claimed: list[list[int]] = []
        claiming = threading.Thread(target=lambda: claimed.append(ids(inbox.claim("w2", 30, 10))))
        with psycopg.connect(postgres_dsn) as other:  # closed on the way out, the lock let go even if the test fails
            other.execute("select pg_advisory_xact_lock(%s, hashtext(%s))", (CLAIM_LOCK, str(BOT)))
            other.execute("update telegram_inbox set worker = 'w1', lease_until = now() + interval '30 seconds', "
                          "attempts = 1 where update_id = 11")
            stored(inbox, (10, "a"))
            claiming.start()
            with psycopg.connect(postgres_dsn, autocommit=True) as watch:
                wait_until_sync(lambda: watch.execute(
                    "select count(*) from pg_locks where locktype = 'advisory' and not granted "
                    "and classid = %s::oid and database = (select oid from pg_database where datname = "
                    "current_database())", (CLAIM_LOCK,)).fetchone() == (1,), what="the claim waiting for the lock")
            other.commit()
        claiming.join(60)
        assert not claiming.is_alive()
        assert claimed == [[20]]  # chat b's; chat a's 10 waits for 11, which w1 holds
        assert inbox.counts()["claimed"] == 2
    finally:
        storage.close()


def test_a_store_and_a_finish_wake_the_workers_only_when_there_is_work_for_them(postgres_dsn: str,
                                                                                 tmp_path: Path) -> None:
    # A new update wakes every listening worker; a repeated one does not; a finish does when its chat has its next
    # update waiting (now free to be taken), and not when the chat has nothing more.
    import psycopg

    storage = PostgresStorage(tmp_path, postgres_dsn)
    inbox = storage.telegram_inbox(BOT)
    channel = f"telegram_inbox_{BOT}"
    try:
        with psycopg.connect(postgres_dsn, autocommit=True) as listener, \
                psycopg.connect(postgres_dsn, autocommit=True) as marker:
            listener.execute(f'listen "{channel}"')

            def wakes() -> int:
                """The wake-ups sent since the last call: those that arrive before a mark sent now."""
                marker.execute("select pg_notify(%s, 'mark')", (channel,))
                count = 0
                for note in listener.notifies(timeout=60):
                    if note.payload == "mark":
                        return count
                    count += 1
                raise AssertionError("the mark never arrived")

            stored(inbox, (1, "甲"), (2, "甲"), (3, "chat b"))
            assert wakes() == 3
            assert not inbox.store(1, "甲", '{"update_id": 1, "text": "again 又一次"}') and wakes() == 0
            assert ids(inbox.claim("w1", 30, 10)) == [1, 3]
            inbox.finish("w1", 1)  # 甲's update 2 may be taken now
            assert wakes() == 1
            inbox.finish("w1", 3)  # chat b has nothing more
            inbox.finish("w2", 2)  # not w2's: nothing finished, nobody woken
            assert wakes() == 0
            assert inbox.counts()["done"] == 2
            assert ids(inbox.claim("w2", 30, 10)) == [2]
    finally:
        inbox.close()
        storage.close()
