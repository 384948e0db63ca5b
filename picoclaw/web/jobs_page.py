"""The jobs page: reminders and recurring tasks (schedule, next run, target, last outcome), added and removed
through the job store as `picoclaw cron` adds and removes them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from aiohttp import web

from picoclaw.web.render import APP_KEY, render, see_other

if TYPE_CHECKING:
    from picoclaw.app import App

WHEN_KINDS = ("in", "at", "every", "cron")


@dataclass(frozen=True)
class JobView:
    """A job as the page shows it."""

    id: str
    schedule: str
    next_run: str
    target: str
    action: str
    text: str
    last_outcome: str
    problem: str


def _jobs(app: App) -> list[JobView]:
    from picoclaw.jobs import job_problem

    jobs = app.jobs()
    views = []
    for job in jobs.load():
        next_run = "" if job.next_run is None else f"{job.next_run.astimezone(jobs.tz):%Y-%m-%d %H:%M %Z}"
        views.append(JobView(job.id, job.schedule.describe(jobs.tz), next_run if job.enabled else "",
                             job.target, job.action, job.text, job.last_outcome or "",
                             job_problem(job, jobs.tz) or ""))
    return views


async def jobs_page(request: web.Request, *, error: str = "", status: int = 200) -> web.Response:
    """Every job of the workspace, and a form to add one."""
    app = request.app[APP_KEY]
    jobs = await asyncio.to_thread(_jobs, app)
    return render(request, "jobs.html", status=status, jobs=jobs, error=error, kinds=WHEN_KINDS,
                  notice=request.query.get("notice", ""))


async def add_job(request: web.Request) -> web.Response:
    """Add a job from the form through the CLI's own `schedule_job`; a bad schedule or target adds nothing."""
    from picoclaw.cli.command import UsageError
    from picoclaw.cli.cron import schedule_job

    form = await request.post()
    kind, when = str(form.get("kind", "")), str(form.get("when", "")).strip()
    action: Literal["message", "agent"] = "agent" if form.get("action") == "agent" else "message"
    text, session = str(form.get("text", "")).strip(), str(form.get("session", "")).strip()
    if kind not in WHEN_KINDS or not when:
        return await jobs_page(request, error="say when: in, at, every (seconds) or cron", status=400)
    every = None
    if kind == "every":
        try:
            every = int(when)
        except ValueError:
            return await jobs_page(request, error=f"every takes a number of seconds, not {when!r}", status=400)
    app = request.app[APP_KEY]
    try:
        await asyncio.to_thread(lambda: schedule_job(
            app, at=when if kind == "at" else None, in_=when if kind == "in" else None, every=every,
            cron=when if kind == "cron" else None, action=action, text=text, session=session, created_by="web"))
    except UsageError as exc:
        return await jobs_page(request, error=str(exc), status=400)
    return see_other("/jobs?notice=job_added")


async def remove_job(request: web.Request) -> web.Response:
    """Remove the job the form names."""
    from picoclaw.jobs import JobError

    job_id = str((await request.post()).get("id", ""))
    jobs = request.app[APP_KEY].jobs()
    try:
        await asyncio.to_thread(jobs.remove, job_id)
    except JobError as exc:
        return await jobs_page(request, error=str(exc), status=404)
    return see_other("/jobs?notice=job_removed")
