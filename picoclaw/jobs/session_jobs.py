"""A job for a session, made the one way every face makes it (`picoclaw cron add`, the console's jobs page, the
model's `cron` tool): the target checked, the schedule read from what was typed, and the job put in the memory
scope of the session it is for.

The scope rule (`job_scope`) is the one by which the Telegram channel and the heartbeat pick the agent serving a
session: a job made anywhere for a chat is seen, removed and run by that chat's own agent.
"""

from __future__ import annotations

from picoclaw.jobs.model import Action, Job, JobError
from picoclaw.jobs.schedule import make_schedule
from picoclaw.jobs.store import JobStore
from picoclaw.session_key import SessionKey


def job_scope(session: str, memory_scope: str) -> str | None:
    """The memory scope a job for `session` belongs to: None (the shared memory), or the user key of the
    per-user scope serving that session; JobError, one line, for a key no channel delivers to."""
    try:
        return SessionKey.parse(session).scope(memory_scope)
    except ValueError as exc:
        raise JobError(str(exc)) from None


def add_session_job(jobs: JobStore, session: str, *, memory_scope: str, action: Action, text: str,
                    created_by: str, at: str | None = None, in_: str | None = None, every: int | None = None,
                    cron: str | None = None) -> Job:
    """Add a job for `session` on exactly one of `at`, `in_`, `every` (seconds) or `cron`, in the session's
    scope under `memory_scope` (the config's `channels.telegram.memory_scope`). JobError, one line and nothing
    written, for a bad target, schedule or text."""
    scope = job_scope(session, memory_scope)
    schedule = make_schedule(at=at, in_=in_, every=every, cron=cron, tz=jobs.tz)
    return jobs.add(schedule, action, text, session, created_by=created_by, scope=scope)


def edit_session_job(jobs: JobStore, job_id: str, session: str, *, memory_scope: str, action: Action, text: str,
                     at: str | None = None, in_: str | None = None, every: int | None = None,
                     cron: str | None = None) -> Job:
    """Give job `job_id` a new schedule, action, text and target, checked and scoped as `add_session_job` does;
    JobError, nothing written, when refused or there is no such job."""
    scope = job_scope(session, memory_scope)
    schedule = make_schedule(at=at, in_=in_, every=every, cron=cron, tz=jobs.tz)
    return jobs.edit(job_id, schedule, action, text, session, scope=scope)
