"""The jobs page: reminders and recurring tasks (schedule, next and last run in the configured zone, named as
IANA names it, target, last outcome), added, edited, switched off and on, run now and removed through the job
store, as `picoclaw cron` adds and removes them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web

from picoclaw.web.render import APP_KEY, render, see_other

if TYPE_CHECKING:
    from picoclaw.app import App
    from picoclaw.jobs import Job, Scheduler

WHEN_KINDS = ("in", "at", "every", "cron")
# The schedulers this console runs (`serve`'s, for the web: conversations): poked when a job is made due now.
SCHEDULERS_KEY: web.AppKey[list[Scheduler]] = web.AppKey("picoclaw_schedulers", list)


@dataclass(frozen=True)
class JobView:
    """A job as the page shows it, with its schedule as the edit form takes it back."""

    id: str
    schedule: str
    next_run: str
    last_run: str
    target: str
    action: str
    text: str
    last_outcome: str
    problem: str
    enabled: bool
    kind: str
    when: str


def shown_time(moment: datetime | None, tz: tzinfo) -> str:
    """A stored instant in the configured zone, to the minute (the zone is named once, beside the table)."""
    return "" if moment is None else f"{moment.astimezone(tz):%Y-%m-%d %H:%M}"


def _when(job: Job, tz: tzinfo) -> tuple[str, str]:
    """The job's schedule as the form's kind and text: `at` in the zone, `every` in seconds, `cron` as written."""
    schedule = job.schedule
    if schedule.at is not None:
        return "at", f"{schedule.at.astimezone(tz):%Y-%m-%dT%H:%M}"
    if schedule.every is not None:
        return "every", str(schedule.every)
    return "cron", schedule.cron or ""


def _jobs(app: App) -> list[JobView]:
    from picoclaw.jobs import job_problem

    jobs = app.jobs()
    views = []
    for job in jobs.load():
        kind, when = _when(job, jobs.tz)
        views.append(JobView(job.id, job.schedule.describe(jobs.tz),
                             shown_time(job.next_run, jobs.tz) if job.enabled else "",
                             shown_time(job.last_run, jobs.tz), job.target, job.action, job.text,
                             job.last_outcome or "", job_problem(job, jobs.tz) or "", job.enabled, kind, when))
    return views


async def jobs_page(request: web.Request, *, error: str = "", status: int = 200) -> web.Response:
    """Every job of the workspace, each with its edit form and switches, and a form to add one."""
    from picoclaw.clock import describe_timezone

    app = request.app[APP_KEY]
    jobs = await asyncio.to_thread(_jobs, app)
    return render(request, "jobs.html", status=status, jobs=jobs, error=error, kinds=WHEN_KINDS,
                  notice=request.query.get("notice", ""), zone=describe_timezone(app.config.timezone))


def _schedule_of(form: Any) -> tuple[dict[str, Any], str]:
    """make_schedule's keyword arguments from the form's kind and when, or why they cannot be."""
    kind, when = str(form.get("kind", "")), str(form.get("when", "")).strip()
    if kind not in WHEN_KINDS or not when:
        return {}, "say when: in, at, every (seconds) or cron"
    if kind == "every":
        try:
            return {"every": int(when)}, ""
        except ValueError:
            return {}, f"every takes a number of seconds, not {when!r}"
    return {{"in": "in_"}.get(kind, kind): when}, ""


async def add_job(request: web.Request) -> web.Response:
    """Add a job from the form as `picoclaw cron add` and the cron tool add one (`add_session_job`); a bad schedule
    or target adds nothing."""
    from picoclaw.jobs import add_session_job

    form = await request.post()
    app = request.app[APP_KEY]
    action: Literal["message", "agent"] = "agent" if form.get("action") == "agent" else "message"
    text, session = str(form.get("text", "")).strip(), str(form.get("session", "")).strip()
    when, problem = _schedule_of(form)
    if problem:
        return await jobs_page(request, error=problem, status=400)
    return await _changed(request, lambda: add_session_job(
        app.jobs(), session, memory_scope=app.config.channels.telegram.memory_scope, **when, action=action,
        text=text, created_by="web"), "job_added")


async def edit_job(request: web.Request) -> web.Response:
    """Give a job a new schedule, action, text or target (checked and scoped as an added one is); nothing written
    if refused."""
    from picoclaw.jobs import edit_session_job

    form = await request.post()
    app = request.app[APP_KEY]
    job_id = str(form.get("id", ""))
    action: Literal["message", "agent"] = "agent" if form.get("action") == "agent" else "message"
    text, session = str(form.get("text", "")), str(form.get("session", "")).strip()
    when, problem = _schedule_of(form)
    if problem:
        return await jobs_page(request, error=problem, status=400)
    return await _changed(request, lambda: edit_session_job(
        app.jobs(), job_id, session, memory_scope=app.config.channels.telegram.memory_scope, **when,
        action=action, text=text), "job_edited")


async def switch_job(request: web.Request) -> web.Response:
    """Switch a job off (it keeps its place and schedule) or on again."""
    form = await request.post()
    job_id, on = str(form.get("id", "")), form.get("enabled") == "1"
    jobs = request.app[APP_KEY].jobs()
    return await _changed(request, lambda: jobs.set_enabled(job_id, on), "job_enabled" if on else "job_disabled")


async def run_job(request: web.Request) -> web.Response:
    """Make a job due now; this console's scheduler (for web: conversations) is told at once, another process's
    sees it at its next look."""
    job_id = str((await request.post()).get("id", ""))
    jobs = request.app[APP_KEY].jobs()
    response = await _changed(request, lambda: jobs.run_now(job_id), "job_due")
    for scheduler in request.app[SCHEDULERS_KEY]:
        scheduler.poke()
    return response


async def remove_job(request: web.Request) -> web.Response:
    """Remove the job the form names."""
    job_id = str((await request.post()).get("id", ""))
    jobs = request.app[APP_KEY].jobs()
    return await _changed(request, lambda: jobs.remove(job_id), "job_removed")


async def _changed(request: web.Request, change: Callable[[], object], notice: str) -> web.Response:
    """Run `change` off the event loop; a JobError is the page again with its one line (404 for a job that is
    not there, else 400), nothing written."""
    from picoclaw.jobs import JobError

    try:
        await asyncio.to_thread(change)
    except JobError as exc:
        return await jobs_page(request, error=str(exc), status=404 if str(exc).startswith("no job") else 400)
    return see_other(f"/jobs?notice={notice}")
