"""The one clock: every timestamp in picoclaw comes from `now()`, so tests can freeze time."""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

LOCAL = "local"


def resolve_timezone(name: str) -> tzinfo:
    """Turn a config timezone name ("Asia/Shanghai", "UTC", or "local") into a tzinfo."""
    if name == LOCAL:
        local = datetime.now().astimezone().tzinfo
        return local if local is not None else UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown timezone {name!r} (use an IANA name such as 'Asia/Shanghai', or 'local')") from exc


def now(tz: tzinfo | None = None) -> datetime:
    """The current time, timezone-aware; in `tz` when given, else UTC."""
    current = datetime.now(UTC)
    return current.astimezone(tz) if tz is not None else current


STAMP_UTC_MARK = "Z"


def stamp(moment: datetime) -> str:
    """`YYYYMMDD_HHMMSSZ`: `moment` in UTC, the form used in backup, snapshot and archive file names.

    Always UTC, whatever timezone `moment` carries: these names are sorted as text to find the newest
    (and the oldest, which pruning deletes). Local-time names go backwards when the configured timezone
    changes or a daylight-saving hour repeats, and the file just written would then sort as the oldest.
    The trailing "Z" marks the name as UTC, telling it apart from the local-time names of older versions
    (see `fsutil.stamped_files`). A naive `moment` is taken as UTC, never as the machine's local time.
    """
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y%m%d_%H%M%S") + STAMP_UTC_MARK
