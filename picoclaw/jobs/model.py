"""A scheduled job and its schedule, as jobs.json holds them, with the limits every new job is checked against.

A job says when (`at` one instant, `every` N seconds, or a 5-field `cron` expression in the configured
timezone), what (`message`: text sent as is; `agent`: a prompt run as a turn of the target session), and
for whom (the target session key, and the memory scope whose agent runs it).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Literal

from croniter import croniter
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from picoclaw.errors import PicoclawError
from picoclaw.pydantic_errors import quote
from picoclaw.session_key import EXPECTED, is_stored_form

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
MAX_TEXT_CHARS = 4_000

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
            utc_or_error(value)
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
    target: str = Field(min_length=3)  # a session key (picoclaw.session_key), as written
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
        # Only the shape: a stored key that SessionKey.parse now refuses is listed as one that cannot be
        # delivered, rather than making the whole file unreadable (and every other job stop).
        if not is_stored_form(value):
            raise ValueError(f"{quote(value)} is not a session key ({EXPECTED})")
        return value

    @field_validator("created_at", "next_run", "last_run")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.utcoffset() is None:
            raise ValueError("must carry a UTC offset")
        return utc_or_error(value)

    @property
    def done(self) -> bool:
        """A one-time job that has run (or a job switched off): the scheduler leaves it alone."""
        return not self.enabled or self.next_run is None


def utc_or_error(moment: datetime) -> datetime:
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


def format_seconds(seconds: int) -> str:
    """3600 → "1h", 5400 → "1h30m", 90 → "1m30s", 86400 → "1d"."""
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def check_cron(expression: str) -> None:
    """ValueError unless `expression` is a standard 5-field cron expression croniter understands."""
    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(f"cron expression {quote(expression)} must have 5 fields (minute hour day month weekday), "
                         f"got {len(fields)}")
    if not croniter.is_valid(" ".join(fields)):
        raise ValueError(f"cron expression {quote(expression)} is not valid (e.g. '0 8 * * 1' is 08:00 every Monday)")
