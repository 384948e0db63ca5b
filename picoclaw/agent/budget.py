"""The budget of one request: system prompt, standing lessons, skills list, tool schemas, injected memory, history,
the user's message and the reply's max_tokens together stay within the model's context window.

Plain functions of token counts (no I/O). Each shrinkable part has a share of the window (policy keys
`prompt_tools_percent`, `prompt_memory_percent`, `prompt_reply_percent`); on a small window the large parts give
way first: the tool schemas go to their short form (decided by their size against their share alone, so the
choice, and with it the prompt cache's prefix, stays the same for every turn on one window), memory carries
fewer blocks, the oldest history is summarised or set aside; the reply's part is a reserve while fitting, and its
max_tokens is config's lowered to what the prompt leaves. A tool's result is cut to what the window leaves
(`cut_to_fit`), and a request that would leave the reply less than REPLY_FLOOR is not sent. The user's message
is never cut: when it alone leaves no room for a reply, the request is not sent (`Fit.fits` is False).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from picoclaw.agent.images import IMAGE_TOKENS, image_count, without_images
from picoclaw.policy_schema import MemoryPolicy
from picoclaw.providers.base import ContextWindow, Message
from picoclaw.tokens import count_tokens
from picoclaw.transcripts import StoredMessage

# The parts of a request, in the order /context lists them.
PARTS = ("system", "lessons", "skills", "tools", "memory", "history", "user", "reply")
PART_LABELS = {"system": "system prompt", "lessons": "standing lessons", "skills": "skills list",
               "tools": "tool schemas", "memory": "memory and notes", "history": "history and summary",
               "user": "your message", "reply": "reply (max_tokens)"}
# Counts are tiktoken's (or an estimate), not the model's own tokenizer, and a chat template adds tokens of its
# own per message: this share of the window is kept free.
MARGIN_PERCENT = 5
# The fewest tokens a reply is given; a message that leaves less is refused rather than sent.
REPLY_FLOOR = 256
# The fewest tokens a tool result is given before the tool schemas leave the next request to make room for it.
RESULT_FLOOR = 128
# A short-form tool's description: whole up to this many characters (cron's says how to call it), else its first
# sentences that fit; a parameter's description at most SHORT_PARAMETER_CHARS ("e.g. 2026-12-01T09:00" stays).
SHORT_DESCRIPTION_CHARS = 200
SHORT_PARAMETER_CHARS = 40


@dataclass(frozen=True)
class Shares:
    """The policy's shares (%) of the window: tool schemas in full, memory and notes, the reply."""

    tools: int
    memory: int
    reply: int

    @classmethod
    def of(cls, policy: MemoryPolicy) -> Shares:
        return cls(policy.prompt_tools_percent, policy.prompt_memory_percent, policy.prompt_reply_percent)


def share_of(window: int, percent: int) -> int:
    return window * percent // 100


def usable(window: int) -> int:
    """The tokens a request may count on: the window less the margin for counting drift."""
    return window - share_of(window, MARGIN_PERCENT)


def reply_reserve(window: int, max_tokens: int, shares: Shares) -> int:
    """The reply's part kept while the prompt is fitted: config's max_tokens, at most its share of the window."""
    return max(1, min(max_tokens, share_of(window, shares.reply)))


def memory_cap(window: int, memory_token_budget: int, shares: Shares) -> int:
    """Most tokens of memory and notes one prompt carries: memory_token_budget, at most its share of the window."""
    return max(0, min(memory_token_budget, share_of(window, shares.memory)))


def short_tools_needed(full_tokens: int, window: int, shares: Shares) -> bool:
    """Whether the tool schemas go in their short form: only their full size against their share decides, so
    every turn on one window sends the same form (the prompt cache keeps the prefix)."""
    return full_tokens > share_of(window, shares.tools)


# -- counting ----------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def _schema_tokens(text: str) -> int:
    return count_tokens(text)


def json_tokens(value: Any) -> int:
    """Tokens of tool schemas as the JSON sent; cached (a process has a few sets of tools, sent every turn)."""
    return _schema_tokens(orjson.dumps(value).decode("utf-8"))


def message_tokens(message: Message) -> int:
    """Tokens of `message` as the JSON sent (not cached: a history message is counted once, `stored_tokens`); an
    image part counts IMAGE_TOKENS, not its data URL's characters."""
    images = image_count(message)
    if images:
        message = without_images(message)
    return count_tokens(orjson.dumps(message).decode("utf-8")) + images * IMAGE_TOKENS


def stored_tokens(stored: StoredMessage) -> int:
    """Tokens of a history message as sent, counted once and kept on it."""
    if stored.tokens is None:
        stored.tokens = message_tokens(stored.as_sent())
    return stored.tokens


def text_tokens(text: str) -> int:
    return count_tokens(text)


# -- the tools' short form ---------------------------------------------------------------------------------------


def short_schemas(schemas: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The tool schemas in their short form: each name, a one-line description, and parameters without their
    descriptions. A pure function of the schemas: the same tools give the same bytes every turn."""
    return [_short_schema(schema) for schema in schemas]


def _short_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    function = dict(schema.get("function") or {})
    short: dict[str, Any] = {"name": function.get("name", "")}
    description = short_description(str(function.get("description") or ""), SHORT_DESCRIPTION_CHARS)
    if description:
        short["description"] = description
    if "parameters" in function:
        short["parameters"] = _short_parameters(function["parameters"])
    return {**{k: v for k, v in schema.items() if k != "function"}, "function": short}


# A sentence ends at . ! ? followed by a space (not after an abbreviation such as "e.g."), or at 。！？.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])")
_ABBREVIATION = re.compile(r"(?:^|\s)(?:e\.g|i\.e|etc|vs|cf|approx|incl|no)\.$", re.IGNORECASE)


def short_description(text: str, limit: int) -> str:
    """`text` on one line, whole when it is at most `limit` characters; else its first sentences that fit (never
    split at an abbreviation), or the first sentence cut at a word with "…"."""
    whole = " ".join(text.split())
    if len(whole) <= limit:
        return whole
    sentences: list[str] = []
    for piece in _SENTENCE_END.split(whole):
        if sentences and _ABBREVIATION.search(sentences[-1]):
            sentences[-1] = f"{sentences[-1]} {piece}"
        elif piece:
            sentences.append(piece)
    kept = ""
    for sentence in sentences:
        joined = f"{kept} {sentence}".strip() if kept and not kept.endswith(("。", "！", "？")) else kept + sentence
        if len(joined) > limit:
            break
        kept = joined
    if kept:
        return kept
    cut = whole[:limit - 1]
    # At a word's end where there are words (a Chinese text has no spaces: cut at the character).
    if " " in cut[limit // 2:]:
        cut = cut[:cut.rindex(" ")]
    return cut.rstrip(" ,;:") + "…"


def _short_parameters(value: Any) -> Any:
    """A parameters schema with titles and examples dropped and each description at most SHORT_PARAMETER_CHARS."""
    if isinstance(value, dict):
        # "properties" maps names to schemas: a parameter named "description" is a name, not a description.
        short: dict[str, Any] = {}
        for key, item in value.items():
            if key in ("title", "examples"):
                continue
            if key == "description" and isinstance(item, str):
                short[key] = short_description(item, SHORT_PARAMETER_CHARS)
            elif key == "properties" and isinstance(item, dict):
                short[key] = {name: _short_parameters(sub) for name, sub in item.items()}
            else:
                short[key] = _short_parameters(item)
        return short
    if isinstance(value, list):
        return [_short_parameters(item) for item in value]
    return value


# -- fitting a request -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    """How one request fits: the history kept from index `history_start`, the first `memory_keep` memory pieces,
    the reply's max_tokens, the prompt's tokens. `fits` False: the fixed parts and the user's message leave less
    than REPLY_FLOOR for a reply, so it must not be sent."""

    history_start: int
    memory_keep: int
    max_tokens: int
    prompt: int
    fits: bool
    history_room: int = 0  # what the fixed parts, the kept memory and the reply's reserve leave for the history


def fit_request(window: int, *, fixed: int, memory: Sequence[int], history: Sequence[int], max_tokens: int,
                reserve: int) -> Fit:
    """Fit memory pieces (best first, together already within their cap) and history messages (oldest first) next to
    the `fixed` parts (system prompt, lessons, skills, tools, summary, the user's message), keeping `reserve` for
    the reply; what the prompt then leaves, up to `max_tokens`, is the reply's."""
    room = usable(window)
    floor = min(REPLY_FLOOR, reserve)
    if fixed + reserve > room:
        # Nothing else fits: no memory, no history, and the reply lowered to what is left.
        reply = min(max_tokens, room - fixed)
        return Fit(len(history), 0, max(reply, 0), fixed, reply >= floor, 0)
    left = room - fixed - reserve
    # Memory takes at most half of what is left, the history the rest: the recent conversation matters as much as
    # what memory brings up, and a fixed split keeps a set-aside from being filled by memory at the next turn.
    memory_room = left // 2
    keep = 0
    for cost in memory:
        if cost > memory_room:
            break
        memory_room -= cost
        left -= cost
        keep += 1
    start = _history_start(history, left)
    if start > 0:
        # Cut once, deep enough that the next turns fit again: keep what fills half the history's room, so a small
        # window sets its history aside (or summarises it) every few turns, not at every turn.
        start = _history_start(history, left // 2)
    prompt = fixed + sum(memory[:keep]) + sum(history[start:])
    return Fit(start, keep, min(max_tokens, room - prompt), prompt, True, left)


def _history_start(history: Sequence[int], room: int) -> int:
    """The first message of the newest run of `history` that fits in `room` tokens."""
    if sum(history) <= room:  # all of it fits, as on most turns of a large window: no walk (counts are never < 0)
        return 0
    start = len(history)
    for index in range(len(history) - 1, -1, -1):
        if history[index] > room:
            break
        room -= history[index]
        start = index
    return start


def reply_tokens(window: int, prompt: int, max_tokens: int) -> int | None:
    """The max_tokens of a request whose prompt is `prompt` tokens: config's, lowered to what the window leaves;
    None when that is below the reply's floor (the request must not be sent as it is)."""
    room = min(max_tokens, usable(window) - prompt)
    return room if room >= min(REPLY_FLOOR, max_tokens) else None


# -- a tool's result, cut to the window ----------------------------------------------------------------------------

CUT_NOTE = "\n[… cut to fit the model's window: {left:,} more characters; read it in parts (offset/limit)]"


def cut_to_fit(message: Message, room: int) -> Message:
    """A tool result `message` whose whole form (as sent) is at most `room` tokens: its content cut, with a note
    saying how much more there is. The cut is estimated from the CJK-aware counter, then checked against it."""
    if message_tokens(message) <= room:
        return message
    content = str(message.get("content") or "")
    fixed = message_tokens({**message, "content": ""}) + count_tokens(CUT_NOTE.format(left=len(content)))
    # Characters per token of this text (Chinese about 1, English about 4), a tenth kept back for the drift.
    per_token = len(content) / max(1, count_tokens(content))
    keep = min(len(content) - 1, int((room - fixed) * per_token * 0.9))
    while keep > 0:
        candidate = {**message, "content": content[:keep] + CUT_NOTE.format(left=len(content) - keep)}
        if message_tokens(candidate) <= room:
            return candidate
        keep = int(keep * 0.9)
    return {**message, "content": CUT_NOTE.format(left=len(content)).lstrip()}


def refusal(split: PromptSplit) -> str:
    """Why a request that does not fit (without a summary, memory or history: they give way first) is not sent:
    the system prompt and the tools when they alone leave no room for a reply, else the user's message."""
    window = split.window
    standing = sum(split.parts.get(name, 0) for name in ("system", "lessons", "skills", "tools"))
    user = split.parts.get("user", 0)
    where = f"the model's window of {window.tokens:,} tokens ({window.source})"
    if standing + REPLY_FLOOR <= usable(window.tokens):
        return (f"your message alone ({user:,} tokens) leaves no room for an answer in {where}; shorten it or send "
                "it in parts")
    return (f"the system prompt, skills and tool schemas ({standing:,} tokens) leave no room for an answer in "
            f"{where}; shorten AGENTS.md and the other bootstrap files, or use a model with a larger window")


# -- the split, for /context and the turn's record ---------------------------------------------------------------


@dataclass(frozen=True)
class PromptSplit:
    """Where one request's tokens went: each part's tokens, the window and where it came from, and what was
    shrunk to fit (tools in short form, memory pieces left out, history messages set aside)."""

    window: ContextWindow
    parts: dict[str, int]
    tools_short: bool = False
    memory_dropped: int = 0
    history_set_aside: int = 0
    history_room: int = 0  # the history's room in this request (Fit.history_room): the summary threshold's base

    def record(self) -> dict[str, Any]:
        """The split as the turn's `why` record keeps it (JSON)."""
        return {"window": self.window.tokens, "source": self.window.source, "detail": self.window.detail,
                "parts": dict(self.parts), "tools_short": self.tools_short, "memory_dropped": self.memory_dropped,
                "history_set_aside": self.history_set_aside, "history_room": self.history_room}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> PromptSplit | None:
        """The split a `why` record keeps; None when it is not one (an older record, a hand edit)."""
        try:
            parts = {str(k): int(v) for k, v in dict(record["parts"]).items()}
            window = ContextWindow(int(record["window"]), record["source"], str(record.get("detail") or ""))
            return cls(window, parts, bool(record.get("tools_short")), int(record.get("memory_dropped") or 0),
                       int(record.get("history_set_aside") or 0), int(record.get("history_room") or 0))
        except (KeyError, TypeError, ValueError):
            return None


def split_report(split: PromptSplit, heading: str) -> str:
    """The split as lines: each part's tokens and share of the window, the total, the window and its source."""
    window = split.window.tokens
    lines = [heading]
    width = max(len(label) for label in PART_LABELS.values())
    for name in PARTS:
        if name not in split.parts:
            continue
        tokens = split.parts[name]
        note = ""
        if name == "tools" and split.tools_short:
            note = "  (short form: the full schemas exceed prompt_tools_percent)"
        elif name == "memory" and split.memory_dropped:
            note = f"  ({split.memory_dropped} piece(s) left out to fit)"
        elif name == "history" and split.history_set_aside:
            note = f"  ({split.history_set_aside} older message(s) summarised or set aside to fit)"
        lines.append(f"  {PART_LABELS[name]:<{width}}  {tokens:>7,}  {_percent(tokens, window):>5}{note}")
    total = sum(split.parts.values())
    lines.append(f"  {'total':<{width}}  {total:>7,}  {_percent(total, window):>5}")
    margin = share_of(window, MARGIN_PERCENT)
    lines.append(f"  {'kept free':<{width}}  {margin:>7,}  {_percent(margin, window):>5}  (token counts are estimates)")
    detail = f": {split.window.detail}" if split.window.detail else ""
    lines.append(f"window: {window:,} tokens ({split.window.source}{detail})")
    return "\n".join(lines)


def _percent(tokens: int, window: int) -> str:
    return f"{100 * tokens / window:.1f}%" if window > 0 else "-"


def over_history_share(history: int, room: int, percent: int) -> bool:
    """Whether `history` tokens are over `percent` % of the history's `room` in a request (0: no room known)."""
    return room > 0 and history > room * percent // 100


def keep_within(costs: Sequence[int], room: int) -> int:
    """The first index of the newest run of `costs` within `room` tokens (a summary keeps no more than that)."""
    return _history_start(costs, room)
