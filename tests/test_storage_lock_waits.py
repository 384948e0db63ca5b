"""Bounded lock waits, on both backends: a lock another process (or machine, or thread) holds is waited for at
most storage.lock_wait_seconds, then one StorageUnavailable line naming it; nothing is written meanwhile, and
the same write succeeds once the holder lets go. No test asserts how fast anything is: time limits here are
only upper bounds on a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from filelock import FileLock

import picoclaw
from picoclaw.cli import main
from picoclaw.config import Config, parse_config
from picoclaw.memory import MemoryStore
from picoclaw.memory.policy import PolicyManager
from picoclaw.storage import (
    LOCK_WAIT_SECONDS,
    FilesStorage,
    LockWaitExpired,
    Storage,
    StorageError,
    StorageUnavailable,
    open_storage,
)
from tests.homes import edit_config
from tests.test_cli import assert_one_line_error
from tests.test_config import config_error
from tests.test_storage_documents import Backend

TZ = ZoneInfo("Asia/Shanghai")
HANG = 120  # seconds: only a bound on a hang (a holder that never starts or never lets go), never a speed check
ENTRY = "用户喜欢绿茶，不加糖 / the user likes green tea, no sugar"

# Takes the lock named argv[4] on a storage of its own and holds it until its stdin closes.
HOLDER = """
import sys
from pathlib import Path
kind, root, dsn, lock = sys.argv[1:5]
if kind == "postgres":
    from picoclaw.storage.postgres.storage import PostgresStorage
    storage = PostgresStorage(Path(root), dsn, 2)
else:
    from picoclaw.storage import FilesStorage
    storage = FilesStorage(Path(root))
try:
    with storage.lock(Path(root) / lock):
        print("held", flush=True)
        sys.stdin.read()
finally:
    storage.close()
"""


def _env() -> dict[str, str]:
    repo = Path(picoclaw.__file__).resolve().parent.parent  # this checkout's picoclaw, not an installed one
    return {**os.environ, "PYTHONIOENCODING": "utf-8",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}


class Holder:
    """Another process holding a storage lock until `let_go`."""

    def __init__(self, kind: str, root: Path, dsn: str, lock: str):
        root.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen([sys.executable, "-c", HOLDER, kind, str(root), dsn, lock], env=_env(),
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # "" if it died: then its error is shown, no hang
        if line != "held\n":
            self.let_go()
            reason = self.process.stderr.read() if self.process.stderr else ""
            pytest.fail(f"the holder did not take the lock: {reason}")

    def let_go(self) -> None:
        assert self.process.stdin is not None
        if not self.process.stdin.closed:
            self.process.stdin.close()
        self.process.wait(timeout=HANG)


def _open(kind: str, root: Path, dsn: str, lock_wait: float) -> Storage:
    if kind == "postgres":
        from picoclaw.storage.postgres.storage import PostgresStorage

        return PostgresStorage(root, dsn, 3, lock_wait=lock_wait)
    return FilesStorage(root, lock_wait=lock_wait)


@pytest.fixture(params=["files", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    dsn = request.getfixturevalue("postgres_dsn") if request.param == "postgres" else ""
    root = tmp_path / "machine0"
    root.mkdir()
    storage = _open(request.param, root, dsn, lock_wait=1)
    try:
        yield Backend(request.param, root, dsn, storage)
    finally:
        storage.close()


def _one_line(exc: BaseException) -> str:
    message = str(exc)
    assert "\n" not in message and "Traceback" not in message, message
    return message


# -- the memory lock, held by another process --------------------------------------------------------------


# The files backend has no other machines: "other machine" runs on PostgreSQL only.
@pytest.mark.slow
@pytest.mark.parametrize(("backend", "where"), [("files", "same folder"), ("postgres", "same folder"),
                                                ("postgres", "other machine")], indirect=["backend"])
def test_a_held_memory_lock_ends_the_wait_in_one_line_and_nothing_is_written(
        backend: Backend, tmp_path: Path, where: str) -> None:
    store = MemoryStore(backend.root / "memory", TZ, storage=backend.storage)
    store.append_long_term("第一条 / the first entry")
    before = backend.stored("memory/MEMORY.md")
    # "other machine": a folder of its own on the same database, so only the advisory lock is shared.
    holder = Holder(backend.kind, backend.root if where == "same folder" else tmp_path / "machine1", backend.dsn,
                    "memory/.memory.lock")
    try:
        with pytest.raises(StorageUnavailable) as caught:
            store.append_long_term(ENTRY)
        message = _one_line(caught.value)
        assert isinstance(caught.value, LockWaitExpired) and isinstance(caught.value, StorageError)
        assert message.startswith("waited 1 s for the memory lock (memory/.memory.lock): "), message
        if where == "other machine":
            assert "another machine" in message, message
        else:
            assert "another picoclaw process holds it" in message, message
        assert backend.stored("memory/MEMORY.md") == before
        assert ENTRY not in store.read_long_term()
    finally:
        holder.let_go()
    store.append_long_term(ENTRY)  # the same write, once the holder let go
    assert ENTRY in (backend.stored("memory/MEMORY.md") or "")
    assert "第一条 / the first entry" in (backend.stored("memory/MEMORY.md") or "")


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)  # the advisory lock is PostgreSQL's
def test_a_failed_postgres_wait_leaves_no_half_taken_lock(backend: Backend, tmp_path: Path) -> None:
    import psycopg

    from picoclaw.storage.postgres.documents import LOCAL_LOCK, cache_root
    from picoclaw.storage.postgres.locks import DOCUMENT_LOCK_CLASS

    store = MemoryStore(backend.root / "memory", TZ, storage=backend.storage)
    holder = Holder("postgres", tmp_path / "machine1", backend.dsn, "memory/.memory.lock")
    try:
        with pytest.raises(LockWaitExpired):
            store.append_long_term(ENTRY)
        # The local file lock was let go: another process on this machine could take it now.
        local = FileLock(str(cache_root(backend.root, "") / LOCAL_LOCK))
        local.acquire(timeout=0)
        local.release()
    finally:
        holder.let_go()
    # No pool connection kept the advisory lock either: a fresh connection takes it at once.
    with psycopg.connect(backend.dsn, autocommit=True) as conn:
        row = conn.execute("select pg_try_advisory_lock(%s, hashtext(''))", (DOCUMENT_LOCK_CLASS,)).fetchone()
        assert row is not None and row[0] is True
        conn.execute("select pg_advisory_unlock(%s, hashtext(''))", (DOCUMENT_LOCK_CLASS,))
    # and the connection that waited went back to the pool with no lock_timeout left on it
    for number in range(3):  # distinct entries: the same one again is not appended twice
        store.append_long_term(f"第{number}次 / again {number}")
    assert all(f"第{number}次 / again {number}" in (backend.stored("memory/MEMORY.md") or "") for number in range(3))


@pytest.mark.slow
def test_the_policy_lock_is_bounded_too(backend: Backend, tmp_path: Path) -> None:
    policy = PolicyManager(backend.root / "memory", storage=backend.storage)
    holder = Holder(backend.kind, backend.root, backend.dsn, "memory/.policy.lock")
    try:
        with pytest.raises(LockWaitExpired) as caught:
            policy.set({"retrieve_limit": 7}, source="cli", reason="测试 / a test")
        assert _one_line(caught.value).startswith("waited 1 s for the policy lock (memory/.policy.lock): ")
        assert policy.read_overrides() == {}
    finally:
        holder.let_go()
    policy.set({"retrieve_limit": 7}, source="cli", reason="测试 / a test")
    assert policy.read_overrides() == {"retrieve_limit": 7}


@pytest.mark.slow
def test_a_thread_of_the_same_process_holding_the_scope_lock_bounds_the_wait(backend: Backend) -> None:
    path = backend.root / "memory" / ".memory.lock"
    (backend.root / "memory").mkdir(parents=True, exist_ok=True)
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with backend.storage.lock(path):
            held.set()
            done.wait(HANG)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(HANG)
        if backend.kind == "files":
            # FileLock is per object, so another object in this process is refused like another process.
            with pytest.raises(LockWaitExpired, match=r"^waited 1 s for the memory lock"):
                with backend.storage.lock(path):
                    pass
        else:
            with pytest.raises(LockWaitExpired, match=r"another task of this picoclaw process holds it$"):
                with backend.storage.lock(path):
                    pass
    finally:
        done.set()
        thread.join(HANG)
    with backend.storage.lock(path):
        pass


@pytest.mark.slow
def test_an_explicit_timeout_wins_and_none_may_be_endless(backend: Backend) -> None:
    path = backend.root / "memory" / ".memory.lock"
    (backend.root / "memory").mkdir(parents=True, exist_ok=True)
    holder = Holder(backend.kind, backend.root, backend.dsn, "memory/.memory.lock")
    try:
        with pytest.raises(LockWaitExpired, match=r"^waited 0 s for the memory lock"):
            with backend.storage.lock(path, timeout=0):
                pass
    finally:
        holder.let_go()
    with pytest.raises(ValueError, match="needs a bound"):
        backend.storage.lock(path, timeout=-1)


@pytest.mark.slow
def test_a_held_sessions_lock_ends_the_wait_and_the_transcript_is_unchanged(backend: Backend) -> None:
    from picoclaw.storage.sessions import LOCK_FILE

    log = backend.storage.session_log(backend.root / "sessions")
    path = backend.root / "sessions" / "telegram_42.jsonl"
    first = {"type": "message", "id": 1, "message": {"role": "user", "content": "你好 / hello"}}
    with log.lock():
        log.append(path, [first])
    second = {"type": "message", "id": 2, "message": {"role": "assistant", "content": "早上好 / good morning"}}
    if backend.kind == "files":
        holder: Holder | None = Holder("files", backend.root, "", LOCK_FILE)
        holding = None
    else:
        # A second connection holds the scope's transaction lock, as another worker's transaction would.
        import psycopg

        from picoclaw.storage.postgres.sessions import LOCK_CLASS

        holder = None
        holding = psycopg.connect(backend.dsn)
        holding.execute("select pg_advisory_xact_lock(%s, hashtext(''))", (LOCK_CLASS,))
    try:
        with pytest.raises(LockWaitExpired) as caught:
            with log.lock():
                log.append(path, [second])
        message = _one_line(caught.value)
        assert "another picoclaw process holds it" in message, message
        assert len(log.read(path).lines) == 1
    finally:
        if holder is not None:
            holder.let_go()
        if holding is not None:
            holding.rollback()
            holding.close()
    with log.lock():
        log.append(path, [second])
    assert len(log.read(path).lines) == 2


# -- the bound comes from config.json ----------------------------------------------------------------------


def test_the_backend_default_is_the_config_default(tmp_path: Path) -> None:
    assert Config().storage.lock_wait_seconds == LOCK_WAIT_SECONDS
    assert FilesStorage(tmp_path).lock_wait == LOCK_WAIT_SECONDS
    config = parse_config({"storage": {"lock_wait_seconds": 5}}, tmp_path / "config.json")
    storage = open_storage(config, tmp_path)
    assert storage.lock_wait == 5
    storage.close()


def test_open_storage_passes_the_bound_to_postgres(tmp_path: Path, postgres_dsn: str) -> None:
    config = parse_config({"storage": {"backend": "postgres", "lock_wait_seconds": 7,
                                       "postgres": {"dsn": postgres_dsn, "pool_size": 2}}}, tmp_path / "config.json")
    storage = open_storage(config, tmp_path)
    try:
        assert storage.lock_wait == 7
    finally:
        storage.close()


@pytest.mark.parametrize(("value", "expected"), [
    (0, "greater than or equal to 1"), (-1, "greater than or equal to 1"), (4000, "less than or equal to 3600"),
    ("abc", "number"), ("三十", "number"), (True, "number"),
], ids=["zero", "negative", "too-long", "text", "chinese-text", "boolean"])
def test_a_bad_lock_wait_is_one_config_error_line(tmp_path: Path, value: object, expected: str) -> None:
    message = config_error(tmp_path / "home", {"storage": {"lock_wait_seconds": value}})
    assert "storage.lock_wait_seconds" in message and expected in message, message


# -- what the user sees ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_memory_append_while_another_process_holds_the_lock_is_one_error_line(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with edit_config(home) as data:
        data.setdefault("storage", {})["lock_wait_seconds"] = 1
    root = Path(os.path.expanduser(data["workspace"])) if data.get("workspace") else home / "workspace"
    assert main(["memory", "append", "第一条 / the first entry"]) == 0
    capsys.readouterr()
    memory = root / "memory" / "MEMORY.md"
    before = memory.read_bytes()
    holder = Holder("files", root, "", "memory/.memory.lock")
    try:
        code = main(["memory", "append", ENTRY])
        captured = capsys.readouterr()
        assert_one_line_error(code, captured.out, captured.err,
                              "waited 1 s for the memory lock (memory/.memory.lock): another picoclaw process holds it")
        assert memory.read_bytes() == before
    finally:
        holder.let_go()
    assert main(["memory", "append", ENTRY]) == 0
    assert ENTRY in memory.read_text(encoding="utf-8")


# -- the advisory lock's lease: a frozen holder on another machine ------------------------------------------

# Takes the memory lock on a storage of its own (the lease is its lock wait, argv[3] s), says "held", then waits
# for a line on stdin (the test stops it meanwhile) and appends an entry still under the lock: one line out.
FROZEN_HOLDER = """
import sys
from pathlib import Path
from zoneinfo import ZoneInfo
from picoclaw.memory import MemoryStore
from picoclaw.storage import StorageError
from picoclaw.storage.postgres.storage import PostgresStorage
root, dsn, lease, entry = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
storage = PostgresStorage(root, dsn, 2, lock_wait=lease)
store = MemoryStore(root / "memory", ZoneInfo("Asia/Shanghai"), storage=storage)
try:
    with storage.lock(root / "memory" / ".memory.lock"):
        print("held", flush=True)
        sys.stdin.readline()
        store.append_long_term(entry)
    print("written", flush=True)
except StorageError as exc:
    print(f"{type(exc).__name__}: {exc}", flush=True)
finally:
    storage.close()
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_holder_frozen_past_its_lease_loses_the_lock_and_its_write_fails_in_one_line(
        backend: Backend, tmp_path: Path) -> None:
    import signal
    import time

    lease = 2.0
    machine1 = tmp_path / "machine1"
    machine1.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", FROZEN_HOLDER, str(machine1), backend.dsn, str(lease),
                               "冻结者 / the frozen holder's entry"], env=_env(), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline() == "held\n", holder.stderr.read() if holder.stderr else ""
        holder.send_signal(signal.SIGSTOP)  # frozen with the lock: its lease is no longer renewed
        store = MemoryStore(backend.root / "memory", TZ, storage=backend.storage)
        started = time.monotonic()
        with backend.storage.lock(backend.root / "memory" / ".memory.lock", timeout=HANG):
            waited = time.monotonic() - started
            store.append_long_term(ENTRY)  # the lock is this machine's now: its write lands
        print(f"\nthe frozen holder's lease of {lease:g} s freed the lock after {waited:.1f} s")
        holder.send_signal(signal.SIGCONT)
        holder.stdin.write("go on\n")
        holder.stdin.flush()
        said = holder.stdout.readline()
        holder.wait(HANG)
        logged = holder.stderr.read() if holder.stderr else ""
    finally:
        holder.kill()
        holder.wait(HANG)
    # Its next statement found the session ended: one StorageUnavailable line saying the lock was lost (not that
    # the server is gone), and nothing of it written.
    assert said.startswith("StorageUnavailable: the memory lock was lost before ") and said.count("\n") == 1, said
    assert "nothing was written" in said
    assert "Traceback" not in logged, logged
    assert ENTRY in (backend.stored("memory/MEMORY.md") or "")
    assert "the frozen holder's entry" not in (backend.stored("memory/MEMORY.md") or "")


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_live_holder_keeps_the_lock_past_its_lease_and_its_write_lands(backend: Backend, tmp_path: Path) -> None:
    import time

    other = _open("postgres", tmp_path / "machine1", backend.dsn, lock_wait=1)
    store = MemoryStore(backend.root / "memory", TZ, storage=backend.storage)
    try:
        with backend.storage.lock(backend.root / "memory" / ".memory.lock"):  # a lease of 1 s (its lock wait)
            time.sleep(3.5)  # working past the lease three times over: the renewals keep the session
            with pytest.raises(LockWaitExpired):
                other.lock(tmp_path / "machine1" / "memory" / ".memory.lock", timeout=0).acquire()
            store.append_long_term(ENTRY)
    finally:
        other.close()
    assert ENTRY in (backend.stored("memory/MEMORY.md") or "")
    # and the connection went back to the pool without its lease: idle there, the server does not end it
    time.sleep(1.5)
    store.append_long_term("之后 / afterwards")
    assert "之后 / afterwards" in (backend.stored("memory/MEMORY.md") or "")
