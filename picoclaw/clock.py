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


def stamp(moment: datetime) -> str:
    """`YYYYMMDD_HHMMSS`, the form used in backup and snapshot file names."""
    return moment.strftime("%Y%m%d_%H%M%S")
