"""A job as one line of text, the same wherever jobs are listed: `picoclaw cron list` and `cron add`, and the
model's `cron` tool. (The console's jobs page lays the same job out as a table row, with the same schedule
phrase, `Schedule.describe`, and the same reason a job cannot run, `job_problem`.)"""

from __future__ import annotations

from datetime import tzinfo

from picoclaw.jobs.model import Job, in_zone
from picoclaw.jobs.schedule import job_problem
from picoclaw.printable import printable
from picoclaw.session_key import CLI, channel_of

TEXT_SHOWN = 60  # characters of the job's text: enough to tell jobs apart, short enough for one terminal line


def job_line(job: Job, tz: tzinfo) -> str:
    """`id  schedule  state  target  action: text  [last outcome]`, freed of escape sequences. The state is `next`
    and the time in `tz`, `done`, or `off`: switched off, or a stored job that can never run, whose reason then
    stands in the brackets."""
    problem = job_problem(job, tz)
    if problem is not None or not job.enabled:
        state = "off"
    elif job.next_run is None:
        state = "done"
    else:
        state = f"next {in_zone(job.next_run, tz, '%Y-%m-%d %H:%M %Z')}"
    text = " ".join(printable(job.text).split())  # cut what will be seen, not escape sequences
    text = text if len(text) <= TEXT_SHOWN else text[:TEXT_SHOWN - 1] + "…"
    last = f"cannot be scheduled: {problem}" if problem is not None else job.last_outcome or "not run yet"
    if problem is None and channel_of(job.target) == CLI and job.enabled and job.next_run is not None:
        # Only an open REPL delivers terminal jobs: `chat -m` runs none, so the user should know to open one.
        last += "; comes in an open `picoclaw chat`, not `chat -m`"
    return printable(f"{job.id}  {job.schedule.describe(tz)}  {state}  {job.target}  {job.action}: {text}  [{last}]")
