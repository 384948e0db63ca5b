"""Scheduled jobs, in one home: reminders and recurring tasks, their schedules, the file, and the runner.

- `model`: a `Job` and its `Schedule` as jobs.json holds them, and the limits a new job is checked against;
- `schedule`: schedules read from what people type (`--in/--at/--cron/--every`), first and following runs,
  and why a stored job can never run (`job_problem`);
- `store`: `JobStore`, the file under a cross-process lock;
- `session_jobs`: a job added (or edited) for a session, checked and put in that session's memory scope, the one way
  `picoclaw cron add`, the console's jobs page and the `cron` tool add one;
- `listing`: `job_line`, a job as the one line every list shows;
- `runner`: `Scheduler`, which fires due jobs and the heartbeat beside a channel.

The `cron` tool (tools/cron.py) and `picoclaw cron` are faces over these names; import them from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from picoclaw.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from picoclaw.jobs.listing import job_line
    from picoclaw.jobs.model import (
        MAX_EVERY_SECONDS,
        MIN_EVERY_SECONDS,
        Action,
        Job,
        JobError,
        JobsFileError,
        Schedule,
        format_seconds,
        in_zone,
    )
    from picoclaw.jobs.runner import (
        HEARTBEAT_QUIET,
        INTERRUPTED,
        POLL_INTERVAL,
        RUNNING,
        AgentFor,
        Outbox,
        Ran,
        Scheduler,
        SessionAgent,
        Sleep,
        TurnReply,
        heartbeat_tasks,
    )
    from picoclaw.jobs.schedule import (
        cron_after,
        first_run,
        following_run,
        job_problem,
        make_schedule,
        parse_at,
        parse_relative,
    )
    from picoclaw.jobs.session_jobs import add_session_job, edit_session_job, job_scope
    from picoclaw.jobs.store import JobStore

__getattr__, __dir__ = lazy_exports(__name__)
