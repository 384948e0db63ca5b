"""Session summaries: the prompt that asks for one, and the checks a summary must pass to be used.

What the summariser (and the memory flush) is shown is what the user saw: a reply that was empty is written
as one, an error as an error, so a summary cannot read an answer into them. A summary that still says the
assistant confirmed, told or answered something when no reply in the part it covers reached the user (a small
model wrote "the assistant confirmed the user's allergies" after an empty answer) is refused like a malformed one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from picoclaw.memory import overlap
from picoclaw.providers.base import Continuation, Message
from picoclaw.transcripts import UNDELIVERED

SECTIONS = ("Goal", "Constraints and preferences", "Progress", "Key decisions", "Next steps", "Key context")
# Models writing in Chinese often translate the headings: each section's English and Chinese names.
SECTION_NAMES: dict[str, tuple[str, ...]] = {
    "Goal": ("goal", "目标"),
    "Constraints and preferences": ("constraints and preferences", "约束和偏好", "约束与偏好"),
    "Progress": ("progress", "进展"),
    "Key decisions": ("key decisions", "关键决策"),
    "Next steps": ("next steps", "下一步"),
    "Key context": ("key context", "关键上下文"),
}
MIN_SECTIONS = 3  # fewer recognisable sections than this means the model did not write a summary
TOOL_RESULT_CHARS = 2000
# How a reply that showed the user nothing is written for the summariser and the memory flush.
EMPTY_REPLY = "(an empty reply: the user was shown no answer)"
# How the loop records a turn the model failed after its tools ran (agent/loop.py writes it, the user sees an error).
CUT_SHORT = "(The answer was cut short: "
# The mark session.py puts after a reply that never reached the user (`undelivered_note`).
_UNDELIVERED = re.compile(rf"{re.escape(UNDELIVERED)}[^\n]*\)\s*$")

@dataclass(frozen=True)
class CompactResult:
    """What a summary did: how many messages it folded in, and the summary text."""

    compacted: int
    summary: str


SUMMARY_FORMAT = (
    "Write a summary in the conversation's language with exactly these Markdown headings, in this order: "
    + ", ".join(f"'## {s}'" for s in SECTIONS)
    + ". Keep exact file paths, names, numbers, dates, identifiers and the user's stated preferences. "
    "Write only the summary."
)
SUMMARY_INSTRUCTIONS = ("You compact a conversation between a user and an assistant so it can continue with less "
                        "context. " + SUMMARY_FORMAT)
# How a summary asked after the conversation's own last request begins (agent/cache_prefix.py).
SUMMARY_TASK = "Compact the conversation so it can continue with less context."
# Said to the summariser of the conversation itself, which sees the replies as they were, not as render_transcript
# writes them, and the memory picoclaw put in front of the user's messages.
UNSEEN = (f"An assistant message that is empty, that begins {CUT_SHORT!r}, or that is marked {UNDELIVERED!r} is an "
          "answer the user never saw: never write that the assistant answered, told or confirmed anything there. "
          "A <context> block in front of a user's message is picoclaw's stored memory, not something said in the "
          "conversation.")


def render_transcript(messages: list[Message]) -> str:
    """The messages as plain text for the summariser (long tool results shortened)."""
    lines = []
    for message in messages:
        role = message.get("role")
        content = str(message.get("content") or "")
        if role == "tool":
            if len(content) > TOOL_RESULT_CHARS:
                content = content[:TOOL_RESULT_CHARS] + " […]"
            lines.append(f"Tool result: {content}")
            continue
        calls = message.get("tool_calls") or []
        for call in calls:
            function = call.get("function", {})
            lines.append(f"Assistant called {function.get('name')}({function.get('arguments')})")
        if role == "assistant" and not content.strip() and not calls:
            content = EMPTY_REPLY
        if content:
            lines.append(f"{'User' if role == 'user' else 'Assistant'}: {content}")
    return "\n".join(lines)


def shown_reply(message: Message) -> bool:
    """Whether `message` is an assistant reply the user saw: some text, not an error note, delivered."""
    content = str(message.get("content") or "").strip()
    return (message.get("role") == "assistant" and bool(content) and not content.startswith(CUT_SHORT)
            and _UNDELIVERED.search(content) is None)


def summary_request(previous: str | None, messages: list[Message]) -> list[Message]:
    """Messages asking the model to fold `messages` (and an earlier summary) into one summary."""
    parts = []
    if previous:
        parts.append(f"Summary of the conversation before this part:\n{previous.strip()}")
    parts.append(f"Conversation to summarise:\n{render_transcript(messages)}")
    return [{"role": "system", "content": SUMMARY_INSTRUCTIONS}, {"role": "user", "content": "\n\n".join(parts)}]


def continued_summary_request(after: Continuation, previous: str | None) -> str:
    """The instruction asking, after the conversation's last request, for a summary of `after.part` of it (with
    `after.earlier`, that part's messages the request did not carry); `previous`, the earlier summary, is in the
    request's first user message (cache_prefix.py continues only then)."""
    scope = after.part + (", together with the summary of what came before it, in the <summary> block above"
                          if previous and after.summary_shown else "")
    lines = [f"{SUMMARY_TASK} Summarise {scope}. {UNSEEN} {SUMMARY_FORMAT}"]
    if after.earlier:
        lines.append(f"Earlier messages of that part, not shown above:\n{after.earlier}")
    return "\n\n".join(lines)


_HEADING = re.compile(r"^#{1,4}\s*(.+?)\s*$", re.MULTILINE)
# Decoration around a heading's name: emoji, numbering ("1."), bold markers, a trailing colon.
_DECORATION = re.compile(r"^[\W\d_]+|[\W_]+$")


def _section_of(heading: str) -> str | None:
    name = _DECORATION.sub("", heading).lower()
    return next((section for section, names in SECTION_NAMES.items() if name in names), None)


def accept_summary(text: str | None) -> str | None:
    """The summary, cleaned, if it looks like one (not empty, enough of the sections); else None."""
    if not text or not text.strip():
        return None
    cleaned = text.strip()
    if cleaned.startswith("```"):
        cleaned = cleaned.strip("`").removeprefix("markdown").strip()
    found = {_section_of(heading) for heading in _HEADING.findall(cleaned)} - {None}
    if len(found) < MIN_SECTIONS:
        return None
    return cleaned


# "The assistant confirmed / told / answered …", "the user was told …", "助手确认了 …": a summary saying an answer
# was given. Tool work ("the assistant searched memory") is not an answer.
_CLAIM = re.compile(
    r"\b(?:the\s+|an?\s+|your\s+)?(?:ai\s+)?assistant\s+(?:has\s+|had\s+|then\s+|also\s+)*(?:confirmed|told"
    r"|answered|replied|responded|explained|informed|said|stated|provided|gave|recommended|suggested|advised"
    r"|shared|mentioned|reminded|clarified|assured|offered|listed|identified|noted|acknowledged)\b"
    r"|\b(?:the\s+)?user\s+(?:was|has\s+been|got)\s+(?:told|informed|given|reminded|shown|answered)\b"
    r"|助手(?:已经?|也|还)?(?:确认|告诉|告知|回答|答复|回复|解释|说明|提供|建议|推荐|提到|表示|提醒|指出|列出)"
    r"|(?:向用户|给用户)(?:确认|说明|解释|提供|推荐|建议)|用户(?:得知|被告知)", re.IGNORECASE)
_SUMMARY_SENTENCE = re.compile(r"[^.!?。！？\n]+[.!?。！？]?")


def unseen_answer_claims(summary: str, messages: list[Message], previous: str | None = None) -> list[str]:
    """The sentences of `summary` that claim the assistant answered something the user never saw: every claim
    when no reply in `messages` (the part it covers) reached the user; otherwise a claim closer to a turn whose
    reply was not seen than to any turn whose reply was. Sentences the earlier summary `previous` already had are
    its, not new claims."""
    turns = _turns(messages)
    unseen = [text for text, seen in turns if not seen]
    if not unseen:
        return []
    seen = [text for text, seen in turns if seen]
    before = {_fold(sentence) for sentence in _SUMMARY_SENTENCE.findall(previous or "")}
    claims = [sentence.strip(" -*#\t") for sentence in _SUMMARY_SENTENCE.findall(summary)
              if _CLAIM.search(sentence) and _fold(sentence) not in before]
    if not seen:
        return claims
    return [claim for claim in claims
            if max(overlap(claim, text) for text in unseen) > max(overlap(claim, text) for text in seen)]


def _turns(messages: list[Message]) -> list[tuple[str, bool]]:
    """Each turn of `messages` (a user message and what followed it) as its user's words and the replies the
    user saw, and whether any was seen; a turn with no reply yet is left out."""
    turns: list[tuple[list[str], list[str], bool]] = []
    for message in messages:
        if message.get("role") == "user" or not turns:
            turns.append(([str(message.get("content") or "")] if message.get("role") == "user" else [], [], False))
        if message.get("role") == "assistant":
            said, shown, replied = turns[-1]
            if shown_reply(message):
                shown.append(str(message.get("content") or ""))
            turns[-1] = (said, shown, True)
    return [("\n".join(said + shown), bool(shown)) for said, shown, replied in turns if replied]


def _fold(sentence: str) -> str:
    return re.sub(r"[\W_]+", "", sentence.casefold())
