"""Reading user-edited JSON files with errors that say which file and where."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from picoclaw.errors import ConfigError


def read_json_object(path: Path) -> dict[str, Any]:
    """Parse `path` as a JSON object; any problem is a ConfigError naming the file (and line, if known)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    # Windows editors (Notepad) save UTF-8 with a byte-order mark; the JSON is fine, so accept it.
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}" if getattr(exc, "lineno", None) else "?"
        raise ConfigError(f"{path}: not valid JSON at {where}: {exc.msg}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected a JSON object at the top level, got {type(value).__name__}")
    return value


def dumps_pretty(value: Any) -> bytes:
    """Indented, key-preserving JSON with a trailing newline, as a person would want to read it."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2) + b"\n"
