"""When a new memory updates an older one ("my dog is now called Max" after "my dog is called Bob").

The older entry is kept and marked superseded, never deleted: a wrong guess costs one marker line, while
a deleted fact would be lost. So the rule is conservative. A new entry supersedes an older one when
- the new one says it is an update ("now", "no longer", "changed", "moved", 现在, 不再, 改成, 换成, 搬到 …)
  and at least half of the words (for Chinese, Japanese and Korean, two thirds of the characters) of the
  older entry's first clause are in it, two at least. The first clause names what an entry is about: "My sister Claire
  lives in Lyon; she works at a bakery" is about where Claire lives, "My sister Claire moved to Toronto"
  updates it without repeating the bakery, and "My brother moved to Berlin, he works at a bakery too"
  shares the bakery but not the subject (an entry whose first clause has fewer than two words is taken
  whole); or
- both say the same thing with different numbers ("locker 217" → "locker 305"): the same words, two at
  least, and different numbers.

The store applies the rule when an entry is appended; memory search applies it again among the entries a
query found (search/reranking.py), so entries that were never marked still rank newest first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property, lru_cache

from picoclaw import cjk
from picoclaw.memory.terms import CJK_STOP_CHARS, terms

_UPDATE = re.compile(r"\b(?:now|no longer|not any ?more|anymore|changed|moved|switched|instead|new)\b"
                     r"|现在|不再|改成|改为|换成|换了|搬到|搬去|已经换"
                     # 新 as "new" is ("新领导", "新车"), not inside words that mean something else.
                     r"|(?<![重创清最])新(?!闻|年|鲜|疆|加坡|西兰|手|奇|颖|郎|娘|华)", re.IGNORECASE)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
# Where an entry's first clause ends: a semicolon, colon, dash or comma, a sentence end, a line end.
_CLAUSE_END = re.compile(r"[;:，；：。！？!?\n]|[,.](?=\s|$)|\s[-–—]\s")


def _words(text: str) -> frozenset[str]:
    """Latin words (stop words dropped) and single CJK characters (common ones dropped), numbers left out.

    Japanese and Korean count by the character as Chinese does: "62キロ" and "217번" are a number and its
    unit, as "62公斤" is, not a word of their own that would make the same fact look different."""
    latin = {term for term in terms(text) if not cjk.has_cjk(term) and not term.isdigit()}
    characters = {ch for ch in cjk.letters(text) if ch not in CJK_STOP_CHARS}
    return frozenset(latin | characters)


@dataclass(frozen=True)
class Statement:
    """An entry's text as the update rule sees it, worked out once: its words, its numbers, and whether it
    says it is an update. Comparing many entries pairwise then costs set operations only."""

    words: frozenset[str]
    subject: frozenset[str]  # the words of its first clause (all its words when that has fewer than two)
    numbers: frozenset[str]
    says_update: bool

    @cached_property  # a search compares one statement with dozens of others
    def subject_share(self) -> float:
        """How much of the subject an update must repeat: half of its words, but two thirds when it is
        counted in characters (Chinese, Japanese, Korean), a character being weaker evidence than a word."""
        characters = sum(1 for word in self.subject if len(word) == 1 and cjk.has_cjk(word))
        return 2 / 3 if characters * 2 > len(self.subject) else 1 / 2

    @classmethod
    def of(cls, text: str) -> Statement:
        words = _words(text)
        subject = _words(_CLAUSE_END.split(text.strip(), maxsplit=1)[0])
        return cls(words, subject if len(subject) >= 2 else words, frozenset(_NUMBER.findall(text)),
                   _UPDATE.search(text) is not None)

    def updates(self, old: Statement) -> bool:
        """Whether this (newer) statement updates `old` (see the module's rule)."""
        shared = self.words & old.words
        if len(shared) < 2:
            return False
        on_subject = len(self.words & old.subject)
        if self.says_update and on_subject >= 2 and on_subject >= old.subject_share * len(old.subject):
            return True
        return old.words == self.words and old.numbers != self.numbers


# An append compares the new entry with every older one that shares two of its terms, and the older ones are the
# same from one append to the next: each text is read (tokenised) once while it is among the last STATEMENTS_KEPT.
STATEMENTS_KEPT = 2048


@lru_cache(maxsize=STATEMENTS_KEPT)
def _statement(text: str) -> Statement:
    return Statement.of(text)


def supersedes(new: str, old: str) -> bool:
    """Whether the entry text `new` updates the older entry text `old` (see the module's rule)."""
    # Read without the line breaks around them (they carry no words): the new entry is the same text as it later
    # is as an older one, with its newline.
    return _statement(new.strip()).updates(_statement(old.strip()))
