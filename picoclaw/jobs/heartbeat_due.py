"""Which of HEARTBEAT.md's tasks are due at a beat, so that a beat with none due makes no model call.

A task is a line of the file (comments, headings and blank lines are not). It may begin with when it is due:
`[every 2h]` (`[每2小时]`), `[daily 09:00]` (`[每天 09:00]`); a task without one is due at every beat. A task
that is new (or changed: a changed line is a new task) is due at the next beat, then by its schedule. What ran
when is kept (`memory/.heartbeat.json`, through the storage) so a restart or another worker agrees.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from datetime import datetime, time, timedelta, tzinfo
from pathlib import Path

import orjson

from picoclaw.jobs.model import JobError
from picoclaw.jobs.schedule import parse_relative
from picoclaw.storage import Storage, StorageError, document_of

log = logging.getLogger(__name__)

_TAGGED = re.compile(r"^(?P<bullet>\s*(?:[-*+]|\d+\.)?\s*)\[(?P<tag>[^\]\n]{1,40})\]\s*(?P<task>\S.*)$")
_DAILY = re.compile(r"^(?:daily|every day|每天|每日)\s*(?:at\s*)?(?P<hour>\d{1,2})[:：](?P<minute>\d{2})$",
                    re.IGNORECASE)
_EVERY = re.compile(r"^(?:every|每)\s*(?P<span>.+)$", re.IGNORECASE)
MIN_EVERY = timedelta(minutes=5)
_VERSION = 1


@dataclass(frozen=True)
class HeartbeatTask:
    """One task line: its text as written, and when it is due (`every`, or `daily` at a local time; neither:
    at every beat)."""

    line: str
    every: timedelta | None = None
    daily: time | None = None

    @property
    def key(self) -> str:
        return hashlib.sha256(self.line.strip().encode("utf-8")).hexdigest()[:16]

    def due(self, last: datetime | None, now: datetime, tz: tzinfo) -> bool:
        """Whether the task is due at `now`, having last run at `last` (None: never, a new task: due)."""
        if last is None or (self.every is None and self.daily is None):
            return True
        if self.every is not None:
            return now - last >= self.every
        assert self.daily is not None
        local = now.astimezone(tz)
        latest = datetime.combine(local.date(), self.daily, tzinfo=tz)
        if latest > local:
            latest -= timedelta(days=1)
        return last < latest


def read_tasks(tasks: str) -> list[HeartbeatTask]:
    """The task lines of `tasks` (heartbeat_tasks's text) with their schedules; a tag that is no schedule is part
    of the task's text (due at every beat)."""
    found = []
    for line in tasks.splitlines():
        tagged = _TAGGED.match(line)
        schedule = _schedule(tagged["tag"].strip()) if tagged else None
        if schedule is None:
            found.append(HeartbeatTask(line))
        else:
            found.append(HeartbeatTask(line, *schedule))
    return found


def _schedule(tag: str) -> tuple[timedelta | None, time | None] | None:
    daily = _DAILY.match(tag)
    if daily is not None:
        hour, minute = int(daily["hour"]), int(daily["minute"])
        return (None, time(hour, minute)) if hour < 24 and minute < 60 else None
    every = _EVERY.match(tag)
    if every is None:
        return None
    span = every["span"].strip()
    if not span[:1].isdigit():  # "every hour", "每小时"
        span = "1" + span
    try:
        spread = parse_relative(span)
    except JobError:
        return None
    return (max(spread, MIN_EVERY), None)


class HeartbeatRuns:
    """When each task last ran (blocking calls; the heartbeat's interval claim lets one worker beat at a time)."""

    def __init__(self, path: Path, storage: Storage):
        self.path = path
        self.documents, self.name = document_of(storage, path)

    def last_runs(self) -> dict[str, datetime]:
        """Task key → when it last ran; {} when nothing is kept or it cannot be read (then every task is new)."""
        try:
            stored = self.documents.read(self.name).data
        except StorageError as exc:
            log.warning("heartbeat: cannot read %s (%s); every task counts as new", self.path, exc)
            return {}
        if stored is None:
            return {}
        try:
            raw = orjson.loads(stored)
            return {str(key): datetime.fromisoformat(value) for key, value in raw["ran"].items()}
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError):
            log.warning("heartbeat: %s is damaged; every task counts as new", self.path)
            return {}

    def record(self, tasks: list[HeartbeatTask], ran: list[HeartbeatTask], now: datetime,
               before: dict[str, datetime]) -> None:
        """`ran` ran at `now`; tasks no longer in the file are forgotten."""
        kept = {task.key: before[task.key] for task in tasks if task.key in before}
        kept.update({task.key: now for task in ran})
        data = {"version": _VERSION, "ran": {key: when.isoformat() for key, when in kept.items()}}
        self.documents.replace(self.name, orjson.dumps(data), durable=False)
