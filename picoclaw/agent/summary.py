"""Session summaries: the prompt that asks for one, and the check a summary must pass to be used."""

from __future__ import annotations

import re
from dataclasses import dataclass

from picoclaw.providers.base import Message

SECTIONS = ("Goal", "Constraints and preferences", "Progress", "Key decisions", "Next steps", "Key context")
# Models writing in Chinese often translate the headings; these are seed 001's names for the sections.
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

@dataclass(frozen=True)
class CompactResult:
    """What a summary did: how many messages it folded in, and the summary text."""

    compacted: int
    summary: str


SUMMARY_INSTRUCTIONS = (
    "You compact a conversation between a user and an assistant so it can continue with less context. "
    "Write a summary in the conversation's language with exactly these Markdown headings, in this order: "
    + ", ".join(f"'## {s}'" for s in SECTIONS)
    + ". Keep exact file paths, names, numbers, dates, identifiers and the user's stated preferences. "
    "Write only the summary."
)


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
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            lines.append(f"Assistant called {function.get('name')}({function.get('arguments')})")
        if content:
            lines.append(f"{'User' if role == 'user' else 'Assistant'}: {content}")
    return "\n".join(lines)


def summary_request(previous: str | None, messages: list[Message]) -> list[Message]:
    """Messages asking the model to fold `messages` (and an earlier summary) into one summary."""
    parts = []
    if previous:
        parts.append(f"Summary of the conversation before this part:\n{previous.strip()}")
    parts.append(f"Conversation to summarise:\n{render_transcript(messages)}")
    return [{"role": "system", "content": SUMMARY_INSTRUCTIONS}, {"role": "user", "content": "\n\n".join(parts)}]


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
