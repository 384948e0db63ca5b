"""Reading user-edited JSON files with errors that say which file and where, and JSON objects out of a model's
text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from picoclaw.disk.bounded_read import FileTooLargeError, read_bounded
from picoclaw.disk.links import NotAFileError
from picoclaw.errors import ConfigError

# The most a settings file (config.json, policy overrides and snapshots) may hold: a thousand times what one
# needs, and small enough that a file linked to /dev/zero, or the wrong file, is refused at once.
MAX_JSON_BYTES = 1 << 20


def read_json_object(path: Path, limit: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """Parse `path` as a JSON object; any problem is a ConfigError naming the file (and line, if known).

    At most `limit` bytes are read (see `disk/bounded_read.py`): a larger file is refused in one line.
    """
    try:
        raw = read_bounded(path, limit)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except (FileTooLargeError, NotAFileError) as exc:
        raise ConfigError(str(exc)) from None
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


def json_objects(text: str) -> Iterator[dict[str, Any]]:
    """Every JSON object written in `text` (alone, in prose or in a code fence), in order: how a model's answer
    holds the object it was asked for."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            yield value
        start = text.find("{", start + 1)
