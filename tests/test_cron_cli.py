"""`picoclaw cron list | add | remove`, and a job added from the command line while the bot runs arrives
in its Telegram chat exactly once."""

from __future__ import annotations

import signal
from pathlib import Path

import orjson
import pytest
from freezegun import freeze_time

from picoclaw.cli import main
from tests.fakes import FakeOpenAIServer
from tests.fakes.telegram_server import FakeTelegramServer
from tests.test_repl import picoclaw
from tests.test_scheduler import NOW, set_config
from tests.test_telegram import OWNER, configure, picoclaw_telegram
from tests.waiting import wait_until_sync


def jobs_file(home: Path) -> Path:
    return home / "workspace" / "cron" / "jobs.json"


def stored(home: Path) -> list[dict[str, object]]:
    return list(orjson.loads(jobs_file(home).read_bytes())["jobs"])


def test_add_list_and_remove(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with freeze_time(NOW):
        assert main(["cron", "add", "--at", "2026-12-01T09:00+08:00", "--message", "call the bank",
                     "--session", "telegram:42"]) == 0
        assert main(["cron", "add", "--in", "20 minutes", "--message", "明天早上九点提醒我给银行打电话",
                     "--session", "telegram:42"]) == 0
        assert main(["cron", "add", "--every", "3600", "--message", "stretch", "--session", "telegram:7"]) == 0
        assert main(["cron", "add", "--cron", "0 8 * * 1", "--agent", "summarise this week's notes",
                     "--session", "telegram:42"]) == 0
        capsys.readouterr()
        assert main(["cron", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    ids = [job["id"] for job in stored(home)]
    assert [line.split()[0] for line in lines] == ids
    assert "at 2026-12-01 09:00  next 2026-12-01 09:00 CST  telegram:42  message: call the bank  [not run yet]" \
        in lines[0]
    assert "next 2025-03-10 10:20 CST" in lines[1] and "明天早上九点提醒我给银行打电话" in lines[1]
    assert "every 1h  next 2025-03-10 11:00 CST  telegram:7" in lines[2]
    assert "cron 0 8 * * 1  next 2025-03-17 08:00 CST  telegram:42  agent: summarise this week's notes" in lines[3]
    assert main(["cron", "remove", ids[0]]) == 0
    assert [job["id"] for job in stored(home)] == ids[1:]
    assert main(["cron", "remove", ids[0]]) == 2


@pytest.mark.parametrize("arguments", [
    ["--at", "2020-01-01T09:00+08:00", "--message", "x", "--session", "telegram:1"],
    ["--at", "tomorrow at nine", "--message", "x", "--session", "telegram:1"],
    ["--cron", "0 8 * *", "--message", "x", "--session", "telegram:1"],
    ["--every", "30", "--message", "x", "--session", "telegram:1"],
    ["--in", "a while", "--message", "x", "--session", "telegram:1"],
    ["--every", "3600", "--message", "x", "--session", "whatsapp:1"],
    ["--every", "3600", "--message", "   ", "--session", "telegram:1"],
    ["--every", "3600", "--cron", "0 8 * * *", "--message", "x", "--session", "telegram:1"],
    ["--every", "3600", "--session", "telegram:1"],
], ids=["past", "not-iso", "four-fields", "too-often", "bad-delay", "bad-session", "empty", "two-schedules",
        "no-action"])
def test_bad_input_is_one_line_exit_2_and_nothing_written(home: Path, capsys: pytest.CaptureFixture[str],
                                                           arguments: list[str]) -> None:
    with freeze_time(NOW):
        assert main(["cron", "add", *arguments]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("picoclaw: error: "), err
    assert not jobs_file(home).exists()


def test_a_malformed_jobs_file_is_reported_and_kept(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jobs_file(home).parent.mkdir(parents=True)
    jobs_file(home).write_text('{"jobs": [', encoding="utf-8")
    assert main(["cron", "list"]) == 1
    assert main(["cron", "add", "--every", "3600", "--message", "x", "--session", "telegram:1"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(str(jobs_file(home)) in line for line in err)
    assert jobs_file(home).read_text(encoding="utf-8") == '{"jobs": ['


def test_per_user_scope_comes_from_the_session(home: Path) -> None:
    set_config(home, channels={"telegram": {"memory_scope": "per_user"}})
    with freeze_time(NOW):
        assert main(["cron", "add", "--every", "3600", "--agent", "x", "--session", "telegram:-100:7"]) == 0
        assert main(["cron", "add", "--every", "3600", "--agent", "y", "--session", "telegram:42"]) == 0
    assert [job["scope"] for job in stored(home)] == ["7", "42"]


@pytest.mark.slow
def test_a_job_added_while_picoclaw_telegram_runs_arrives_once(home: Path, fake_telegram: FakeTelegramServer,
                                                               fake_openai: FakeOpenAIServer) -> None:
    """Two real processes, as a user runs them: the bot, and `picoclaw cron add` beside it."""
    configure(home, fake_telegram, fake_openai)
    bot = picoclaw_telegram(home)
    try:
        # The bound only stops a hang: the bot's process imports aiogram first, slow on a busy machine.
        fake_telegram.wait_until(lambda: bool(fake_telegram.calls("getUpdates")), timeout=180)
        # Resolved inside the `cron add` process, so however slowly it starts, the job is due after it is added.
        added = picoclaw(home, "cron", "add", "--in", "3 seconds", "--message", "**X** 打电话",
                         "--session", f"telegram:{OWNER}")
        assert added.returncode == 0, added.stderr
        # The bot looks at jobs.json every 3 s: the reminder comes a few seconds after it is due.
        fake_telegram.wait_until(lambda: bool(fake_telegram.sent_texts(OWNER)), timeout=60)
        wait_until_sync(lambda: stored(home)[0]["last_outcome"] == "ok", timeout=60, what="the outcome on disk")
        bot.send_signal(signal.SIGTERM)
        out, err = bot.communicate(timeout=60)
    finally:
        bot.kill()
    assert bot.returncode == 0, err
    assert fake_telegram.sent_texts(OWNER) == ["<b>X</b> 打电话"]  # once, Markdown as Telegram HTML
    [job] = stored(home)
    assert job["next_run"] is None and job["last_outcome"] == "ok"
    assert fake_openai.chat_requests() == []
