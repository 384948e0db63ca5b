"""Lessons: procedural memory kept in `memory/LEARNINGS.md` — what worked, what failed,
what the user corrected — one `## YYYY-MM-DD` entry per lesson, in words a person can edit.

An entry is the lesson (when it applies and what to do) and a last line `Source: …` saying where it came
from (the session, and why it was written); the heading's date is when it was learned or last updated.
A section may also hold several lessons, one a paragraph (a hand-written `## Tools` section): search and the
store both take each paragraph as a lesson (search/blocks.py, `lesson_blocks`), and a paragraph before the
first heading is one too. The store (memory/store.py) writes the file; these are the rules it writes by:

- a lesson that says again what a lesson already says (`restates`: most of the telling terms of both are
  shared) replaces that lesson instead of adding a second one;
- a lesson that says it always holds ("always …", "from now on …", "以后都…", `is_standing`) and that a person
  gave (`given_by_a_person`: a hand edit, the CLI, a user's correction, not what the model saved or drafted
  from tool results, which may carry a web page's words) is a standing lesson: every system prompt carries
  it. Other lessons come only when the message is about them.
"""

from __future__ import annotations

import re

from picoclaw.cjk import has_cjk
from picoclaw.memory.terms import terms

LEARNINGS_FILE = "LEARNINGS.md"
SOURCE_PREFIX = "Source: "
MAX_LESSON_CHARS = 1_000
# How many of the two lessons' telling terms (shared / all, lone CJK characters aside) must be shared for the two
# to be one lesson said twice. Lessons are short; a restatement keeps the subject and the advice and changes a
# few words around them, while "answer in Chinese" and "answer in Celsius" share half and say different things.
RESTATES_SHARE = 0.5
RESTATES_MIN_TERMS = 3
# Where a lesson came from, as the learner and the memory_append tool write it: the model's own words, or
# drafted from tool results. Such a lesson never stands in every system prompt.
# A correction's lesson the model drafted in words the user did not say (curation/lesson_drafting.py): the model's too.
DRAFTED_CORRECTION = "correction, drafted"
# A lesson drafted after a 👎 on a reply: the model's guess at what was wrong.
MODEL_SOURCES = ("(memory_append)", "(recovery)", "(workflow)", f"({DRAFTED_CORRECTION})", "(disliked)")


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


def _telling_terms(lesson: str) -> set[str]:
    """A lesson's terms for comparing it: a quoted instruction's own words, no lone CJK characters (the pairs
    carry the meaning; 以后都用中文 and 以后都用摄氏度 share 以, 后, 都, 用)."""
    quoted = _QUOTED_INSTRUCTION.fullmatch(lesson.strip())
    words = quoted.group(1) or quoted.group(2) if quoted else lesson
    return {term for term in terms(words) if not (len(term) == 1 and has_cjk(term))}


def restates(new: str, old: str) -> bool:
    """Whether lesson `new` says again what lesson `old` says: RESTATES_SHARE of their telling terms together
    are shared, RESTATES_MIN_TERMS at least. On terms, so English stems and Chinese pairs count ("always
    answer in Chinese" / "answer in Chinese always"; "回答天气问题时用摄氏度" / "天气问题用摄氏度")."""
    new_terms, old_terms = _telling_terms(new), _telling_terms(old)
    shared = len(new_terms & old_terms)
    return shared >= RESTATES_MIN_TERMS and shared >= RESTATES_SHARE * len(new_terms | old_terms)


def given_by_a_person(entry_text: str) -> bool:
    """Whether a lesson entry was written by a person (by hand, the CLI, from a user's correction) rather than
    by the model on its own or from tool results (`MODEL_SOURCES`)."""
    sources = [line for line in entry_text.splitlines() if line.startswith(SOURCE_PREFIX)]
    return not any(source.rstrip().endswith(MODEL_SOURCES) for source in sources)


_STANDING = re.compile(r"\b(?:always|from now on|never|every (?:answer|reply|time)"
                       r"|in (?:all|every) (?:answers|replies))\b"
                       r"|总是|始终|一直|以后|今后|从现在起|从现在开始|一律|永远|每次都|都要|不要再", re.IGNORECASE)


def is_standing(lesson: str) -> bool:
    """Whether a lesson says it holds whatever the message is about ("Always answer in Chinese", "以后都用中文回答")."""
    return _STANDING.search(lesson) is not None


def stands(entry_text: str) -> bool:
    """Whether a lesson (an entry or a paragraph of LEARNINGS.md, as written) is a standing one, carried by
    every system prompt: it says it always holds, and a person gave it."""
    return is_standing(lesson_of(entry_text)) and given_by_a_person(entry_text)


_QUOTED_INSTRUCTION = re.compile(r'The user asked: "(.*)"|用户要求：“(.*)”', re.DOTALL)


def instruction_lesson(instruction: str) -> str:
    """A lesson that quotes the user's standing instruction, saying whose words they are (in Chinese for
    Chinese words): "The user asked: “answer me in Chinese from now on.”"."""
    return f"用户要求：“{instruction}”" if has_cjk(instruction) else f"The user asked: \"{instruction}\""


def keeps_point(lesson: str, instruction: str) -> bool:
    """Whether `lesson` still says what `instruction` asks: two of its telling terms at least (all of them when
    it has fewer). A small model's fluent lesson often drops the one thing the user said ("Always consult
    reliable sources" for "answer me in Chinese from now on")."""
    wanted = _telling_terms(instruction)
    return len(wanted & _telling_terms(lesson)) >= min(2, len(wanted))
