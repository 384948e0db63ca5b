"""The sessions port, the same tests on both backends: JSONL files and PostgreSQL's `messages` table."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path

import orjson
import psycopg
import pytest
from freezegun import freeze_time

from picoclaw.storage import FilesStorage, Storage, StorageError, StorageUnavailable
from picoclaw.storage.postgres.sessions import LOCK_CLASS, PostgresSessionLog
from picoclaw.storage.postgres.storage import PostgresStorage
from picoclaw.storage.waits import LockWaitExpired
from picoclaw.transcripts.session_store import SessionStore, StoredMessage
from tests.waiting import wait_until_sync

# "spawn": each writer is a fresh interpreter with its own pool (or FileLock), as separate processes are.
CTX = multiprocessing.get_context("spawn")
KEY = "telegram:42"
WRITERS, EACH = 3, 20


@dataclass
class Backend:
    """A workspace root and its storage."""

    root: Path
    storage: Storage
    dsn: str | None  # PostgreSQL's, for writers in other processes

    def store(self, folder: str = "sessions") -> SessionStore:
        return SessionStore(self.root / folder, storage=self.storage)


def _open(root: Path, dsn: str | None) -> Storage:
    return PostgresStorage(root, dsn) if dsn else FilesStorage(root)


@pytest.fixture(params=["files", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    dsn = request.getfixturevalue("postgres_dsn") if request.param == "postgres" else None
    storage = _open(tmp_path, dsn)
    try:
        yield Backend(tmp_path, storage, dsn)
    finally:
        storage.close()


def _said(role: str, text: str) -> StoredMessage:
    return StoredMessage(0, {"role": role, "content": text})


def _records(store: SessionStore, path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in store.log.read(path).lines]


def test_a_store_keeps_its_transcripts_with_the_storage_it_was_given(backend: Backend) -> None:
    assert type(backend.store().log).__name__ == ("PostgresSessionLog" if backend.dsn else "FilesSessionLog")


def test_messages_and_marks_come_back_as_written_in_english_and_chinese(backend: Backend) -> None:
    store = backend.store()
    session = store.load(KEY)
    store.append_messages(session, [_said("user", "What did I plant?"), _said("assistant", "Tomatoes.")])
    store.append_messages(session, [_said("user", "我种了什么？"), _said("assistant", "番茄和罗勒。")])
    store.add_compaction(session, 2, "用户种了番茄 (tomatoes).", "budget")
    store.add_reflection(session, 4)
    store.mark_undelivered(session, 4, "网络断了")

    again = backend.store().load(KEY)
    assert [m.id for m in again.messages] == [1, 2, 3, 4]
    assert [m.message["content"] for m in again.active()][0] == "我种了什么？"
    assert again.summary == "用户种了番茄 (tomatoes)."
    assert (again.compacted_through, again.reflected_through) == (2, 4)
    assert again.messages[-1].undelivered == "网络断了"
    kinds = [record["type"] for record in _records(store, session.path)]
    assert kinds == ["message"] * 4 + ["compaction", "reflection", "undelivered"]


def test_a_second_store_takes_in_what_another_appended(backend: Backend) -> None:
    first, second = backend.store(), backend.store()
    mine, theirs = first.load(KEY), second.load(KEY)
    first.append_messages(mine, [_said("user", "hello")])
    assert second.refresh(theirs) and [m.message["content"] for m in theirs.messages] == ["hello"]
    assert not second.refresh(theirs)  # nothing new since
    second.append_messages(theirs, [_said("assistant", "你好")])
    assert first.refresh(mine) and [m.id for m in mine.messages] == [1, 2]


@pytest.mark.parametrize("said", ["hello", "你好"])
def test_an_append_from_a_session_read_before_another_writer_follows_that_writer(backend: Backend,
                                                                                 said: str) -> None:
    first, second = backend.store(), backend.store()
    mine, theirs = first.load(KEY), second.load(KEY)
    first.append_messages(mine, [_said("user", said)])
    second.append_messages(theirs, [_said("assistant", f"{said}!")])  # `theirs` was read before any transcript
    first.append_messages(mine, [_said("user", f"{said}?")])  # `mine` was read at its own append, before that
    again = backend.store().load(KEY)
    assert [(m.id, m.message["content"]) for m in again.messages] == [(1, said), (2, f"{said}!"), (3, f"{said}?")]
    assert [m.id for m in mine.messages] == [1, 2, 3] and [m.id for m in theirs.messages] == [1, 2]


def test_the_active_history_and_its_blocks_follow_every_change_of_the_session(tmp_path: Path) -> None:
    # Session keeps what active() and injected_blocks() worked out until the history or its compaction point
    # changes: an append, a compaction, a reload after another process wrote, each must show at once.
    store, other = (SessionStore(tmp_path / "sessions", storage=FilesStorage(tmp_path)) for _ in range(2))
    session = store.load(KEY)
    asked = StoredMessage(0, {"role": "user", "content": "Where do I live?"}, context="<context>…</context>",
                          blocks=("a1",))
    store.append_messages(session, [asked, _said("assistant", "In Berlin.")])
    assert [m.id for m in session.active()] == [1, 2] and session.injected_blocks() == {"a1"}
    session.active().clear()  # the caller's own list: the session's history is untouched
    assert [m.id for m in session.active()] == [1, 2]

    store.append_messages(session, [StoredMessage(0, {"role": "user", "content": "我住在哪里？"}, blocks=("b2",))])
    assert [m.id for m in session.active()] == [1, 2, 3] and session.injected_blocks() == {"a1", "b2"}

    store.add_compaction(session, 2, "用户住在柏林 (Berlin).", "budget")
    assert [m.id for m in session.active()] == [3] and session.injected_blocks() == {"b2"}

    theirs = other.load(KEY)
    other.append_messages(theirs, [_said("assistant", "在柏林。")])
    assert store.refresh(session)
    assert [m.message["content"] for m in session.active()] == ["我住在哪里？", "在柏林。"]
    assert session.active_messages()[-1]["content"] == "在柏林。"


def test_the_files_lock_kept_for_every_append_still_keeps_threads_apart(tmp_path: Path) -> None:
    # One filelock serves all of a folder's appends; each thread holds it on its own, so another waits.
    log = SessionStore(tmp_path / "sessions", storage=FilesStorage(tmp_path)).log
    outcome: list[str] = []

    def other_thread() -> None:
        try:
            log.lock().acquire(timeout=0.05)
        except LockWaitExpired as exc:
            outcome.append(str(exc))
        else:
            outcome.append("taken")
            log.lock().release()

    with log.lock(), log.lock():  # reentrant within this thread
        waiter = threading.Thread(target=other_thread)
        waiter.start()
        waiter.join()
    assert len(outcome) == 1 and outcome[0].startswith("waited 0.05 s for the sessions lock")
    waiter = threading.Thread(target=other_thread)
    waiter.start()
    waiter.join()
    assert outcome[1] == "taken"


def _append_in_child(store: SessionStore, done: Queue) -> None:  # type: ignore[type-arg]
    try:
        store.append_messages(store.load(KEY), [_said("user", "from a forked child 子进程")])
        done.put("ok")
    except Exception as exc:
        done.put(repr(exc))


def test_a_store_whose_lock_was_taken_before_a_fork_still_appends_in_the_child(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions", storage=FilesStorage(tmp_path))
    store.append_messages(store.load(KEY), [_said("user", "before the fork")])  # the lock is made and taken here
    fork = multiprocessing.get_context("fork")
    done = fork.Queue()
    child = fork.Process(target=_append_in_child, args=(store, done))
    child.start()
    child.join(30)
    assert done.get(timeout=5) == "ok"
    assert [m.message["content"] for m in store.load(KEY).messages] == ["before the fork", "from a forked child 子进程"]


def _append_many(root: str, dsn: str | None, worker: int, go: Event) -> None:
    storage = _open(Path(root), dsn)
    try:
        store = SessionStore(Path(root) / "sessions", storage=storage)
        session = store.load(KEY)
        go.wait()
        for number in range(EACH):
            store.append_messages(session, [_said("user", f"writer {worker} 第{number}条")])
    finally:
        storage.close()


@pytest.mark.slow
def test_ids_from_three_processes_are_1_to_60_none_lost_none_reused(backend: Backend) -> None:
    go = CTX.Event()
    writers = [CTX.Process(target=_append_many, args=(str(backend.root), backend.dsn, worker, go))
               for worker in range(WRITERS)]
    for writer in writers:
        writer.start()
    go.set()
    for writer in writers:
        writer.join(timeout=120)
    assert [writer.exitcode for writer in writers] == [0] * WRITERS

    store = backend.store()
    records = _records(store, store.path_for(KEY))
    assert [record["id"] for record in records] == list(range(1, WRITERS * EACH + 1))  # in line order too
    said = sorted(str(record["message"]["content"]) for record in records)  # type: ignore[index]
    assert said == sorted(f"writer {w} 第{n}条" for w in range(WRITERS) for n in range(EACH))


def test_archive_moves_the_transcript_and_the_key_starts_afresh(backend: Backend) -> None:
    store = backend.store()
    session = store.load(KEY)
    store.append_messages(session, [_said("user", "old chat 旧的")])
    first = store.archive(KEY)
    store.append_messages(store.load(KEY), [_said("user", "second")])
    second = store.archive(KEY)  # the same second: a name of its own
    assert first is not None and second is not None and first != second
    assert first.parent == second.parent == store.folder / "archive"
    assert first.name.endswith("_telegram%3A42.jsonl")
    assert store.archive(KEY) is None  # nothing left to archive
    assert store.load(KEY).messages == []
    assert [m.message["content"] for m in store.read(first).messages] == ["old chat 旧的"]
    assert store.transcripts() == sorted([first, second])
    assert store.refresh(session)  # the archived transcript is gone from under the loaded session
    assert session.messages == []


def test_rename_gives_the_transcript_to_the_new_key_unless_it_has_one(backend: Backend) -> None:
    store = backend.store()
    store.append_messages(store.load("cli"), [_said("user", "named 命名")])
    store.append_messages(store.load("cli:taken"), [_said("user", "mine")])
    assert store.rename("cli", "cli:work")
    assert not store.rename("cli:work", "cli:taken") and not store.rename("missing", "cli:new")
    assert [m.message["content"] for m in store.load("cli:work").messages] == ["named 命名"]
    assert store.load("cli").messages == []
    assert [m.message["content"] for m in store.load("cli:taken").messages] == ["mine"]


def test_a_users_sessions_are_never_read_from_another_scope(backend: Backend) -> None:
    alice, bob, shared = backend.store("users/alice/sessions"), backend.store("users/bob/sessions"), backend.store()
    alice.append_messages(alice.load(KEY), [_said("user", "alice 的秘密")])
    assert bob.load(KEY).messages == [] and shared.load(KEY).messages == []
    assert bob.transcripts() == [] and shared.transcripts() == []
    assert [m.message["content"] for m in alice.load(KEY).messages] == ["alice 的秘密"]


def test_a_users_old_transcript_in_the_shared_folder_moves_to_the_user(backend: Backend) -> None:
    shared = backend.store()
    shared.append_messages(shared.load(KEY), [_said("user", "before per-user 以前")])
    mine = SessionStore(backend.root / "users/alice/sessions", storage=backend.storage,
                        moved_from=backend.root / "sessions")
    assert [m.message["content"] for m in mine.load(KEY).messages] == ["before per-user 以前"]
    assert shared.load(KEY).messages == []


def test_a_record_that_cannot_be_stored_is_one_error_and_nothing_is_written(backend: Backend) -> None:
    store = backend.store()
    session = store.load(KEY)
    store.append_messages(session, [_said("user", "kept 保留")])
    bad = StoredMessage(0, {"role": "user", "content": object()})  # type: ignore[typeddict-item]
    with pytest.raises(StorageError, match="cannot be stored"):
        store.append_messages(session, [_said("user", "lost with it 一起丢"), bad])
    assert [m.id for m in session.messages] == [1]
    assert [m.message["content"] for m in backend.store().load(KEY).messages] == ["kept 保留"]
    store.append_messages(session, [_said("user", "next")])
    assert [m.id for m in backend.store().load(KEY).messages] == [1, 2]


# PostgreSQL alone: its own checks, the server going away, and moving transcripts in and out.

@pytest.fixture
def postgres(postgres_dsn: str, tmp_path: Path) -> Iterator[PostgresStorage]:
    storage = PostgresStorage(tmp_path / "db", postgres_dsn)
    try:
        yield storage
    finally:
        storage.close()


def test_a_message_id_used_already_is_refused_in_the_appending_transaction(postgres: PostgresStorage) -> None:
    log = postgres.session_log(postgres.root / "sessions")
    path = log.folder / "chat.jsonl"
    log.append(path, [{"type": "message", "id": 1, "message": {"role": "user", "content": "one"}}])
    with pytest.raises(StorageError, match="message id 1 does not follow 1"):
        log.append(path, [{"type": "reflection", "through": 1},
                          {"type": "message", "id": 1, "message": {"role": "user", "content": "again"}}])
    assert len(log.read(path).lines) == 1
    assert postgres.session_counts() == {"sessions": 1, "messages": 1}


@pytest.mark.parametrize("said", ["one", "一条消息"])
def test_an_append_numbers_its_records_after_the_rows_and_refuses_ids_out_of_order(postgres: PostgresStorage,
                                                                                  said: str) -> None:
    log = postgres.session_log(postgres.root / "sessions")
    path = log.folder / "telegram%3A用户.jsonl"

    def message(number: int) -> dict[str, object]:
        return {"type": "message", "id": number, "message": {"role": "user", "content": f"{said} {number}"}}

    first = log.append(path, [message(1), message(2)])
    second = log.append(path, [{"type": "reflection", "through": 2}])  # no message: the last id stays 2
    assert first != second
    with pytest.raises(StorageError, match="message id 3 does not follow 4"):  # within the batch
        log.append(path, [message(4), message(3)])
    with pytest.raises(StorageError, match="message id 2 does not follow 2"):  # behind the row's
        log.append(path, [message(2)])
    log.append(path, [message(3), {"type": "reflection", "through": 3}])
    assert [orjson.loads(line).get("id") for line in log.read(path).lines] == [1, 2, None, 3, None]
    assert orjson.loads(log.read(path).lines[3])["message"]["content"] == f"{said} 3"
    assert log.marker(path) != second and postgres.session_counts() == {"sessions": 1, "messages": 5}


@pytest.mark.parametrize("said", ["again", "再来"])
def test_an_append_to_a_session_nothing_changed_since_takes_no_lock(postgres: PostgresStorage, said: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    store = SessionStore(postgres.root / "sessions", storage=postgres)
    session = store.load(KEY)
    store.append_messages(session, [_said("user", "hello 你好")])  # a new transcript: under the lock

    def taken(log: PostgresSessionLog) -> None:
        raise AssertionError("the lock was taken")
    monkeypatch.setattr(PostgresSessionLog, "lock", taken)
    store.append_messages(session, [_said("assistant", said)])
    assert [(m.id, m.message["content"]) for m in SessionStore(postgres.root / "sessions", storage=postgres)
            .load(KEY).messages] == [(1, "hello 你好"), (2, said)]


@pytest.mark.parametrize("said", ["mine", "我的"])
def test_an_append_waits_for_a_writer_holding_the_lock_and_follows_what_it_wrote(postgres: PostgresStorage,
                                                                                 postgres_dsn: str, said: str) -> None:
    """An append takes no lock when none is held and nothing changed; one held is waited for, as before."""
    other = PostgresStorage(postgres.root, postgres_dsn)  # another process's pool
    try:
        mine_store = SessionStore(postgres.root / "sessions", storage=postgres)
        their_store = SessionStore(postgres.root / "sessions", storage=other)
        mine = mine_store.load(KEY)
        mine_store.append_messages(mine, [_said("user", "hello 你好")])
        theirs = their_store.load(KEY)
        held, go = threading.Event(), threading.Event()
        failures: list[BaseException] = []

        def holder() -> None:  # a writer holding the lock for a read and a write (a summary, a compaction …)
            try:
                with their_store.lock():
                    held.set()
                    assert go.wait(60)
                    their_store.append_messages(theirs, [_said("assistant", "theirs 他们的")])
            except BaseException as exc:  # noqa: BLE001 - reported by the test below
                failures.append(exc)

        def appender() -> None:
            try:
                mine_store.append_messages(mine, [_said("user", said)])
            except BaseException as exc:  # noqa: BLE001
                failures.append(exc)
        threads = [threading.Thread(target=holder), threading.Thread(target=appender)]
        threads[0].start()
        assert held.wait(60)
        threads[1].start()
        with psycopg.connect(postgres_dsn, autocommit=True) as watch:
            # The sessions' lock of this database only: a server shared by the test workers has others.
            wait_until_sync(lambda: watch.execute(
                "select count(*) from pg_locks where locktype = 'advisory' and not granted and classid = %s::oid "
                "and database = (select oid from pg_database where datname = current_database())",
                (LOCK_CLASS,)).fetchone() == (1,), what="the append waiting for the lock")
        go.set()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads) and failures == []
        again = mine_store.load(KEY)
        assert [(m.id, m.message["content"]) for m in again.messages] == [
            (1, "hello 你好"), (2, "theirs 他们的"), (3, said)]
    finally:
        other.close()


def test_a_server_gone_mid_write_is_one_line_and_the_transaction_is_undone(postgres: PostgresStorage,
                                                                           postgres_dsn: str) -> None:
    log = postgres.session_log(postgres.root / "sessions")
    path = log.folder / "chat.jsonl"
    log.append(path, [{"type": "reflection", "through": 0}])
    with pytest.raises(StorageUnavailable) as raised, log.lock():
        log.append(path, [{"type": "reflection", "through": 1}])
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute("select pg_terminate_backend(pid, 30000) from pg_stat_activity "
                          "where datname = current_database() and pid <> pg_backend_pid()")
        log.append(path, [{"type": "reflection", "through": 2}])
    assert "cannot be reached" in str(raised.value) and "\n" not in str(raised.value)
    assert [orjson.loads(line)["through"] for line in log.read(path).lines] == [0]  # the pool reconnects


def _files_workspace(root: Path) -> None:
    """Transcripts as the files backend writes them: shared, archived, and one user's, in two languages."""
    files = FilesStorage(root)
    shared = SessionStore(root / "sessions", storage=files)
    alice = SessionStore(root / "users/alice/sessions", storage=files)
    session = shared.load(KEY)
    shared.append_messages(session, [_said("user", "Plant tomatoes"), _said("assistant", "好的，种番茄。")])
    shared.add_compaction(session, 1, "种番茄 / tomatoes", "budget")
    shared.archive(KEY)
    shared.append_messages(shared.load("cli"), [_said("user", "new chat")])
    alice.append_messages(alice.load(KEY), [_said("user", "alice 的")])
    (root / "sessions" / "hand.jsonl").write_bytes(b'{"type":"message","id":1,"message":{"role":"user"}}\n'
                                                  b"not json\n\n")


def _tree(root: Path) -> dict[str, bytes]:
    return {path.relative_to(root).as_posix(): path.read_bytes()
            for path in sorted(root.rglob("*.jsonl")) if path.is_file()}


def test_export_after_import_gives_the_same_bytes_and_import_is_idempotent(postgres: PostgresStorage,
                                                                         tmp_path: Path) -> None:
    source, exported = tmp_path / "files", tmp_path / "exported"
    _files_workspace(source)
    assert postgres.import_sessions(source, replace=False) == 4
    counts = postgres.session_counts()
    with pytest.raises(StorageError, match="--replace"):
        postgres.import_sessions(source, replace=False)
    assert postgres.import_sessions(source, replace=True) == 4
    assert postgres.session_counts() == counts == {"sessions": 4, "messages": 8}
    assert postgres.export_sessions(exported) == 4
    assert _tree(exported) == _tree(source) and len(_tree(source)) == 4

    # What PostgreSQL appends exports as the files backend writes it: the imported numbering goes on.
    with freeze_time("2026-11-26 10:00:00"):
        store = SessionStore(postgres.root / "sessions", storage=postgres)
        store.append_messages(store.load("cli"), [_said("assistant", "接着说 go on")])
        files = SessionStore(source / "sessions", storage=FilesStorage(source))
        files.append_messages(files.load("cli"), [_said("assistant", "接着说 go on")])
    postgres.export_sessions(exported)
    assert _tree(exported) == _tree(source)
    assert b'"id":2' in (exported / "sessions/cli.jsonl").read_bytes()
