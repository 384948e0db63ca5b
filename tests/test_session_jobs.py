"""A job has one home: `picoclaw cron add`, the console's jobs page and the model's cron tool add a job for a
session through `add_session_job`, so the same job lands in the same memory scope, and `cron list` and the tool
show it in the same line (`job_line`), which the console's row agrees with. English and Chinese."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from picoclaw.app import App
from picoclaw.cli import main
from picoclaw.jobs import JobError, add_session_job, job_line, job_scope
from picoclaw.tools.registry import build_tools
from tests.fakes.console import console_of, csrf_of, logged_in
from tests.test_cron_tool import call
from tests.test_scheduler import set_config

# One member's own conversation in a group with per-user memory: served by user 7's agent.
MEMBER = "telegram:-100500:7"
# Fixed, so the next run does not depend on when the test runs (within the 100 years a job may be ahead).
AT = "2099-12-01T09:00"


@pytest.mark.parametrize("text", ["call the bank about the card", "给银行打电话问信用卡的事"], ids=["en", "zh"])
def test_the_cli_the_console_and_the_tool_give_a_job_the_same_scope_and_line(
        home: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    set_config(home, channels={"telegram": {"memory_scope": "per_user"}})
    assert main(["cron", "add", "--at", AT, "--message", text, "--session", MEMBER]) == 0
    cli_added = capsys.readouterr().out.splitlines()[1]
    with console_of(home) as console:
        client = logged_in(console)
        added = client.post("/jobs", data={"kind": "at", "when": AT, "action": "message", "session": MEMBER,
                                           "text": text, "csrf_token": csrf_of(client.get("/jobs").text)})
        assert added.status_code == 303, added.text
        # The tool in the member's own agent, and in the shared one (`picoclaw chat --session telegram:…`).
        workspace = App.open(home).workspace
        member_tools, shared_tools = build_tools(workspace.for_user("7")), build_tools(workspace)
        for tools in (member_tools, shared_tools):
            assert call(tools, MEMBER, action="add", at=AT, message=text).startswith("added job ")
        jobs = App.open(home).jobs()
        listed = jobs.load()
        pages = {language: client.get("/jobs", headers={"Accept-Language": language}).text
                 for language in ("en", "zh-CN")}

    assert [job.created_by for job in listed] == ["cli", "web", MEMBER, MEMBER]
    assert {job.scope for job in listed} == {"7"} == {job_scope(MEMBER, "per_user")}
    lines = [job_line(job, jobs.tz) for job in listed]
    # The same line but for the id.
    assert {line.removeprefix(f"{job.id}  ") for line, job in zip(lines, listed, strict=True)} == {
        f"at 2099-12-01 09:00  next 2099-12-01 09:00 CST  {MEMBER}  message: {text}  [not run yet]"}
    assert cli_added == lines[0]
    assert main(["cron", "list"]) == 0
    assert capsys.readouterr().out.splitlines() == lines
    assert call(member_tools, MEMBER, action="list") == call(shared_tools, MEMBER, action="list") == "\n".join(lines)
    for language, page in pages.items():
        for job in listed:
            row = re.search(rf'<tr id="job-{job.id}".*?</tr>', page, re.DOTALL)
            assert row is not None, language
            shown = html.unescape(row.group(0))
            # The line's schedule phrase, next run (the zone is named once, beside the table), target and text.
            assert all(part in shown for part in (job.schedule.describe(jobs.tz), "2099-12-01 09:00", MEMBER, text))


@pytest.mark.parametrize(("text", "session", "problem"), [
    ("call the bank", "whatsapp:1", "is not a session key"),
    ("给银行打电话", "telegram:042", "is not a Telegram id"),
    ("   ", "telegram:42", "is empty"),
], ids=["en-bad-target", "zh-bad-target", "empty"])
def test_a_refused_job_is_one_line_of_the_jobs_layer_and_nothing_is_written(home: Path, text: str, session: str,
                                                                             problem: str) -> None:
    jobs = App.open(home).jobs()
    with pytest.raises(JobError) as refused:
        add_session_job(jobs, session, memory_scope="per_user", in_="2 hours", action="message", text=text,
                        created_by="test")
    assert problem in str(refused.value) and "\n" not in str(refused.value)
    assert not jobs.path.exists()


def test_the_scope_is_the_sessions_whoever_adds_the_job() -> None:
    assert job_scope("telegram:42", "per_user") == "42"  # a private chat: its user's own memory
    assert job_scope("telegram:-100500:t3:7", "per_user") == "7"  # a member's own, in a forum topic
    assert job_scope("telegram:42", "shared") is None
    assert job_scope("cli:默认", "per_user") is None and job_scope("web:console", "per_user") is None
