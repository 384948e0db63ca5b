"""Scheduled jobs on disk (`workspace/cron/jobs.json`): reminders and recurring tasks, and their schedules.

A job says when (`at` one instant, `every` N seconds, or a 5-field `cron` expression in the configured
timezone), what (`message`: text sent as is; `agent`: a prompt run as a turn of the target session), and
for whom (the target session key, and the memory scope whose agent runs it). Every change happens under a
cross-process file lock and is written atomically, so the bot, the CLI and the model's tool can all add
and remove jobs at once. A malformed file is one clear error naming it, and is never overwritten.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any, Literal, TypeVar

import orjson
from croniter import CroniterError, croniter
from filelock import FileLock
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from picoclaw import clock
from picoclaw.errors import PicoclawError
from picoclaw.fsutil import FileTooLargeError, NotAFileError, atomic_write, read_bounded
from picoclaw.printable import printable
from picoclaw.pydantic_errors import describe_error, quote

log = logging.getLogger(__name__)

T = TypeVar("T")

# An interval job runs at most once a minute: cron's own resolution. The scheduler notices new jobs by
# polling the file every few seconds, and a sub-minute reminder would flood the chat (and, for an agent
# job, the model bill) faster than anyone reads it.
MIN_EVERY_SECONDS = 60
MAX_EVERY_SECONDS = 366 * 86400  # a longer interval is a one-time job in all but name
# A new job runs within this long: far enough for any reminder, and far enough inside datetime's range (year
# 9999) that its time can be shown in every timezone (UTC-12 to UTC+14) and its next runs computed.
MAX_AHEAD_YEARS = 100
MAX_AHEAD = timedelta(days=MAX_AHEAD_YEARS * 366)
MAX_CRON_CHARS = 200  # croniter takes seconds over an expression of megabytes
# A session key names its transcript file, percent-encoded (at most 3 characters a byte) plus ".jsonl", and
# /new archives it under a name 21 characters longer: 64 bytes keep that well under the usual 255 a name.
MAX_SESSION_KEY_BYTES = 64
TELEGRAM_IDS = range(-(2**63), 2**63)  # Telegram's ids are signed 64-bit integers
MAX_TEXT_CHARS = 4_000
MAX_FILE_BYTES = 16 << 20  # thousands of jobs of the longest text; /dev/zero, or the wrong file, is refused at once
# A one-time job that has run stays listed (with its outcome) this long, then is pruned on the next write.
KEEP_DONE = timedelta(days=7)
FILE_VERSION = 1
ID_BYTES = 4  # 8 hex digits: short enough to type, and checked against the ids in use

Action = Literal["message", "agent"]


class JobError(PicoclawError):
    """A job or schedule given by the user is invalid, or a job asked for does not exist."""


class JobsFileError(PicoclawError):
    """jobs.json cannot be read or is malformed; it is left as it is."""


class Schedule(BaseModel):
    """Exactly one of `at` (an aware instant), `every` (seconds, ≥ 60) or `cron` (5 fields, local time)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: datetime | None = None
    every: int | None = Field(None, ge=MIN_EVERY_SECONDS)
    cron: str | None = None

    @field_validator("at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.utcoffset() is None:
            raise ValueError("must carry a UTC offset, e.g. 2026-12-01T09:00+08:00")
        if value is not None:
            _utc_or_error(value)
        return value

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str | None) -> str | None:
        if value is None:
            return None
        check_cron(value)
        return " ".join(value.split())

    @model_validator(mode="after")
    def _exactly_one(self) -> Schedule:
        given = [name for name in ("at", "every", "cron") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"a schedule needs exactly one of at, every, cron (got {', '.join(given) or 'none'})")
        return self

    @model_serializer(mode="wrap")
    def _only_the_one(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # {"cron": "0 8 * * 1"} on disk, not two nulls beside it
        return {key: value for key, value in handler(self).items() if value is not None}

    @property
    def kind(self) -> str:
        return "at" if self.at is not None else "every" if self.every is not None else "cron"

    def describe(self, tz: tzinfo) -> str:
        """One short phrase: `at 2026-12-01 09:00`, `every 1h`, `cron 0 8 * * 1`."""
        if self.at is not None:
            return f"at {in_zone(self.at, tz, '%Y-%m-%d %H:%M')}"
        if self.every is not None:
            return f"every {format_seconds(self.every)}"
        return f"cron {self.cron}"


class Job(BaseModel):
    """One scheduled job, as stored in jobs.json."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=32)
    schedule: Schedule
    action: Action
    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    target: str = Field(min_length=3)  # session key: telegram:<chat_id>[:<user_id>] or cli:<name>
    created_by: str = "cli"
    scope: str | None = None  # None: the shared memory; else the user key of a per-user scope
    created_at: datetime
    next_run: datetime | None = None  # UTC; None once a one-time job has run
    last_run: datetime | None = None
    last_outcome: str | None = None  # "ok", "late", "skipped: …", "error: …"
    enabled: bool = True

    @field_validator("target")
    @classmethod
    def _session_key(cls, value: str) -> str:
        # Only the shape: a stored key that check_session_key now refuses is listed as one that cannot be
        # delivered, rather than making the whole file unreadable (and every other job stop).
        if not _STORED_SESSION.match(value):
            raise ValueError(f"{quote(value)} is not a session key (expected telegram:<chat_id>, "
                             "telegram:<chat_id>:<user_id> or cli:<name>)")
        return value

    @field_validator("created_at", "next_run", "last_run")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.utcoffset() is None:
            raise ValueError("must carry a UTC offset")
        return _utc_or_error(value)

    @property
    def done(self) -> bool:
        """A one-time job that has run (or a job switched off): the scheduler leaves it alone."""
        return not self.enabled or self.next_run is None


def _utc_or_error(moment: datetime) -> datetime:
    """`moment` in UTC; ValueError (a validation error, not a crash) when it lies beyond datetime's range."""
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{moment.isoformat()} is outside the range of dates (years 1 to 9999)") from None


def in_zone(moment: datetime, tz: tzinfo, pattern: str) -> str:
    """`moment` on the clock of `tz` as `pattern`; in UTC (marked) when `tz` cannot hold it (9999-12-31 at +14)."""
    try:
        return moment.astimezone(tz).strftime(pattern)
    except OverflowError:
        return moment.astimezone(UTC).strftime(pattern) + ("" if "%Z" in pattern else " UTC")


class JobsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = FILE_VERSION
    jobs: list[Job] = []


# -- parsing what people type ---------------------------------------------------------------------------

_STORED_SESSION = re.compile(r"^(telegram:-?\d+(:\d+)?|cli:[\w.-]+)$")  # what older versions accepted
_TELEGRAM = re.compile(r"telegram:(-?[0-9]+)(?::([0-9]+))?")
_CLI = re.compile(r"cli:[\w.-]+")  # letters of any script (中文 too), digits, _ . -: what `--session` names


def check_session_key(key: str) -> None:
    """ValueError unless a channel can deliver to `key`: `telegram:<chat_id>`, `telegram:<chat_id>:<user_id>`
    (ids as Telegram writes them, in 64 bits) or `cli:<name>`, in at most MAX_SESSION_KEY_BYTES bytes."""
    expected = "expected telegram:<chat_id>, telegram:<chat_id>:<user_id> or cli:<name>"
    telegram = _TELEGRAM.fullmatch(key)
    if telegram is None and not _CLI.fullmatch(key):
        raise ValueError(f"{quote(key)} is not a session key ({expected}; a name has letters, digits, _ . -)")
    for number in telegram.groups() if telegram else ():
        # "042" would be delivered to chat 42 but run in another session than the chat's own "telegram:42";
        # the length goes first, as int() refuses 4,300 digits and more with an error of its own
        if number is not None and (len(number) > 20 or str(int(number)) != number
                                   or int(number) not in TELEGRAM_IDS):
            raise ValueError(f"{quote(number)} in {quote(key)} is not a Telegram id (a whole number without "
                             "leading zeros that fits in 64 bits)")
    size = len(key.encode("utf-8"))
    if size > MAX_SESSION_KEY_BYTES:
        raise ValueError(f"the session key {quote(key)} is too long: {size} bytes in UTF-8, at most "
                         f"{MAX_SESSION_KEY_BYTES} (a Chinese character takes 3), since it names the chat's file")


def check_cron(expression: str) -> None:
    """ValueError unless `expression` is a standard 5-field cron expression croniter understands."""
    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(f"cron expression {quote(expression)} must have 5 fields (minute hour day month weekday), "
                         f"got {len(fields)}")
    if not croniter.is_valid(" ".join(fields)):
        raise ValueError(f"cron expression {quote(expression)} is not valid (e.g. '0 8 * * 1' is 08:00 every Monday)")


_UNITS: dict[str, int] = {}
for _names, _seconds in ((("s", "sec", "secs", "second", "seconds", "秒", "秒钟"), 1),
                         (("m", "min", "mins", "minute", "minutes", "分", "分钟"), 60),
                         (("h", "hr", "hrs", "hour", "hours", "小时", "个小时", "钟头", "个钟头"), 3600),
                         (("d", "day", "days", "天", "日"), 86400),
                         (("w", "week", "weeks", "周", "星期", "个星期", "礼拜", "个礼拜"), 7 * 86400)):
    for _name in _names:
        _UNITS[_name] = _seconds
_TOO_FAR = f"a job can be at most {MAX_AHEAD_YEARS} years ahead"
_RELATIVE_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+|[\u4e00-\u9fff]+)")


def parse_relative(text: str) -> timedelta:
    """"in 20 minutes", "2 hours", "1h 30m", "3 days", "20分钟后" → a timedelta; JobError otherwise."""
    spoken = text.strip().lower()
    spoken = spoken.removeprefix("in ").removesuffix(" from now").removesuffix("以后").removesuffix("之后")
    spoken = spoken.removesuffix("后").strip()
    parts = _RELATIVE_PART.findall(spoken)
    leftover = _RELATIVE_PART.sub("", spoken).replace("and", "").replace(",", "").strip()
    if not parts or leftover:
        raise JobError(f"cannot read {quote(text)} as a delay: write e.g. 'in 20 minutes', 'in 2 hours', "
                       "'in 3 days'")
    total = 0.0
    for number, unit in parts:
        if unit not in _UNITS:
            raise JobError(f"unknown time unit {quote(unit)} in {quote(text)} (use seconds, minutes, hours, days "
                           "or weeks)")
        total += float(number) * _UNITS[unit]
    if total <= 0:
        raise JobError(f"the delay {quote(text)} is zero: a reminder needs a time in the future")
    if total > MAX_AHEAD.total_seconds():  # also keeps timedelta and the date from overflowing (inf too)
        raise JobError(f"the delay {quote(text)} is too long: {_TOO_FAR}")
    return timedelta(seconds=total)


def parse_at(text: str, tz: tzinfo) -> datetime:
    """ISO 8601 (`2026-12-01T09:00+08:00`, `2026-12-01 09:00`); a time without offset is in `tz`."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise JobError(f"cannot read {quote(text)} as a date and time: use ISO 8601, e.g. 2026-12-01T09:00+08:00 "
                       "(without an offset the configured timezone is meant)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=tz)
    try:
        _utc_or_error(moment)
    except ValueError as exc:
        raise JobError(f"{exc}: {_TOO_FAR}") from None
    return moment


def format_seconds(seconds: int) -> str:
    """3600 → "1h", 5400 → "1h30m", 90 → "1m30s", 86400 → "1d"."""
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def make_schedule(*, at: str | None = None, in_: str | None = None, every: int | None = None,
                  cron: str | None = None, tz: tzinfo, now: datetime | None = None) -> Schedule:
    """A schedule from exactly one of the ways people give one; relative times are resolved now."""
    given = [name for name, value in (("at", at), ("in", in_), ("every", every), ("cron", cron)) if value is not None]
    if len(given) != 1:
        raise JobError(f"give exactly one schedule: at, in, every or cron (got {', '.join(given) or 'none'})")
    now = now or clock.now()
    if every is not None and not MIN_EVERY_SECONDS <= every <= MAX_EVERY_SECONDS:
        raise JobError(f"every must be at least {MIN_EVERY_SECONDS} seconds and at most {MAX_EVERY_SECONDS} "
                       f"({format_seconds(MAX_EVERY_SECONDS)}), got {every}")
    if cron is not None:
        if len(cron) > MAX_CRON_CHARS:  # croniter takes seconds over an expression of megabytes
            raise JobError(f"cron expression {quote(cron)} is too long: {len(cron)} characters, "
                           f"at most {MAX_CRON_CHARS}")
        try:
            check_cron(cron)
        except ValueError as exc:
            raise JobError(str(exc)) from None
        cron_after(" ".join(cron.split()), now, tz)  # "0 0 30 2 *" is valid but never comes
    moment: datetime | None = None
    if at is not None:
        moment = parse_at(at, tz)
    elif in_ is not None:
        moment = now + parse_relative(in_)
    if moment is not None:
        check_moment(moment, now, tz)
    try:
        return Schedule(at=moment, every=every, cron=cron)
    except ValidationError as exc:
        raise JobError(describe_error(Schedule, exc)) from None


def check_moment(moment: datetime, now: datetime, tz: tzinfo) -> None:
    """JobError unless a one-time job at `moment` is in the future, and at most MAX_AHEAD from `now`."""
    shown = "%Y-%m-%d %H:%M:%S %Z"
    if moment <= now:
        raise JobError(f"{in_zone(moment, tz, shown)} is in the past (now it is {in_zone(now, tz, shown)})")
    if moment - now > MAX_AHEAD:
        raise JobError(f"{in_zone(moment, tz, shown)} is too far ahead: {_TOO_FAR}")


# -- when a job runs ------------------------------------------------------------------------------------

def cron_after(expression: str, after: datetime, tz: tzinfo) -> datetime:
    """The first time the cron expression matches strictly after `after`, in UTC (wall clock of `tz`).

    Across a fall-back change the clock repeats an hour (02:00–02:59 CEST, then CET); like cron, a job runs
    once per wall-clock time, so a match whose wall-clock time is not after `after`'s is skipped.
    """
    try:
        start = after.astimezone(tz)
        times = croniter(expression, start)
        while True:
            candidate: datetime = times.get_next(datetime)
            if candidate.replace(tzinfo=None) > start.replace(tzinfo=None):
                return candidate.astimezone(UTC)
    except (CroniterError, OverflowError):  # croniter gives up after some years without a match
        raise JobError(f"cron expression {quote(expression)} matches no date after "
                       f"{in_zone(after, tz, '%Y-%m-%d')} (e.g. '0 0 30 2 *', 30 February, never comes)") from None


def first_run(schedule: Schedule, now: datetime, tz: tzinfo) -> datetime:
    """When a new job first runs."""
    if schedule.at is not None:
        return schedule.at.astimezone(UTC)
    if schedule.every is not None:
        return (now + timedelta(seconds=schedule.every)).astimezone(UTC)
    assert schedule.cron is not None
    return cron_after(schedule.cron, now, tz)


def following_run(job: Job, now: datetime, tz: tzinfo) -> datetime | None:
    """The run after the one due now (None for a one-time job); missed runs are not made up, only skipped."""
    schedule, due = job.schedule, job.next_run or now
    if schedule.at is not None:
        return None
    if schedule.every is not None:
        try:  # a hand-edited interval or date can reach past the year 9999
            step = timedelta(seconds=schedule.every)
            following = due + step  # on the grid of the first run, so an interval does not drift …
            return following if following > now else now + step  # … unless runs were missed: then from now
        except OverflowError:
            raise JobError(f"the run after {in_zone(due, tz, '%Y-%m-%d')} is past the year 9999") from None
    assert schedule.cron is not None
    return cron_after(schedule.cron, max(due, now), tz)


def job_problem(job: Job, tz: tzinfo) -> str | None:
    """Why a stored job that is still to run never can (None when it can): a target no channel delivers to,
    a next run that `tz` cannot show, no run after it. Listings mark such a job; the scheduler skips it."""
    if job.done or job.next_run is None:
        return None
    try:
        check_session_key(job.target)
    except ValueError as exc:
        return str(exc)
    try:
        job.next_run.astimezone(tz)
    except OverflowError:
        return f"its next run, {in_zone(job.next_run, UTC, '%Y-%m-%d %H:%M %Z')}, is outside the dates of {tz}"
    try:
        following_run(job, job.next_run, tz)
    except JobError as exc:
        return str(exc)
    return None


def scope_for(session_key: str, memory_scope: str) -> str | None:
    """The memory scope whose agent serves `session_key`: None (shared), or a user key (per_user).

    With Telegram's per_user scope a private chat's id is its user's id, and a group member's session
    key ends in the user's id (`telegram:<chat>:<user>`), as channels/telegram.py makes them.
    """
    if memory_scope != "per_user" or not session_key.startswith("telegram:"):
        return None
    parts = session_key.split(":")
    return parts[2] if len(parts) == 3 else parts[1].lstrip("-")


# -- the file -------------------------------------------------------------------------------------------

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
            check_session_key(target)
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
