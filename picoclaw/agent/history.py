"""Rules for cutting a chat history without breaking it.

The API rejects a tool result whose assistant tool call is missing, so every cut (summary, forced
compression, fallback window) moves forward past orphaned tool results.
"""

from __future__ import annotations

from picoclaw.providers.base import Message


def safe_start(messages: list[Message], start: int) -> int:
    """The first index ≥ `start` that does not begin with a tool result cut from its call."""
    start = max(0, min(start, len(messages)))
    while start < len(messages) and messages[start].get("role") == "tool":
        start += 1
    return start


def keep_last(messages: list[Message], count: int) -> int:
    """Index where a tail of about `count` messages starts without orphaned tool results."""
    return safe_start(messages, len(messages) - count) if count > 0 else len(messages)


def turns(messages: list[Message]) -> list[tuple[int, int]]:
    """(start, end) index ranges of turns: a user message and everything up to the next user message."""
    bounds = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not bounds or bounds[0] != 0:
        bounds.insert(0, 0)
    return [(start, end) for start, end in zip(bounds, bounds[1:] + [len(messages)]) if end > start]
