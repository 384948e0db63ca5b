"""Key facts of a memory text, so a rewrite that lost one can be refused before it replaces MEMORY.md.

A small model asked to compress the file writes fluent `## ` Markdown that quietly drops an allergy, a phone
number or a whole Chinese entry, or translates an entry into English. Nothing here understands the text;
it extracts what must survive any faithful rewrite, and `missing_facts(original, rewrite)` lists what did not.

The rules (both texts are first normalised with Unicode NFKC, so full-width digits and letters count as
their ASCII forms, and thousands separators are dropped, so "1,200" is 1200):

- Dates: YYYY-MM-DD, YYYY/MM/DD, YYYY.MM.DD and YYYY年M月D日 are one date whatever the form (the `## `
  heading dates of entries included). A date is kept when the rewrite holds the same date in any of these
  forms, or the month and day ("03-10", "3月10日") somewhere and the year anywhere (a block headed
  "## 2025" or "(2025-03-01 to 2025-03-20)" listing "03-10: …").
- Phone numbers (a leading "+", or three or more digit groups joined by spaces or hyphens with seven digits
  or more) are kept when the same digits appear in order, however they are grouped.
- Identifiers: URLs, e-mail addresses, file paths, host and file names ("ci-1.example.com", "notes.md"),
  and codes: words with an underscore, with a capital after the first letter ("ECONNREFUSED", "CAF-42",
  "B-AX", "iPhone"), or a letter followed by digits ("A380", "mp3"). Compared without case.
- Numbers: every other run of digits ("217", "3.5", "7:30"), kept when the same run stands in the rewrite
  with no digit joined to it ("2019" is not kept by "20190"; "3" is not kept by "3.5"). The digits of a
  code, a date or a phone number are part of that fact, not numbers of their own.
- Names: capitalised Latin words ("Bob", "Charité", "Munich", "March"), except a common English word
  (COMMON_WORDS: "The", "My", "It", "Call", "Error", "Work" …) where a sentence, a list item or a part
  after a colon starts, or anywhere in a heading (models write headings in Title Case). "I" is no name.
  Compared without case; a plural or possessive ("Anna's") keeps the name.
- CJK names and terms: Chinese has no capitals, so only two reliable kinds are taken: a CJK term in
  brackets or quotes ("（复旦大学）", "「猎鹰」", "《三体》") and the 2–4 characters after 叫/名叫/叫做 that run
  to a boundary ("我女儿叫小雨，" → 小雨). Kept when the same characters appear in the rewrite.
- Sentences (split at . ! ? ; 。 ！ ？ ； and line ends): what the hard facts above cannot see, a preference
  or an allergy with no number or name in it, and the language of an entry. A sentence's CJK text is its set
  of 2-character shingles ("我每周三晚上" → 我每 每周 周三 三晚 晚上); its Latin text is its words of three
  letters or more that are not stop words, compared by a crude stem (the first five letters, or the word
  without a final "s"). A sentence is lost when under a quarter of its shingles, or under a quarter of its
  words (when it has two or more and is no heading: headings name topics, which a rewrite may rename),
  appear anywhere in the rewrite. So a Chinese sentence rephrased in Chinese keeps most of its shingles
  and passes; one dropped, or translated into English, keeps none and is listed. A lost sentence is listed
  in quotes (cut at 40 characters), after the facts it held.

Merging is free: a rewrite that puts two entries' facts into one sentence, in any order ("14 March" →
"March 14"), passes as long as every fact is somewhere in it.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from picoclaw import cjk
from picoclaw.cjk import LETTERS as CJK
from picoclaw.cjk import PUNCTUATION
from picoclaw.memory.terms import STOP_WORDS

LATIN = "0-9A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f_"
KEPT_SHARE = 0.25  # a sentence with under a quarter of its words / shingles left was dropped or translated

# Capitalised because a sentence, list item, heading or a part after a colon starts with them, not because
# they are names: there they are not taken as names. No first names, months or weekdays here (Bill, May).
COMMON_WORDS = STOP_WORDS | frozenset(
    """
    also always another anything around away back best better big called cannot could daily day days dear
    done early either else even ever every everything few first get gets go goes going good got great has
    here however i'd i'll i'm i've instead it's just last later least less let like little lot lots made
    make many maybe might much must need needs never new next none nothing often ok okay old one only
    others please really same see several since something sometimes soon still sure take than thanks
    that's there's though today tomorrow together two usually want wants we'd we'll we're well what's yes
    yesterday yet you'd you'll you're let's don't doesn't didn't can't won't isn't
    likes liked loves loved hates hated prefers preferred lives lived works worked uses used had owns
    drives drinks eats plays studies studied speaks started starts moved born bought visited visits
    married allergic allergy allergies favourite favorite birthday birthdays phone mobile email e-mail
    address wife husband son daughter mother father mom mum dad sister brother parents children kids boss
    colleague colleagues team job office meeting meetings appointment appointments
    call ask buy pay book check send bring pick meet text read write fix try keep stop start avoid
    remind remember reminder reminders note notes todo to-do update updated important summary misc
    miscellaneous general error errors issue issues bug bugs problem question answer idea ideas plan plans
    goal goals task tasks password account username login server database key keys budget deadline price
    cost flight flights hotel train doctor dentist medicine medication diet
    work home family health hobbies hobby pets pet food drink drinks travel trip trips contacts contact
    preferences preference personal private profile background facts fact info information details topics
    topic schedule routine finance finances money school study shopping car cars people friends friend
    user owner age languages language current recent earlier older newer entries entry project projects
    life lifestyle professional career education interests relationships household housing vehicle
    vehicles transport medical health-related dislikes habits sports exercise fitness music books movies
    games tech technology software tools devices accounts documents numbers dates events various overview
    """.split()
)
_ALL_CAPS_COMMON = frozenset({"AM", "PM", "OK", "TODO", "FYI", "NB", "PS"})

FactKind = Literal["date", "phone", "identifier", "number", "name", "term"]


@dataclass(frozen=True)
class Fact:
    """One thing a rewrite must keep: its kind, its text as written (normalised), where it stood."""

    kind: FactKind
    text: str
    position: tuple[int, int]  # (sentence, offset): the order facts are listed in


@dataclass(frozen=True)
class Sentence:
    """One sentence of the original: its text, and the words and CJK shingles that say what it is about."""

    text: str
    position: tuple[int, int]
    stems: frozenset[str]
    shingles: frozenset[str]
    heading: bool = False


@dataclass(frozen=True)
class FactSet:
    """The key facts of a text (deduplicated, in order) and its sentences."""

    facts: tuple[Fact, ...]
    sentences: tuple[Sentence, ...]

    @property
    def has_cjk(self) -> bool:
        return any(sentence.shingles for sentence in self.sentences)


# -- normalising -------------------------------------------------------------------------------------

_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def normalise(text: str) -> str:
    """NFKC (full-width digits and letters become ASCII), one apostrophe, no thousands separators."""
    text = unicodedata.normalize("NFKC", text).replace("’", "'")
    return _THOUSANDS.sub("", text)


# -- splitting into sentences --------------------------------------------------------------------------

_MARKUP = re.compile(r"^\s*(?:#+\s*|[-*+>]\s+|\d{1,3}[.)]\s+)*")
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|(?<=[。！？；])")


def sentences(text: str) -> list[tuple[str, bool]]:
    """The sentences of `text` as written, each with whether it is a heading: split at line ends and
    sentence punctuation, Markdown markup (`## `, `- `, `1. `) removed."""
    out: list[tuple[str, bool]] = []
    for line in text.splitlines():
        heading = line.startswith("#")
        line = _MARKUP.sub("", line)
        out.extend((part.strip(), heading) for part in _SENTENCE_END.split(line) if part.strip())
    return out


# -- extracting ------------------------------------------------------------------------------------

_URL = re.compile(rf"(?:https?|ftp)://[^\s<>\"'{CJK}{PUNCTUATION}]+|www\.[A-Za-z0-9\-]+\.[^\s<>\"'{CJK}]+")
_EMAIL = re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)+")
_PATH = re.compile(r"(?<![\w/~.:])(?:~|\.{1,2})?/[\w.\-]+(?:/[\w.\-]+)*/?")
_FULL_DATE = re.compile(r"(?<!\d)(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})(?!\d)"
                        r"|(?<!\d)(\d{4})\s*年\s*(\d{1,2})\s*月\s*(\d{1,2})\s*[日号]")
_MONTH_DAY = re.compile(r"(?<![\d\-/.])(\d{1,2})-(\d{1,2})(?![\d\-])|(?<!\d)(\d{1,2})\s*月\s*(\d{1,2})\s*[日号]")
_PHONE = re.compile(r"(?<![\w+])\+\d[\d \-().]*\d|(?<![\w+\-])\(?\d{2,5}\)?(?:[ \-]\d{2,5}){2,}(?![\w\-])")
_TOKEN = re.compile(rf"(?<![{LATIN}])[{LATIN}]+(?:[-.'][{LATIN}]+)*")
_PART = re.compile(r"[-.']")
_NUMBER = re.compile(r"(?<!\d)(?<!\d[.:/])\d+(?:[.:/]\d+)*")
_WORD = re.compile(r"[A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f]+")
_CJK_TERM = re.compile(rf"[(「『《“【〈\"]([{CJK}·・]{{2,12}})[)」』》”】〉\"]"
                       rf"|(?:名叫|叫做|叫)([{CJK}]{{2,4}})(?![{CJK}])")


def _date(match: re.Match[str]) -> tuple[int, int, int] | None:
    year, month, day = (int(g) for g in (match.groups()[:3] if match.group(1) else match.groups()[3:]))
    return (year, month, day) if 1 <= month <= 12 and 1 <= day <= 31 else None


def _phone_digits(text: str) -> str:
    return ("+" if text.startswith("+") else "") + re.sub(r"\D", "", text)


def _identifier(token: str) -> bool:
    parts = _PART.split(token)
    if "_" in token:
        return True
    if "." in token and any(c.isalpha() for c in token) and len(parts[0]) >= 2 and parts[-1].isalpha() \
            and len(parts[-1]) >= 2:
        return True  # a host or file name: ci-1.example.com, notes.md, Node.js
    if any(part[:1].isalpha() and any(c.isdigit() for c in part) for part in parts):
        return True  # A380, mp3, v2
    if any(c.isupper() for c in token[1:]) and token not in _ALL_CAPS_COMMON:
        return True  # ECONNREFUSED, CAF-42, B-AX, iPhone
    return False


_LATIN_LETTER = re.compile(r"[A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f]")


def _starts_something(before: str) -> bool:
    # Nothing Latin before it in the sentence, or right after a colon, bracket or quote: "Note: Call mom".
    before = before.rstrip()
    return not _LATIN_LETTER.search(before) or before.endswith((":", "(", '"', "“", "—"))


def _name(token: str, initial: bool) -> str | None:
    if token.endswith("'s"):
        token = token[:-2]
    if len(token) < 2 or not token[0].isupper() or not token[0].isalpha() or token in _ALL_CAPS_COMMON:
        return None
    if _PART.split(token)[0] == "I":  # I'm, I'll, I've, I'd
        return None
    common = token.lower() in COMMON_WORDS or _PART.split(token)[0].lower() in COMMON_WORDS
    return None if common and initial else token


def _stem(word: str) -> str:
    word = word.lower()
    return word[:5] if len(word) > 5 else (word[:-1] if len(word) > 3 and word.endswith("s") else word)


def _stems(text: str) -> frozenset[str]:
    return frozenset(_stem(w) for w in _WORD.findall(text) if len(w) >= 3 and w.lower() not in STOP_WORDS)


def _shingles(text: str) -> frozenset[str]:
    return frozenset(run[i:i + 2] for run in cjk.runs(text) for i in range(len(run) - 1))


def _blank(text: str, match: re.Match[str]) -> str:
    return text[:match.start()] + " " * (match.end() - match.start()) + text[match.end():]


def _sentence_facts(index: int, text: str, heading: bool) -> list[Fact]:
    """The facts of one normalised sentence, each span blanked once taken so its digits are not taken again.

    In a heading every word counts as starting something: models write headings in Title Case."""
    found: list[Fact] = []

    def take(kind: FactKind, match: re.Match[str], value: str | None = None) -> None:
        nonlocal text
        found.append(Fact(kind, value if value is not None else match.group(0), (index, match.start())))
        text = _blank(text, match)

    for pattern in (_URL, _EMAIL, _PATH):
        for match in list(pattern.finditer(text)):
            value = match.group(0).rstrip(".,;:!?'\")")
            if pattern is _URL and "(" in value and match.group(0).endswith(")"):
                value += ")"
            take("identifier", match, value.rstrip("/") if pattern is not _EMAIL else value)
    for match in list(_FULL_DATE.finditer(text)):
        if _date(match) is not None:
            take("date", match)
    for match in list(_PHONE.finditer(text)):
        if len(re.sub(r"\D", "", match.group(0))) >= 7 or match.group(0).startswith("+"):
            take("phone", match, match.group(0).strip())
    for match in list(_TOKEN.finditer(text)):
        token = match.group(0)
        if _identifier(token):
            take("identifier", match)
        elif (name := _name(token, heading or _starts_something(text[:match.start()]))) is not None:
            found.append(Fact("name", name, (index, match.start())))
    for match in _NUMBER.finditer(text):
        found.append(Fact("number", match.group(0), (index, match.start())))
    for match in _CJK_TERM.finditer(text):
        term = match.group(1) or match.group(2)
        found.append(Fact("term", term, (index, match.start(1) if match.group(1) else match.start(2))))
    return found


def _key(fact: Fact) -> tuple[str, str]:
    if fact.kind == "date":
        match = _FULL_DATE.search(fact.text)
        assert match is not None
        return "date", str(_date(match))
    if fact.kind == "phone":
        return "phone", _phone_digits(fact.text)
    return fact.kind, fact.text.lower()


def key_facts(text: str) -> FactSet:
    """The key facts and the sentences of `text` (see the module docstring for the rules)."""
    facts: dict[tuple[str, str], Fact] = {}
    found: list[Sentence] = []
    for index, (raw, heading) in enumerate(sentences(text)):
        norm = normalise(raw)
        for fact in _sentence_facts(index, norm, heading):
            facts.setdefault(_key(fact), fact)
        found.append(Sentence(raw, (index, len(norm)), _stems(norm), _shingles(norm), heading))
    ordered = sorted(facts.values(), key=lambda fact: fact.position)
    return FactSet(tuple(ordered), tuple(found))


# -- looking them up in a rewrite -------------------------------------------------------------------


class Rewrite:
    """A rewrite, normalised once and indexed for the look-ups `missing` makes for every fact."""

    def __init__(self, text: str):
        self.text = normalise(text)
        self.lower = self.text.lower()

    @cached_property
    def numbers(self) -> frozenset[str]:
        return frozenset(_NUMBER.findall(self.text))

    @cached_property
    def dates(self) -> frozenset[tuple[int, int, int]]:
        return frozenset(d for m in _FULL_DATE.finditer(self.text) if (d := _date(m)) is not None)

    @cached_property
    def month_days(self) -> frozenset[tuple[int, int]]:
        pairs = {(int(m.group(1) or m.group(3)), int(m.group(2) or m.group(4))) for m in _MONTH_DAY.finditer(self.text)}
        return frozenset(pairs | {(month, day) for _, month, day in self.dates})

    @cached_property
    def stems(self) -> frozenset[str]:
        return _stems(self.text)

    @cached_property
    def shingles(self) -> frozenset[str]:
        return _shingles(self.text)

    def keeps(self, fact: Fact) -> bool:
        """Whether the rewrite still holds `fact`."""
        if fact.kind == "number":
            return fact.text in self.numbers
        if fact.kind == "date":
            match = _FULL_DATE.search(fact.text)
            assert match is not None
            date = _date(match)
            assert date is not None
            year, month, day = date
            return date in self.dates or ((month, day) in self.month_days
                                          and re.search(rf"(?<!\d){year}(?!\d)", self.text) is not None)
        if fact.kind == "phone":
            # The same digits in the same order, grouped in any way ("+49 30 450 50" = "+49-30-45050").
            digits = _phone_digits(fact.text)
            start = r"\+[ (]*" if digits.startswith("+") else r"(?<![\d+])"
            pattern = start + r"[ \-().]*".join(digits.lstrip("+")) + r"(?!\d)"
            return re.search(pattern, self.text) is not None
        if fact.kind == "term":
            return fact.text in self.text
        return re.search(self._word_pattern(fact), self.lower) is not None

    def count(self, fact: Fact) -> int | None:
        """How often the rewrite says `fact` (a name, number, identifier or CJK term); None for a date or a phone
        number, which are written in too many forms to count."""
        if fact.kind == "number":
            return _NUMBER.findall(self.text).count(fact.text)
        if fact.kind == "term":
            return self.text.count(fact.text)
        if fact.kind in ("date", "phone"):
            return None
        return len(re.findall(self._word_pattern(fact), self.lower))

    @staticmethod
    def _word_pattern(fact: Fact) -> str:
        suffix = "(?:'s|s|es)?" if fact.kind == "name" else ""
        return rf"(?<![{LATIN}]){re.escape(fact.text.lower())}{suffix}(?![{LATIN}])"

    def keeps_sentence(self, sentence: Sentence) -> bool:
        """Whether enough of a sentence's words and CJK shingles are left (each script on its own).

        A sentence of one Latin word ("Call +86 …") says nothing its facts do not, and a heading's Latin words
        name a topic the model may rename: their words are not checked (their facts are).
        """
        least_words = 10**9 if sentence.heading else 2
        for own, there, least in ((sentence.stems, self.stems, least_words), (sentence.shingles, self.shingles, 1)):
            if len(own) >= least and len(own & there) < KEPT_SHARE * len(own):
                return False
        return True


def _quoted(text: str, limit: int = 40) -> str:
    return f"“{text if len(text) <= limit else text[:limit - 1] + '…'}”"


def missing_facts(original: str, rewrite: str) -> list[str]:
    """What of `original` the `rewrite` lost, in the original's order: each fact as written, and each lost
    sentence in quotes. Empty when the rewrite keeps everything the rules can check."""
    facts = key_facts(original)
    index = Rewrite(rewrite)
    lost: list[tuple[tuple[int, int], str]] = [(f.position, f.text) for f in facts.facts if not index.keeps(f)]
    lost += [(s.position, _quoted(s.text)) for s in facts.sentences if not index.keeps_sentence(s)]
    return [text for _, text in sorted(lost, key=lambda item: item[0])]
