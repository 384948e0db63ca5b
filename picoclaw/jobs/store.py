"""The jobs of a workspace, `cron/jobs.json` (or its rows on PostgreSQL): read, changed atomically, claimed.

The workspace's storage keeps them (picoclaw.storage: the file under a `filelock` lock, or rows
in PostgreSQL transactions), so the bot, the CLI and the model's tool, on one machine or several, can all
add and remove jobs at once, and `claim` gives each due run to one scheduler. A malformed file is one clear
error naming it, and is never overwritten.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Hashable
from datetime import timedelta, tzinfo
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from picoclaw import clock
from picoclaw.jobs.model import Action, Job, JobError, JobsFileError, Schedule
from picoclaw.jobs.schedule import check_moment, first_run
from picoclaw.printable import printable
from picoclaw.pydantic_errors import describe_error, quote
from picoclaw.session_key import SessionKey
from picoclaw.storage import JOBS_VERSION, JobsDocument, JobTable, Storage, StorageError

log = logging.getLogger(__name__)

T = TypeVar("T")

# A one-time job that has run stays listed (with its outcome) this long, then is pruned on the next write.
KEEP_DONE = timedelta(days=7)
FILE_VERSION = JOBS_VERSION
ID_BYTES = 4  # 8 hex digits: short enough to type, and checked against the ids in use


class JobsFile(BaseModel):
    """jobs.json as a whole."""

    model_config = ConfigDict(extra="forbid")

    version: int = FILE_VERSION
    jobs: list[Job] = []


class JobStore:
    """The jobs of a workspace (jobs.json, or the rows standing for it): read, changed atomically under the
    backend's lock, and due runs claimed; `storage` is the workspace's backend."""

    def __init__(self, path: Path, tz: tzinfo, *, storage: Storage):
        self.path = Path(path)
        self.tz = tz
        self.storage = storage
        self.lock_path = self.path.with_name(f".{self.path.name}.lock")

    @property
    def table(self) -> JobTable:
        """Where the jobs are kept: the storage's table for `path`."""
        return self.storage.job_table(self.path)

    def load(self) -> list[Job]:
        """Every job ([] when there is none); JobsFileError, one line naming the file (or table), if malformed."""
        table = self.table
        return self._jobs(_stored(table.read), table.where)

    def _jobs(self, data: Any, where: str) -> list[Job]:
        if data is None:
            return []
        try:
            return JobsFile.model_validate(data).jobs
        except ValidationError as exc:
            raise JobsFileError(f"{where}: {describe_error(JobsFile, exc)}; fix the job or remove it, "
                                "the file is left unchanged") from None

    def stamp(self) -> Hashable | None:
        """Changes whenever the stored jobs change (None: none stored): the runner re-reads only then."""
        return _stored(self.table.stamp)

    def get(self, job_id: str) -> Job | None:
        return next((job for job in self.load() if job.id == job_id), None)

    def change(self, edit: Callable[[list[Job]], T]) -> T:
        """Run `edit` on the jobs under the lock and write them back if they changed; returns its result."""
        table = self.table

        def apply(data: Any) -> tuple[JobsDocument | None, T]:
            jobs = self._jobs(data, table.where)
            before = [job.model_copy(deep=True) for job in jobs]
            result = edit(jobs)
            now = clock.now()
            # A one-time job that ran is dropped a while later; one switched off stays until it is removed.
            jobs[:] = [job for job in jobs if not (job.next_run is None and job.last_run is not None
                                                    and now - job.last_run > KEEP_DONE)]
            if jobs != before:
                return JobsFile(jobs=jobs).model_dump(mode="json"), result
            return None, result

        return _stored(lambda: table.change(apply))

    def claim(self, job_id: str, take: Callable[[Job], bool]) -> Job | None:
        """Take the due run of `job_id` for this process (`take` moves its next run on and returns True),
        or None: not due, changed meanwhile, or taken by another scheduler, on this machine or another."""
        table = self.table

        def take_record(record: dict[str, Any]) -> dict[str, Any] | None:
            job = self._jobs({"jobs": [record]}, table.where)[0]
            return job.model_dump(mode="json") if take(job) else None

        taken = _stored(lambda: table.claim(job_id, clock.now(), take_record))
        return None if taken is None else Job.model_validate(taken)

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
        if not _stored(self.table.exists):  # nothing to remove: no lock file, no folder made for it
            raise JobError(f"no job with id {quote(job_id)}")

        def drop(jobs: list[Job]) -> Job:
            for index, job in enumerate(jobs):
                if job.id == job_id and allowed(job):
                    return jobs.pop(index)
            raise JobError(f"no job with id {quote(job_id)}")

        return self.change(drop)

    def edit(self, job_id: str, schedule: Schedule, action: Action, text: str, target: str, *,
             scope: str | None = None) -> Job:
        """Give a job a new schedule, action, text and target, checked as `add` checks them; a new schedule starts
        from now. JobError, and nothing written, when there is no such job or a value is refused."""
        cleaned = printable(text).strip()
        if not cleaned:
            raise JobError(f"the {'message' if action == 'message' else 'agent prompt'} is empty")
        try:
            SessionKey.parse(target)
        except ValueError as exc:
            raise JobError(str(exc)) from None
        now = clock.now()

        def apply(jobs: list[Job]) -> Job:
            for index, job in enumerate(jobs):
                if job.id != job_id:
                    continue
                moved = job.schedule != schedule
                if moved and schedule.at is not None:
                    check_moment(schedule.at, now, self.tz)
                try:
                    edited = Job.model_validate({**job.model_dump(), "schedule": schedule, "action": action,
                                                 "text": cleaned, "target": target, "scope": scope,
                                                 "next_run": first_run(schedule, now, self.tz) if moved
                                                 else job.next_run})
                except ValidationError as exc:
                    raise JobError(describe_error(Job, exc)) from None
                jobs[index] = edited
                return edited
            raise JobError(f"no job with id {quote(job_id)}")

        job = self.change(apply)
        log.info("cron: edited job %s (%s, %s) for %s", job.id, schedule.describe(self.tz), action, target)
        return job

    def set_enabled(self, job_id: str, enabled: bool) -> Job:
        """Switch a job on or off. Switched on again, a recurring job's next run is its next one from now (the
        runs it missed while off are not made up); a one-time job whose moment passed stays done."""
        now = clock.now()

        def apply(jobs: list[Job]) -> Job:
            job = next((job for job in jobs if job.id == job_id), None)
            if job is None:
                raise JobError(f"no job with id {quote(job_id)}")
            if enabled and not job.enabled and job.schedule.at is None and job.next_run is not None \
                    and job.next_run <= now:
                job.next_run = first_run(job.schedule, now, self.tz)
            job.enabled = enabled
            return job

        return self.change(apply)

    def run_now(self, job_id: str) -> Job:
        """Make a job due now: a scheduler that serves its target runs it at its next look, and a recurring job
        then goes on with its schedule. JobError for no such job or one switched off."""
        now = clock.now()

        def apply(jobs: list[Job]) -> Job:
            job = next((job for job in jobs if job.id == job_id), None)
            if job is None:
                raise JobError(f"no job with id {quote(job_id)}")
            if not job.enabled:
                raise JobError(f"job {job.id} is switched off: switch it on first")
            job.next_run = now
            return job

        return self.change(apply)

    def update(self, job_id: str, edit: Callable[[Job], bool]) -> Job | None:
        """Apply `edit` to the job with `job_id` (it returns False to leave the job as it is)."""
        def apply(jobs: list[Job]) -> Job | None:
            for job in jobs:
                if job.id == job_id:
                    return job if edit(job) else None
            return None

        return self.change(apply)


def _stored(call: Callable[[], T]) -> T:
    """`call()` on the jobs' storage; what it could not do is a JobsFileError (the one error of the jobs
    kept: the runner logs it and goes on, the CLI and the tool show its line)."""
    try:
        return call()
    except StorageError as exc:
        raise JobsFileError(str(exc)) from None
