"""Eval cases from past turns: the user's questions whose answers the model took from the memory the turn carried.

Each user message keeps its record of why it remembered (memory/search/turn_memory.py: every block it carried, what
found it, the block's first WHY_SNIPPET characters). A turn is a case when it asked a question, a block the search
found is in that record, and the reply repeats a stretch of that block (at least MIN_WORDS words, some of them not in
the question): the model answered from what was retrieved. That stretch is the case's expect. Enough such turns
(MIN_CASES) make a case set; fewer say little, and none is used.
"""

from __future__ import annotations

import logging
import re
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

from picoclaw.memory.eval.cases import PAST_TURN, EvalCase, holds, merged
from picoclaw.memory.grounding import is_question
from picoclaw.memory.terms import words
from picoclaw.storage import StorageError
from picoclaw.transcripts import SessionStore, StoredMessage

log = logging.getLogger(__name__)

MIN_CASES = 5  # fewer past-turn cases are not used as a set
MAX_CASES = 200  # the newest this many
MIN_WORDS = 2  # words of the entry the reply repeats (a CJK bigram is a word)
FOUND_BY = ("search", "lessons")  # a block the retrieval found, not the recent notes or the no-hit fallback
_EDGE = re.compile(r"^[\W_]+|[\W_]+$")


def answer_span(reply: str, entry: str, question: str) -> str | None:
    """The longest stretch of `entry` the reply repeats, cut to whole words, when it holds at least MIN_WORDS words
    and one the question does not; else None."""
    match = SequenceMatcher(None, entry, reply, autojunk=False).find_longest_match(0, len(entry), 0, len(reply))
    start, end = match.a, match.a + match.size
    # Whole words only: a Latin word cut at either end is dropped (CJK text has no word edges to respect).
    while start < end and start > 0 and entry[start - 1].isascii() and entry[start - 1].isalnum() \
            and entry[start].isascii() and entry[start].isalnum():
        start += 1
    while end > start and end < len(entry) and entry[end].isascii() and entry[end].isalnum() \
            and entry[end - 1].isascii() and entry[end - 1].isalnum():
        end -= 1
    span = _EDGE.sub("", entry[start:end])
    said = words(span)
    if len(said) < MIN_WORDS or not said - words(question) or holds(question, span):
        return None
    return span


def _reply_after(messages: list[StoredMessage], at: int) -> str:
    """The final reply to the user message at `at`: the last assistant text before the next user message."""
    reply = ""
    for stored in messages[at + 1:]:
        role = stored.message.get("role")
        if role == "user":
            break
        content = stored.message.get("content")
        if role == "assistant" and isinstance(content, str) and content.strip():
            reply = content
    return reply


def turn_case(messages: list[StoredMessage], at: int, origin: str) -> EvalCase | None:
    """The case the user message at `at` makes, if its reply was taken from a block the retrieval found."""
    stored = messages[at]
    question = stored.message.get("content")
    why: dict[str, Any] | None = stored.why
    if not isinstance(question, str) or not why or not is_question(question.strip()):
        return None
    reply = _reply_after(messages, at)
    if not reply:
        return None
    for item in why.get("items") or ():
        if not isinstance(item, dict) or item.get("found_by") not in FOUND_BY or not isinstance(item.get("text"), str):
            continue
        lines = item["text"].split("\n")
        body = "\n".join(lines[1:] if lines[0].startswith("## ") else lines)
        span = answer_span(reply, body, question)
        if span is not None:
            return EvalCase(question.strip(), span, PAST_TURN, origin)
    return None


def past_turn_cases(sessions: SessionStore, root: Path) -> list[EvalCase]:
    """The newest MAX_CASES cases from the transcripts of `sessions`; [] when fewer than MIN_CASES."""
    found: list[EvalCase] = []
    try:
        transcripts = sessions.transcripts()
    except (OSError, StorageError) as exc:
        log.warning("past turns cannot be read for eval cases: %s", exc)
        return []
    for path in sorted(transcripts, key=sessions.modified):
        try:
            session = sessions.read(path)
        except (OSError, StorageError, ValueError) as exc:
            log.warning("%s: left out of the eval cases: %s", path, exc)
            continue
        try:
            origin = path.relative_to(root).as_posix()
        except ValueError:
            origin = path.name
        messages = session.messages
        for at, stored in enumerate(messages):
            if stored.message.get("role") == "user":
                case = turn_case(messages, at, origin)
                if case is not None:
                    found.append(case)
    cases = merged([], reversed(found))[:MAX_CASES]  # the newest asking of a question counts
    return cases if len(cases) >= MIN_CASES else []
