"""The one clock: every timestamp in picoclaw comes from `now()`, so tests can freeze time."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

LOCAL = "local"
LOCALTIME = Path("/etc/localtime")  # a link into the zoneinfo database on Linux and macOS
TIMEZONE_FILE = Path("/etc/timezone")  # Debian's copy of the machine's zone name


def resolve_timezone(name: str) -> tzinfo:
    """Turn a config timezone name ("Asia/Shanghai", "UTC", or "local") into a tzinfo."""
    if name == LOCAL:
        # The machine's zone by name when it can be found: a fixed offset would keep summer time all winter.
        local_name = local_zone_name()
        if local_name is not None:
            return ZoneInfo(local_name)
        local = datetime.now().astimezone().tzinfo
        return local if local is not None else UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown timezone {name!r} (use an IANA name such as 'Asia/Shanghai', or 'local')") from exc


def local_zone_name(environ: Mapping[str, str] | None = None, localtime: Path = LOCALTIME,
                    timezone_file: Path = TIMEZONE_FILE) -> str | None:
    """The IANA name of the machine's zone ("Europe/Berlin"): from TZ, else the /etc/localtime link, else
    /etc/timezone; None when none of them names a zone this Python knows."""
    env = os.environ if environ is None else environ
    if "TZ" in env:  # TZ rules when set (the C library reads nothing else), even when it is no IANA name
        return _known_zone(env["TZ"].removeprefix(":"))
    try:  # the link as written (one level): the name the machine was given, not an alias it resolves to
        target = os.readlink(localtime)
    except OSError:  # no link (a copied file, Windows): no name in it
        target = ""
    if "/zoneinfo/" in target:
        return _known_zone(target.rsplit("/zoneinfo/", 1)[1])
    try:
        return _known_zone(timezone_file.read_text(encoding="utf-8").strip())
    except (OSError, UnicodeError):
        return None


def _known_zone(name: str) -> str | None:
    if not name or name.startswith("/") or ".." in name:  # a path, not a name: ZoneInfo would refuse it anyway
        return None
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None
    return name


def describe_timezone(name: str) -> str:
    """A config timezone as a person reads it: "Asia/Shanghai", or "local (Europe/Berlin)" with the zone found."""
    if name != LOCAL:
        return name
    found = local_zone_name()
    if found is not None:
        return f"{LOCAL} ({found})"
    offset = datetime.now().astimezone().strftime("%z")
    return f"{LOCAL} (UTC{offset[:3]}:{offset[3:]})" if offset else LOCAL


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
    (see `disk/stamped.py: stamped_files`). A naive `moment` is taken as UTC, never as the machine's local time.
    """
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y%m%d_%H%M%S") + STAMP_UTC_MARK
