"""cron: the model sets, lists and removes reminders and recurring tasks for the chat it is talking in.

Every job the tool touches belongs to the current session (the chat of the turn) and to this agent's
memory scope: a chat never sees, nor removes, another chat's jobs, and with memory_scope "per_user" a user
never sees another user's. The process serving the session delivers what comes due: the bot for telegram:
chats, `picoclaw chat` for its own cli: session while it is open (see picoclaw/jobs/runner.py). The jobs
themselves, their schedules and their file are the `picoclaw.jobs` package's: this is a face over it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from picoclaw.errors import PicoclawError
from picoclaw.jobs import MAX_EVERY_SECONDS, Job, JobStore, job_problem, make_schedule
from picoclaw.memory import Workspace
from picoclaw.session_key import CLI, channel_of
from picoclaw.tools.base import ToolError, current_session
from picoclaw.tools.files import WorkspaceTool, os_errors
from picoclaw.tools.sandbox import WorkspaceFiles

MAX_LISTED = 50


class Cron(WorkspaceTool):
    """cron: add / list / remove scheduled jobs of the current chat."""

    name = "cron"
    description = (f"This chat's reminders. add: one of at, in, every (seconds, 60 to {MAX_EVERY_SECONDS}), cron; "
                   "and message (the reminder text) or, only for work to do then, prompt. remove: by id.")

    class Args(BaseModel):
        model_config = ConfigDict(extra="forbid", populate_by_name=True)
        # Plain strings and numbers, empty when not given: simple schemas suit small local models best.
        action: Literal["add", "list", "remove"]
        at: str = Field("", description="e.g. 2026-12-01T09:00")
        in_: str = Field("", alias="in", description="e.g. 20 minutes")
        every: int = Field(0, ge=0)
        cron: str = Field("", description="e.g. 0 8 * * 1")
        message: str = ""
        prompt: str = ""
        id: str = ""

    def __init__(self, workspace: Workspace, files: WorkspaceFiles | None = None):
        super().__init__(workspace, files)
        self.jobs = JobStore(workspace.layout.jobs_path, workspace.tz, storage=workspace.storage)
        self.scope = workspace.layout.scope_dir.name if workspace.layout.is_per_user else None

    def run_sync(self, args: Cron.Args) -> str:
        session = current_session.get()
        if session is None:
            raise ToolError("cron works only inside a chat session")
        try:
            with os_errors("change", "the job list"):
                if args.action == "add":
                    return self._add(args, session)
                if args.action == "remove":
                    if not args.id:
                        raise ToolError("remove needs the id of a job (see action 'list')")
                    job = self.jobs.remove(args.id.strip(), allowed=lambda job: self._ours(job, session))
                    return f"removed job {job.id} ({job.schedule.describe(self.jobs.tz)}: {job.text[:80]})"
                mine = [job for job in self.jobs.load() if self._ours(job, session)]
        except PicoclawError as exc:  # a bad schedule, an unknown id, a malformed jobs.json
            raise ToolError(str(exc)) from None
        if not mine:
            return "this chat has no scheduled jobs"
        lines = [self._line(job) for job in mine[:MAX_LISTED]]
        if len(mine) > MAX_LISTED:
            lines.append(f"… and {len(mine) - MAX_LISTED} more")
        return "\n".join(lines)

    def _ours(self, job: Job, session: str) -> bool:
        return job.target == session and job.scope == self.scope

    def _add(self, args: Cron.Args, session: str) -> str:
        texts = [(kind, text) for kind, text in (("message", args.message), ("agent", args.prompt)) if text]
        if len(texts) != 1:
            raise ToolError("add needs exactly one of message (text to send) or prompt (a task to run)")
        action, text = texts[0]
        schedule = make_schedule(at=args.at or None, in_=args.in_ or None, every=args.every or None,
                                 cron=args.cron or None, tz=self.jobs.tz)
        job = self.jobs.add(schedule, "message" if action == "message" else "agent", text, session,
                            created_by=session, scope=self.scope)
        added = f"added job {job.id}: {self._line(job)}"
        if channel_of(session) == CLI:  # the user should know a closed terminal cannot remind them
            added += (" (delivered while this terminal chat is open, not to a one-shot `picoclaw chat -m`; if it "
                      "is closed then, when it next opens)")
        return added

    def _line(self, job: Job) -> str:
        tz = self.jobs.tz
        problem = job_problem(job, tz)
        if problem is not None:  # listed, so the model can tell the user and remove it
            when = f"cannot be scheduled: {problem}"
        else:
            when = f"next {job.next_run.astimezone(tz):%Y-%m-%d %H:%M %Z}" if job.next_run and job.enabled else "done"
        last = f", last: {job.last_outcome}" if job.last_outcome else ""
        return f"[{job.id}] {job.schedule.describe(tz)} ({when}{last}) {job.action}: {job.text[:200]}"
