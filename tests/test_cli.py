"""The `picoclaw` command line, driven in-process through `main([...])`, plus one real subprocess run."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from freezegun import freeze_time

import picoclaw
from picoclaw.app import App
from picoclaw.cli import main
from tests.fakes import FakeOpenAIServer
from tests.homes import edit_config

# 18:30 UTC is 02:30 the next day in Asia/Shanghai, the test homes' timezone (tests/zones.py): dates follow it.
FROZEN = "2025-03-10 18:30:00"
LOCAL_DAY = "2025-03-11"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    """A failure: non-zero exit, nothing on stdout, exactly one line on stderr, no traceback."""
    assert code != 0
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("picoclaw: error: ")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"


def tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `root` with its bytes and mtime, to prove a command changed nothing."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def memory_dir(home: Path) -> Path:
    return home / "workspace" / "memory"


def policy_rows(out: str) -> dict[str, tuple[str, str]]:
    """`policy show` output as {key: (value, source)}."""
    rows = {}
    for line in out.splitlines():
        match = re.fullmatch(r"(\w+)\s+(\S+)\s+\((default|config|overrides)\)", line)
        assert match, line
        rows[match.group(1)] = (match.group(2), match.group(3))
    return rows


# -- onboard -------------------------------------------------------------------------------------------


def test_onboard_creates_then_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "新家 home"
    monkeypatch.setenv("PICOCLAW_HOME", str(home))
    code, out, err = run(capsys, "onboard")
    assert (code, err) == (0, "")
    workspace = home / "workspace"
    for name in ("AGENTS.md", "SOUL.md", "USER.md", "IDENTITY.md", "memory/MEMORY.md"):
        assert (workspace / name).is_file(), name
        assert str(workspace / name) in out
    config_path = home / "config.json"
    assert stat.S_IMODE(config_path.stat().st_mode) == 0o600  # it will hold API keys
    assert json.loads(config_path.read_text())["workspace"] == str(workspace)
    assert all(line.startswith("created ") for line in out.splitlines()[:-1])
    assert out.splitlines()[-1].startswith("Done.")

    before = tree(home)
    code, out, err = run(capsys, "onboard")
    assert (code, err) == (0, "")
    *steps, last = out.splitlines()
    assert last == "Nothing to do: picoclaw is already set up here; no file was changed."
    assert steps and all(line.startswith("already there") for line in steps)
    assert tree(home) == before


def test_onboard_leaves_a_user_edited_file_alone(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    user = home / "workspace" / "USER.md"
    user.write_text("# User\n\n我叫小明，请用中文回答。\nI am Xiaoming; answer in Chinese.\n", encoding="utf-8")
    (home / "workspace" / "SOUL.md").unlink()
    before = user.read_bytes()
    code, out, err = run(capsys, "onboard")
    assert (code, err) == (0, "")
    assert user.read_bytes() == before
    [user_line] = [line for line in out.splitlines() if line.endswith("USER.md")]
    assert user_line.startswith("already there, left as you have it")
    [soul_line] = [line for line in out.splitlines() if line.endswith("SOUL.md")]
    assert soul_line.startswith("created")  # a deleted file comes back
    assert (home / "workspace" / "SOUL.md").is_file()


# -- memory ---------------------------------------------------------------------------------------------


def test_memory_show_fresh_and_after_append(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "memory", "show")
    assert code == 0 and out.startswith("# Long-term memory")
    with freeze_time(FROZEN):
        code, out, err = run(capsys, "memory", "append", "项目 A 的截止日期是 3 月 15 日")
    assert (code, err) == (0, "")
    assert out == f"appended to {memory_dir(home) / 'MEMORY.md'}\n"
    code, out, _ = run(capsys, "memory", "show")
    assert out.endswith(f"## {LOCAL_DAY}\n项目 A 的截止日期是 3 月 15 日\n")


def test_memory_show_empty_file(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (memory_dir(home) / "MEMORY.md").write_text("")
    code, out, _ = run(capsys, "memory", "show")
    assert code == 0 and "MEMORY.md is empty" in out


@pytest.fixture
def facts(home: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """Sample facts (a deadline, a pet, an email), in Chinese and English, appended through the CLI."""
    with freeze_time(FROZEN):
        for text in ("项目 A 的截止日期是 3 月 15 日。", "宠物狗叫 Bob，是一只柯基。", "常用邮箱是 alice@example.com。",
                     "The deadline for project A is March 15.", "My pet dog is called Bob."):
            assert main(["memory", "append", text]) == 0
    capsys.readouterr()
    return memory_dir(home) / "MEMORY.md"


def test_memory_search_chinese_and_english(facts: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = facts.read_text(encoding="utf-8").split("\n")
    for query, expected in [("项目 A 什么时候截止？", "项目 A 的截止日期是 3 月 15 日。"),
                            ("我的狗叫什么", "宠物狗叫 Bob，是一只柯基。"),
                            ("What is my dog called?", "My pet dog is called Bob.")]:
        code, out, err = run(capsys, "memory", "search", query)
        assert (code, err) == (0, "")
        first = re.match(r"1\. score \d+\.\d{3}  (\S+):(\d+)-(\d+)\n", out)
        assert first, out
        assert first.group(1) == "memory/MEMORY.md"
        start, end = int(first.group(2)), int(first.group(3))
        assert lines[end - 1] == expected  # the printed range points at the fact in the real file
        assert lines[start - 1] == f"## {LOCAL_DAY}"
        assert out.splitlines()[2] == f"   {expected}"


def test_memory_search_limit(facts: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "memory", "search", "Bob 狗 dog")
    assert code == 0 and "\n2. score" in out
    code, out, _ = run(capsys, "memory", "search", "Bob 狗 dog", "--limit", "1")
    assert code == 0 and out.startswith("1. score") and "\n2. score" not in out


def test_memory_search_no_hit(facts: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "memory", "search", "量子计算")
    assert (code, out, err) == (0, "no memory matches '量子计算'\n", "")
    code, out, _ = run(capsys, "memory", "search", "quantum")
    assert out == "no memory matches 'quantum'\n"


def test_memory_search_includes_daily_notes(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with freeze_time(FROZEN):
        assert main(["memory", "append", "--today", "和朋友去爬山 / went hiking with friends"]) == 0
    code, out, _ = run(capsys, "memory", "search", "爬山")
    assert code == 0 and "memory/202503/20250311.md:" in out
    code, out, _ = run(capsys, "memory", "search", "hiking")
    assert "memory/202503/20250311.md:" in out


def test_memory_append_today_and_notes_days(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with freeze_time(FROZEN) as frozen:
        code, out, _ = run(capsys, "memory", "append", "--today", "买了狗粮 / bought dog food")
        note = memory_dir(home) / "202503" / "20250311.md"
        assert code == 0 and out == f"appended to {note}\n"
        assert note.read_text(encoding="utf-8") == "# 2025-03-11\n\n## 02:30\n买了狗粮 / bought dog food\n"
        frozen.tick(2 * 86400)  # two days later
        code, out, _ = run(capsys, "memory", "append", "--today", "遛狗 / walked the dog")
        assert out.endswith("20250313.md\n")
        code, out, _ = run(capsys, "memory", "notes", "--days", "1")
        assert "遛狗" in out and "狗粮" not in out
        assert out.startswith("==> memory/202503/20250313.md <==\n")
        code, out, _ = run(capsys, "memory", "notes", "--days", "3")
        assert out.index("狗粮") < out.index("遛狗")  # oldest first
        code, out, _ = run(capsys, "memory", "notes")  # default: recent_days = 3 from config
        assert "狗粮" in out and "遛狗" in out
        code, out, _ = run(capsys, "memory", "notes", "--days", "0")
        assert out == "no daily notes in the last 0 day(s)\n"
    # The long-term memory was not touched by --today.
    assert "狗粮" not in (memory_dir(home) / "MEMORY.md").read_text(encoding="utf-8")


@freeze_time(FROZEN)
def test_memory_backups_and_restore(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    memory = memory_dir(home) / "MEMORY.md"
    original = memory.read_bytes()
    code, out, _ = run(capsys, "memory", "backups")
    assert code == 0 and out.startswith("no backups yet")
    run(capsys, "memory", "append", "宠物狗叫 Bob")
    run(capsys, "memory", "append", "My pet dog is called Bob")
    code, out, _ = run(capsys, "memory", "backups")
    assert code == 0 and out.startswith("no backups yet")  # an append copies nothing
    appended = memory.read_bytes()
    store = App.open(home).workspace.store  # backups are for rewrites: compression, restore, edits
    store.rewrite_long_term(original)
    after_first = memory.read_bytes()
    store.rewrite_long_term(original + "## 2025-03-10\n我的狗叫旺财\n".encode())
    after_second = memory.read_bytes()
    code, out, _ = run(capsys, "memory", "backups")
    names = [line.split()[0] for line in out.splitlines()]
    # Stamped in UTC, newest first, unique within the frozen second.
    assert names == ["20250310_183000Z_1_MEMORY.md", "20250310_183000Z_MEMORY.md"]
    assert f"{len(appended)} bytes" in out.splitlines()[1]

    code, out, err = run(capsys, "memory", "restore", "20250310_183000Z_MEMORY.md")
    assert (code, err) == (0, "")
    assert memory.read_bytes() == appended
    assert "the previous MEMORY.md was saved as" in out
    # The restore itself was backed up, so it can be undone.
    saved = out.split("saved as ")[1].strip()
    assert (memory_dir(home) / "backups" / saved).read_bytes() == after_second
    run(capsys, "memory", "restore", "20250310_183000Z_1_MEMORY.md")
    assert memory.read_bytes() == after_first


@pytest.mark.parametrize(
    "name", ["20990101_000000_MEMORY.md", "不存在的备份", "../MEMORY.md", "../../config.json", "/etc/passwd", ""]
)
def test_memory_restore_unknown_or_hostile_name(home: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    with freeze_time(FROZEN):
        run(capsys, "memory", "append", "宠物狗叫 Bob")
    before = tree(home)
    assert_one_line_error(*run(capsys, "memory", "restore", name), "no backup named")
    assert tree(home) == before


@pytest.mark.parametrize(
    ("argv", "needles", "exit_code"),
    [
        pytest.param(["memory", "search"], ["required", "query"], 2, id="missing-query"),
        pytest.param(["memory", "search", "狗", "--limit", "0"], ["--limit", "between 1 and 1000"], 2, id="limit-0"),
        pytest.param(["memory", "search", "dog", "--limit", "ten"], ["--limit", "whole number"], 2, id="limit-word"),
        pytest.param(["memory", "notes", "--days", "-1"], ["--days"], 2, id="days-negative"),
        pytest.param(["memory", "append", "   "], ["nothing to store"], 1, id="empty-entry"),
        pytest.param(["memory", "append", "--today", "\n\n"], ["nothing to store"], 1, id="empty-note"),
        pytest.param(["memory"], ["missing an action", "picoclaw memory --help"], 2, id="memory-no-action"),
        pytest.param([], ["missing a command"], 2, id="no-command"),
        pytest.param(["memroy", "show"], ["invalid choice"], 2, id="typo-command"),
    ],
)
def test_bad_memory_usage_is_one_line_and_changes_nothing(
    home: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needles: list[str], exit_code: int
) -> None:
    before = tree(home)
    code, out, err = run(capsys, *argv)
    assert_one_line_error(code, out, err, *needles)
    assert code == exit_code
    assert tree(home) == before


# -- policy ---------------------------------------------------------------------------------------------


def test_policy_show_values_and_sources(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "policy", "show")
    rows = policy_rows(out)
    assert code == 0
    assert rows["retrieve_limit"] == ("10", "config")  # onboarding wrote every key into config.json
    assert rows["evolution_enabled"] == ("false", "config")
    # A config without a memory block: everything is default.
    (home / "config.json").write_text(json.dumps({"workspace": str(home / "workspace")}))
    rows = policy_rows(run(capsys, "policy", "show")[1])
    assert set(source for _, source in rows.values()) == {"default"}
    assert rows["memory_token_budget"] == ("2000", "default")


@freeze_time(FROZEN)
def test_policy_set_show_snapshots_rollback_reset(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    overrides = memory_dir(home) / "policy_overrides.json"
    code, out, _ = run(capsys, "policy", "snapshots")
    assert code == 0 and out.startswith("no snapshots yet")

    code, out, err = run(capsys, "policy", "set", "retrieve_limit=5", "evolution_enabled=true")
    assert (code, err) == (0, "")
    assert out == ("retrieve_limit = 5\nevolution_enabled = true\n"
                   "previous overrides saved as 20250310_183000Z.json\n")
    assert json.loads(overrides.read_text()) == {"retrieve_limit": 5, "evolution_enabled": True}
    rows = policy_rows(run(capsys, "policy", "show")[1])
    assert rows["retrieve_limit"] == ("5", "overrides")
    assert rows["evolution_enabled"] == ("true", "overrides")
    assert rows["recent_days"] == ("3", "config")

    run(capsys, "policy", "set", "retrieve_limit = 7")  # spaces around "=" are fine
    code, out, _ = run(capsys, "policy", "snapshots")
    assert [line.split()[0] for line in out.splitlines()] == ["20250310_183000Z_1.json", "20250310_183000Z.json"]
    # One line per snapshot, showing what it holds.
    assert out.splitlines()[0] == '20250310_183000Z_1.json  {"retrieve_limit":5,"evolution_enabled":true}'
    assert out.splitlines()[1] == "20250310_183000Z.json  {}"

    code, out, _ = run(capsys, "policy", "rollback")
    assert code == 0 and "20250310_183000Z_1.json" in out
    assert policy_rows(run(capsys, "policy", "show")[1])["retrieve_limit"] == ("5", "overrides")

    code, out, _ = run(capsys, "policy", "rollback", "20250310_183000Z.json")
    assert code == 0 and json.loads(overrides.read_text()) == {}
    assert policy_rows(run(capsys, "policy", "show")[1])["retrieve_limit"] == ("10", "config")

    run(capsys, "policy", "set", "recent_days=1")
    code, out, _ = run(capsys, "policy", "reset")
    assert code == 0 and "policy overrides cleared" in out
    assert policy_rows(run(capsys, "policy", "show")[1])["recent_days"] == ("3", "config")
    history = (memory_dir(home) / "policy_history.jsonl").read_text().splitlines()
    assert [json.loads(line)["source"] for line in history] == ["cli"] * 6


@pytest.mark.parametrize(
    ("assignments", "needles", "exit_code"),
    [
        pytest.param(["retrive_limit=5"], ["unknown policy key 'retrive_limit'"], 1, id="unknown-key"),
        pytest.param(["retrieve_limit=99"], ["retrieve_limit", "got 99", "allowed 1–50"], 1, id="out-of-bounds"),
        pytest.param(["recent_days=-1"], ["recent_days", "allowed 0–30"], 1, id="negative"),
        pytest.param(["retrieve_limit"], ["expected KEY=VALUE", "'retrieve_limit'"], 2, id="no-equals"),
        pytest.param(["=5"], ["expected KEY=VALUE"], 2, id="no-key"),
        pytest.param(['retrieve_limit="15"'], ["retrieve_limit", "valid integer"], 1, id="quoted-number"),
        pytest.param(["evolution_enabled=是"], ["evolution_enabled", "valid boolean", "'是'"], 1, id="chinese-bool"),
        pytest.param(["recent_days=1", "memory_token_budget=10"], ["memory_token_budget", "allowed 200–32000"], 1,
                     id="one-bad-of-two"),
        pytest.param(["session_summary_keep_count=20"], ["session_summary_keep_count must be smaller"], 1,
                     id="keep-vs-threshold"),
    ],
)
def test_bad_policy_set_is_one_line_and_changes_nothing(
    home: Path, capsys: pytest.CaptureFixture[str], assignments: list[str], needles: list[str], exit_code: int
) -> None:
    before = tree(home)
    code, out, err = run(capsys, "policy", "set", *assignments)
    assert_one_line_error(code, out, err, *needles)
    assert code == exit_code
    assert tree(home) == before  # no overrides, no snapshot, no history line
    assert not (memory_dir(home) / "policy_overrides.json").exists()


def test_policy_set_without_assignments(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(*run(capsys, "policy", "set"), "KEY=VALUE")


def test_policy_rollback_errors(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(*run(capsys, "policy", "rollback"), "no policy snapshots")
    with freeze_time(FROZEN):
        run(capsys, "policy", "set", "retrieve_limit=5")
    before = tree(home)
    for name in ("20990101_000000.json", "快照", "../policy_overrides.json"):
        assert_one_line_error(*run(capsys, "policy", "rollback", name), "no snapshot named")
    assert tree(home) == before


def test_policy_show_with_broken_overrides_still_works(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (memory_dir(home) / "policy_overrides.json").write_text('{"retrieve_limit": 5,,}')
    code, out, _ = run(capsys, "policy", "show")
    assert code == 0
    assert policy_rows(out)["retrieve_limit"] == ("10", "config")


# -- config problems ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv", [["memory", "show"], ["memory", "search", "狗"], ["policy", "show"], ["policy", "set", "recent_days=1"],
             ["onboard"]],
)
def test_broken_config_is_one_line_naming_the_file(
    home: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    config = home / "config.json"
    config.write_text('{\n  "timezone": "Asia/Shanghai",\n  "memory": {"retrieve_limit": 5,}\n}\n')
    before = tree(home)
    assert_one_line_error(*run(capsys, *argv), str(config), "not valid JSON", "line 3")
    assert tree(home) == before


def test_invalid_config_value_is_one_line_naming_key_and_range(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = home / "config.json"
    with edit_config(home) as data:
        data["memory"]["retrieve_limit"] = 0
    assert_one_line_error(*run(capsys, "memory", "search", "dog"), str(config), "memory.retrieve_limit",
                          "allowed 1–50")
    with edit_config(home) as data:
        data["memory"]["retrieve_limit"] = 5
        data["memory"]["retrive_limit"] = 5
    assert_one_line_error(*run(capsys, "policy", "show"), "memory.retrive_limit", "unknown key")


def test_no_config_tells_you_to_onboard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PICOCLAW_HOME", str(tmp_path / "empty"))
    for argv in (["memory", "show"], ["policy", "show"], ["memory", "search", "Bob"]):
        assert_one_line_error(*run(capsys, *argv), "run `picoclaw onboard`", str(tmp_path / "empty" / "config.json"))
    assert not (tmp_path / "empty").exists()  # reading commands create nothing


# -- end to end ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_python_m_picoclaw_memory_search_subprocess(facts: Path, home: Path, tmp_path: Path) -> None:
    repo = Path(picoclaw.__file__).resolve().parent.parent
    env = {**os.environ, "PICOCLAW_HOME": str(home), "PYTHONIOENCODING": "utf-8",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-m", "picoclaw", "memory", "search", "狗叫 Bob", "--limit", "1"],
        cwd=tmp_path, env=env, capture_output=True, timeout=60,
    )
    out = result.stdout.decode("utf-8")
    assert result.returncode == 0, result.stderr.decode("utf-8", "replace")
    assert result.stderr == b""
    assert re.match(r"1\. score \d+\.\d{3}  memory/MEMORY\.md:\d+-\d+\n", out), out
    assert out.splitlines()[2] == "   宠物狗叫 Bob，是一只柯基。"
    assert "My pet dog is called Bob." not in out  # it matches too, but --limit 1 keeps only the best


def picoclaw_env(home: Path) -> dict[str, str]:
    repo = Path(picoclaw.__file__).resolve().parent.parent
    return {**os.environ, "PICOCLAW_HOME": str(home), "PYTHONIOENCODING": "utf-8",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["memory", "show"], ["memory", "search", "咖啡 coffee", "--limit", "50"]],
                         ids=["show", "search"])
def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly(home: Path, argv: list[str]) -> None:
    # `picoclaw memory show | head`: far more than a pipe holds (64 KiB), so the writer meets the closed end.
    entries = [f"## 2025-03-{day % 28 + 1:02d}\nEntry {day}: my coffee is an oat-milk latte, the dog is Bob.\n"
               f"第 {day} 条：我喜欢燕麦拿铁咖啡，我的狗叫 Bob，是一只柯基。" + " 更多的记忆文字 more memory text" * 60
               for day in range(400)]
    (memory_dir(home) / "MEMORY.md").write_text("# Long-term memory\n\n" + "\n\n".join(entries) + "\n",
                                                encoding="utf-8")
    child = subprocess.Popen([sys.executable, "-m", "picoclaw", *argv], env=picoclaw_env(home),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    first = child.stdout.readline()  # as `head -1` reads: one line, then the pipe is closed
    child.stdout.close()
    err = child.stderr.read().decode("utf-8", "replace")
    assert child.wait(timeout=60) == 141, err  # 128 + SIGPIPE, as the shell reports a tool a closed pipe ended
    assert first.strip() and err == ""  # no "Broken pipe" error, no "Exception ignored … BrokenPipeError"


def test_a_broken_pipe_that_is_not_stdout_is_still_an_error(
        home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import picoclaw.cli.memory

    def broken(args: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")  # e.g. a helper program that died: stdout itself is fine

    monkeypatch.setattr(picoclaw.cli.memory, "cmd_memory_show", broken)
    assert_one_line_error(*run(capsys, "memory", "show"), "Broken pipe")


# -- terminal escapes -------------------------------------------------------------------------------------

# What would act on a terminal if printed: ESC, BEL and the 8-bit CSI.
ACTING = ("\x1b", "\x07", "\x9b")
HOSTILE = "a\x1b[31mred\x07 \x1b]0;pwned\x07提醒\x9b1m红色"
HOSTILE_SHOWN = "ared 提醒红色"


def assert_inert(*texts: str) -> None:
    for text in texts:
        assert not any(byte in text for byte in ACTING), repr(text)


@freeze_time(FROZEN)
def test_memory_append_stores_and_shows_no_terminal_escapes(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "memory", "append", HOSTILE)
    assert code == 0
    assert out == f"appended to {memory_dir(home) / 'MEMORY.md'}\n"
    assert err == "note: terminal control characters were removed from the text\n"
    memory = (memory_dir(home) / "MEMORY.md").read_text(encoding="utf-8")
    assert memory.endswith(f"## {LOCAL_DAY}\n{HOSTILE_SHOWN}\n")
    assert_inert(memory)

    code, out, err = run(capsys, "memory", "append", "--today", "tab\tstays 🎉\x1b[2J")
    note = (memory_dir(home) / "202503" / "20250311.md").read_text(encoding="utf-8")
    assert code == 0 and note.endswith("## 02:30\ntab\tstays 🎉\n")

    code, out, err = run(capsys, "memory", "show")
    assert code == 0 and out.endswith(f"{HOSTILE_SHOWN}\n") and err == ""
    assert_inert(out)


def test_memory_append_of_nothing_but_escapes_is_refused_and_stores_nothing(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = tree(home)
    code, out, err = run(capsys, "memory", "append", "\x1b[31m\x07")
    assert code == 1 and out == ""
    assert err.splitlines() == ["picoclaw: error: nothing to store: the entry is empty"]  # one line, no note
    assert tree(home) == before


@freeze_time(FROZEN)
def test_memory_written_by_hand_with_escapes_is_shown_without_them(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file edited elsewhere (or by an older version) may hold escapes: show, search and notes print none."""
    (memory_dir(home) / "MEMORY.md").write_text(f"# Long-term memory\n\n## 2025-03-01\n狗叫 Bob {HOSTILE}\n",
                                                 encoding="utf-8")
    (memory_dir(home) / "202503").mkdir()
    (memory_dir(home) / "202503" / "20250311.md").write_text(f"# 2025-03-11\n\n## 02:00\n遛狗 walk {HOSTILE}\n",
                                                             encoding="utf-8")
    outputs = []
    for argv in (["memory", "show"], ["memory", "search", "Bob"], ["memory", "search", "遛狗"], ["memory", "notes"]):
        code, out, err = run(capsys, *argv)
        assert code == 0 and err == "", argv
        assert HOSTILE_SHOWN in out, (argv, out)
        outputs.append(out)
    assert_inert(*outputs)


def test_policy_history_and_snapshots_show_no_escapes(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from picoclaw.app import App

    with freeze_time(FROZEN):
        App.open(home).workspace.policy.set({"recent_days": 2}, source="reflection",
                                            reason=f"the model said {HOSTILE}")
    snapshots = memory_dir(home) / "policy_snapshots"
    (snapshots / "20250310_190000.json").write_text(f"not json {HOSTILE}", encoding="utf-8")

    code, out, err = run(capsys, "policy", "history")
    assert code == 0 and err == ""
    assert f"    reason: the model said {HOSTILE_SHOWN}" in out.splitlines()
    code, snapshot_out, err = run(capsys, "policy", "snapshots")
    assert code == 0 and f"20250310_190000.json  not json {HOSTILE_SHOWN}" in snapshot_out.splitlines()
    assert_inert(out, snapshot_out)


def test_cron_list_shows_no_escapes(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "cron", "add", "--in", "2 hours", "--message", f"call {HOSTILE}",
                         "--session", "cli:default")
    assert code == 0, err
    added = out
    code, out, err = run(capsys, "cron", "list")
    assert code == 0 and err == ""
    # A terminal job waits for an open chat, and the list says so: `chat -m` delivers none.
    assert f"message: call {HOSTILE_SHOWN}  [not run yet; comes in an open `picoclaw chat`, not `chat -m`]" in out
    assert_inert(added, out)


def test_skills_list_shows_no_escapes(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    skill = home / "workspace" / "skills" / "tea-log" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    # YAML's double-quoted "\e" is an ESC: a downloaded skill can carry one in its description.
    skill.write_text('---\nname: tea-log\ndescription: "log tea \\e[31m红茶\\a\\e]0;pwned\\a"\n---\nDo it.\n',
                     encoding="utf-8")
    code, out, err = run(capsys, "skills", "list")
    assert code == 0 and err == ""
    assert "tea-log: log tea 红茶" in out.splitlines()
    assert_inert(out)


def test_an_error_quoting_the_models_server_shows_no_escapes(
        home: Path, capsys: pytest.CaptureFixture[str], fake_openai: FakeOpenAIServer) -> None:
    with edit_config(home) as config:
        config["providers"]["openai"] = {"api_key": "sk-cli-test-0123456789", "api_base": fake_openai.base_url}
    run(capsys, "memory", "append", "咖啡 coffee: oat-milk latte")
    memory = (memory_dir(home) / "MEMORY.md").read_bytes()
    fake_openai.reply_error(400, f"bad request {HOSTILE}")

    code, out, err = run(capsys, "memory", "compress", "--force")

    assert_one_line_error(code, out, err, f"bad request {HOSTILE_SHOWN}", "MEMORY.md was left unchanged")
    assert_inert(err)
    assert (memory_dir(home) / "MEMORY.md").read_bytes() == memory

