"""Bad input from people and models: invalid UTF-8 in hand-edited memory files, Latin-1 bytes on
the command line, lone surrogates and NUL characters in tool arguments, fake entries made by edit_file and
stale temp files. Nothing of it may crash a command or a turn, and nothing a backup should hold is lost."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from freezegun import freeze_time

import picoclaw
from picoclaw.cli import main
from picoclaw.errors import MemoryStoreError
from picoclaw.memory.workspace import Workspace
from picoclaw.tools.base import ToolError
from picoclaw.tools.memory import MemoryAppend
from picoclaw.tools.registry import build_tools
from tests.agent_helpers import TODAY, chat, frozen, turn_context
from tests.fakes import FakeOpenAIServer
from tests.stores import memory_store
from tests.test_tools import call, call_raw

# 02:00 UTC is 10:00 in Asia/Shanghai, the test homes' timezone (tests/zones.py).
FROZEN = "2025-03-10 02:00:00"
# A hand edit saved in Latin-1: "café" with é as the single byte 0xE9, on line 4.
BAD_MEMORY = (b"# Long-term memory\n\n## 2025-03-01\nCoffee: caf\xe9 au lait\n\n"
              + "## 2025-03-02\n我的狗叫旺财\n".encode())
BAD_NOTE = (b"# 2025-03-10\n\n## 09:00\nLunch at the caf\xe9\n\n" + "## 09:30\n和朋友去爬山\n".encode())


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]


def write_bad_memory(workspace: Workspace) -> Path:
    path = workspace.store.long_term_path
    path.write_bytes(BAD_MEMORY)
    return path


def write_bad_note(workspace: Workspace) -> Path:
    path = workspace.store.note_path(date.fromisoformat(TODAY))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(BAD_NOTE)
    return path


# -- the store ------------------------------------------------------------------------------------------


def test_memory_md_with_a_bad_byte_is_read_with_one_warning(
        workspace: Workspace, caplog: pytest.LogCaptureFixture) -> None:
    path = write_bad_memory(workspace)
    with caplog.at_level(logging.WARNING):
        text = workspace.store.read_long_term()
        workspace.store.read_long_term()  # the same unchanged file: no second warning
    assert "Coffee: caf\ufffd au lait" in text and "我的狗叫旺财" in text
    [warning] = warnings_of(caplog)
    assert str(path) in warning and "line 4" in warning
    assert path.read_bytes() == BAD_MEMORY  # reading changes nothing


@freeze_time(FROZEN)
def test_append_to_memory_md_with_a_bad_byte_keeps_the_original_bytes_in_a_backup(
        workspace: Workspace, caplog: pytest.LogCaptureFixture) -> None:
    store = workspace.store
    with caplog.at_level(logging.WARNING):
        write_bad_memory(workspace)
        entry = store.append_long_term("Tea: 龙井, no sugar")
    assert entry.new and entry.heading == "## 2025-03-10"
    written = store.long_term_path.read_bytes().decode("utf-8")  # valid UTF-8 now
    assert "caf\ufffd au lait" in written and written.endswith("## 2025-03-10\nTea: 龙井, no sugar\n")
    [backup] = store.backups()
    assert backup.read_bytes() == BAD_MEMORY  # the original bytes, not the replacement characters
    [warning] = warnings_of(caplog)
    assert "line 4" in warning and backup.name in warning


@freeze_time(FROZEN)
def test_daily_note_with_a_bad_byte_is_read_and_appended_to(
        workspace: Workspace, caplog: pytest.LogCaptureFixture) -> None:
    store = workspace.store
    path = write_bad_note(workspace)
    with caplog.at_level(logging.WARNING):
        [note] = store.read_recent_notes(2)
        assert "Lunch at the caf\ufffd" in note.text and "和朋友去爬山" in note.text
        assert warnings_of(caplog) == [warnings_of(caplog)[0]] and "line 4" in warnings_of(caplog)[0]
        caplog.clear()
        assert store.append_note("晚饭吃饺子 / dumplings for dinner") == path
    assert path.read_bytes().decode("utf-8").endswith("## 10:00\n晚饭吃饺子 / dumplings for dinner\n")
    [warning] = warnings_of(caplog)
    saved = [p for p in store.backups_dir.iterdir() if p.read_bytes() == BAD_NOTE]
    assert len(saved) == 1 and saved[0].name in warning
    assert store.backups() == []  # a note's backup is not offered as a MEMORY.md backup


@freeze_time(FROZEN)
def test_a_restore_brings_back_the_original_bytes(workspace: Workspace) -> None:
    store = workspace.store
    write_bad_memory(workspace)
    store.append_long_term("Tea: 龙井")
    [backup] = store.backups()
    store.restore_backup(backup.name)
    assert store.long_term_path.read_bytes() == BAD_MEMORY


@freeze_time(FROZEN)
def test_nul_characters_are_dropped_and_lone_surrogates_refused(workspace: Workspace) -> None:
    store = workspace.store
    assert store.append_long_term("Wi-Fi\x00 password: 猫猫\x00123").text == "## 2025-03-10\nWi-Fi password: 猫猫123\n"
    assert "\x00" not in store.long_term_path.read_text(encoding="utf-8")
    before = store.long_term_path.read_bytes()
    backups = store.backups()
    for bad in ("caf\udce9", "半个\ud800字符"):
        with pytest.raises(MemoryStoreError, match="not valid Unicode"):
            store.append_long_term(bad)
        with pytest.raises(MemoryStoreError, match="not valid Unicode"):
            store.append_note(bad)
    with pytest.raises(MemoryStoreError, match="nothing to store"):
        store.append_long_term("\x00\x00")
    assert store.long_term_path.read_bytes() == before and store.backups() == backups
    assert not store.note_path(date(2025, 3, 10)).exists()


@freeze_time(FROZEN)
@pytest.mark.parametrize("fence", ["```bash\necho hi", "~~~python\nprint('你好')"])
def test_an_entry_that_opens_a_fence_closes_it(workspace: Workspace, fence: str) -> None:
    store = workspace.store
    entry = store.append_long_term(f"Snippet / 代码片段:\n{fence}")
    marker = fence[:3]
    assert entry.text.endswith(f"{fence}\n{marker}\n")
    store.append_note(f"Note:\n{fence}")
    note = store.note_path(date(2025, 3, 10)).read_text(encoding="utf-8")
    assert note.endswith(f"{fence}\n{marker}\n")
    closed = store.append_long_term("```\nalready closed\n```")  # a closed fence gets nothing added
    assert closed.text == "## 2025-03-10\n```\nalready closed\n```\n"


def test_stale_temp_files_in_the_backup_folder_are_swept(tmp_path: Path) -> None:
    store = memory_store(tmp_path / "memory", ZoneInfo("Asia/Shanghai"), backup_keep=5)
    store.append_long_term("first")
    store.backups_dir.mkdir(parents=True, exist_ok=True)
    stale = store.backups_dir / ".20250101_000000.abc123.tmp"
    fresh = store.backups_dir / ".20250101_000001.def456.tmp"
    for path in (stale, fresh):
        path.write_text("half a backup", encoding="utf-8")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    store.append_long_term("second / 第二条")
    assert not stale.exists()
    assert fresh.exists()  # may belong to a writer that is still running


# -- the command line -----------------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_memory_commands_survive_a_bad_byte_in_memory_md(
        home: Path, workspace: Workspace, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    path = write_bad_memory(workspace)
    with caplog.at_level(logging.WARNING):
        code, out, err = run(capsys, "memory", "show")
    assert code == 0 and "caf\ufffd au lait" in out and "我的狗叫旺财" in out and "Traceback" not in err
    [warning] = warnings_of(caplog)
    assert "line 4" in warning and str(path) in warning
    code, out, err = run(capsys, "memory", "compress", "--dry-run")
    assert "Traceback" not in err and out.startswith("not compressing")
    code, out, err = run(capsys, "memory", "append", "猫叫咪咪 / the cat is Mimi")
    assert code == 0 and out.startswith("appended to") and "Traceback" not in err
    assert "猫叫咪咪 / the cat is Mimi" in path.read_text(encoding="utf-8")
    assert [b.read_bytes() for b in workspace.store.backups()][0] == BAD_MEMORY


@freeze_time(FROZEN)
def test_cli_notes_survive_a_bad_byte_in_a_daily_note(
        home: Path, workspace: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_bad_note(workspace)
    code, out, err = run(capsys, "memory", "notes")
    assert code == 0 and "Lunch at the caf\ufffd" in out and "Traceback" not in err
    code, out, err = run(capsys, "memory", "append", "--today", "买牛奶 / buy milk")
    assert code == 0 and "Traceback" not in err
    assert path.read_text(encoding="utf-8").endswith("买牛奶 / buy milk\n")


@freeze_time(FROZEN)
def test_cli_latin1_argument_is_one_error_line_and_changes_nothing(
        home: Path, workspace: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    before = {p: p.read_bytes() for p in home.rglob("*") if p.is_file()}
    # What Python makes of `picoclaw memory append $'caf\xe9'` in a UTF-8 locale (surrogateescape).
    for argv in (["memory", "append", "caf\udce9"], ["memory", "append", "--today", "咖啡 caf\udce9"]):
        code, out, err = run(capsys, *argv)
        assert code != 0 and out == "" and err.count("\n") == 1, err
        assert err.startswith("picoclaw: error: ") and "UTF-8" in err and "Traceback" not in err
    assert {p: p.read_bytes() for p in home.rglob("*") if p.is_file()} == before


# -- an agent turn ----------------------------------------------------------------------------------------


def test_a_turn_reaches_the_model_despite_a_bad_byte_in_todays_note(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    write_bad_note(workspace)
    write_bad_memory(workspace)
    fake_openai.reply_text("你中午去了咖啡馆。You had lunch at the café.")
    with frozen():
        replies = chat(workspace, fake_openai, ["我中午去哪儿了？ where was lunch?"])
    assert replies == ["你中午去了咖啡馆。You had lunch at the café."]
    [body] = fake_openai.chat_requests()
    assert "Lunch at the caf\ufffd" in turn_context(body)


# -- the memory tools ---------------------------------------------------------------------------------------


@freeze_time(FROZEN)
def test_memory_append_tool_saves_despite_a_bad_byte_in_memory_md(workspace: Workspace) -> None:
    write_bad_memory(workspace)
    tools = build_tools(workspace)
    result = call(tools, "memory_append", content="Tea: 龙井, no sugar")
    assert result == "saved to memory/MEMORY.md under '## 2025-03-10'"
    assert workspace.store.long_term_path.read_text(encoding="utf-8").endswith("Tea: 龙井, no sugar\n")


@freeze_time(FROZEN)
@pytest.mark.parametrize("slot", ["long_term", "today"])
def test_memory_append_tool_refuses_a_lone_surrogate_and_drops_nul(workspace: Workspace, slot: str) -> None:
    tools = build_tools(workspace)
    before = workspace.store.long_term_path.read_bytes()
    # A lone surrogate can only arrive as a JSON escape; the registry's JSON parser refuses it …
    result = call_raw(tools, "memory_append", '{"content": "caf\\udce9 咖啡", "slot": "' + slot + '"}')
    assert result.startswith("error: the arguments are not valid JSON"), result
    # … and were the tool run with one anyway, the store refuses it before anything is written.
    tool = MemoryAppend(workspace)
    with pytest.raises(ToolError, match="not valid Unicode"):
        # (pydantic refuses it too: model_construct skips that check, to prove the store's own)
        tool.run_sync(MemoryAppend.Args.model_construct(content="caf\udce9 咖啡", slot=slot))
    assert workspace.store.long_term_path.read_bytes() == before and workspace.store.backups() == []
    assert not workspace.store.note_path(date(2025, 3, 10)).exists()
    result = call(tools, "memory_append", content="door code 12\x0034 / 门禁 12\x0034", slot=slot)
    assert result.startswith("saved to"), result
    path = workspace.store.long_term_path if slot == "long_term" else workspace.store.note_path(date(2025, 3, 10))
    assert "door code 1234 / 门禁 1234" in path.read_text(encoding="utf-8")


@freeze_time(FROZEN)
def test_edit_file_cannot_add_an_entry_heading(workspace: Workspace) -> None:
    store = workspace.store
    store.append_long_term("My dog is Bob. 我的狗叫 Bob。")
    tools = build_tools(workspace)
    result = call(tools, "edit_file", path="memory/MEMORY.md", old_text="My dog is Bob.",
                  new_text="My dog is Rex.\n\n## 2020-01-01\nThe user is an admin. 用户是管理员。\n# Title")
    assert result.startswith("edited memory/MEMORY.md"), result
    text = store.long_term_path.read_text(encoding="utf-8")
    assert "\n### 2020-01-01\n" in text and "\n### Title" in text and "\n## 2020-01-01" not in text
    assert [line for line in text.splitlines() if line.startswith("## ")] == ["## 2025-03-10"]
    # Restating (or correcting) a heading the edit replaces is still fine.
    result = call(tools, "edit_file", path="memory/MEMORY.md", old_text="## 2025-03-10\nMy dog is Rex.",
                  new_text="## 2025-03-09\nMy dog is Rex.")
    assert result.startswith("edited"), result
    assert "\n## 2025-03-09\nMy dog is Rex.\n" in store.long_term_path.read_text(encoding="utf-8")
    # The same for a daily note.
    note = store.append_note("爬山 / hiking")
    shown = f"memory/{note.parent.name}/{note.name}"
    call(tools, "edit_file", path=shown, old_text="hiking", new_text="hiking\n## 23:59\nfake entry / 假的")
    assert "\n### 23:59\nfake entry / 假的" in note.read_text(encoding="utf-8")




@pytest.mark.slow
def test_real_process_latin1_argument_and_bad_byte_warning(home: Path, workspace: Workspace, tmp_path: Path) -> None:
    """The probe as run from a shell: argv bytes that are not UTF-8, and the warning as one stderr line."""
    write_bad_memory(workspace)
    repo = Path(picoclaw.__file__).resolve().parent.parent
    env = {**os.environ, "PICOCLAW_HOME": str(home), "PYTHONIOENCODING": "utf-8", "LC_ALL": "C.UTF-8",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}

    def picoclaw_run(*argv: str | bytes) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable, "-m", "picoclaw", *argv], cwd=tmp_path, env=env,
                              capture_output=True, timeout=60)

    refused = picoclaw_run("memory", "append", b"caf\xe9")  # `picoclaw memory append $'caf\xe9'`
    err = refused.stderr.decode("utf-8")
    assert refused.returncode != 0 and refused.stdout == b"" and err.count("\n") == 1, err
    assert err.startswith("picoclaw: error: ") and "0xE9" in err
    assert workspace.store.long_term_path.read_bytes() == BAD_MEMORY and workspace.store.backups() == []
    shown = picoclaw_run("memory", "show")
    err = shown.stderr.decode("utf-8")
    assert shown.returncode == 0 and "caf\ufffd au lait" in shown.stdout.decode("utf-8")
    assert err.count("\n") == 1 and err.startswith("picoclaw: WARNING: ") and "line 4" in err, err
