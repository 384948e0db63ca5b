"""The documents port (storage/documents.py), the same tests on files and on PostgreSQL, and `picoclaw memory
edit`, which saves a hand edit back only when the document did not change meanwhile."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from picoclaw.storage import MISSING, Documents, StaleRevision, StorageError
from tests.test_cli import assert_one_line_error, run
from tests.test_storage_documents import Backend, backend  # noqa: F401 - the fixture, on both backends
from tests.test_storage_transfer import set_storage

MEMORY = "memory/MEMORY.md"


@pytest.fixture
def documents(backend: Backend) -> Documents:  # noqa: F811 - the fixture imported above
    return backend.storage.documents("")


def test_a_replace_is_in_the_storage_when_it_returns_and_reads_give_its_revision(
        backend: Backend, documents: Documents) -> None:  # noqa: F811
    assert documents.read(MEMORY).data is None and documents.read(MEMORY).revision == MISSING
    first = documents.replace(MEMORY, "## 2026-12-01\nThe user's sister lives in Lisbon.\n")
    assert backend.stored(MEMORY) == "## 2026-12-01\nThe user's sister lives in Lisbon.\n"
    found = documents.read(MEMORY)
    assert found.revision == first and found.data is not None and b"Lisbon" in found.data
    second = documents.replace(MEMORY, "## 2026-12-01\n用户的妹妹住在里斯本。\n".encode(), expect=first)
    assert second != first and backend.stored(MEMORY) == "## 2026-12-01\n用户的妹妹住在里斯本。\n"
    assert documents.local(MEMORY).read_text(encoding="utf-8") == "## 2026-12-01\n用户的妹妹住在里斯本。\n"


def test_a_stale_replace_is_refused_and_writes_nothing(backend: Backend, documents: Documents) -> None:  # noqa: F811
    read = documents.replace(MEMORY, "## 2026-12-01\nversion one 第一版\n")
    documents.append(MEMORY, "\n## 2026-12-02\nappended meanwhile 之后追加\n".encode())
    with pytest.raises(StaleRevision, match="changed since it was read; nothing was written"):
        documents.replace(MEMORY, "## 2026-12-01\nan edit of version one\n", expect=read)
    after = "## 2026-12-01\nversion one 第一版\n\n## 2026-12-02\nappended meanwhile 之后追加\n"
    assert backend.stored(MEMORY) == after and documents.local(MEMORY).read_text(encoding="utf-8") == after
    with pytest.raises(StaleRevision):  # "must not exist yet"
        documents.replace(MEMORY, "new", expect=MISSING)
    with pytest.raises(StaleRevision):  # a revision this port never gave
        documents.replace(MEMORY, "new", expect="not-a-revision")
    assert backend.stored(MEMORY) == after


def test_create_append_records_names_and_delete(backend: Backend, documents: Documents) -> None:  # noqa: F811
    assert documents.create("memory/LEARNINGS.md", "# Lessons\n") is True
    assert documents.create("memory/LEARNINGS.md", "# Other\n") is False
    assert backend.stored("memory/LEARNINGS.md") == "# Lessons\n"
    documents.append_records("memory/policy_history.jsonl", [{"why": "tea"}, {"why": "茶"}])
    size = documents.append_records("memory/policy_history.jsonl", [{"why": "more"}])
    assert size == len('{"why":"tea"}\n{"why":"茶"}\n{"why":"more"}\n'.encode())  # bytes, as stored
    assert backend.stored("memory/policy_history.jsonl") == '{"why":"tea"}\n{"why":"茶"}\n{"why":"more"}\n'
    documents.replace("memory/202612/20261202.md", "# 2026-12-02\n")
    assert documents.names("memory/2026") == ["memory/202612/20261202.md"]
    assert "memory/LEARNINGS.md" in documents.names()
    documents.delete("memory/202612/20261202.md")
    assert backend.stored("memory/202612/20261202.md") is None and documents.names("memory/2026") == []
    assert not documents.local("memory/202612/20261202.md").exists()
    with pytest.raises(StorageError):
        documents.append("memory/none.md", b"x")  # nothing to append to


@pytest.mark.parametrize("name", ["../outside.md", "/etc/passwd", "memory/../../x", ""])
def test_a_name_that_leaves_the_scope_is_refused(documents: Documents, name: str) -> None:
    with pytest.raises(StorageError, match="not the name of a document"):
        documents.replace(name, "x")


def test_changes_since_names_what_was_written_after_a_mark(documents: Documents) -> None:
    documents.replace(MEMORY, "## 2026-12-01\none\n")
    mark = documents.changes_since(MISSING).mark
    assert documents.changes_since(mark).names == []
    documents.replace("memory/LEARNINGS.md", "# Lessons 教训\n")
    later = documents.changes_since(mark)
    assert later.names == ["memory/LEARNINGS.md"] and later.mark != mark
    assert documents.changes_since(later.mark).names == []


def test_versions_are_kept_once_pruned_and_read_back(backend: Backend, documents: Documents) -> None:  # noqa: F811
    labels = [documents.keep_version(MEMORY, f"version {n} 版本{n}\n".encode(), "_MEMORY.md", 2) for n in range(3)]
    assert documents.versions("_MEMORY.md") == labels[1:]
    assert documents.read_version(labels[2]) == "version 2 版本2\n".encode()
    assert [label for label, _ in documents.version_sizes("_MEMORY.md")] == labels[1:]
    # On files a version is a file of memory/backups/; on PostgreSQL a row only, never a file in the folder.
    assert (backend.root / "memory" / "backups").is_dir() == (backend.kind == "files")
    with pytest.raises(StorageError):
        documents.read_version(labels[0])
    assert documents.versions("_LEARNINGS.md") == []


# -- picoclaw memory edit ----------------------------------------------------------------------------------

EDITOR = '''
import os, subprocess, sys
path = sys.argv[1]
mode = os.environ["EDIT_MODE"]
if mode == "fail":
    sys.exit(3)
data = open(path, "rb").read()
if mode == "conflict":  # someone else writes the document while it is open in the editor
    subprocess.run([sys.executable, "-m", "picoclaw", "memory", "append", "Written meanwhile. 同时写入。"], check=True)
if mode == "bad":
    data += b"\\xff\\xfe"
elif mode != "same":
    data += "\\n## 2026-12-02\\nEdited by hand: the user's sister lives in Lisbon. 妹妹住在里斯本。\\n".encode()
open(path, "wb").write(data)
'''


@pytest.fixture(params=["files", "postgres"])
def edit_home(request: pytest.FixtureRequest, home: Path, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    if request.param == "postgres":
        set_storage(home, {"backend": "postgres", "postgres": {"dsn": request.getfixturevalue("postgres_dsn")}})
    script = tmp_path / "editor.py"
    script.write_text(EDITOR, encoding="utf-8")
    monkeypatch.setenv("EDITOR", f"{sys.executable} {script}")
    monkeypatch.delenv("VISUAL", raising=False)
    yield home


def _memory(capsys: pytest.CaptureFixture[str]) -> str:
    code, out, _ = run(capsys, "memory", "show")
    assert code == 0
    return out


@pytest.mark.slow
def test_memory_edit_saves_the_edit_and_keeps_a_backup(edit_home: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    assert run(capsys, "memory", "append", "The user's dog is called Biscuit. 狗叫饼干。")[0] == 0
    monkeypatch.setenv("EDIT_MODE", "add")
    code, out, err = run(capsys, "memory", "edit")
    assert (code, err) == (0, "") and out.startswith("saved memory/MEMORY.md (the previous version was kept as ")
    shown = _memory(capsys)
    assert "Biscuit" in shown and "sister lives in Lisbon. 妹妹住在里斯本。" in shown
    code, out, _ = run(capsys, "memory", "backups")
    assert code == 0 and "_MEMORY.md" in out
    code, out, _ = run(capsys, "memory", "search", "里斯本")
    assert code == 0 and "里斯本" in out


@pytest.mark.slow
def test_memory_edit_of_a_document_changed_meanwhile_is_refused_and_the_text_kept(
        edit_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert run(capsys, "memory", "append", "The user's dog is called Biscuit. 狗叫饼干。")[0] == 0
    monkeypatch.setenv("EDIT_MODE", "conflict")
    code, out, err = run(capsys, "memory", "edit", "MEMORY.md")
    assert_one_line_error(code, out, err, "changed while it was being edited", "nothing was written")
    kept = Path(err.rsplit(" in ", 1)[1].strip())
    assert kept.is_file() and kept.is_relative_to(edit_home / "edits")
    assert "妹妹住在里斯本" in kept.read_text(encoding="utf-8")
    shown = _memory(capsys)
    assert "Written meanwhile. 同时写入。" in shown and "Lisbon" not in shown  # the other write stays, ours not


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "needle"), [("fail", "exited with status 3"), ("bad", "not valid UTF-8")])
def test_memory_edit_that_fails_writes_nothing(edit_home: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch, mode: str, needle: str) -> None:
    assert run(capsys, "memory", "append", "The user's dog is called Biscuit.")[0] == 0
    before = _memory(capsys)
    monkeypatch.setenv("EDIT_MODE", mode)
    code, out, err = run(capsys, "memory", "edit")
    assert_one_line_error(code, out, err, needle, "nothing was written")
    assert _memory(capsys) == before


@pytest.mark.slow
def test_memory_edit_of_an_unchanged_document_writes_nothing(edit_home: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDIT_MODE", "same")
    code, out, err = run(capsys, "memory", "edit", "USER.md")
    assert (code, err) == (0, "") and out == "USER.md unchanged; nothing was written\n"


@pytest.mark.slow
@pytest.mark.parametrize(("document", "needle"), [
    ("NOPE.md", "no memory document 'NOPE.md'"),
    ("../config.json", "no memory document"),
    (".model_usage.json", "bookkeeping"),
    ("2026-13-45", "no memory document"),
])
def test_memory_edit_refuses_what_is_not_an_editable_document(edit_home: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch, document: str,
                                                              needle: str) -> None:
    monkeypatch.setenv("EDIT_MODE", "add")
    assert_one_line_error(*run(capsys, "memory", "edit", document), needle)


@pytest.mark.slow
def test_memory_edit_opens_a_daily_note_by_its_date(edit_home: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run(capsys, "memory", "append", "--today", "今天去了西湖 and walked the dog")
    assert code == 0
    day = Path(out.split()[-1]).stem
    monkeypatch.setenv("EDIT_MODE", "add")
    code, out, err = run(capsys, "memory", "edit", f"{day[:4]}-{day[4:6]}-{day[6:]}")
    assert (code, err) == (0, "") and out == f"saved memory/{day[:6]}/{day}.md\n"
    code, out, _ = run(capsys, "memory", "notes", "--days", "1")
    assert "西湖" in out and "里斯本" in out


# -- the workspace folder and this machine's cache on PostgreSQL ------------------------------------------------

def test_a_folder_back_from_files_is_left_as_it_is(tmp_path: Path, postgres_dsn: str) -> None:
    from picoclaw.memory import MemoryStore
    from picoclaw.storage import FilesStorage
    from picoclaw.storage.postgres.storage import PostgresStorage
    from tests.test_storage_documents import TZ

    root = tmp_path / "workspace"
    on_postgres = PostgresStorage(root, postgres_dsn, 3)
    try:
        MemoryStore(root / "memory", TZ, storage=on_postgres).append_long_term("On PostgreSQL first. 先在数据库。")
    finally:
        on_postgres.close()
    on_files = MemoryStore(root / "memory", TZ, storage=FilesStorage(root))  # config switched to files
    on_files.append_long_term("Added on files: the user's sister is Ana. 妹妹叫安娜。")
    note = on_files.append_note("A note written on files. 文件里的笔记。")
    folder = {path: path.read_bytes() for path in (root / "memory").rglob("*") if path.is_file()}
    on_postgres = PostgresStorage(root, postgres_dsn, 3)  # and back: the rows lack what files added
    try:
        back = MemoryStore(root / "memory", TZ, storage=on_postgres)
        text = back.read_long_term()
        notes = back.note_files()
        back.append_long_term("Added on PostgreSQL again. 又回到数据库。")
    finally:
        on_postgres.close()
    assert "On PostgreSQL first" in text and "Ana" not in text and notes == []  # the database's truth...
    after = {path: path.read_bytes() for path in (root / "memory").rglob("*") if path.is_file()}
    assert after == folder and "文件里的笔记" in note.read_text(encoding="utf-8")  # ...the folder untouched


def test_a_damaged_cache_file_is_fetched_again(backend: Backend) -> None:  # noqa: F811
    from picoclaw.memory import MemoryStore
    from tests.test_storage_documents import TZ

    store = MemoryStore(backend.root / "memory", TZ, storage=backend.storage)
    store.append_long_term("The first entry. 第一条。")
    store.rewrite_long_term("## 2026-12-01\nRewritten. 改写了。\n")
    if backend.kind == "postgres":  # this machine's cache of the row, changed behind the port's back
        local = store.local(store.long_term_path)
        assert ".picoclaw-work" in local.parts
        local.write_text("a hand edit of the cache\n", encoding="utf-8")
        assert store.read_long_term() == "## 2026-12-01\nRewritten. 改写了。\n"
        local.unlink()
    assert store.read_long_term() == "## 2026-12-01\nRewritten. 改写了。\n"
    [backup] = store.backups()
    assert "第一条" in store.read_backup(backup.name).decode("utf-8")


def test_a_tool_edit_of_a_document_written_meanwhile_is_refused(backend: Backend) -> None:  # noqa: F811
    from picoclaw.storage import edit_file

    path = backend.root / "USER.md"
    backend.storage.documents("").replace("USER.md", "# User\nName: Ana 安娜\n")

    def meanwhile(data: bytes | None) -> bytes:
        backend.storage.documents("").replace("USER.md", "# User\nName: Ana 安娜\nLives in Lisbon.\n")
        return (data or b"") + b"Likes tea.\n"

    with pytest.raises(StaleRevision):
        edit_file(backend.storage, path, meanwhile)
    assert backend.stored("USER.md") == "# User\nName: Ana 安娜\nLives in Lisbon.\n"
    edit_file(backend.storage, path, lambda data: (data or b"") + "Likes tea. 喜欢茶。\n".encode())
    assert backend.stored("USER.md") == "# User\nName: Ana 安娜\nLives in Lisbon.\nLikes tea. 喜欢茶。\n"


def test_schema_4_turns_the_backup_rows_of_a_version_3_database_into_versions(tmp_path: Path, postgres_dsn: str,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    from picoclaw.memory import MemoryStore
    from picoclaw.storage.postgres import schema
    from picoclaw.storage.postgres.storage import PostgresStorage
    from tests.test_storage_documents import TZ

    # A database as the previous picoclaw left it: its backups were document rows, and every replace also kept a
    # version of its own (of MEMORY.md, and of a note).
    monkeypatch.setattr(schema, "STEPS", schema.STEPS[:3])
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 3)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        schema.ensure_schema(conn)
        for name, content in [("memory/MEMORY.md", "## 2026-12-02\nNow. 现在。\n"),
                              ("memory/backups/20261201_120000Z_MEMORY.md", "## 2026-12-01\nBefore. 之前。\n"),
                              ("memory/202612/20261201.md", "# 2026-12-01\n")]:
            conn.execute("insert into documents (scope, name, content) values ('', %s, %s)", (name, content.encode()))
        for name, content in [("memory/MEMORY.md", "## 2026-12-01\nBefore. 之前。\n"),
                              ("memory/202612/20261201.md", "")]:
            conn.execute("insert into document_versions (scope, name, content) values ('', %s, %s)",
                         (name, content.encode()))
    monkeypatch.undo()

    storage = PostgresStorage(tmp_path / "workspace", postgres_dsn, 3)  # starts, and upgrades to version 4
    try:
        store = MemoryStore(tmp_path / "workspace" / "memory", TZ, storage=storage)
        with store.locked():
            assert store.read_long_term() == "## 2026-12-02\nNow. 现在。\n"
        assert [path.name for path in store.backups()] == ["20261201_120000Z_MEMORY.md"]  # kept once, as before
        assert store.read_backup("20261201_120000Z_MEMORY.md") == "## 2026-12-01\nBefore. 之前。\n".encode()
        assert storage.documents("").names("memory/backups/") == []  # no longer a document
        layout = storage.stored_layout()
        assert sorted(name for name in layout if name.startswith("memory/backups/")) == [
            "memory/backups/20261201_120000Z_MEMORY.md"]
    finally:
        storage.close()
