"""Session summaries in the daily notes: each compaction appends "Summary of session <key>:" and its summary to
today's note. A small model often gives back the previous summary word for word, ignoring the new turns (a real
1.5B model did so three compactions in a row); that repeat says nothing new and is not appended again."""

from __future__ import annotations

import re
from collections.abc import Iterable

from picoclaw.memory.grounding import same_words

# How the agent loop writes a summary into the daily note (agent/loop.py: f"Summary of session {key}:\n{summary}").
_SUMMARY_NOTE = re.compile(r"\ASummary of session (?P<key>.+?):\n(?P<summary>.+)\Z", re.DOTALL)
# A daily note's entry: a `## HH:MM` heading line and what follows up to the next one (appended content has its
# own `## ` headings demoted, so each of these starts an entry).
_NOTE_ENTRY = re.compile(r"^## \d{2}:\d{2}[^\n]*\n(?P<body>.*?)(?=^## \d{2}:\d{2}|\Z)", re.DOTALL | re.MULTILINE)


def summary_note(content: str) -> tuple[str, str] | None:
    """The session key and summary of a summary note's `content`, or None for any other note."""
    match = _SUMMARY_NOTE.match(content.strip())
    return (match["key"], match["summary"]) if match else None


def last_summary(notes: Iterable[str], key: str) -> str | None:
    """The newest summary of session `key` in the daily notes `notes` (their texts, newest first), or None."""
    for note in notes:
        found = [parsed[1] for entry in _NOTE_ENTRY.finditer(note)
                 if (parsed := summary_note(entry["body"])) is not None and parsed[0] == key]
        if found:
            return found[-1]
    return None


def repeats_last_summary(content: str, notes: Iterable[str]) -> bool:
    """Whether `content`, a note about to be appended, is a session's summary that says the same words as that
    session's previous one in `notes` (newest first): emphasis, case, width and punctuation aside."""
    parsed = summary_note(content)
    if parsed is None:
        return False
    key, summary = parsed
    previous = last_summary(notes, key)
    return previous is not None and same_words(previous, summary)
