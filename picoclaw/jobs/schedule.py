"""When a job runs: schedules read from what people type (`--in/--at/--cron/--every`), first and following
runs in the configured timezone, and why a stored job can never run."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, tzinfo

from croniter import CroniterError, croniter
from pydantic import ValidationError

from picoclaw import clock
from picoclaw.cjk import LETTERS
from picoclaw.jobs.model import (
    MAX_AHEAD,
    MAX_AHEAD_YEARS,
    MAX_CRON_CHARS,
    MAX_EVERY_SECONDS,
    MIN_EVERY_SECONDS,
    Job,
    JobError,
    Schedule,
    check_cron,
    format_seconds,
    in_zone,
    utc_or_error,
)
from picoclaw.pydantic_errors import describe_error, quote
from picoclaw.session_key import SessionKey

# -- parsing what people type ---------------------------------------------------------------------------

_UNITS: dict[str, int] = {}
for _names, _seconds in ((("s", "sec", "secs", "second", "seconds", "秒", "秒钟"), 1),
                         (("m", "min", "mins", "minute", "minutes", "分", "分钟"), 60),
                         (("h", "hr", "hrs", "hour", "hours", "小时", "个小时", "钟头", "个钟头"), 3600),
                         (("d", "day", "days", "天", "日"), 86400),
                         (("w", "week", "weeks", "周", "星期", "个星期", "礼拜", "个礼拜"), 7 * 86400)):
    for _name in _names:
        _UNITS[_name] = _seconds
_TOO_FAR = f"a job can be at most {MAX_AHEAD_YEARS} years ahead"
_RELATIVE_PART = re.compile(rf"(\d+(?:\.\d+)?)\s*([a-z]+|[{LETTERS}]+)")


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
        utc_or_error(moment)
    except ValueError as exc:
        raise JobError(f"{exc}: {_TOO_FAR}") from None
    return moment


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
        SessionKey.parse(job.target)
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
