"""The jobs file, `workspace/cron/jobs.json`: read, and changed under a cross-process lock, atomically.

Every change happens under a cross-process file lock and is written atomically, so the bot, the CLI and the
model's tool can all add and remove jobs at once. A malformed file is one clear error naming it, and is
never overwritten.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from datetime import timedelta, tzinfo
from pathlib import Path
from typing import Any, TypeVar

import orjson
from filelock import FileLock
from pydantic import BaseModel, ConfigDict, ValidationError

from picoclaw import clock
from picoclaw.fsutil import FileTooLargeError, NotAFileError, atomic_write, read_bounded
from picoclaw.jobs.model import Action, Job, JobError, JobsFileError, Schedule
from picoclaw.jobs.schedule import check_moment, first_run
from picoclaw.printable import printable
from picoclaw.pydantic_errors import describe_error, quote
from picoclaw.session_key import SessionKey

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_FILE_BYTES = 16 << 20  # thousands of jobs of the longest text; /dev/zero, or the wrong file, is refused at once
# A one-time job that has run stays listed (with its outcome) this long, then is pruned on the next write.
KEEP_DONE = timedelta(days=7)
FILE_VERSION = 1
ID_BYTES = 4  # 8 hex digits: short enough to type, and checked against the ids in use


class JobsFile(BaseModel):
    """jobs.json as a whole."""

    model_config = ConfigDict(extra="forbid")

    version: int = FILE_VERSION
    jobs: list[Job] = []


class JobStore:
    """jobs.json: read, and changed under a cross-process lock (the lock file beside it), atomically."""

    def __init__(self, path: Path, tz: tzinfo):
        self.path = Path(path)
        self.tz = tz
        self.lock_path = self.path.with_name(f".{self.path.name}.lock")

    def _lock(self) -> FileLock:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.lock_path))

    def load(self) -> list[Job]:
        """Every job in the file ([] when there is none); JobsFileError, one line naming it, if malformed."""
        try:
            raw = read_bounded(self.path, MAX_FILE_BYTES)
        except FileNotFoundError:
            return []
        except (FileTooLargeError, NotAFileError) as exc:  # a link to /dev/zero, a FIFO: refused, not read
            raise JobsFileError(f"{exc}; it is left unchanged") from None
        except OSError as exc:
            raise JobsFileError(f"{self.path}: cannot read ({exc.strerror})") from None
        if not raw.strip():
            return []
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise JobsFileError(f"{self.path}: not valid JSON ({exc.msg}); fix or remove the file, "
                                "it is left unchanged") from None
        try:
            return JobsFile.model_validate(data).jobs
        except ValidationError as exc:
            raise JobsFileError(f"{self.path}: {describe_error(JobsFile, exc)}; fix the job or remove it, "
                                "the file is left unchanged") from None

    def get(self, job_id: str) -> Job | None:
        return next((job for job in self.load() if job.id == job_id), None)

    def change(self, edit: Callable[[list[Job]], T]) -> T:
        """Run `edit` on the jobs under the lock and write them back if they changed; returns its result."""
        with self._lock():
            jobs = self.load()
            before = [job.model_copy(deep=True) for job in jobs]
            result = edit(jobs)
            now = clock.now()
            jobs[:] = [job for job in jobs if not (job.done and job.last_run is not None
                                                    and now - job.last_run > KEEP_DONE)]
            if jobs != before:
                self._write(jobs)
            return result

    def _write(self, jobs: list[Job]) -> None:
        data: dict[str, Any] = JobsFile(jobs=jobs).model_dump(mode="json")
        atomic_write(self.path, orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")

    def add(self, schedule: Schedule, action: Action, text: str, target: str, *, created_by: str = "cli",
            scope: str | None = None) -> Job:
        """A new job, written at once; its first run is computed from the schedule now."""
        # Shown in chats and terminals when due: escape sequences and control characters are not kept.
        cleaned = printable(text).strip()
        if not cleaned:
            raise JobError(f"the {'message' if action == 'message' else 'agent prompt'} is empty"
                           + (" once control characters are removed" if text.strip() else ""))
        now = clock.now()
        try:
            SessionKey.parse(target)
        except ValueError as exc:
            raise JobError(str(exc)) from None
        if schedule.at is not None:
            check_moment(schedule.at, now, self.tz)
        try:  # checked whole before the file (or its folder) is touched; the id is drawn under the lock
            draft = Job(id="-", schedule=schedule, action=action, text=cleaned, target=target,
                        created_by=created_by, scope=scope, created_at=now, next_run=first_run(schedule, now, self.tz))
        except ValidationError as exc:
            raise JobError(describe_error(Job, exc)) from None

        def insert(jobs: list[Job]) -> Job:
            taken = {job.id for job in jobs}
            job_id = secrets.token_hex(ID_BYTES)
            while job_id in taken:
                job_id = secrets.token_hex(ID_BYTES)
            job = draft.model_copy(update={"id": job_id})
            jobs.append(job)
            return job

        job = self.change(insert)
        log.info("cron: added job %s (%s, %s) for %s", job.id, schedule.describe(self.tz), action, target)
        return job

    def remove(self, job_id: str, *, allowed: Callable[[Job], bool] = lambda job: True) -> Job:
        """Delete a job; JobError when there is none with that id (or `allowed` says it is not theirs)."""
        if not self.path.exists():  # nothing to remove: no lock file, no folder made for it
            raise JobError(f"no job with id {quote(job_id)}")

        def drop(jobs: list[Job]) -> Job:
            for index, job in enumerate(jobs):
                if job.id == job_id and allowed(job):
                    return jobs.pop(index)
            raise JobError(f"no job with id {quote(job_id)}")

        return self.change(drop)

    def update(self, job_id: str, edit: Callable[[Job], bool]) -> Job | None:
        """Apply `edit` to the job with `job_id` (it returns False to leave the job as it is)."""
        def apply(jobs: list[Job]) -> Job | None:
            for job in jobs:
                if job.id == job_id:
                    return job if edit(job) else None
            return None

        return self.change(apply)
