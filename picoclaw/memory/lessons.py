"""Lessons: procedural memory kept in `memory/LEARNINGS.md` (seed 003, layer 3) — what worked, what failed,
what the user corrected — one `## YYYY-MM-DD` entry per lesson, in words a person can edit.

An entry is the lesson (when it applies and what to do) and a last line `Source: …` saying where it came
from (the session, and why it was written); the heading's date is when it was learned or last updated.
The store (memory/store.py) writes the file; these are the rules it writes by, and the ones search reads by:

- a lesson that says again what an entry already says (`restates`: most of the terms of the shorter one are
  in the other) updates that entry instead of adding a second one;
- a lesson that says it always holds ("always …", "from now on …", "以后都…", `is_standing`) is a standing
  lesson: every turn's prompt carries it (once per conversation), where other lessons come only when the
  message is about them;
- a file that has lost its `## ` headings (a hand edit, a paste) is still read (search/blocks.py,
  `lesson_blocks`): each paragraph is a lesson, and a warning names the file.
"""

from __future__ import annotations

import re

from picoclaw.cjk import has_cjk
from picoclaw.memory.terms import terms

LEARNINGS_FILE = "LEARNINGS.md"
SOURCE_PREFIX = "Source: "
MAX_LESSON_CHARS = 1_000
# How much of the shorter lesson's terms the other must hold for the two to be one lesson said twice. Lessons
# are short; a restatement keeps the subject and the advice and changes a few words around them.
RESTATES_SHARE = 0.6
RESTATES_MIN_TERMS = 3


def lesson_text(body: str, source: str) -> str:
    """An entry's body: the lesson, then its `Source:` line when there is a source."""
    source = " ".join(source.split())
    return f"{body}\n{SOURCE_PREFIX}{source}" if source else body


def lesson_of(entry_text: str) -> str:
    """The lesson an entry holds: its text without the `## ` heading and the `Source:` line."""
    lines = entry_text.strip("\n").split("\n")
    if lines and lines[0].startswith("##"):
        lines = lines[1:]
    kept = [line for line in lines if not line.startswith(SOURCE_PREFIX)]
    return "\n".join(kept).strip()


def restates(new: str, old: str) -> bool:
    """Whether lesson `new` says again what lesson `old` says: RESTATES_SHARE of the terms of the shorter one
    (RESTATES_MIN_TERMS at least) are in the other. Compared on terms, so English stems and Chinese bigrams
    count ("always answer in Chinese" / "answer in Chinese from now on"; "用摄氏度回答" / "回答时用摄氏度")."""
    new_terms, old_terms = set(terms(new)), set(terms(old))
    if min(len(new_terms), len(old_terms)) < RESTATES_MIN_TERMS:
        return False
    shared = len(new_terms & old_terms)
    return shared >= RESTATES_MIN_TERMS and shared >= RESTATES_SHARE * min(len(new_terms), len(old_terms))


_STANDING = re.compile(r"\b(?:always|from now on|never|every (?:answer|reply|time)"
                       r"|in (?:all|every) (?:answers|replies))\b"
                       r"|总是|始终|一直|以后|今后|从现在起|从现在开始|一律|永远|每次都|都要|不要再", re.IGNORECASE)


def is_standing(lesson: str) -> bool:
    """Whether a lesson says it holds whatever the message is about ("Always answer in Chinese", "以后都用中文回答")."""
    return _STANDING.search(lesson) is not None


_SENTENCE = re.compile(r"[^.!?。！？\n]+[.!?。！？]?")


# What a correction starts with, before what the user wants: "No —", "Wrong,", "不对，".
_CORRECTION_OPENING = re.compile(r"^(?:(?:no|nope|wrong|not quite)\b[\s,.!;:—–-]*"
                                 r"|(?:不对|不是|错了)[\s，,。！!：:—-]*)+", re.IGNORECASE)


def standing_instruction(text: str) -> str | None:
    """The first sentence of `text` that says it always holds, without the "No —" before it ("answer me in
    Chinese from now on."); None when there is none. A user's correction that holds one is the lesson itself."""
    for match in _SENTENCE.finditer(text):
        sentence = _CORRECTION_OPENING.sub("", match.group().strip()).strip()
        if is_standing(sentence) and len(set(terms(sentence))) >= 2:
            return sentence
    return None


def instruction_lesson(instruction: str) -> str:
    """A lesson that quotes the user's standing instruction, saying whose words they are (in Chinese for
    Chinese words): "The user asked: “answer me in Chinese from now on.”"."""
    return f"用户要求：“{instruction}”" if has_cjk(instruction) else f"The user asked: \"{instruction}\""


def keeps_point(lesson: str, instruction: str) -> bool:
    """Whether `lesson` still says what `instruction` asks: two of its terms at least (all of them when it has
    fewer). A small model's fluent lesson often drops the one thing the user said ("Always consult reliable
    sources" for "answer me in Chinese from now on")."""
    wanted = set(terms(instruction))
    return len(wanted & set(terms(lesson))) >= min(2, len(wanted))
