"""The model's `cron` tool: driven by the fake model it creates a job that then fires; it only ever sees and
removes the current chat's (and, per user, the current user's) jobs."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
from freezegun import freeze_time

from picoclaw.app import App
from picoclaw.memory.workspace import Workspace
from picoclaw.tools.base import ToolRegistry, current_session
from picoclaw.tools.registry import build_tools
from tests.agent_helpers import make_provider
from tests.fakes import FakeOpenAIServer
from tests.test_scheduler import NOW, Delivered, set_config, utc

OWNER = "telegram:42"
STRANGER = "telegram:666"


def call(tools: ToolRegistry, session: str | None, **arguments: Any) -> str:
    async def run() -> str:
        if session is not None:
            current_session.set(session)
        return await tools.execute("cron", orjson.dumps(arguments).decode())
    return asyncio.run(run())


def test_the_model_sets_a_reminder_that_then_fires(home: Path, fake_openai: FakeOpenAIServer) -> None:
    base = App.open(home)
    workspace = base.workspace
    app = App(base.config, home, make_provider=lambda _config: make_provider(workspace, fake_openai))
    fake_openai.reply_tool_calls([("cron", {"action": "add", "in": "20 minutes", "message": "给银行打电话"})])
    fake_openai.reply_text("好的，20 分钟后提醒你。")
    delivered = Delivered()
    with freeze_time(NOW, real_asyncio=True) as frozen:
        async def turn() -> str:
            async with app:
                return (await app.agent().handle(OWNER, "20分钟后提醒我给银行打电话")).text
        assert asyncio.run(turn()) == "好的，20 分钟后提醒你。"
        tool_result = fake_openai.chat_requests()[1]["messages"][-1]
        assert tool_result["role"] == "tool" and tool_result["content"].startswith("added job ")
        [job] = app.jobs().load()
        assert (job.target, job.created_by, job.scope, job.action) == (OWNER, OWNER, None, "message")
        assert job.next_run == utc("2025-03-10 02:20")

        scheduler = app.scheduler(delivered)
        frozen.tick(timedelta(minutes=19))
        asyncio.run(scheduler.run_due())
        assert delivered.sent == []
        frozen.tick(timedelta(minutes=1))
        asyncio.run(scheduler.run_due())
    assert delivered.sent == [(OWNER, "给银行打电话")]
    assert len(fake_openai.chat_requests()) == 2  # a message job costs no model call


def test_a_stranger_cannot_list_or_remove_another_chats_jobs(workspace: Workspace) -> None:
    tools = build_tools(workspace)
    with freeze_time(NOW):
        added = call(tools, OWNER, action="add", cron="0 8 * * 1", prompt="summarise this week's notes")
        job_id = added.split()[2].rstrip(":")
        before = (workspace.root / "cron" / "jobs.json").read_bytes()
        assert call(tools, STRANGER, action="list") == "this chat has no scheduled jobs"
        assert call(tools, STRANGER, action="remove", id=job_id) == f"error: no job with id '{job_id}'"
        assert (workspace.root / "cron" / "jobs.json").read_bytes() == before
        assert f"{job_id}  cron 0 8 * * 1" in call(tools, OWNER, action="list")
        assert call(tools, OWNER, action="remove", id=job_id).startswith(f"removed job {job_id}")
        assert call(tools, OWNER, action="list") == "this chat has no scheduled jobs"


def test_per_user_scopes_see_only_their_own_jobs(home: Path) -> None:
    set_config(home, channels={"telegram": {"memory_scope": "per_user"}})
    workspace = App.open(home).workspace
    # In a group with per-user memory each member talks in a session of their own, served by their own agent.
    alice_key, bob_key = "telegram:-100500:7", "telegram:-100500:8"
    alice, bob = build_tools(workspace.for_user("7")), build_tools(workspace.for_user("8"))
    with freeze_time(NOW):
        added = call(alice, alice_key, action="add", every=3600, message="drink water 喝水")
        job_id = added.split()[2].rstrip(":")
        [job] = App.open(workspace.home).jobs().load()
        assert job.scope == "7"
        assert call(bob, bob_key, action="list") == "this chat has no scheduled jobs"  # same chat, another user
        assert call(bob, bob_key, action="remove", id=job_id).startswith("error: no job")
        assert call(build_tools(workspace), "telegram:-100500", action="list") == "this chat has no scheduled jobs"
        assert "drink water 喝水" in call(alice, alice_key, action="list")


def test_bad_calls_are_clear_errors_and_write_nothing(workspace: Workspace) -> None:
    tools = build_tools(workspace)
    with freeze_time(NOW):
        assert call(tools, None, action="list") == "error: cron works only inside a chat session"
        assert "exactly one of message" in call(tools, OWNER, action="add", every=3600)
        assert "exactly one schedule" in call(tools, OWNER, action="add", message="x")
        assert "in the past" in call(tools, OWNER, action="add", at="2025-03-10T09:00", message="x")
        assert "5 fields" in call(tools, OWNER, action="add", cron="every monday", message="x")
        assert "at least 60" in call(tools, OWNER, action="add", every=5, message="x")
    assert not (workspace.root / "cron" / "jobs.json").exists()


def test_file_tools_can_neither_write_nor_read_the_jobs(workspace: Workspace) -> None:
    tools = build_tools(workspace)
    result = asyncio.run(tools.execute("write_file", orjson.dumps(
        {"path": "cron/jobs.json", "content": "{}"}).decode()))
    assert result.startswith("error:") and "cron tool" in result
    assert not (workspace.root / "cron" / "jobs.json").exists()
    with freeze_time(NOW):
        call(tools, OWNER, action="add", in_="1 hour", message="secret plan 秘密计划")
    for name, path in (("read_file", "cron/jobs.json"), ("list_dir", "cron")):
        shown = asyncio.run(tools.execute(name, orjson.dumps({"path": path}).decode()))
        assert shown.startswith("error:") and "cron tool" in shown and "秘密计划" not in shown
