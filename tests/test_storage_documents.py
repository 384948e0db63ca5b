"""The memory documents' contract, run on both backends: the files themselves, and PostgreSQL rows read and
written through the documents port (storage/postgres/documents.py)."""

from __future__ import annotations

import multiprocessing
import random
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from picoclaw.memory import MemoryStore
from picoclaw.storage import FilesStorage, Storage, StorageUnavailable
from tests.stores import stored_document

CTX = multiprocessing.get_context("spawn")  # fresh interpreters: other processes, or other machines
TZ = ZoneInfo("Asia/Shanghai")
EACH = 30


def _open(kind: str, root: Path, dsn: str) -> Storage:
    if kind == "postgres":
        from picoclaw.storage.postgres.storage import PostgresStorage

        return PostgresStorage(root, dsn, 3)
    return FilesStorage(root)


@dataclass
class Backend:
    """A workspace folder and its storage; `folder(n)` is where process n works."""

    kind: str
    root: Path
    dsn: str
    storage: Storage

    def folder(self, number: int) -> Path:
        # On PostgreSQL each process has a folder of its own, as on machines of their own.
        return self.root.parent / f"machine{number}" if self.kind == "postgres" else self.root

    def stored(self, name: str) -> str | None:
        """The truth of document `name` of the shared scope, as a fresh reader sees it."""
        return stored_document(self.kind, self.root, self.dsn, name)


@pytest.fixture(params=["files", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    dsn = request.getfixturevalue("postgres_dsn") if request.param == "postgres" else ""
    root = tmp_path / "workspace"
    storage = _open(request.param, root, dsn)
    try:
        yield Backend(request.param, root, dsn, storage)
    finally:
        storage.close()


def _entry(worker: int, number: int) -> str:
    return f"worker {worker} entry {number:03d}：第{number}条记录\nline two of w{worker}e{number:03d}"


def _append_many(kind: str, root: str, dsn: str, worker: int, go: object) -> None:
    storage = _open(kind, Path(root), dsn)
    try:
        store = MemoryStore(Path(root) / "memory", TZ, storage=storage)
        go.wait()  # type: ignore[attr-defined]
        for number in range(EACH):
            store.append_long_term(_entry(worker, number))
    finally:
        storage.close()


def _append_forever(kind: str, root: str, dsn: str) -> None:
    store = MemoryStore(Path(root) / "memory", TZ, storage=_open(kind, Path(root), dsn))
    number = 0
    while True:
        store.append_long_term(_entry(9, number))
        number += 1


def _blocks(text: str) -> list[str]:
    return re.split(r"^(?=## )", text, flags=re.MULTILINE)[1:]


def test_appends_and_a_rewrite_reach_the_storage_in_english_and_chinese(backend: Backend) -> None:
    store = MemoryStore(backend.root / "memory", TZ, storage=backend.storage)
    store.append_long_term("The user prefers tea in the morning.")
    store.append_long_term("用户喜欢早上喝茶。")
    note = store.append_note("Met Alice at the café. 和爱丽丝见面。")
    text = backend.stored("memory/MEMORY.md")
    assert text is not None and "prefers tea" in text and "用户喜欢早上喝茶" in text
    assert "和爱丽丝见面" in (backend.stored(note.relative_to(backend.root).as_posix()) or "")

    store.rewrite_long_term("## 2026-01-01\nOnly this now. 只剩这一条。\n")
    assert backend.stored("memory/MEMORY.md") == "## 2026-01-01\nOnly this now. 只剩这一条。\n"
    # The previous content is kept once: a backup file on files; on PostgreSQL a version row only (never a
    # document of its own, never a file in the workspace folder).
    [backup] = store.backups()
    assert "用户喜欢早上喝茶" in store.read_backup(backup.name).decode("utf-8")
    assert backup.is_file() == (backend.kind == "files")
    stored_backup = backend.stored(backup.relative_to(backend.root).as_posix())
    assert stored_backup == (backup.read_text(encoding="utf-8") if backend.kind == "files" else None)
    if backend.kind == "postgres":
        import psycopg

        with psycopg.connect(backend.dsn) as conn:
            versions = [bytes(row[0]).decode() for row in conn.execute(
                "select content from document_versions where name = 'memory/MEMORY.md' order by id")]
        assert len(versions) == 1 and "prefers tea" in versions[0] and "用户喜欢早上喝茶" in versions[0]


@pytest.mark.slow
def test_three_processes_append_without_losing_or_doubling_an_entry(backend: Backend) -> None:
    go = CTX.Event()
    workers = [CTX.Process(target=_append_many, args=(backend.kind, str(backend.folder(n)), backend.dsn, n, go))
               for n in range(3)]
    for process in workers:
        process.start()
    go.set()
    for process in workers:
        process.join(timeout=120)
    assert [process.exitcode for process in workers] == [0, 0, 0]

    # A fresh reader: on PostgreSQL a folder nobody wrote, brought up to date from the rows.
    reader = backend.root.parent / "reader" if backend.kind == "postgres" else backend.root
    storage = _open(backend.kind, reader, backend.dsn) if backend.kind == "postgres" else backend.storage
    text = MemoryStore(reader / "memory", TZ, storage=storage).read_long_term()
    assert text == backend.stored("memory/MEMORY.md")
    seen: Counter[str] = Counter()
    for block in _blocks(text):
        match = re.fullmatch(r"## \d{4}-\d{2}-\d{2}\n(worker \d entry \d{3}：.*\n.*)\n\n?", block)
        assert match, block
        seen[match.group(1)] += 1
    assert set(seen) == {_entry(w, n) for w in range(3) for n in range(EACH)}
    assert max(seen.values()) == 1


@pytest.mark.slow
def test_a_writer_killed_mid_append_leaves_whole_entries(backend: Backend, seed: int) -> None:
    folder = backend.folder(1)
    child = CTX.Process(target=_append_forever, args=(backend.kind, str(folder), backend.dsn))
    child.start()
    try:
        deadline = time.monotonic() + 60
        while len(_blocks(backend.stored("memory/MEMORY.md") or "")) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(random.Random(seed).uniform(0, 0.05))  # a moment of the next appends: under the lock or pushing
    finally:
        child.kill()
        child.join()
    if backend.kind == "postgres":
        stored = backend.stored("memory/MEMORY.md") or ""
    else:
        stored = MemoryStore(folder / "memory", TZ, storage=backend.storage).read_long_term()  # repairs a cut append
    blocks = _blocks(stored)
    assert len(blocks) >= 3
    for number, block in enumerate(blocks):
        assert re.fullmatch(r"## \d{4}-\d{2}-\d{2}\n" + re.escape(_entry(9, number)) + r"\n\n?", block), block


def test_one_users_documents_never_reach_another_scope(backend: Backend) -> None:
    alice = MemoryStore(backend.root / "users" / "alice" / "memory", TZ, storage=backend.storage)
    alice.append_long_term("Alice's secret: the door code is 4711. 爱丽丝的秘密。")
    shared = MemoryStore(backend.root / "memory", TZ, storage=backend.storage)
    shared.append_long_term("Shared: the office opens at nine. 九点开门。")
    bob = MemoryStore(backend.root / "users" / "bob" / "memory", TZ, storage=backend.storage)
    bob.append_long_term("Bob likes jazz. 鲍勃喜欢爵士。")

    # On PostgreSQL, another machine that uses the shared scope and Bob's gets neither of Alice's rows.
    other = backend.folder(2)
    storage = _open(backend.kind, other, backend.dsn) if backend.kind == "postgres" else backend.storage
    bob = MemoryStore(other / "users" / "bob" / "memory", TZ, storage=storage)
    with bob.locked():
        pass
    assert "鲍勃喜欢爵士" in bob.read_long_term()
    assert "九点开门" in MemoryStore(other / "memory", TZ, storage=storage).read_long_term()
    for path in [*(other / "memory").rglob("*"), *(other / "users" / "bob").rglob("*"),
                 *(other / ".picoclaw-work").rglob("*")]:  # this machine's cache of the rows too
        if path.is_file():
            text = path.read_bytes().decode("utf-8", "replace")
            assert "4711" not in text and "爱丽丝" not in text, path
    if backend.kind == "postgres":
        import psycopg

        with psycopg.connect(backend.dsn) as conn:
            scopes = {row[0] for row in conn.execute(
                "select scope from documents where convert_from(content, 'UTF8') like '%%4711%%'")}
        assert scopes == {"alice"}


def test_a_server_gone_is_one_line_and_changes_nothing(postgres_dsn: str, tmp_path: Path) -> None:
    import psycopg

    from picoclaw.storage.postgres.storage import PostgresStorage

    storage = PostgresStorage(tmp_path / "ws", postgres_dsn, 3)
    try:
        store = MemoryStore(tmp_path / "ws" / "memory", TZ, storage=storage)
        store.append_long_term("Kept: the first entry. 第一条。")

        def stored() -> bytes:
            with psycopg.connect(postgres_dsn) as conn:
                row = conn.execute("select content from documents where name = 'memory/MEMORY.md'").fetchone()
            assert row is not None
            return bytes(row[0])

        # A write is in the database when it returns: the server dropping every connection afterwards, while the
        # lock is still held, loses nothing, and letting go of the lock raises nothing.
        with store.locked():
            store.append_long_term("Kept too: written before the server dropped us. 也保留。")
            with psycopg.connect(postgres_dsn, autocommit=True) as admin:
                admin.execute("select pg_terminate_backend(pid, 30000) from pg_stat_activity "
                              "where datname = current_database() and pid <> pg_backend_pid()")
        before = stored()
        assert "Kept too" in before.decode() and store.read_long_term() == before.decode()

        storage.pool.close()  # a server that cannot be reached: one line, nothing written, here or there
        with pytest.raises(StorageUnavailable) as raised:
            store.append_long_term("Never stored. 未保存。")
        message = str(raised.value)
        assert "\n" not in message and "cannot be reached" in message
        assert stored() == before
        with pytest.raises(StorageUnavailable):  # a read asks the server too: no stale answer from a cache
            store.read_long_term()
    finally:
        storage.close()
