"""Schedules and session keys that can never work are refused by `picoclaw cron add` and by
the model's cron tool in one clear line, nothing written; a stored job that can never run (hand-edited, or
added before these checks, then the timezone changed) is listed, marked, removable, and the scheduler
skips it with one warning instead of stopping."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import orjson
import pytest
from freezegun import freeze_time

from picoclaw.app import App
from picoclaw.cli import main
from picoclaw.jobs import Scheduler
from picoclaw.memory.workspace import Workspace
from picoclaw.tools.registry import build_tools
from tests.test_cron_cli import jobs_file, stored
from tests.test_cron_tool import OWNER, call
from tests.test_scheduler import NOW, Delivered, no_agent, set_config

REMINDER = "明天早上九点提醒我给银行打电话"  # the message of every bad add: refused for the schedule or the key only
KIRITIMATI = "Pacific/Kiritimati"  # UTC+14: the last day of year 9999 there is past datetime's range


def add(*schedule: str, message: str = REMINDER, session: str = "telegram:42") -> list[str]:
    return ["cron", "add", *schedule, "--message", message, "--session", session]


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    assert "Traceback" not in caplog.text
    assert [record.getMessage() for record in caplog.records if record.exc_info] == []


def record(job_id: str, schedule: dict[str, Any], next_run: str | None, *, target: str = "telegram:42",
           text: str = "千年之后 a thousand years on") -> dict[str, Any]:
    """A job as jobs.json holds it: written by hand, or by a version that did not check what this one does."""
    return {"id": job_id, "schedule": schedule, "action": "message", "text": text, "target": target,
            "created_by": "cli", "scope": None, "created_at": "2025-03-01T00:00:00Z", "next_run": next_run,
            "last_run": None, "last_outcome": None, "enabled": True}


# What `cron add --at 9999-12-31T23:59` stored in Asia/Shanghai before it was refused.
FAR = record("far0far0", {"at": "9999-12-31T15:59:00Z"}, "9999-12-31T15:59:00Z")
# Due a minute before NOW, and no run can follow: 30 February never comes; 10¹² s is 31,700 years on.
FEB_30 = record("feb30fe0", {"cron": "0 0 30 2 *"}, "2025-03-10T01:59:00Z", text="二月三十日 Feb 30")
EONS = record("e0e0e0e0", {"every": 10**12}, "2025-03-10T01:59:00Z", text="每万年 every eon")
LONG_KEY = record("10ng10ng", {"every": 3600}, "2025-03-10T03:00:00Z", target="cli:" + "x" * 300)


def write_jobs(home: Path, *jobs: dict[str, Any]) -> bytes:
    """Add `jobs` to jobs.json after those already there; the file's bytes."""
    path = jobs_file(home)
    data = orjson.loads(path.read_bytes()) if path.exists() else {"version": 1, "jobs": []}
    data["jobs"].extend(jobs)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    return path.read_bytes()


# -- refused at add time --------------------------------------------------------------------------------------

BAD_ADDS = [
    pytest.param(add("--in", "9999999 days"), "at most 100 years", id="in-9999999-days"),
    pytest.param(add("--in", "99999999999 minutes"), "at most 100 years", id="in-99999999999-minutes"),
    pytest.param(add("--in", "9" * 400 + " minutes"), "at most 100 years", id="in-infinite"),
    pytest.param(add("--in", "99999999999分钟后"), "at most 100 years", id="in-zh-huge"),
    pytest.param(add("--at", "9999-12-31T23:59:59-12:00"), "outside the range of dates", id="at-9999-minus-12"),
    pytest.param(add("--at", "9999-12-31T23:59"), "at most 100 years", id="at-9999"),
    pytest.param(add("--at", "0001-01-01T00:00+14:00"), "outside the range of dates", id="at-year-1-plus-14"),
    pytest.param(add("--at", "2026-12-01\x00T09:00"), "cannot read", id="at-nul"),
    pytest.param(add("--cron", "0 0 30 2 *"), "matches no date", id="cron-feb-30"),
    pytest.param(add("--cron", "0 0 31 4,6,9,11 *"), "matches no date", id="cron-31st-of-short-months"),
    pytest.param(add("--cron", "*/0 * * * *"), "not valid", id="cron-step-zero"),
    pytest.param(add("--cron", "0 8 * * 1\x00"), "not valid", id="cron-nul"),
    pytest.param(add("--cron", ",".join(["0"] * 100_000) + " * * * *"), "too long", id="cron-huge"),
    pytest.param(add("--every", "9" * 30), "--every", id="every-huge"),
    pytest.param(add("--every", "-3600"), "--every", id="every-negative"),
    pytest.param(add("--every", "0"), "--every", id="every-zero"),
    pytest.param(add("--every", "3600", session="telegram:" + "9" * 5000), "Telegram id", id="session-5000-nines"),
    pytest.param(add("--every", "3600", session="telegram:9223372036854775808"), "64 bits", id="chat-over-64-bits"),
    pytest.param(add("--every", "3600", session="telegram:-100:9223372036854775808"), "64 bits",
                 id="user-over-64-bits"),
    pytest.param(add("--every", "3600", session="telegram:042"), "leading zeros", id="chat-leading-zero"),
    pytest.param(add("--every", "3600", session="telegram:٤٢"), "not a session key", id="chat-arabic-digits"),
    pytest.param(add("--every", "3600", session="cli:" + "x" * 300), "too long", id="session-cli-300"),
    pytest.param(add("--every", "3600", session="cli:" + "会" * 21), "too long", id="session-cli-zh-67-bytes"),
    pytest.param(add("--every", "3600", session="cli:work\n"), "not a session key", id="session-newline"),
    pytest.param(add("--every", "3600", session="cli:a\x00b"), "not a session key", id="session-nul"),
    pytest.param(add("--every", "3600", message="\x1b[31m\x07\x00"), "empty", id="message-only-controls"),
]


@pytest.mark.parametrize(("argv", "needle"), BAD_ADDS)
def test_cli_refuses_in_one_line_exit_2_and_writes_nothing(home: Path, capsys: pytest.CaptureFixture[str],
                                                           caplog: pytest.LogCaptureFixture, argv: list[str],
                                                           needle: str) -> None:
    with freeze_time(NOW):
        assert main(add("--every", "3600", message="喝水 drink water")) == 0
        before = jobs_file(home).read_bytes()
        capsys.readouterr()
        with caplog.at_level(logging.DEBUG):
            code = main(argv)
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err
    assert err.count("\n") == 1 and err.startswith("picoclaw: error: ") and needle in err, err
    assert "Traceback" not in err and len(err) < 600
    no_traceback(caplog)
    assert jobs_file(home).read_bytes() == before


def test_cli_refuses_without_making_the_cron_folder(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with freeze_time(NOW):
        assert main(add("--every", "3600", message="x" * 5000)) == 2  # longer than a job's text may be
        assert main(["cron", "remove", "0badc0de"]) == 2
    assert "4000" in capsys.readouterr().err
    assert not jobs_file(home).parent.exists()


def test_cli_accepts_up_to_the_limits(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with freeze_time(NOW):
        for argv in (add("--every", "3600", session="cli:" + "会" * 20),  # 64 bytes in UTF-8
                     add("--every", "3600", session="telegram:-9223372036854775808"),
                     add("--every", "3600", session="telegram:-100:9223372036854775807"),
                     add("--in", "36500 days"),
                     add("--at", "2124-01-01T00:00"),
                     add("--cron", "0 0 29 2 *"),  # comes once in four years
                     add("--every", str(366 * 86400), message="a\x1b[31mred\x07 红色")):
            assert main(argv) == 0, capsys.readouterr().err
    jobs = stored(home)
    assert [job["target"] for job in jobs][:3] == ["cli:" + "会" * 20, "telegram:-9223372036854775808",
                                                  "telegram:-100:9223372036854775807"]
    assert jobs[-1]["text"] == "ared 红色"  # delivered to a chat or a terminal: no escape sequence kept


TOOL_BAD_ADDS = [
    pytest.param({"in": "9999999 days"}, "at most 100 years", id="in-9999999-days"),
    pytest.param({"in": "99999999999 minutes"}, "at most 100 years", id="in-99999999999-minutes"),
    pytest.param({"at": "9999-12-31T23:59:59-12:00"}, "outside the range of dates", id="at-9999-minus-12"),
    pytest.param({"at": "9999-12-31T23:59"}, "at most 100 years", id="at-9999"),
    pytest.param({"cron": "0 0 30 2 *"}, "matches no date", id="cron-feb-30"),
    pytest.param({"every": 10**18}, "at most 31622400", id="every-huge"),
    pytest.param({"every": 99_999_999_999}, "at most 31622400", id="every-overflow"),
]


@pytest.mark.parametrize(("schedule", "needle"), TOOL_BAD_ADDS)
def test_the_tool_gets_a_refusal_it_can_act_on(workspace: Workspace, caplog: pytest.LogCaptureFixture,
                                               schedule: dict[str, Any], needle: str) -> None:
    tools = build_tools(workspace)
    with freeze_time(NOW):
        assert call(tools, OWNER, action="add", every=3600, message="喝水").startswith("added job ")
        before = (workspace.root / "cron" / "jobs.json").read_bytes()
        with caplog.at_level(logging.DEBUG):
            result = call(tools, OWNER, action="add", message=REMINDER, **schedule)
    assert result.startswith("error: ") and needle in result and "\n" not in result, result
    assert "failed" not in result and "Error" not in result  # no exception's name: a reason, and what is allowed
    no_traceback(caplog)
    assert (workspace.root / "cron" / "jobs.json").read_bytes() == before


def test_the_tool_refuses_a_chat_whose_key_cannot_be_delivered(workspace: Workspace) -> None:
    tools = build_tools(workspace)
    with freeze_time(NOW):
        result = call(tools, "cli:" + "长" * 30, action="add", in_="20 minutes", message=REMINDER)
    assert result.startswith("error: the session key") and "at most 64" in result, result
    assert not (workspace.root / "cron" / "jobs.json").exists()


# -- a stored job that can never run breaks nothing -----------------------------------------------------------


def test_a_far_job_is_listed_marked_after_the_timezone_moves_to_kiritimati(home: Path,
                                                                           capsys: pytest.CaptureFixture[str],
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    with freeze_time(NOW):
        assert main(add("--cron", "0 8 * * 1", message="周一例会 Monday meeting")) == 0
        before = write_jobs(home, FAR, FEB_30, LONG_KEY)
        set_config(home, timezone=KIRITIMATI)
        capsys.readouterr()
        with caplog.at_level(logging.DEBUG):
            assert main(["cron", "list"]) == 0
            out, err = capsys.readouterr()
            chat_list = call(build_tools(App.open(home).workspace), "telegram:42", action="list")
    assert err == "" and jobs_file(home).read_bytes() == before
    good, far, feb30, long_key = out.splitlines()
    assert "cron 0 8 * * 1  next 2025-03-17 14:00 +14" in good and "周一例会" in good
    assert far.startswith("far0far0  at 9999-12-31 15:59 UTC  off  telegram:42") and "千年之后" in far
    assert "[cannot be scheduled: its next run, 9999-12-31 15:59 UTC, is outside the dates of Pacific/Kiritimati]" \
        in far
    assert "off" in feb30 and "[cannot be scheduled: cron expression '0 0 30 2 *' matches no date" in feb30
    assert "off" in long_key and "cannot be scheduled: the session key 'cli:xxx" in long_key
    # The chat's own list (the model's cron tool) shows them too, in the same lines, so the model can tell the user.
    assert chat_list.splitlines() == [good, far, feb30]
    no_traceback(caplog)
    with freeze_time(NOW):
        assert main(["cron", "remove", "far0far0"]) == 0
    assert "removed job far0far0 (at 9999-12-31 15:59 UTC for telegram:42)" in capsys.readouterr().out
    assert [job["id"] for job in stored(home)][1:] == ["feb30fe0", "10ng10ng"]


def test_the_scheduler_skips_a_job_that_can_never_run_with_one_warning(home: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    set_config(home, timezone=KIRITIMATI)
    jobs = App.open(home).jobs()
    delivered = Delivered()
    waits: list[float] = []
    with freeze_time(NOW, real_asyncio=True):
        write_jobs(home, FAR, FEB_30, EONS, record("9009d009", {"every": 3600}, "2025-03-10T01:59:00Z",
                                                   text="喝水 drink water"))
        bad_before = [job for job in stored(home) if job["id"] != "9009d009"]

        async def sleep(seconds: float) -> None:
            waits.append(seconds)
            await scheduler.stop()

        scheduler = Scheduler(jobs, no_agent, delivered, poll_interval=3600, sleep=sleep, storage=jobs.storage)
        with caplog.at_level(logging.WARNING, logger="picoclaw.jobs.runner"):
            asyncio.run(scheduler.run())
            asyncio.run(scheduler.run_due())  # another pass: nothing runs, nothing is said again
    assert delivered.sent == [("telegram:42", "喝水 drink water")]
    assert waits == [3540]  # until the good job's next run: the skipped ones, due long ago, do not spin the loop
    assert [job for job in stored(home) if job["id"] != "9009d009"] == bad_before  # left as they are
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3 and all("cannot be scheduled" in warning for warning in warnings), warnings
    assert sorted(warning.split()[2] for warning in warnings) == ["e0e0e0e0", "far0far0", "feb30fe0"]
    no_traceback(caplog)


def test_a_hand_edited_date_beyond_the_calendar_is_one_line(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An instant not even UTC can hold cannot be kept as a job: the file is reported (and kept), as any
    malformed jobs.json is, rather than a traceback."""
    before = write_jobs(home, record("b0b0b0b0", {"at": "9999-12-31T23:59:00-12:00"}, "9999-12-31T23:59:00-12:00"))
    assert main(["cron", "list"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(jobs_file(home)) in err and "outside the range of dates" in err, err
    assert jobs_file(home).read_bytes() == before


def test_a_jobs_file_too_big_to_be_right_is_refused_unread(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jobs_file(home).parent.mkdir(parents=True)
    jobs_file(home).write_bytes(b'{"jobs": []}' + b" " * (16 << 20))  # the wrong file, or one gone wild
    with freeze_time(NOW):
        assert main(["cron", "list"]) == 1
        assert main(add("--every", "3600")) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(str(jobs_file(home)) in line and "larger than 16 MiB" in line for line in err), err
    assert jobs_file(home).stat().st_size == 12 + (16 << 20)
