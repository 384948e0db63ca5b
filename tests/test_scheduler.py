"""The scheduler (picoclaw/jobs/runner.py), driven step by step under frozen time: jobs fire at their
instants, restarts neither lose nor repeat a job, failures are recorded, and the heartbeat."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
from freezegun import freeze_time

from picoclaw.app import App
from picoclaw.config import Config, parse_config
from picoclaw.errors import ConfigError
from picoclaw.jobs import HEARTBEAT_QUIET, INTERRUPTED, RUNNING, JobStore, Scheduler, heartbeat_tasks, make_schedule
from picoclaw.onboard import template_paths
from tests.agent_helpers import make_provider, said
from tests.fakes import FakeOpenAIServer
from tests.homes import edit_config

T = TypeVar("T")
NOW = "2025-03-10 02:00:00"  # 10:00 in Shanghai, the test homes' timezone (tests/zones.py)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


class Delivered:
    """The channel the scheduler delivers to: records (session key, text); fails for the keys in `failing`."""

    name = "telegram"  # the channel whose sessions App.scheduler serves by default

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self.at: list[datetime] = []
        self.failing: set[str] = set()

    async def deliver(self, key: str, text: str) -> None:
        if key in self.failing:
            raise RuntimeError(f"chat {key} is gone")
        self.sent.append((key, text))
        self.at.append(datetime.now(UTC))


def set_config(home: Path, **changes: Any) -> None:
    with edit_config(home) as config:
        config.update(changes)


def open_app(home: Path, model: FakeOpenAIServer | None = None) -> App:
    app = App.open(home)
    if model is not None:
        workspace = app.workspace
        app = App(app.config, home, make_provider=lambda _config: make_provider(workspace, model))
    return app


@dataclass(frozen=True)
class Outbox:
    """A channel whose `deliver` is the function given."""

    deliver: Callable[[str, str], Awaitable[None]]


def no_agent(scope: str | None) -> Any:
    raise AssertionError("a message job must not need an agent")


def scheduler_of(jobs: JobStore, outbox: Any, **options: Any) -> Scheduler:
    """A scheduler of `jobs` for message jobs only, on the jobs' own storage (as App builds one)."""
    return Scheduler(jobs, no_agent, outbox, storage=jobs.storage, **options)


def in_loop(body: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(body())


def stored(app: App) -> dict[str, dict[str, Any]]:
    return {job["id"]: job for job in orjson.loads(app.jobs().path.read_bytes())["jobs"]}


# -- jobs fire at their instants ------------------------------------------------------------------------------


def test_one_time_interval_and_cron_jobs_fire_at_their_instants_in_shanghai(home: Path) -> None:
    app = open_app(home)
    jobs = app.jobs()
    delivered = Delivered()
    scheduler = scheduler_of(jobs, delivered)
    with freeze_time(NOW, real_asyncio=True) as frozen:
        once = jobs.add(make_schedule(at="2025-03-10T11:30", tz=jobs.tz), "message", "给银行打电话", "telegram:1")
        hourly = jobs.add(make_schedule(every=3600, tz=jobs.tz), "message", "stretch", "telegram:2")
        noon = jobs.add(make_schedule(cron="0 12 * * *", tz=jobs.tz), "message", "lunch", "telegram:3")

        def step(when: str) -> list[str]:
            frozen.move_to(when)
            before = len(delivered.sent)
            in_loop(scheduler.run_due)
            return [text for _, text in delivered.sent[before:]]

        assert step("2025-03-10 02:59:59") == []
        assert step("2025-03-10 03:00:00") == ["stretch"]
        assert step("2025-03-10 03:29:59") == []
        assert step("2025-03-10 03:30:00") == ["给银行打电话"]  # 11:30 Shanghai
        assert step("2025-03-10 03:59:59") == []
        assert sorted(step("2025-03-10 04:00:00")) == ["lunch", "stretch"]  # 12:00 Shanghai; two chats at once
        assert step("2025-03-10 04:00:30") == []
        assert step("2025-03-11 03:59:59") == ["stretch"]  # missed hours: once, not 23 times
        assert step("2025-03-11 04:00:00") == ["lunch"]
    assert delivered.sent[1] == ("telegram:1", "给银行打电话")
    after = stored(app)
    assert after[once.id]["next_run"] is None and after[once.id]["last_outcome"] == "ok"
    assert after[hourly.id]["last_outcome"] == "late"  # the run a day after its hour
    assert after[noon.id]["next_run"] == "2025-03-12T04:00:00Z" and after[noon.id]["last_outcome"] == "ok"


def test_a_daily_job_across_berlin_dst_changes(home: Path) -> None:
    set_config(home, timezone="Europe/Berlin")
    app = open_app(home)
    jobs = app.jobs()
    delivered = Delivered()
    scheduler = scheduler_of(jobs, delivered)
    with freeze_time("2026-03-27 12:00:00", real_asyncio=True) as frozen:
        jobs.add(make_schedule(cron="30 7 * * *", tz=jobs.tz), "message", "Guten Morgen", "telegram:1")
        for day in ("2026-03-28", "2026-03-29", "2026-03-30"):
            for hour in range(0, 24):
                frozen.move_to(f"{day} {hour:02}:30:00")
                in_loop(scheduler.run_due)
    # 07:30 CET is 06:30 UTC; from 29 March, 07:30 CEST is 05:30 UTC.
    assert delivered.at == [utc("2026-03-28 06:30"), utc("2026-03-29 05:30"), utc("2026-03-30 05:30")]


def test_the_run_loop_sleeps_exactly_until_the_next_job(home: Path) -> None:
    app = open_app(home)
    jobs = app.jobs()
    delivered = Delivered()
    waits: list[float] = []
    with freeze_time(NOW, real_asyncio=True) as frozen:
        jobs.add(make_schedule(in_="90 minutes", tz=jobs.tz), "message", "tea", "telegram:1")

        async def sleep(seconds: float) -> None:
            waits.append(seconds)
            frozen.tick(timedelta(seconds=seconds))
            if delivered.sent:
                await scheduler.stop()

        scheduler = scheduler_of(jobs, delivered, poll_interval=3600, sleep=sleep)
        in_loop(scheduler.run)
    assert waits == [3600, 1800, 3600]  # an hour (the poll), the half hour left, then polling again
    assert delivered.sent == [("telegram:1", "tea")] and delivered.at == [utc("2025-03-10 03:30")]


# -- restarts --------------------------------------------------------------------------------------------------


def test_a_job_due_while_down_runs_once_at_start_marked_late(home: Path) -> None:
    app = open_app(home)
    jobs = app.jobs()
    with freeze_time(NOW, real_asyncio=True) as frozen:
        once = jobs.add(make_schedule(in_="10 minutes", tz=jobs.tz), "message", "while you were away", "telegram:1")
        daily = jobs.add(make_schedule(cron="0 9 * * *", tz=jobs.tz), "message", "daily", "telegram:1")
        frozen.move_to("2025-03-13 02:00:00")  # the bot was down for three days
        first, second = Delivered(), Delivered()
        ran = in_loop(scheduler_of(jobs, first).run_due)
        assert sorted(r.outcome for r in ran) == ["late", "late"]
        assert sorted(first.sent) == [("telegram:1", "daily"), ("telegram:1", "while you were away")]
        in_loop(scheduler_of(JobStore(jobs.path, jobs.tz, storage=jobs.storage), second).run_due)  # restarted again
        assert second.sent == []
    after = stored(app)
    assert after[once.id]["next_run"] is None and after[once.id]["last_outcome"] == "late"
    assert after[daily.id]["next_run"] == "2025-03-14T01:00:00Z"  # from now on, not the missed days


def test_a_one_time_job_is_marked_run_before_it_is_delivered(home: Path) -> None:
    app = open_app(home)
    jobs = app.jobs()
    seen: list[dict[str, Any]] = []

    async def crash(key: str, text: str) -> None:
        seen.append(stored(app)[job.id])  # what is on disk while the message goes out
        raise KeyboardInterrupt  # the process dies here: not an Exception, nothing catches it

    with freeze_time(NOW, real_asyncio=True) as frozen:
        job = jobs.add(make_schedule(in_="1 minute", tz=jobs.tz), "message", "once", "telegram:1")
        frozen.tick(timedelta(minutes=1))
        with pytest.raises(KeyboardInterrupt):
            in_loop(scheduler_of(jobs, Outbox(crash)).run_due)
        assert seen[0]["next_run"] is None and seen[0]["last_outcome"] == RUNNING
        delivered = Delivered()
        restarted = scheduler_of(jobs, delivered, sleep=lambda s: restarted.stop())
        in_loop(restarted.run)
    assert delivered.sent == []  # never twice
    assert stored(app)[job.id]["last_outcome"] == INTERRUPTED


def test_a_terminal_chat_starting_leaves_the_bots_running_job_alone(home: Path) -> None:
    """Only a process that serves a session may call its job interrupted: the bot may be running it now."""
    app = open_app(home)
    jobs = app.jobs()
    with freeze_time(NOW, real_asyncio=True):
        job = jobs.add(make_schedule(in_="1 minute", tz=jobs.tz), "agent", "summarise", "telegram:1")
        jobs.update(job.id, lambda stored: setattr(stored, "last_outcome", RUNNING) or True)
        repl = scheduler_of(jobs, Delivered(), channels=("cli:default",), sleep=lambda s: repl.stop())
        in_loop(repl.run)
    assert stored(app)[job.id]["last_outcome"] == RUNNING


# -- removal, failures, a broken file ---------------------------------------------------------------------------


def test_removing_a_job_stops_it(home: Path) -> None:
    app = open_app(home)
    jobs = app.jobs()
    delivered = Delivered()
    scheduler = scheduler_of(jobs, delivered)
    with freeze_time(NOW, real_asyncio=True) as frozen:
        job = jobs.add(make_schedule(every=600, tz=jobs.tz), "message", "ping", "telegram:1")
        frozen.tick(timedelta(minutes=10))
        in_loop(scheduler.run_due)
        # As `picoclaw cron remove` does, from another process.
        JobStore(jobs.path, jobs.tz, storage=jobs.storage).remove(job.id)
        for _ in range(3):
            frozen.tick(timedelta(minutes=10))
            in_loop(scheduler.run_due)
    assert delivered.sent == [("telegram:1", "ping")]


def test_a_failing_job_is_recorded_and_the_others_still_run(home: Path, caplog: pytest.LogCaptureFixture) -> None:
    app = open_app(home)
    jobs = app.jobs()
    delivered = Delivered()
    delivered.failing.add("telegram:1")
    with freeze_time(NOW, real_asyncio=True) as frozen:
        bad = jobs.add(make_schedule(in_="1 minute", tz=jobs.tz), "message", "lost", "telegram:1")
        good = jobs.add(make_schedule(in_="1 minute", tz=jobs.tz), "message", "fine", "telegram:2")
        skipped = jobs.add(make_schedule(in_="1 minute", tz=jobs.tz), "message", "terminal", "cli:default")
        frozen.tick(timedelta(minutes=1))
        with caplog.at_level(logging.ERROR, logger="picoclaw.jobs.runner"):
            in_loop(scheduler_of(jobs, delivered).run_due)
    assert delivered.sent == [("telegram:2", "fine")]
    after = stored(app)
    assert after[bad.id]["last_outcome"] == "error: RuntimeError: chat telegram:1 is gone"
    assert after[bad.id]["next_run"] is None  # not retried: the outcome says what happened
    assert after[good.id]["last_outcome"] == "ok"
    assert "job " + bad.id + " failed" in caplog.text
    # A cli: job is not this (telegram) scheduler's: left as it was for `picoclaw chat` to deliver.
    assert after[skipped.id]["last_outcome"] is None and after[skipped.id]["next_run"] == "2025-03-10T02:01:00Z"


def test_a_scheduler_delivers_only_the_sessions_it_serves_and_leaves_the_rest_as_they_are(home: Path) -> None:
    app = open_app(home)
    jobs = app.jobs()
    with freeze_time(NOW, real_asyncio=True) as frozen:
        mine = jobs.add(make_schedule(in_="1 minute", tz=jobs.tz), "message", "你的提醒", "cli:default")
        other = jobs.add(make_schedule(in_="1 minute", tz=jobs.tz), "message", "not yours", "cli:work")
        chat = jobs.add(make_schedule(in_="1 minute", tz=jobs.tz), "message", "bot's", "telegram:1")
        frozen.tick(timedelta(minutes=1))
        terminal, bot = Delivered(), Delivered()
        repl = scheduler_of(jobs, terminal, channels=("cli:default",))
        assert [r.job_id for r in in_loop(repl.run_due)] == [mine.id]
        assert repl._seconds_to_wait() > 0  # the jobs it leaves do not keep it spinning
        assert [r.job_id for r in in_loop(scheduler_of(jobs, bot).run_due)] == [chat.id]
    assert terminal.sent == [("cli:default", "你的提醒")] and bot.sent == [("telegram:1", "bot's")]
    assert stored(app)[other.id]["last_outcome"] is None


def test_a_slow_job_holds_up_no_other_job_due_at_the_same_time(home: Path) -> None:
    app = open_app(home)
    jobs = app.jobs()
    sent: list[str] = []

    async def deliver(key: str, text: str) -> None:
        if key == "telegram:1":  # this chat's delivery waits until the other chat's has gone out
            while "fast" not in sent:
                await asyncio.sleep(0.01)
        sent.append(text)

    with freeze_time(NOW, real_asyncio=True) as frozen:
        jobs.add(make_schedule(in_="1 minute", tz=jobs.tz), "message", "slow", "telegram:1")
        jobs.add(make_schedule(in_="1 minute", tz=jobs.tz), "message", "fast", "telegram:2")
        frozen.tick(timedelta(minutes=1))

        async def body() -> list[str]:
            ran = await asyncio.wait_for(scheduler_of(jobs, Outbox(deliver)).run_due(), 60)
            return [r.outcome for r in ran]
        assert in_loop(body) == ["ok", "ok"]
    assert sent == ["fast", "slow"]


def test_a_malformed_jobs_file_runs_nothing_and_stays_as_it_is(home: Path, caplog: pytest.LogCaptureFixture
                                                               ) -> None:
    app = open_app(home)
    jobs = app.jobs()
    delivered = Delivered()
    scheduler = scheduler_of(jobs, delivered)
    with freeze_time(NOW, real_asyncio=True) as frozen:
        jobs.add(make_schedule(in_="1 minute", tz=jobs.tz), "message", "hello", "telegram:1")
        in_loop(scheduler.run_due)  # the last good state
        good = jobs.path.read_bytes()
        broken = good.replace(b'"message"', b'"shout"')  # a hand edit gone wrong
        jobs.path.write_bytes(broken)
        frozen.tick(timedelta(minutes=1))
        with caplog.at_level(logging.ERROR, logger="picoclaw.jobs.runner"):
            in_loop(scheduler.run_due)
            in_loop(scheduler.run_due)
        assert delivered.sent == [] and jobs.path.read_bytes() == broken
        assert caplog.text.count(str(jobs.path)) == 1  # one clear line, not one per poll
        jobs.path.write_bytes(good)  # fixed
        in_loop(scheduler.run_due)
    assert delivered.sent == [("telegram:1", "hello")]


# -- agent jobs -------------------------------------------------------------------------------------------------


def test_an_agent_job_runs_as_a_turn_of_its_session_and_the_reply_is_delivered(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    app = open_app(home, fake_openai)
    jobs = app.jobs()
    delivered = Delivered()
    fake_openai.reply_text("本周：买了咖啡豆，约了牙医。")
    with freeze_time(NOW, real_asyncio=True) as frozen:
        jobs.add(make_schedule(cron="0 11 * * 1", tz=jobs.tz), "agent", "总结我这周的笔记", "telegram:42")
        frozen.move_to("2025-03-10 03:00:00")

        async def body() -> None:
            async with app:
                await app.scheduler(delivered).run_due()
        in_loop(body)
    assert delivered.sent == [("telegram:42", "本周：买了咖啡豆，约了牙医。")]
    [request] = fake_openai.chat_requests()
    asked = said(request["messages"][-1])
    assert "总结我这周的笔记" in asked and "Scheduled task" in asked
    # A small model narrates a bare task ("stood up and stretched."): the frame asks for the user's message.
    assert "answer with the message the user should read now" in asked
    history = App.open(home).workspace.sessions().load("telegram:42")
    assert [m.message["role"] for m in history.active()] == ["user", "assistant"]


# -- heartbeat --------------------------------------------------------------------------------------------------


def enable_heartbeat(home: Path, **settings: Any) -> None:
    set_config(home, heartbeat={"enabled": True, "interval_minutes": 30, "session": "telegram:42", **settings})


def beat(home: Path, model: FakeOpenAIServer, delivered: Delivered) -> str | None:
    app = open_app(home, model)

    async def body() -> str | None:
        async with app:
            return await app.scheduler(delivered).beat()
    with freeze_time(NOW, real_asyncio=True):
        return in_loop(body)


@pytest.mark.parametrize("content", [None, "", "\n\n", "# Heartbeat\n\n## Tasks\n<!-- nothing yet -->\n"],
                         ids=["missing", "empty", "blank", "headings-and-comments"])
def test_a_heartbeat_without_tasks_makes_no_model_call(home: Path, fake_openai: FakeOpenAIServer,
                                                       content: str | None) -> None:
    enable_heartbeat(home)
    path = home / "workspace" / "HEARTBEAT.md"
    path.unlink(missing_ok=True)
    if content is not None:
        path.write_text(content, encoding="utf-8")
    delivered = Delivered()
    assert beat(home, fake_openai, delivered) is None
    assert fake_openai.chat_requests() == [] and delivered.sent == []


def test_the_shipped_heartbeat_file_lists_no_tasks(home: Path, fake_openai: FakeOpenAIServer) -> None:
    template = template_paths()[0] / "HEARTBEAT.md"
    assert template.is_file() and (home / "workspace" / "HEARTBEAT.md").read_bytes() == template.read_bytes()
    assert "- " in template.read_text(encoding="utf-8")  # an example is there, inside a comment
    assert heartbeat_tasks(template.read_text(encoding="utf-8")) == ""
    enable_heartbeat(home)
    assert beat(home, fake_openai, Delivered()) is None
    assert fake_openai.chat_requests() == []


def test_a_heartbeat_with_tasks_is_one_turn_of_the_owners_session(home: Path, fake_openai: FakeOpenAIServer
                                                                  ) -> None:
    enable_heartbeat(home)
    (home / "workspace" / "HEARTBEAT.md").write_text(
        "# Heartbeat\n<!-- standing tasks -->\n- 检查今天的日记里有没有待办事项\n", encoding="utf-8")
    fake_openai.reply_text("你今天还要给牙医打电话。")
    delivered = Delivered()
    assert beat(home, fake_openai, delivered) == "你今天还要给牙医打电话。"
    assert delivered.sent == [("telegram:42", "你今天还要给牙医打电话。")]
    [request] = fake_openai.chat_requests()
    asked = said(request["messages"][-1])
    assert "检查今天的日记里有没有待办事项" in asked and "Periodic check" in asked
    assert "standing tasks -->" not in asked and "# Heartbeat" not in asked


@pytest.mark.parametrize("answer", [HEARTBEAT_QUIET, "", f"All fine. {HEARTBEAT_QUIET}"],
                         ids=["quiet", "empty", "quiet-at-the-end"])
def test_a_heartbeat_with_nothing_to_say_sends_nothing(home: Path, fake_openai: FakeOpenAIServer,
                                                       answer: str) -> None:
    enable_heartbeat(home)
    (home / "workspace" / "HEARTBEAT.md").write_text("- check the weather for rain\n", encoding="utf-8")
    fake_openai.reply_text(answer)
    delivered = Delivered()
    assert beat(home, fake_openai, delivered) is None
    assert len(fake_openai.chat_requests()) == 1 and delivered.sent == []


@pytest.mark.parametrize("task", ["- check the weather for rain", "- 看看今天会不会下雨"], ids=["english", "chinese"])
def test_an_empty_heartbeat_answer_is_quiet_asked_once_with_no_error_and_nothing_stored(
        home: Path, fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture, task: str) -> None:
    # The frame asks for silence when nothing is due: an empty answer is that, not a failure to ask again.
    enable_heartbeat(home)
    (home / "workspace" / "HEARTBEAT.md").write_text(f"{task}\n", encoding="utf-8")
    fake_openai.reply_text("\n")
    fake_openai.reply_text("It will rain at noon. 中午有雨。")  # what a try would have said: never asked
    delivered = Delivered()
    with caplog.at_level(logging.INFO):
        assert beat(home, fake_openai, delivered) is None
    assert len(fake_openai.chat_requests()) == 1 and delivered.sent == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert "scheduler: heartbeat: nothing to report" in [r.getMessage() for r in caplog.records]
    assert App.open(home).workspace.sessions().load("telegram:42").active() == []


def test_an_agent_job_the_model_never_answers_delivers_one_line_that_fits_a_task(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    app = open_app(home, fake_openai)
    jobs = app.jobs()
    delivered = Delivered()
    for empty in ("", "\n", " "):
        fake_openai.reply_text(empty)
    with freeze_time(NOW, real_asyncio=True) as frozen:
        job = jobs.add(make_schedule(cron="0 11 * * 1", tz=jobs.tz), "agent", "总结我这周的笔记", "telegram:42")
        frozen.move_to("2025-03-10 03:00:00")

        async def body() -> None:
            async with app:
                await app.scheduler(delivered).run_due()
        in_loop(body)
    line = "Sorry, the model returned no answer, also when asked twice more without tools."
    assert delivered.sent == [("telegram:42", line)]  # no "your message": nobody typed one
    assert len(fake_openai.chat_requests()) == 3
    assert stored(app)[job.id]["last_outcome"] == f"error: {line[len('Sorry, '):-1]}"
    assert App.open(home).workspace.sessions().load("telegram:42").active() == []

def test_a_heartbeat_for_a_session_this_process_does_not_serve_makes_no_model_call(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    enable_heartbeat(home, session="cli:default")  # `picoclaw chat` beats for it, not the bot
    (home / "workspace" / "HEARTBEAT.md").write_text("- look at the calendar\n", encoding="utf-8")
    delivered = Delivered()
    assert beat(home, fake_openai, delivered) is None
    assert fake_openai.chat_requests() == [] and delivered.sent == []


def test_a_heartbeat_session_no_channel_delivers_to_makes_no_model_call_and_says_so_once(
        home: Path, fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    # Older versions accepted it in config.json, but "042" would run in another session than chat 42's own.
    enable_heartbeat(home, session="telegram:042")
    (home / "workspace" / "HEARTBEAT.md").write_text("- 看看日历 look at the calendar\n", encoding="utf-8")
    delivered = Delivered()
    app = open_app(home, fake_openai)

    async def body() -> list[str | None]:
        async with app:
            scheduler = app.scheduler(delivered)
            return [await scheduler.beat(), await scheduler.beat()]
    with caplog.at_level(logging.ERROR, logger="picoclaw.jobs.runner"), freeze_time(NOW, real_asyncio=True):
        assert in_loop(body) == [None, None]
    assert fake_openai.chat_requests() == [] and delivered.sent == []
    errors = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert errors == ["scheduler: heartbeat: no turn runs until heartbeat.session is fixed: '042' in "
                      "'telegram:042' is not a Telegram id (a whole number without leading zeros that fits in 64 bits)"]


def test_the_heartbeat_beats_on_its_interval(home: Path, fake_openai: FakeOpenAIServer) -> None:
    enable_heartbeat(home, interval_minutes=5)
    (home / "workspace" / "HEARTBEAT.md").write_text("- look at the calendar\n", encoding="utf-8")
    for _ in range(2):
        fake_openai.reply_text("Meeting at 11.")
    delivered = Delivered()
    app = open_app(home, fake_openai)
    with freeze_time(NOW, real_asyncio=True) as frozen:
        async def sleep(seconds: float) -> None:
            frozen.tick(timedelta(seconds=seconds))
            if len(delivered.sent) == 2:
                await scheduler.stop()

        scheduler = app.scheduler(delivered, poll_interval=3600, sleep=sleep)

        async def body() -> None:
            async with app:
                await scheduler.run()
        in_loop(body)
    assert delivered.at == [utc("2025-03-10 02:05"), utc("2025-03-10 02:10")]


def test_of_two_workers_whose_heartbeat_falls_due_one_beats_and_a_terminal_never_takes_its_turn(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    enable_heartbeat(home)  # every 30 minutes, for telegram:42
    (home / "workspace" / "HEARTBEAT.md").write_text("- 看看日历 look at the calendar\n", encoding="utf-8")
    fake_openai.responder = lambda body: "Meeting at 11. / 十一点开会。"
    delivered = [Delivered(), Delivered()]

    async def body(at: str) -> list[str | None]:
        terminal, first, second = (open_app(home, fake_openai) for _ in range(3))  # three processes, one workspace
        with freeze_time(at, real_asyncio=True):
            async with terminal, first, second:
                # A `picoclaw chat` scheduler serves cli:default only: it must not use up the interval.
                return [await terminal.scheduler(Delivered(), channels=("cli:default",)).beat(),
                        await first.scheduler(delivered[0]).beat(), await second.scheduler(delivered[1]).beat()]
    assert in_loop(lambda: body(NOW)) == [None, "Meeting at 11. / 十一点开会。", None]
    assert in_loop(lambda: body("2025-03-10 02:20:00")) == [None, None, None]  # within the interval: no one
    assert in_loop(lambda: body("2025-03-10 02:30:00")) == [None, "Meeting at 11. / 十一点开会。", None]
    assert len(fake_openai.chat_requests()) == 2 and delivered[1].sent == []


def config_with(heartbeat: dict[str, Any]) -> Config:
    return parse_config({"heartbeat": heartbeat}, "config.json")


def test_heartbeat_settings_are_validated() -> None:
    assert config_with({}).heartbeat.enabled is False
    five = config_with({"enabled": True, "interval_minutes": 5, "session": "telegram:1"})
    assert five.heartbeat.interval_minutes == 5
    with pytest.raises(ConfigError, match="heartbeat.interval_minutes") as caught:
        config_with({"enabled": True, "interval_minutes": 4, "session": "telegram:1"})
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="heartbeat.session is required"):
        config_with({"enabled": True})
    with pytest.raises(ConfigError, match="not a session key"):
        config_with({"session": "my chat"})
    with pytest.raises(ConfigError, match="unknown key"):
        config_with({"interval": 30})
