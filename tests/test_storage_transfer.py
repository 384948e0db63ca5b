"""Moving a workspace between backends, and the storage health check, through the command line.

The same tests run on the files backend and on PostgreSQL: export writes the files layout byte for byte,
import refuses a target that holds anything without --replace and changes nothing when it already holds the
import, and a round trip files → postgres → files gives back the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from picoclaw.cli import main
from picoclaw.storage.postgres.schema import SCHEMA_VERSION
from picoclaw.storage.stored_files import stored_files
from picoclaw.storage.transfer import read_layout
from tests.fakes import FakeOpenAIServer
from tests.test_cli import assert_one_line_error, run
from tests.zones import onboard_in_shanghai

ENTRIES = ["The user's dog is called Biscuit.", "用户的猫叫小白，三岁了。"]


def set_storage(home: Path, storage: dict[str, object]) -> None:
    """Point `home`'s config.json at `storage`."""
    path = home / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["storage"] = storage
    path.write_text(json.dumps(config), encoding="utf-8")


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
        config = json.loads((where / "config.json").read_text(encoding="utf-8"))
        config["providers"]["openai"] = {"api_key": "sk-test-0123456789abc", "api_base": fake_openai.base_url}
        (where / "config.json").write_text(json.dumps(config), encoding="utf-8")
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
