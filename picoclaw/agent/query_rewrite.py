"""Query rewriting: one short model call turns a conversational message ("and her sister?") into a standalone
search query ("Where does Anna's sister live?") using the last turns, before memory is searched.

Off unless the policy's `query_rewrite_enabled` is on. Built for small local models, which answer the
question instead of rewriting it, make up words, wrap the query in quotes, a "Query:" label or a code fence,
write a tool call as text, or switch to English: `refusal_reason` names each, and the message alone is
searched (one log line says why). An accepted rewrite is searched together with the message
(`search_query`). With no earlier turn there is nothing to resolve, so no call is made at all (on a CPU it
costs seconds to a minute). The call never enters the session history; a failed or slow call is logged and
the turn goes on with the message."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from picoclaw.cjk import has_cjk, letters
from picoclaw.providers.base import ChatProvider, Message, ProviderError

log = logging.getLogger(__name__)

PROMPT_VERSION = 1
MAX_TOKENS = 64  # a query is one line; a model that goes on is answering, and is cut off early
TIMEOUT_SECONDS = 60.0  # a CPU model reads the short prompt in seconds; longer means it is busy elsewhere
EARLIER_MESSAGES = 4  # user and assistant messages before the new one that the model sees
EARLIER_CHARS = 300  # of each: a long answer's start says what it was about
MAX_GROWTH = 80  # characters a rewrite may add to the message (names, the thing "it" was)
MIN_KEPT = 0.5  # share of the message's own words a rewrite keeps, unless its words come from the earlier turns
MAX_NEW = 1 / 3  # … share of its words found in neither the message nor the earlier turns

REWRITE_INSTRUCTIONS = (
    "Rewrite the user's new message as a standalone search query for their stored notes. Replace words "
    "such as he, she, it, they, there, that, 他, 她, 它, 他们, 那里 with the names or things they refer to in "
    "the earlier messages. Keep the other words of the message. Write in the language of the new message. "
    "Do not answer it. Reply with the query only, on one line.\n"
    "Example. Earlier: \"User: How is Anna doing?\" New: \"Where does her sister live?\" "
    "Query: Where does Anna's sister live?\n"
    "Example. Earlier: \"User: 我的猫叫小白\" New: \"它几岁了？\" Query: 小白几岁了？"
)

# Labels and wrappers small models put around the query (seen in tests/data/real_query_rewrites.json).
_LABEL = re.compile(r"^\s*\**\s*(?:(?:standalone\s+)?(?:search\s+)?query|rewritten(?:\s+message)?|new\s+message"
                    r"|(?:搜索)?查询(?:语句)?|改写(?:后)?)\s*\**\s*[:：]\s*\**\s*", re.IGNORECASE)
_FENCE = re.compile(r"^```[\w-]*\s*\n?|\n?```\s*$")
_QUOTES = "\"'“”‘’「」『』`"
_TOOL_CALL = re.compile(r"^\s*[{\[]|<tool_call>|functions\.\w|\"name\"\s*:", re.IGNORECASE)
_REFUSAL = re.compile(r"^\s*(?:i'?m sorry|sorry|i can(?:not|'t)|as an ai|i am unable|i'm unable|抱歉|对不起|"
                      r"很抱歉|我无法|我不能)", re.IGNORECASE)
_ANSWER = re.compile(r"^\s*(?:yes\b|no\b|the answer|based on|according to|是的|不是|根据|答案)", re.IGNORECASE)
_WORD = re.compile(r"[a-z0-9]+")
# Words a rewrite is meant to replace: not counted among the message's words it must keep.
_REFERRING = frozenset(
    "he she it they them him her his hers its their theirs there that this those these what about and "
    "the a an of to in on for is was do does did".split()) | frozenset("他她它们那这里的了吗呢么")


@dataclass(frozen=True)
class Rewrite:
    """The query memory is searched with for one message, and why the model's rewrite was not used."""

    query: str
    rewritten: str | None  # the accepted rewrite, None when the message itself is searched
    refused: str | None = None  # why the model's text was refused, or why no call was made


def earlier_turns(history: Sequence[Message]) -> list[Message]:
    """The last user/assistant messages with text (tool traffic left out), shortened."""
    said = [m for m in history if m.get("role") in ("user", "assistant") and str(m.get("content") or "").strip()]
    return [{"role": m["role"], "content": _shorten(str(m["content"]))} for m in said[-EARLIER_MESSAGES:]]


def rewrite_request(message: str, earlier: Sequence[Message]) -> list[Message]:
    """The messages asking the model for a standalone query for `message` given `earlier` turns."""
    lines = [f"{'User' if m['role'] == 'user' else 'Assistant'}: {m['content']}" for m in earlier]
    user = "Earlier messages:\n" + "\n".join(lines) + f"\n\nNew message: {message.strip()}\n\nQuery:"
    return [{"role": "system", "content": REWRITE_INSTRUCTIONS}, {"role": "user", "content": user}]


def clean_rewrite(text: str | None) -> str:
    """The model's text with code fences, labels and quotes taken off, first non-empty line only."""
    cleaned = _FENCE.sub("", (text or "").strip()).strip()
    lines = [line for line in cleaned.splitlines() if line.strip()]
    line = lines[0].strip() if lines else ""
    line = _LABEL.sub("", line).strip()
    if len(line) >= 2 and line[0] in _QUOTES and line[-1] in _QUOTES:
        line = line[1:-1].strip()
    return line


def refusal_reason(message: str, text: str | None, earlier: Sequence[Message] = ()) -> str | None:
    """Why the model's `text` is not a usable rewrite of `message` (given the `earlier` turns it saw), or
    None when it is."""
    raw = (text or "").strip()
    if _TOOL_CALL.search(raw) or _TOOL_CALL.search(clean_rewrite(raw)):
        return "a tool call as text"
    query = clean_rewrite(raw)
    if not query:
        return "empty"
    if len(query) > len(message.strip()) + MAX_GROWTH or len(raw.splitlines()) > 3:
        return "too long"
    if _REFUSAL.match(query):
        return "a refusal"
    if has_cjk(message) != has_cjk(query) or (has_cjk(message) and len(letters(query)) * 3 < len(letters(message))):
        return "another language"
    asked = message.rstrip().endswith(("?", "？"))
    if (_ANSWER.match(query) and not _ANSWER.match(message)) or (asked and query.endswith((".", "。", "!", "！"))):
        return "an answer"
    # A rewrite may drop the message's own words when it takes its words from the earlier turns ("tell me
    # more about that" → what "that" was); one that drops them and brings words of its own made them up.
    said = " ".join([message, *(str(m.get("content") or "") for m in earlier)])
    if _share(_units(message), _units(query)) < MIN_KEPT and 1 - _share(_units(query), _units(said)) > MAX_NEW:
        return "made up"
    return None


def accept_rewrite(message: str, text: str | None, earlier: Sequence[Message] = ()) -> str | None:
    """The cleaned rewrite when it is usable (see `refusal_reason`), else None."""
    return clean_rewrite(text) if refusal_reason(message, text, earlier) is None else None


def search_query(message: str, rewritten: str) -> str:
    """What memory is searched with: the message and its rewrite together (bench/query_rewrite.py measured
    this against the rewrite alone), so a word the rewrite dropped is still found."""
    if rewritten.strip().casefold() == message.strip().casefold():
        return message
    return f"{message}\n{rewritten}"


class QueryRewriter:
    """Asks `provider` for a standalone search query; every failure falls back to the message."""

    def __init__(self, provider: ChatProvider, *, timeout: float = TIMEOUT_SECONDS):
        self.provider = provider
        self.timeout = timeout

    async def rewrite(self, message: str, history: Sequence[Message]) -> Rewrite:
        """The query for `message` given the session's `history` (plain messages, oldest first)."""
        earlier = earlier_turns(history)
        if not message.strip() or not any(m["role"] == "user" for m in earlier):
            return Rewrite(message, None, "no earlier turn")
        try:
            reply = await asyncio.wait_for(
                self.provider.chat(rewrite_request(message, earlier), None, max_tokens=MAX_TOKENS), self.timeout)
        except (ProviderError, TimeoutError) as exc:
            failure = f"model call failed: {exc}" if isinstance(exc, ProviderError) else "timed out"
            log.info("query rewrite: %s; searching with the message", failure)
            return Rewrite(message, None, failure)
        usage = reply.usage
        if usage is not None:
            log.info("query rewrite: %d prompt + %d completion tokens", usage.prompt_tokens, usage.completion_tokens)
        reason = refusal_reason(message, reply.content, earlier)
        if reason is not None:
            log.info("query rewrite refused (%s): %.80r; searching with the message", reason, reply.content)
            return Rewrite(message, None, reason)
        rewritten = clean_rewrite(reply.content)
        return Rewrite(search_query(message, rewritten), rewritten)


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= EARLIER_CHARS else text[:EARLIER_CHARS] + " …"


def _units(text: str) -> set[str]:
    """The words (CJK: the characters) of `text` that carry meaning, lower-cased."""
    found = set(letters(text)) if has_cjk(text) else set(_WORD.findall(text.lower()))
    return found - _REFERRING


def _share(wanted: set[str], found: set[str]) -> float:
    """The share of `wanted` that `found` holds (1 when nothing is wanted)."""
    return len(wanted & found) / len(wanted) if wanted else 1.0
