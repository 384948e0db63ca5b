"""Moving a workspace between backends, and the storage health check, through the command line.

The same tests run on the files backend and on PostgreSQL: export writes the files layout byte for byte,
import refuses a target that holds anything without --replace and changes nothing when it already holds the
import, and a round trip files → postgres → files gives back the same bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import picoclaw
from picoclaw.cli import main
from picoclaw.config import load_config
from picoclaw.layout import WorkspaceLayout
from picoclaw.storage import Storage, open_storage, switch_warning
from picoclaw.storage.postgres.schema import SCHEMA_VERSION
from picoclaw.storage.stored_files import stored_files
from picoclaw.storage.switching import SWITCH_FILE
from picoclaw.storage.transfer import read_layout
from picoclaw.storage.work import WORK_DIR
from tests.fakes import FakeOpenAIServer
from tests.homes import edit_config
from tests.test_cli import assert_one_line_error, run
from tests.zones import onboard_in_shanghai

ENTRIES = ["The user's dog is called Biscuit.", "用户的猫叫小白，三岁了。"]


def set_storage(home: Path, storage: dict[str, object]) -> None:
    """Point `home`'s config.json at `storage`."""
    with edit_config(home) as config:
        config["storage"] = storage


@pytest.fixture(params=["files", "postgres"])
def backend_home(request: pytest.FixtureRequest, home: Path) -> Iterator[Path]:
    """An onboarded home whose storage is the backend of the test's parameter."""
    if request.param == "postgres":
        set_storage(home, {"backend": "postgres", "postgres": {"dsn": request.getfixturevalue("postgres_dsn")}})
    yield home


def fill(capsys: pytest.CaptureFixture[str]) -> None:
    for text in ENTRIES:
        assert run(capsys, "memory", "append", text)[0] == 0
    assert run(capsys, "memory", "append", "--today", "今天去了西湖 and walked the dog")[0] == 0
    code, _, err = run(capsys, "cron", "add", "--every", "3600", "--message", "喝水 drink water",
                       "--session", "cli:main")
    assert code == 0, err


def test_export_holds_every_entry_in_the_files_layout(backend_home: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    fill(capsys)
    code, out, err = run(capsys, "memory", "export", str(tmp_path / "copy"))
    assert code == 0, err
    assert "exported" in out
    memory = (tmp_path / "copy" / "memory" / "MEMORY.md").read_text(encoding="utf-8")
    assert all(text in memory for text in ENTRIES)
    notes = list((tmp_path / "copy" / "memory").glob("??????/????????.md"))
    assert len(notes) == 1 and "西湖" in notes[0].read_text(encoding="utf-8")
    assert "喝水 drink water" in (tmp_path / "copy" / "cron" / "jobs.json").read_text(encoding="utf-8")
    assert (tmp_path / "copy" / "AGENTS.md").is_file()


def test_export_refuses_a_folder_that_holds_files(backend_home: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "busy"
    target.mkdir()
    (target / "keep.txt").write_text("mine", encoding="utf-8")
    assert_one_line_error(*run(capsys, "memory", "export", str(target)), "not an empty folder")
    assert [p.name for p in target.iterdir()] == ["keep.txt"]


def test_import_refuses_a_target_with_content_unless_replace_and_is_idempotent(
        backend_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "source"
    (source / "memory").mkdir(parents=True)
    (source / "memory" / "MEMORY.md").write_text("# Memory\n\n## 2025-01-01\nImported fact 导入的事实\n",
                                                   encoding="utf-8")
    fill(capsys)
    before = tmp_path / "before"
    assert run(capsys, "memory", "export", str(before))[0] == 0

    assert_one_line_error(*run(capsys, "memory", "import", str(source)), "--replace")
    unchanged = tmp_path / "unchanged"
    assert run(capsys, "memory", "export", str(unchanged))[0] == 0
    assert read_layout(unchanged) == read_layout(before)

    code, out, err = run(capsys, "memory", "import", "--replace", str(source))
    assert code == 0, err
    assert "imported 1 files" in out
    code, out, _ = run(capsys, "memory", "import", str(source))
    assert code == 0 and "nothing was changed" in out
    after = tmp_path / "after"
    assert run(capsys, "memory", "export", str(after))[0] == 0
    assert read_layout(after) == read_layout(source)


def test_import_of_a_missing_or_empty_folder_is_one_line(backend_home: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(*run(capsys, "memory", "import", str(tmp_path / "nowhere")), "no such folder")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(*run(capsys, "memory", "import", str(tmp_path / "empty")), "holds no memory")


def test_round_trip_files_to_postgres_and_back_byte_for_byte(home: Path, postgres_dsn: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    fill(capsys)
    assert run(capsys, "memory", "append", "--learning", "Answer in Chinese when asked in Chinese. 中文问题用中文回答。"
               )[0] == 0
    embedded = tmp_path / "embedded"
    assert run(capsys, "memory", "export", str(embedded))[0] == 0
    assert any(name.startswith("sessions/") for name in stored_files(embedded)) is False  # no chat yet

    # The server side is a new machine: a home of its own, onboarded, nothing in it yet.
    server_home = tmp_path / "server-home"
    onboard_in_shanghai(server_home)  # the same zone as the first machine
    set_storage(server_home, {"backend": "postgres", "postgres": {"dsn": postgres_dsn}})
    monkeypatch.setenv("PICOCLAW_HOME", str(server_home))
    code, _, err = run(capsys, "memory", "import", str(embedded))
    assert code == 0, err
    server = tmp_path / "server"
    assert run(capsys, "memory", "export", str(server))[0] == 0
    assert read_layout(server) == read_layout(embedded)

    monkeypatch.setenv("PICOCLAW_HOME", str(home))
    code, _, err = run(capsys, "memory", "import", "--replace", str(server))
    assert code == 0, err
    back = tmp_path / "back"
    assert run(capsys, "memory", "export", str(back))[0] == 0
    assert read_layout(back) == read_layout(embedded)


def test_storage_status_names_backend_versions_and_rows(backend_home: Path, capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    fill(capsys)
    code, out, err = run(capsys, "storage", "status")
    assert code == 0, err
    config = json.loads((backend_home / "config.json").read_text(encoding="utf-8"))
    if config.get("storage", {}).get("backend") == "postgres":
        assert "backend: postgres" in out and f"schema version: {SCHEMA_VERSION}" in out
        assert "pgvector version: 0." in out
        assert "  documents: " in out and "  jobs: 1" in out
    else:
        assert "backend: files" in out and "stored files:" in out


@pytest.mark.slow
def test_storage_status_of_an_unreachable_server_is_one_line_without_the_password(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    set_storage(home, {"backend": "postgres",
                       "postgres": {"dsn": "postgresql://bot:s3cret-pass-word@127.0.0.1:1/picoclaw"}})
    code, out, err = run(capsys, "storage", "status")
    assert_one_line_error(code, out, err, "127.0.0.1:1", "cannot be reached")
    assert "s3cret" not in err
    assert main(["storage", "status"]) == 1


def test_the_whole_cli_on_postgres_one_machine_after_another(home: Path, postgres_dsn: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str],
                                                            fake_openai: FakeOpenAIServer,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """onboard, append, chat -m, search, cron add/list and export on PostgreSQL; a second home on the same
    database (a second machine) sees all of it, and the export holds every appended entry."""
    second = tmp_path / "second-machine"
    for where in (home, second):
        if where == second:
            onboard_in_shanghai(second)  # the same zone as the first machine
        set_storage(where, {"backend": "postgres", "postgres": {"dsn": postgres_dsn}})
        with edit_config(where) as config:
            config["providers"]["openai"] = {"api_key": "sk-test-0123456789abc", "api_base": fake_openai.base_url}
    fill(capsys)
    fake_openai.reply_text("好的，我记住了 Biscuit。")
    code, out, err = run(capsys, "chat", "-m", "What is my dog called? 我的狗叫什么？")
    assert code == 0, err
    assert "Biscuit" in out
    assert "Biscuit" in json.dumps(fake_openai.chat_requests()[-1]["messages"], ensure_ascii=False)

    monkeypatch.setenv("PICOCLAW_HOME", str(second))
    code, out, err = run(capsys, "memory", "search", "小白")
    assert code == 0 and "小白" in out, err
    code, out, _ = run(capsys, "cron", "list")
    assert code == 0 and "drink water" in out
    assert run(capsys, "memory", "append", "Second machine fact: 第二台机器")[0] == 0
    code, _, err = run(capsys, "memory", "export", str(tmp_path / "copy"))
    assert code == 0, err
    memory = (tmp_path / "copy" / "memory" / "MEMORY.md").read_text(encoding="utf-8")
    assert all(text in memory for text in [*ENTRIES, "Second machine fact: 第二台机器"])
    transcripts = list((tmp_path / "copy" / "sessions").glob("*.jsonl"))
    assert len(transcripts) == 1 and "我的狗叫什么" in transcripts[0].read_text(encoding="utf-8")


# Switching a workspace from files to PostgreSQL.

BAD_MEMORY = b"# Memory\n\n## 2025-01-01\ncaf\xe9 au lait \xff\xfe\n"  # Latin-1 bytes: not UTF-8


@contextmanager
def opened_storage(home: Path) -> Iterator[Storage]:
    """The configured storage of `home`, opened without an App (nothing of the workspace starts)."""
    config = load_config(home)
    storage = open_storage(config, WorkspaceLayout.of(config, home).root)
    try:
        yield storage
    finally:
        storage.close()


def stored(home: Path) -> dict[str, bytes]:
    with opened_storage(home) as storage:
        return storage.stored_layout()


def use_model(home: Path, fake_openai: FakeOpenAIServer) -> None:
    with edit_config(home) as config:
        config["providers"]["openai"] = {"api_key": "sk-test-0123456789abc", "api_base": fake_openai.base_url}


def fill_with_chat(capsys: pytest.CaptureFixture[str], home: Path, fake_openai: FakeOpenAIServer) -> None:
    """Entries in English and Chinese, a note, a job and a conversation, on the home's current backend."""
    use_model(home, fake_openai)
    fill(capsys)
    fake_openai.reply_text("记住了：Biscuit 和小白。")
    code, _, err = run(capsys, "chat", "-m", "我的狗叫 Biscuit, remember it")
    assert code == 0, err


def picoclaw_process(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a shell runs it: its own process, so its log lines reach stderr as a user sees them."""
    repo = Path(picoclaw.__file__).resolve().parent.parent
    env = {**os.environ, "PICOCLAW_HOME": str(home), "PYTHONIOENCODING": "utf-8", "LC_ALL": "C.UTF-8",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "picoclaw", *argv], cwd=home, env=env, capture_output=True,
                          text=True, encoding="utf-8", timeout=120)


def switch_warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if "picoclaw memory import" in line]


@pytest.mark.parametrize("source", ["export", "workspace folder"])
def test_import_after_the_cli_already_started_on_the_folder_needs_no_replace(
        home: Path, postgres_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        fake_openai: FakeOpenAIServer, source: str) -> None:
    """The operator's report: a files workspace switched to a database nobody had used, one command run (which
    sent the folder's documents up), then `memory import` without --replace: it succeeds, and every read command
    shows the entries, the note, the job and the conversation."""
    fill_with_chat(capsys, home, fake_openai)
    folder = home / "workspace"
    if source == "export":
        assert run(capsys, "memory", "export", str(tmp_path / "copy"))[0] == 0
        src = tmp_path / "copy"
    else:
        src = folder
    expected = read_layout(src)
    set_storage(home, {"backend": "postgres", "postgres": {"dsn": postgres_dsn}})
    assert run(capsys, "memory", "show")[0] == 0  # the start-up: on PostgreSQL the folder's documents went up

    code, out, err = run(capsys, "memory", "import", str(src))
    assert code == 0, err
    assert f"imported {len(expected)} files" in out
    assert stored(home) == expected
    code, out, _ = run(capsys, "memory", "import", str(src))
    assert code == 0 and "nothing was changed" in out

    code, out, _ = run(capsys, "memory", "show")
    assert code == 0 and all(text in out for text in ENTRIES)
    for query, needle in (("Biscuit", ENTRIES[0]), ("小白", ENTRIES[1])):
        code, out, _ = run(capsys, "memory", "search", query)
        assert code == 0 and needle in out, out
    code, out, _ = run(capsys, "memory", "notes", "--days", "3")
    assert code == 0 and "西湖" in out
    code, out, _ = run(capsys, "memory", "stats")
    assert code == 0 and "MEMORY.md" in out
    code, out, _ = run(capsys, "cron", "list")
    assert code == 0 and "drink water" in out
    fake_openai.reply_text("Biscuit。")
    code, out, err = run(capsys, "chat", "-m", "他叫什么？")
    assert code == 0, err
    sent = json.dumps(fake_openai.chat_requests()[-1]["messages"], ensure_ascii=False)
    assert "我的狗叫 Biscuit, remember it" in sent  # the imported conversation goes on


def test_a_refused_import_changes_nothing_and_says_so(home: Path, postgres_dsn: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A database another machine filled, a folder with memory of its own, an import that would overwrite the
    database's entries: refused in one line that names what it would overwrite, and not a byte of the database
    changed (the folder's own documents were not sent up either)."""
    other = tmp_path / "other-machine"
    onboard_in_shanghai(other)
    set_storage(other, {"backend": "postgres", "postgres": {"dsn": postgres_dsn}})
    monkeypatch.setenv("PICOCLAW_HOME", str(other))
    fill(capsys)
    source = tmp_path / "source"
    (source / "memory").mkdir(parents=True)
    (source / "memory" / "MEMORY.md").write_text("# Memory\n\n## 2025-01-01\n另一个事实 another fact\n",
                                                   encoding="utf-8")
    monkeypatch.setenv("PICOCLAW_HOME", str(home))
    assert run(capsys, "memory", "append", "This folder's own fact 本机的事实")[0] == 0
    (home / "workspace" / "memory" / "topics.md").write_text("# 话题 Topics\n", encoding="utf-8")
    set_storage(home, {"backend": "postgres", "postgres": {"dsn": postgres_dsn}})
    before = stored(home)

    code, out, err = run(capsys, "memory", "import", str(source))
    assert_one_line_error(code, out, err, "--replace", "memory/MEMORY.md", "nothing was changed")
    assert stored(home) == before
    assert "memory/topics.md" not in before and "本机的事实".encode() not in b"".join(before.values())

    code, out, err = run(capsys, "memory", "import", "--replace", str(source))
    assert code == 0, err
    assert stored(home) == read_layout(source)


@pytest.mark.slow
def test_the_switch_warning_is_one_line_in_every_command_until_the_import(
        home: Path, postgres_dsn: str, capsys: pytest.CaptureFixture[str], fake_openai: FakeOpenAIServer) -> None:
    """A files workspace whose config.json now says postgres: each command starts with one line naming
    `picoclaw memory import`, until the import. A chat meanwhile is a conversation the import would overwrite,
    which it says (and --replace does)."""
    fill_with_chat(capsys, home, fake_openai)
    folder = home / "workspace"
    set_storage(home, {"backend": "postgres", "postgres": {"dsn": postgres_dsn}})
    fake_openai.reply_text("好的。")
    for argv in (("memory", "show"), ("cron", "list"), ("chat", "-m", "你好")):
        done = picoclaw_process(home, *argv)
        assert done.returncode == 0, done.stderr
        warnings = switch_warnings(done.stderr)
        assert len(warnings) == 1 and done.stderr == warnings[0] + "\n", done.stderr
        assert warnings[0].startswith("picoclaw: WARNING: the workspace folder ")
        assert f"run `picoclaw memory import {folder}`" in warnings[0]
        assert "1 conversation" in warnings[0] and "scheduled jobs" in warnings[0], warnings[0]
    assert "好的。" in done.stdout

    assert_one_line_error(*run(capsys, "memory", "import", str(folder)), "sessions/", "nothing was changed")
    code, _, err = run(capsys, "memory", "import", "--replace", str(folder))
    assert code == 0, err
    for argv in (("memory", "show"), ("cron", "list")):
        done = picoclaw_process(home, *argv)
        assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "drink water" in done.stdout


def test_the_switch_warning_goes_once_the_database_holds_the_folder_content(
        home: Path, postgres_dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """No `memory import` needed when the database already holds what the folder does (imported from an export)."""
    fill(capsys)
    folder = home / "workspace"
    export = home.parent / "export"
    assert run(capsys, "memory", "export", str(export))[0] == 0
    set_storage(home, {"backend": "postgres", "postgres": {"dsn": postgres_dsn}})
    with opened_storage(home) as storage:
        assert switch_warning(storage) is not None
        storage.import_files(export)  # as another command, or machine, might have: no mark of this folder's
        assert switch_warning(storage) is None
        marks = folder / WORK_DIR / SWITCH_FILE
        assert marks.is_file() and "picoclaw_test_" in marks.read_text(encoding="utf-8")
        assert switch_warning(storage) is None


@pytest.mark.slow
def test_no_switch_warning_for_a_fresh_postgres_workspace_or_a_files_one(
        home: Path, postgres_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fill(capsys)
    done = picoclaw_process(home, "memory", "show")  # files, full of content: nothing to say
    assert done.returncode == 0 and done.stderr == "" and ENTRIES[1] in done.stdout, done.stderr

    fresh = tmp_path / "fresh"
    onboard_in_shanghai(fresh)
    set_storage(fresh, {"backend": "postgres", "postgres": {"dsn": postgres_dsn}})
    for argv in (("memory", "show"), ("cron", "list")):
        done = picoclaw_process(fresh, *argv)
        assert done.returncode == 0 and done.stderr == "", done.stderr


def test_import_of_a_file_a_missing_folder_or_a_bad_jobs_file_is_one_line_and_changes_nothing(
        backend_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fill(capsys)
    before = stored(backend_home)
    a_file = tmp_path / "a-file.md"
    a_file.write_text("## 2025-01-01\nnot a workspace\n", encoding="utf-8")
    bad_jobs = tmp_path / "bad-jobs"
    (bad_jobs / "cron").mkdir(parents=True)
    (bad_jobs / "memory").mkdir()
    (bad_jobs / "memory" / "MEMORY.md").write_text("# Memory\n\n## 2025-01-01\nfact\n", encoding="utf-8")
    (bad_jobs / "cron" / "jobs.json").write_text('{"version": 1, "jobs": [', encoding="utf-8")
    for folder, needle in ((tmp_path / "nowhere", "no such folder"), (a_file, "not a folder"),
                           (bad_jobs, "not valid JSON")):
        for argv in (("memory", "import", str(folder)), ("memory", "import", "--replace", str(folder))):
            assert_one_line_error(*run(capsys, *argv), needle, "nothing was imported")
            assert stored(backend_home) == before


def test_import_keeps_memory_that_is_not_utf8_byte_for_byte(backend_home: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "latin1"
    (source / "memory").mkdir(parents=True)
    (source / "memory" / "MEMORY.md").write_bytes(BAD_MEMORY)
    code, out, err = run(capsys, "memory", "import", str(source))
    assert code == 0, err
    assert out.count("\n") == 1 and "imported 1 files" in out
    assert stored(backend_home) == {"memory/MEMORY.md": BAD_MEMORY}
    code, out, _ = run(capsys, "memory", "import", str(source))
    assert code == 0 and "nothing was changed" in out
