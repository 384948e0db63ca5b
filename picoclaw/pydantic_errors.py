"""Turn pydantic validation errors into one line a user can act on."""

from __future__ import annotations

from typing import Any

import annotated_types
from pydantic import BaseModel, ValidationError


def bounds_of(model: type[BaseModel], name: str) -> tuple[Any, Any]:
    """(lower, upper) bounds declared on a field with ge/le, or None for a missing side."""
    field = model.model_fields.get(name)
    low = high = None
    if field is not None:
        for meta in field.metadata:
            if isinstance(meta, annotated_types.Ge):
                low = meta.ge
            elif isinstance(meta, annotated_types.Le):
                high = meta.le
    return low, high


def _field_model(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[type[BaseModel] | None, str]:
    """Walk `loc` through nested models; return the model owning the last field and its name."""
    current: type[BaseModel] | None = model
    for part in loc[:-1]:
        if current is None or not isinstance(part, str) or part not in current.model_fields:
            return None, str(loc[-1])
        annotation = current.model_fields[part].annotation
        current = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return current, str(loc[-1])


QUOTE_LIMIT = 80  # characters of a value quoted in an error; a config value can be megabytes long
MESSAGE_LIMIT = 300  # characters of one problem's message (a validator may quote the value itself)


def shorten(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, ending in "…" when anything was cut."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def quote(value: Any) -> str:
    """repr(value) of at most QUOTE_LIMIT characters, so a huge value still gives a one-line error of sane size."""
    return shorten(repr(value), QUOTE_LIMIT)


def describe_error(model: type[BaseModel], exc: ValidationError, prefix: str = "") -> str:
    """All problems of `exc` on one line: `key: what is wrong (got X; allowed A–B)`."""
    parts = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = prefix + ".".join(str(p) for p in loc) if loc else (prefix.rstrip(".") or "(top level)")
        if err["type"] == "extra_forbidden":
            parts.append(f"{key}: unknown key (check the spelling)")
            continue
        message = err["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, "):]
        quotable = err["type"] != "missing" and "input" in err and not isinstance(err["input"], (dict, list))
        if quotable:  # a validator's own message may quote the value too (the timezone check does)
            message = message.replace(repr(err["input"]), quote(err["input"]))
        detail = f"{key}: {shorten(message, MESSAGE_LIMIT)}"
        if quotable:
            detail += f" (got {quote(err['input'])}"
            owner, name = _field_model(model, loc) if loc else (None, "")
            low, high = bounds_of(owner, name) if owner else (None, None)
            if low is not None and high is not None:
                detail += f"; allowed {low}–{high}"
            elif low is not None:
                detail += f"; allowed ≥ {low}"
            detail += ")"
        parts.append(detail)
    return "; ".join(parts)
