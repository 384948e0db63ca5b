"""Every read of a memory document asks the storage: on PostgreSQL a write through another
workspace folder is read at once by MemoryStore, the keyword search and the policy, with no lock taken and
nothing refreshed first; the workspace folder is never read as memory, and nothing writes memory into it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from picoclaw.memory import MemoryStore, PolicyManager
from picoclaw.memory.search.keyword import KeywordSearch
from picoclaw.storage import FilesStorage, Storage
from picoclaw.storage.files_documents import FilesDocuments
from picoclaw.storage.stored_files import document_names

TZ = ZoneInfo("Asia/Shanghai")
FACT_EN, FACT_ZH = "The user's sister lives in Lisbon.", "用户的妹妹住在里斯本。"
NOTE = "Called the sister in Lisbon today. 今天给住在里斯本的妹妹打了电话。"
LESSON = "When the user asks about family, mention the sister in Lisbon. 问到家人时提到里斯本的妹妹。"


def _postgres(root: Path, dsn: str) -> Storage:
    from picoclaw.storage.postgres.storage import PostgresStorage

    return PostgresStorage(root, dsn, 3)


@pytest.fixture
def machines(tmp_path: Path, postgres_dsn: str) -> Iterator[tuple[Storage, Storage]]:
    """Two workspace folders on one database: two machines, as far as the storage can tell."""
    first, second = _postgres(tmp_path / "machine1", postgres_dsn), _postgres(tmp_path / "machine2", postgres_dsn)
    try:
        yield first, second
    finally:
        first.close()
        second.close()


def _no_locks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any lock of the PostgreSQL backend taken from now on fails the test: a read must not need one."""
    from picoclaw.storage.postgres.locks import ScopeLock

    def refuse(*_: object) -> None:
        raise AssertionError("a read took the memory lock")

    monkeypatch.setattr(ScopeLock, "acquire", refuse)


def _store(storage: Storage) -> MemoryStore:
    return MemoryStore(storage.root / "memory", TZ, storage=storage)


def test_a_write_through_another_folder_is_read_at_once_without_a_lock(
        machines: tuple[Storage, Storage], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = machines
    writer, reader = _store(a), _store(b)
    search = KeywordSearch(reader)
    policy = PolicyManager(b.root / "memory", {}, TZ, storage=b)
    writer.append_long_term("An older fact: the user likes tea. 用户喜欢喝茶。")
    # B reads first, so whatever it keeps of what it read is there before A writes again.
    assert "喜欢喝茶" in reader.read_long_term() and reader.read_learnings() == ""
    assert reader.note_files() == [] and policy.current().retrieve_limit != 7
    assert not search.search("Lisbon 里斯本", 5, include_notes=True)

    writer.append_long_term(FACT_EN)
    writer.append_long_term(FACT_ZH)
    day = datetime(2026, 12, 2, 9, 30, tzinfo=TZ)
    note = writer.append_note(NOTE, at=day)
    writer.append_learning(LESSON, "the user")
    PolicyManager(a.root / "memory", {}, TZ, storage=a).set({"retrieve_limit": 7}, source="cli")

    _no_locks(monkeypatch)
    text = reader.read_long_term()
    assert FACT_EN in text and FACT_ZH in text and "喜欢喝茶" in text
    assert reader.note_files() == [b.root / "memory" / "202612" / "20261202.md"] and note.name == "20261202.md"
    assert "今天给住在里斯本的妹妹打了电话" in reader.read_note(reader.note_files()[0])
    assert "问到家人时提到里斯本的妹妹" in reader.read_learnings()
    assert policy.current().retrieve_limit == 7
    hits = [hit.block.text for hit in search.search("Lisbon 里斯本", 5, include_notes=True)]
    assert any(FACT_EN in hit for hit in hits) and any(FACT_ZH in hit for hit in hits)
    assert any("打了电话" in hit for hit in hits)
    assert any("问到家人" in hit.block.text for hit in search.search_learnings("家人 family", 3))
    # Every block is named by its place in the workspace, not by where this machine keeps its cache.
    assert {hit.block.path.parent.name for hit in search.search("Lisbon", 5, include_notes=True)} <= {
        "memory", "202612"}

    monkeypatch.undo()  # the writer takes the lock, as every write does
    writer.rewrite_long_term(f"## 2026-12-03\n{FACT_ZH}\n")  # a rewrite, not an append: read at once too
    _no_locks(monkeypatch)
    assert reader.read_long_term() == f"## 2026-12-03\n{FACT_ZH}\n"
    assert [hit.block.text for hit in search.search("tea 喝茶", 5)] == []


def test_a_hand_written_file_in_the_folder_is_not_memory(machines: tuple[Storage, Storage]) -> None:
    a, _ = machines
    store = _store(a)
    store.append_long_term(FACT_ZH)
    (a.root / "memory").mkdir(parents=True, exist_ok=True)
    (a.root / "memory" / "MEMORY.md").write_text(f"## 2026-12-01\n{FACT_EN}\n", encoding="utf-8")
    (a.root / "memory" / "202612").mkdir(exist_ok=True)
    (a.root / "memory" / "202612" / "20261201.md").write_text(f"# 2026-12-01\n\n## 09:00\n{NOTE}\n", encoding="utf-8")
    (a.root / "memory" / "LEARNINGS.md").write_text(f"## 2026-12-01\n{LESSON}\n", encoding="utf-8")

    assert store.read_long_term() == _store(a).read_long_term()
    assert FACT_ZH in store.read_long_term() and FACT_EN not in store.read_long_term()
    assert store.note_files() == [] and store.read_learnings() == ""
    assert not KeywordSearch(store).search("Lisbon 打了电话", 5, include_notes=True)
    store.append_long_term("A second fact. 第二条。")  # and a write neither reads nor replaces the hand-written file
    assert (a.root / "memory" / "MEMORY.md").read_text(encoding="utf-8") == f"## 2026-12-01\n{FACT_EN}\n"


def test_nothing_writes_memory_into_a_postgres_workspace_folder(machines: tuple[Storage, Storage]) -> None:
    a, _ = machines
    store = _store(a)
    store.append_long_term(FACT_EN)
    store.append_long_term(FACT_ZH)
    store.rewrite_long_term(f"## 2026-12-03\n{FACT_ZH}\n")  # a backup: a version row
    store.append_note(NOTE)
    store.append_learning(LESSON)
    PolicyManager(a.root / "memory", {}, TZ, storage=a).set({"retrieve_limit": 7}, source="cli")
    assert FACT_ZH in store.read_long_term() and store.read_learnings() and store.note_files()
    KeywordSearch(store).search("Lisbon 里斯本", 5, include_notes=True)

    assert document_names(a.root, shared=True) == []  # no document in the folder, read or written
    cache = a.root / ".picoclaw-work" / "documents"  # what was read is cached here, and only here
    assert FACT_ZH in (cache / "memory" / "MEMORY.md").read_text(encoding="utf-8")
    assert not (a.root / "memory" / "backups").exists()


def _statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement the PostgreSQL backend sends from now on (not the pool's empty check of a connection)."""
    import psycopg

    sent: list[str] = []
    execute = psycopg.Connection.execute

    def counted(self: psycopg.Connection, query: Any, *args: Any, **kwargs: Any) -> Any:
        if str(query):
            sent.append(str(query))
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", counted)
    return sent


def test_a_read_round_lists_a_scope_once_and_ends_with_its_block(
        machines: tuple[Storage, Storage], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = machines
    writer, reader = _store(a), _store(b)
    policy = PolicyManager(b.root / "memory", {}, TZ, storage=b)
    writer.append_long_term(FACT_EN)
    assert FACT_EN in reader.read_long_term() and reader.read_learnings() == ""  # read once before: cached
    sent = _statements(monkeypatch)
    with b.read_round():
        for _ in range(5):
            assert reader.read_learnings() == "" and FACT_EN in reader.read_long_term()
            assert policy.current().retrieve_limit != 7 and reader.note_files() == []
        assert len(sent) == 1  # the scope's documents and their revisions, listed once: nothing had moved

        writer.append_long_term(FACT_ZH)  # another machine writes while the round is open
        writer.append_learning(LESSON, "the user")
        PolicyManager(a.root / "memory", {}, TZ, storage=a).set({"retrieve_limit": 7}, source="cli")
        del sent[:]
        assert FACT_ZH not in reader.read_long_term() and reader.read_learnings() == ""  # what the round saw
        assert policy.current().retrieve_limit != 7 and sent == []
        with reader.locked():  # a read under the lock (a read-modify-write) reads the row, round or not
            assert "问到家人时提到里斯本的妹妹" in reader.read_learnings()
        reader.append_long_term("B's own fact. 自己写的。")  # and this machine's own write is read at once
        assert "自己写的" in reader.read_long_term() and FACT_ZH in reader.read_long_term()
    # The round is over: every read checks again.
    assert policy.current().retrieve_limit == 7
    assert "问到家人时提到里斯本的妹妹" in reader.read_learnings()

    writer.append_note(NOTE, at=datetime(2026, 12, 2, 9, 30, tzinfo=TZ))
    del sent[:]
    with b.read_round():  # a new round: the list, then only what moved (the new note)
        for _ in range(3):
            notes = reader.note_files()
            assert notes == [b.root / "memory" / "202612" / "20261202.md"]
            assert "今天给住在里斯本的妹妹打了电话" in reader.read_note(notes[0])
            assert "自己写的" in reader.read_long_term()
    assert len(sent) == 2

    writer.documents.delete("memory/202612/20261202.md")  # removed through another machine
    with b.read_round():
        assert "自己写的" in reader.read_long_term()  # the scope listed
        assert not reader.local(b.root / "memory" / "202612" / "20261202.md").exists()  # not served from the cache
        assert reader.note_files() == []
        assert not (b.root / ".picoclaw-work" / "documents" / "memory" / "202612" / "20261202.md").exists()


def test_on_files_the_port_reads_the_files_themselves(tmp_path: Path) -> None:
    storage = FilesStorage(tmp_path)
    store = _store(storage)
    store.append_long_term(FACT_ZH)
    assert store.local(store.long_term_path) == store.long_term_path
    assert storage.documents("").local_folder("memory/") == tmp_path / "memory"
    store.long_term_path.write_text(f"## 2026-12-01\n{FACT_EN}\n", encoding="utf-8")  # a hand edit is memory here
    assert store.read_long_term() == f"## 2026-12-01\n{FACT_EN}\n"
    assert not (tmp_path / ".picoclaw-work" / "documents").exists()
    with storage.read_round():  # on files a round keeps nothing: a file read is always current
        store.long_term_path.write_text(f"## 2026-12-02\n{FACT_ZH}\n", encoding="utf-8")
        assert store.read_long_term() == f"## 2026-12-02\n{FACT_ZH}\n"


def test_the_stored_documents_are_listed_as_the_files_layout_stores_them(tmp_path: Path) -> None:
    (tmp_path / "AGENTS.md").write_text("agents")
    (tmp_path / "USER.md").mkdir()  # a folder by a document's name is no document
    (tmp_path / "SOUL.md").symlink_to(tmp_path / "gone")  # nor is a broken link
    (tmp_path / "elsewhere.md").write_text("identity")
    (tmp_path / "IDENTITY.md").symlink_to(tmp_path / "elsewhere.md")  # a link to a file is
    memory = tmp_path / "memory"
    (memory / "index").mkdir(parents=True)
    (memory / "index" / "terms.sqlite3").write_text("")  # the index: derived
    (memory / "MEMORY.md").write_text(FACT_EN)
    (memory / ".MEMORY.md.entries").write_text("")  # derived
    (memory / "2026" / "12").mkdir(parents=True)
    (memory / "2026" / "12" / "20261204.md").write_text(NOTE)
    (memory / "2026" / "index").mkdir()
    (memory / "2026" / "index" / "笔记.md").write_text(FACT_ZH)  # an "index" folder below the top is memory
    (tmp_path / "vault").mkdir()
    (tmp_path / "vault" / "kept.md").write_text("vault")
    (memory / "vault").symlink_to(tmp_path / "vault")  # a linked folder is not entered
    (memory / "LEARNINGS.md").symlink_to(memory / "MEMORY.md")
    (memory / "broken.md").symlink_to(memory / "gone")
    assert document_names(tmp_path, shared=True) == [
        "AGENTS.md", "IDENTITY.md", "memory/2026/12/20261204.md", "memory/2026/index/笔记.md",
        "memory/LEARNINGS.md", "memory/MEMORY.md"]
    assert document_names(tmp_path, shared=False) == [
        "memory/2026/12/20261204.md", "memory/2026/index/笔记.md", "memory/LEARNINGS.md", "memory/MEMORY.md"]
    assert document_names(tmp_path / "elsewhere.md", shared=True) == []  # not a folder: nothing


def test_listing_the_stored_documents_costs_no_stat_for_a_regular_file(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn lists them (the notes it reads): a memory of a year of daily notes is 365 files."""
    for day in range(1, 31):
        note = tmp_path / "memory" / "2026" / "11" / f"202611{day:02}.md"
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(NOTE)
    stats: list[object] = []
    real_stat = os.stat

    def counted(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        stats.append(path)
        return real_stat(path, *args, **kwargs)
    monkeypatch.setattr(os, "stat", counted)
    assert len(document_names(tmp_path, shared=False)) == 30
    assert stats == []
    (tmp_path / "AGENTS.md").write_text("# 规则 rules")
    # The notes' folder alone, as a PostgreSQL turn brings it up to date: no look at the bootstrap files either.
    assert len(FilesDocuments("", tmp_path).names("memory/")) == 30
    assert stats == []
    assert "AGENTS.md" in FilesDocuments("", tmp_path).names() and stats
