"""Background calls that keep the prompt cache: each session's last request, and which part of it a summary folds.

A single-slot local server (llama.cpp, llama-cpp-python) keeps only its last prompt in the cache. A background call
between turns (the memory flush, the session summary, a lesson) with a prompt of its own evicts the conversation,
and the next turn reads its whole prompt again (minutes on a CPU). So the loop remembers each session's last request
as sent (`LastRequests`), and a background call asks its question after it (`PromptPrefix.then`): the server reads
only the instruction, and the next turn still finds the conversation cached.

A remembered request is used only when it is the conversation the job is about: its history must be the session's
active history as sent (or the newest part of it), else the job falls back to its own prompt (a fresh process, a
/compact before any turn, relevant-history mode, another process's messages since).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from picoclaw.agent.summary import render_transcript
from picoclaw.agent.turn_review import FinishedTurn
from picoclaw.keyed import LruCache
from picoclaw.memory import StoredMessage, user_texts
from picoclaw.providers.base import Message, PromptPrefix

EXCERPT_CHARS = 80  # of the message a folded part ends with, quoted so a small model need not count messages

# What `ContextBuilder.build` puts after the system prompt for a session with a summary.
SUMMARY_HEADING = "## Summary of the earlier conversation"


@dataclass(frozen=True)
class Remembered:
    """A session's last request with its reply (`prefix`), and the stored id of that turn's user message."""

    prefix: PromptPrefix
    user_id: int


@dataclass(frozen=True)
class Fold:
    """What a background job about the older part of a conversation asks after the conversation's last request:
    `part` says which messages above are that part, `earlier` is the transcript of those of its messages the
    request did not carry ("" when it carried them all)."""

    prefix: PromptPrefix
    part: str
    earlier: str
    summary_shown: bool  # the session's summary is in the request's system message


class LastRequests:
    """Each session's last request as sent, at most `size` sessions (the least recently used forgotten)."""

    def __init__(self, size: int):
        self._kept: LruCache[str, Remembered] = LruCache(size)

    def keep(self, key: str, messages: Sequence[Message], tools: Sequence[dict[str, Any]], user_id: int) -> None:
        """Remember `messages` (the last request's, with the reply appended) and `tools` for session `key`."""
        self._kept.put(key, Remembered(PromptPrefix(tuple(messages), tuple(tools)), user_id))

    def forget(self, key: str) -> Remembered | None:
        return self._kept.pop(key)

    def get(self, key: str) -> Remembered | None:
        return self._kept.peek(key)

    def for_turn(self, turn: FinishedTurn) -> PromptPrefix | None:
        """The request `turn` ended with, when it is still the session's last one (no turn of it came since)."""
        remembered = self._kept.peek(turn.key)
        if remembered is None or remembered.user_id != turn.user_id:
            return None
        return remembered.prefix

    def for_history(self, key: str, active: Sequence[StoredMessage], cut: int,
                    summary: str | None) -> Fold | None:
        """How to ask about `active[:cut]` after session `key`'s last request; None when that request is not this
        history (see the module doc)."""
        remembered = self._kept.peek(key)
        return None if remembered is None else fold_of(remembered.prefix, active, cut, summary)


def fold_of(prefix: PromptPrefix, active: Sequence[StoredMessage], cut: int, summary: str | None) -> Fold | None:
    """Which messages of `prefix` are `active[:cut]`, said for the model; None when the request's history is not
    the newest part of `active` as sent, or its system message lacks the session's summary."""
    messages = prefix.messages
    if not messages or messages[0].get("role") != "system":
        return None
    system = str(messages[0].get("content") or "")
    summary_shown = bool(summary) and f"{SUMMARY_HEADING}\n{(summary or '').strip()}" in system
    if summary and not summary_shown:
        return None
    shown = list(messages[1:])
    sent = [stored.as_sent() for stored in active]
    start = len(sent) - len(shown)  # the first active message the request carried
    if not shown or start < 0 or sent[start:] != shown:
        return None
    earlier = render_transcript([stored.message for stored in active[:min(start, cut)]])
    after = len(sent) - max(cut, start)  # messages at the end of the request that are not part of it
    if cut <= start:
        part = "only the earlier messages quoted below; the conversation above is not part of it"
    elif after == 0:
        part = "the whole conversation above"
    else:
        tail = ("the last message above comes after it and is not" if after == 1
                else f"the last {after} messages above come after it and are not")
        part = f"the conversation above up to and including {describe(sent[cut - 1])}; {tail} part of it"
    if earlier and cut > start:
        part += ", and the earlier messages of that part quoted below"
    return Fold(prefix, part, earlier, summary_shown)


def describe(message: Message) -> str:
    """A message named for the model by its role and the start of its text: "the user's message that begins «…»"."""
    role = message.get("role")
    content = str(message.get("content") or "")
    if role == "user":
        content = user_texts([message])[0]  # without the data block picoclaw sent in front of it
    calls = message.get("tool_calls") or []
    if role == "assistant" and not content.strip() and calls:
        names = ", ".join(str(call.get("function", {}).get("name")) for call in calls)
        return f"the assistant's call of {names}"
    who = {"user": "the user's message", "assistant": "the assistant's reply", "tool": "the tool result"}.get(
        str(role), "the message")
    text = " ".join(content.split())
    if not text:
        return f"{who} that is empty"
    excerpt = text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "…"
    return f"{who} that begins «{excerpt}»"

