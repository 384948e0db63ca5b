"""cron: the model sets, lists and removes reminders and recurring tasks for the chat it is talking in.

Every job the tool touches belongs to the current session (the chat of the turn) and to that session's memory
scope (`job_scope`, as a job added from the CLI or the console gets it): a chat never sees, nor removes, another
chat's jobs, and with memory_scope "per_user" a user never sees another user's. The process serving the session
delivers what comes due: the bot for telegram: chats, `picoclaw chat` for its own cli: session while it is open
(see picoclaw/jobs/runner.py). The jobs themselves, their schedules, their file, how one is added and shown as a
line are the `picoclaw.jobs` package's: this is a face over it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from picoclaw.errors import PicoclawError
from picoclaw.jobs import MAX_EVERY_SECONDS, Job, JobStore, add_session_job, job_line, job_scope
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
        self.memory_scope = workspace.config.channels.telegram.memory_scope

    def run_sync(self, args: Cron.Args) -> str:
        session = current_session.get()
        if session is None:
            raise ToolError("cron works only inside a chat session")
        try:
            with os_errors("change", "the job list"):
                if args.action == "add":
                    return self._add(args, session)
                scope = job_scope(session, self.memory_scope)

                def ours(job: Job) -> bool:
                    return job.target == session and job.scope == scope

                if args.action == "remove":
                    if not args.id:
                        raise ToolError("remove needs the id of a job (see action 'list')")
                    job = self.jobs.remove(args.id.strip(), allowed=ours)
                    return f"removed job {job.id} ({job.schedule.describe(self.jobs.tz)}: {job.text[:80]})"
                mine = [job for job in self.jobs.load() if ours(job)]
        except PicoclawError as exc:  # a bad schedule, an unknown id, a malformed jobs.json
            raise ToolError(str(exc)) from None
        if not mine:
            return "this chat has no scheduled jobs"
        lines = [job_line(job, self.jobs.tz) for job in mine[:MAX_LISTED]]
        if len(mine) > MAX_LISTED:
            lines.append(f"… and {len(mine) - MAX_LISTED} more")
        return "\n".join(lines)

    def _add(self, args: Cron.Args, session: str) -> str:
        texts = [(kind, text) for kind, text in (("message", args.message), ("agent", args.prompt)) if text]
        if len(texts) != 1:
            raise ToolError("add needs exactly one of message (text to send) or prompt (a task to run)")
        action, text = texts[0]
        job = add_session_job(self.jobs, session, memory_scope=self.memory_scope, at=args.at or None,
                              in_=args.in_ or None, every=args.every or None, cron=args.cron or None,
                              action="message" if action == "message" else "agent", text=text, created_by=session)
        added = f"added job {job.id}: {job_line(job, self.jobs.tz)}"
        if channel_of(session) == CLI:  # the user should know a closed terminal cannot remind them
            added += (" (delivered while this terminal chat is open, not to a one-shot `picoclaw chat -m`; if it "
                      "is closed then, when it next opens)")
        return added
