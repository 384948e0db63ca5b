"""Background calls that keep the prompt cache: each session's last request, and which part of it a job is about.

A single-slot local server (llama.cpp, llama-cpp-python) keeps only its last prompt in the cache. A background call
between turns (the memory flush, the session summary, a lesson) with a prompt of its own evicts the conversation,
and the next turn reads its whole prompt again (minutes on a CPU). So the loop remembers each session's last request
as sent (`LastRequests`), and a background call asks its question after it (providers/base.py `ask_between_turns`):
the server reads only the instruction, and the next turn still finds the conversation cached. (Not after a reply
that came empty and was asked again without tools: the server last read that retry, not the request kept, so the
first background call reads the conversation once more.)

Only for a local endpoint (app.py: `continue_background`): a cloud API bills the whole conversation again for every
lesson, and its cache is not a single slot. A remembered request is used only when it is the conversation the job is
about: its history must be the session's active history as sent (or the newest part of it), else the job falls back
to its own prompt (a fresh process, a /compact before any turn, relevant-history mode, another process's messages).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from picoclaw.curation import FinishedTurn, render_transcript
from picoclaw.memory import user_texts
from picoclaw.per_key import LruCache
from picoclaw.providers.base import Continuation, Message, PromptPrefix
from picoclaw.transcripts import StoredMessage, with_summary

EXCERPT_CHARS = 80  # of the message a folded part ends with, quoted so a small model need not count messages
# Sessions whose last request is kept. Each is a whole request (up to the window's worth of text); a single-slot
# server caches one prompt anyway, so more than the recently active sessions would only hold memory.
LAST_REQUESTS_KEPT = 32
# Taken out of a quoted excerpt: the quotes' own marks, so a message cannot close its quote and speak as picoclaw.
_QUOTE_MARKS = str.maketrans("", "", "«»")
_ORDINALS = ("first", "second", "third", "fourth", "fifth")


@dataclass(frozen=True)
class Remembered:
    """A session's last request with its reply (`prefix`), and the stored id of that turn's user message."""

    prefix: PromptPrefix
    user_id: int


class LastRequests:
    """Each session's last request as sent, at most `size` sessions (the least recently used forgotten); with
    `size` 0 none (background calls use their own prompts)."""

    def __init__(self, size: int):
        self.size = size
        self._kept: LruCache[str, Remembered] | None = LruCache(size) if size > 0 else None

    def keep(self, key: str, messages: Sequence[Message], tools: Sequence[dict[str, Any]], user_id: int) -> None:
        """Remember `messages` (the last request's, with the reply appended) and `tools` for session `key`."""
        if self._kept is not None:
            self._kept.put(key, Remembered(PromptPrefix(tuple(messages), tuple(tools)), user_id))

    def forget(self, key: str) -> Remembered | None:
        return self._kept.pop(key) if self._kept is not None else None

    def get(self, key: str) -> Remembered | None:
        return self._kept.peek(key) if self._kept is not None else None

    def for_turn(self, turn: FinishedTurn) -> Continuation | None:
        """How to ask about `turn` after the request it ended with: when that is still the session's last request
        (no turn of it came since) and ends with the turn's messages as they were sent."""
        remembered = self.get(turn.key)
        if remembered is None or remembered.user_id != turn.user_id:
            return None
        messages = remembered.prefix.messages
        count = len(turn.messages)
        if not count or count >= len(messages) or not _sent_as(messages[-count:], turn.messages):
            return None
        return Continuation(remembered.prefix, f"the last turn of the conversation above: "
                                               f"{describe(messages, len(messages) - count)} and everything after it")

    def for_newest(self, key: str, stored: Sequence[StoredMessage]) -> Continuation | None:
        """How to ask about `stored` after session `key`'s last request, when it ends with exactly those messages
        as sent (a reflection on the messages since the last one)."""
        remembered = self.get(key)
        messages = remembered.prefix.messages if remembered is not None else ()
        if remembered is None or not stored or len(stored) >= len(messages):
            return None
        if not _sent_as(messages[-len(stored):], [m.as_sent() for m in stored]):  # the first may carry the summary
            return None
        return Continuation(remembered.prefix, "the newest part of the conversation above: from "
                                               f"{describe(messages, len(messages) - len(stored))} to the end")

    def for_history(self, key: str, active: Sequence[StoredMessage], cut: int,
                    summary: str | None) -> Continuation | None:
        """How to ask about `active[:cut]` after session `key`'s last request; None when that request is not this
        history (see the module doc)."""
        remembered = self.get(key)
        return None if remembered is None else fold_of(remembered.prefix, active, cut, summary)


def _sent_as(sent: Sequence[Message], stored: Sequence[Message]) -> bool:
    """Whether the request's messages `sent` are the turn's `stored` ones (the user's with its data block in
    front, the others as they are)."""
    return all(a == b or (a.get("role") == b.get("role") == "user" and user_texts([a]) == user_texts([b]))
               for a, b in zip(sent, stored, strict=True))


def fold_of(prefix: PromptPrefix, active: Sequence[StoredMessage], cut: int,
            summary: str | None) -> Continuation | None:
    """Which messages of `prefix` are `active[:cut]`, said for the model; None when the request's history is not
    the newest part of `active` as sent, or its first user message lacks the session's summary."""
    messages = prefix.messages
    if not messages or messages[0].get("role") != "system":
        return None
    shown = list(messages[1:])
    sent = [stored.as_sent() for stored in active]
    start = len(sent) - len(shown)  # the first active message the request carried
    if not shown or start < 0:
        return None
    expected = sent[start:]
    if summary:  # the request carried it, as `ContextBuilder.build` does, or it is not this history
        first = next((i for i, message in enumerate(expected) if message.get("role") == "user"), None)
        if first is None:
            return None
        expected[first] = with_summary(expected[first], summary)
    if expected != shown:
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
        part = (f"the conversation above up to and including {describe(shown, cut - 1 - start)}; {tail} part of "
                "it")
    if earlier and cut > start:
        part += ", and the earlier messages of that part quoted below"
    return Continuation(prefix, part, earlier, bool(summary))


def describe(messages: Sequence[Message], index: int) -> str:
    """`messages[index]` named for the model: a tool result by its tool and position ("the result of web_fetch"),
    the others by role and the start of their text ("the user's message that begins «…»", without « » or line
    breaks of its own)."""
    message = messages[index]
    role = message.get("role")
    if role == "tool":
        return _tool_result(messages, index)
    content = str(message.get("content") or "")
    if role == "user":
        content = user_texts([message])[0]  # without the data block picoclaw sent in front of it
    calls = message.get("tool_calls") or []
    if role == "assistant" and not content.strip() and calls:
        return f"the assistant's call of {', '.join(_call_name(call) for call in calls)}"
    who = {"user": "the user's message", "assistant": "the assistant's reply"}.get(str(role), "the message")
    text = " ".join(content.translate(_QUOTE_MARKS).split())
    if not text:
        return f"{who} that is empty"
    excerpt = text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "…"
    return f"{who} that begins «{excerpt}»"


def _call_name(call: dict[str, Any]) -> str:
    return str(call.get("function", {}).get("name"))


def _tool_result(messages: Sequence[Message], index: int) -> str:
    """A tool result named by its tool, never quoted (it is what a web page or a file said): "the result of
    web_fetch", "the second result of web_fetch" when the same call step ran it more than once."""
    call_id = messages[index].get("tool_call_id")
    for earlier in reversed(messages[:index]):
        calls = earlier.get("tool_calls") or []
        if earlier.get("role") != "assistant" or not calls:
            continue
        names = [_call_name(call) for call in calls]
        position = next((i for i, call in enumerate(calls) if call.get("id") == call_id), None)
        if position is None:
            break
        name = names[position]
        if names.count(name) == 1:
            return f"the result of {name}"
        nth = names[:position + 1].count(name)
        ordinal = _ORDINALS[nth - 1] if nth <= len(_ORDINALS) else f"#{nth}"
        return f"the {ordinal} result of {name}"
    return "a tool result"
