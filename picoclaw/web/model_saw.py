"""What the model saw, for one turn of the why page: the window and its split by part as a bar with numbers (from
the split the turn's record keeps), every memory block it carried or left out and why, scores relative to the
turn's best (raw on hover), and the exact request as sent, secrets masked, when this console still holds it.

A record written by an older picoclaw lacks some of this (no split, no token counts, no blocks left out): the
view says which, rather than showing a zero.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from picoclaw.config import Config

BAR_WIDTH = 600
# The parts of the bar, in the order a request is laid out (the label keys are labels.py's "part_<name>").
PARTS = ("system", "lessons", "skills", "tools", "memory", "notes", "history", "user", "reply")
REQUEST_CHARS = 200_000  # of the exact request shown: a window of text is plenty to read
SECRET_WORDS = re.compile(r"token|key|secret|passw|auth|credential", re.IGNORECASE)
SECRET_ENV = re.compile(r"(API_KEY|TOKEN|SECRET|PASSWORD)$", re.IGNORECASE)  # not TIKTOKEN_CACHE_DIR


@dataclass(frozen=True)
class Part:
    """One part of the window: its tokens, its share of the window in percent, and its place on the bar."""

    name: str
    tokens: int
    percent: float
    x: float
    width: float


@dataclass(frozen=True)
class Block:
    """A memory block the search found: where, what found it, its score relative to the turn's best (raw kept
    for the hover), its tokens, and why it was left out ("" when the prompt carried it)."""

    found_by: str
    where: str
    text: str
    relative: float | None
    raw: float | None
    tokens: int | None
    reason: str = ""


@dataclass(frozen=True)
class ModelSaw:
    """A turn's view of what the model saw."""

    window: int
    window_source: str
    parts: list[Part]
    prompt: int  # the parts before the reply, added up: the estimate of the request's prompt tokens
    carried: list[Block]
    left_out: list[Block]
    lacks: list[str]  # label keys of what this turn's record does not hold
    tools_short: bool
    history_set_aside: int


def model_saw(why: dict[str, Any]) -> ModelSaw:
    """The view of a turn's record of why (as why_page._why read it, the raw record's `context` in `split`)."""
    lacks: list[str] = []
    split = why.get("split")
    items, left = why.get("items") or [], why.get("left_out")
    if left is None:
        lacks.append("lacks_left_out")
    scores = [item["score"] for item in [*items, *(left or [])] if item.get("score") is not None]
    best = max(scores, default=0.0)
    carried = [_block(item, best) for item in items]
    dropped = [_block(item, best) for item in left or []]
    if items and any(block.tokens is None for block in carried):
        lacks.append("lacks_tokens")
    if not isinstance(split, dict):
        lacks.append("lacks_split")
        return ModelSaw(0, "", [], 0, carried, dropped, lacks, False, 0)
    window = max(1, _int(split.get("window")))
    raw = split.get("parts")
    tokens = {str(name): max(0, _int(value)) for name, value in raw.items()} if isinstance(raw, dict) else {}
    notes = sum(block.tokens or 0 for block in carried if block.found_by == "recent notes")
    if "memory" in tokens and notes:
        notes = min(notes, tokens["memory"])  # the data block's framing stays with the memory blocks
        tokens["memory"], tokens["notes"] = tokens["memory"] - notes, notes
    parts, x = [], 0.0
    for name in PARTS:
        if name not in tokens:
            continue
        width = BAR_WIDTH * tokens[name] / window
        parts.append(Part(name, tokens[name], round(100 * tokens[name] / window, 1), round(x, 1), round(width, 1)))
        x += width
    prompt = sum(part.tokens for part in parts if part.name != "reply")
    return ModelSaw(window, str(split.get("source") or ""), parts, prompt, carried, dropped, lacks,
                    bool(split.get("tools_short")), _int(split.get("history_set_aside")))


def _block(item: dict[str, Any], best: float) -> Block:
    score = item.get("score")
    relative = round(score / best, 3) if score is not None and best > 0 else None
    lines = item.get("lines") or ["?", "?"]
    tokens = item.get("tokens")
    return Block(str(item.get("found_by", "")), f"{item.get('path', '')}:{lines[0]}-{lines[1]}",
                 str(item.get("text", "")), relative, score, tokens if isinstance(tokens, int) else None,
                 str(item.get("reason") or ""))


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def config_secrets(config: Config) -> list[str]:
    """Every secret the request could carry from this configuration: values of keys named like secrets (API keys,
    bot tokens, webhook secrets), MCP servers' environments and headers, and secret-named environment variables."""
    found: list[str] = []

    def walk(value: Any, secret: bool) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(inner, secret or bool(SECRET_WORDS.search(str(key))) or key in ("env", "headers"))
        elif isinstance(value, list | tuple):
            for inner in value:
                walk(inner, secret)
        elif isinstance(value, str) and secret and value:
            found.append(value)

    walk(config.model_dump(), False)
    found += [value for name, value in os.environ.items() if SECRET_ENV.search(name) and value]
    return found


def masked_request(messages: Any, tools: Any, secrets: list[str]) -> str:
    """The request as JSON, every secret masked before it is encoded (an escape would hide one), cut to
    REQUEST_CHARS."""
    from picoclaw.redact import redact

    def mask(value: Any) -> Any:
        if isinstance(value, str):
            if value.startswith("data:") and len(value) > 200:  # an attached image: its bytes say nothing here
                return f"{value[:40]}… ({len(value):,} characters)"
            return redact(value, secrets)
        if isinstance(value, dict):
            return {key: mask(inner) for key, inner in value.items()}
        if isinstance(value, list | tuple):
            return [mask(inner) for inner in value]
        return value

    text = orjson.dumps({"messages": mask(list(messages)), "tools": mask(list(tools))},
                        option=orjson.OPT_INDENT_2).decode("utf-8")
    return text if len(text) <= REQUEST_CHARS else text[:REQUEST_CHARS] + "\n…"
