"""Search terms for English, Chinese and mixed text: the one tokenizer of the keyword search and the index.

Latin-script text gives lower-cased words (stop words dropped), English words reduced to their Snowball
stem ("running", "runs" → run); identifiers, e-mail addresses, paths and error codes are kept whole
(`handleWebSocketReconnect`, `ECONNREFUSED`, `alice@example.com`) and their parts are added too. CJK text
has no spaces, so each run of CJK characters gives its characters and its character bigrams ("宠物狗叫" →
宠 宠物 物 物狗 狗 狗叫 叫). The bigrams carry most of the meaning; the single characters catch what bigrams
miss: one-character words (猫, 画) and names transliterated differently in different places (梅拉妮 /
梅兰妮). Very common characters (的, 了, 我, 什, 么 …) are not kept on their own, only inside bigrams; a lone
CJK character is always kept. A number written against a CJK character also gives the pair ("5月", "3个").

In ranking, a bigram match is what outweighs a shared character: an entry holding 护照 matches 护, 照 and
护照, one with 护士 only 护. Where a text is compared with a query as a set of words (`words`: does it hold
what the query asks for?), a character of a longer CJK run is a fragment of a word, not a word: left out.

A query (`query_terms`) also drops question words (what, kind, likely …; 什么, 时候, 哪些 …): they say what
is asked, not what to find. A block (`block_terms`) also gets its date in words when its heading is
`## YYYY-MM-DD` or its file a daily note `YYYYMMDD.md` ("8 May 2023", "2023年5月8日"), so "in May 2023"
and "2023年5月" find it; the file itself is unchanged.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from datetime import date
from functools import lru_cache
from pathlib import PurePath

import snowballstemmer  # type: ignore[import-untyped]

from picoclaw.cjk import LETTERS, is_cjk, pattern, runs

# Bumped whenever the terms of a text change: the index stores terms, and re-tokenises every file when this
# differs from what it was built with (2: Snowball stems, number+CJK pairs, date words).
TERMS_VERSION = 2

_WORD = rf"[^\W{LETTERS}]+"
_TOKEN = rf"(?P<cjk>[{LETTERS}]+)|(?P<word>{_WORD}(?:[.@/:\-]{_WORD})*)"  # compiled at first use
_PART_SPLIT = re.compile(r"[.@/:\-_]+")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_STEMMABLE = re.compile(r"[a-z]+")

STOP_WORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have
    having he her here hers herself him himself his how i if in into is it its itself just me more most
    my myself no nor not now of off on once only or other our ours ourselves out over own same she should
    so some such than that the their theirs them themselves then there these they this those through to
    too under until up very was we were what when where which while who whom why will with would you your
    yours yourself yourselves s t don
    """.split()
)

# Particles, pronouns and question characters: as single-character terms they match nearly every block.
CJK_STOP_CHARS = frozenset("的了是在我你他她它们吗呢吧啊呀哦嗯和也都就很这那有一个不么什哪何谁时候为")

# Words that make a sentence a question, or hedge it, without naming anything the answer holds ("What kind
# of music might Tim like?"). Dropped from queries only; a document keeps them.
QUESTION_WORDS = frozenset(
    """
    what when where who whom whose which how why kind kinds type types sort likely would could might did
    does do many much often ever
    """.split()
)
# Longest first, so 为什么 goes before 什么 would leave 为 behind.
CJK_QUESTION_WORDS = tuple(sorted(
    """
    什么样 什么 为什么 为何 何时 时候 哪天 哪些 哪个 哪种 哪里 哪儿 在哪 怎么样 怎么 怎样 如何 多少 多久 是否 可能 吗 呢
    """.split(), key=len, reverse=True))
_CJK_QUESTION = re.compile("|".join(map(re.escape, CJK_QUESTION_WORDS)))

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
_DATE_HEADING = re.compile(r"## (\d{4})-(\d{2})-(\d{2})(?!\d)")
_NOTE_NAME = re.compile(r"(\d{4})(\d{2})(\d{2})\.md")

_stemmer = snowballstemmer.stemmer("english")  # PyStemmer's C code when installed, else pure Python
# A stemmer object keeps the word it works on in itself, and searches run in worker threads too.
_stemmer_lock = threading.Lock()


@lru_cache(maxsize=1 << 16)
def stem(word: str) -> str:
    """The Snowball English stem of a lower-cased ASCII word; any other word unchanged."""
    if not _STEMMABLE.fullmatch(word):
        return word
    with _stemmer_lock:
        return str(_stemmer.stemWord(word))


@lru_cache(maxsize=1 << 16)  # words repeat a lot (Zipf); splitting each one again dominated indexing time
def _word_terms(word: str) -> tuple[str, ...]:
    whole = word.lower()
    terms = [] if whole in STOP_WORDS else [stem(whole)]
    pieces = [p for chunk in _PART_SPLIT.split(word) for p in _CAMEL.findall(chunk) or [chunk]]
    if len(pieces) > 1:
        terms.extend(stem(p.lower()) for p in pieces if p and p.lower() not in STOP_WORDS)
    return tuple(terms)


def _cjk_terms(run: str) -> list[str]:
    if len(run) == 1:
        return [run]
    out: list[str] = []
    for i, char in enumerate(run):
        if char not in CJK_STOP_CHARS:
            out.append(char)
        if i + 1 < len(run):
            out.append(run[i : i + 2])
    return out


def _terms(text: str, word_terms: Callable[[str], tuple[str, ...]]) -> list[str]:
    out: list[str] = []
    for match in pattern(_TOKEN).finditer(text):
        run, word = match.groups()
        if run is not None:
            out.extend(_cjk_terms(run))
            continue
        out.extend(word_terms(word))
        # "5月", "3个": the number with its unit, so 2023年5月 does not also match every 5th of a month.
        if word.isdigit():
            end = match.end()
            if end < len(text) and is_cjk(text[end]):
                out.append(word + text[end])
    return out


def terms(text: str) -> list[str]:
    """All search terms of `text`, in order, with repeats (BM25 needs term frequencies)."""
    return _terms(text, _word_terms)


def _query_word_terms(word: str) -> tuple[str, ...]:
    # Compared before stemming: the stem of "does" is "doe", which must stay findable.
    return () if word.lower() in QUESTION_WORDS else _word_terms(word)


def query_terms(query: str) -> list[str]:
    """The distinct terms of a query, question words left out; all of its terms when nothing else is left."""
    found = _terms(_CJK_QUESTION.sub(" ", query), _query_word_terms)
    # A query of nothing but question words ("what kind?", "什么时候？") still searches for what it says.
    return list(dict.fromkeys(found or terms(query)))


def _is_number(term: str) -> bool:
    return term.isdigit() or (term[:-1].isdigit() and is_cjk(term[-1]))  # "217", or "5月" with its unit


def words(text: str) -> frozenset[str]:
    """The words of `text` as a set: its terms but numbers ("217", "5月") and fragments (a character of a
    longer CJK run: 护 of 护照, whose bigrams are its words). What a text must hold to hold what a query asks."""
    lone = {run for run in runs(text) if len(run) == 1}  # a character standing alone is a word (猫，狗)
    return frozenset(term for term in terms(text)
                     if not _is_number(term) and not (len(term) == 1 and is_cjk(term) and term not in lone))


@lru_cache(maxsize=1 << 15)  # a memory spans a few thousand days at most
def date_terms(day: date) -> tuple[str, ...]:
    """`day` in words, as terms: "8 May 2023" and "2023年5月8日" (its number+unit pairs: a lone 年, 月 or 日
    in every dated block would make every Chinese query that has one scan the whole memory)."""
    found = terms(f"{day.day} {MONTHS[day.month - 1]} {day.year} {day.year}年{day.month}月{day.day}日")
    return tuple(term for term in dict.fromkeys(found) if not is_cjk(term))


def _as_date(parts: Iterable[str]) -> date | None:
    try:
        year, month, day = (int(part) for part in parts)
        return date(year, month, day)
    except ValueError:  # 2023-02-30 is no date: it stays an ordinary word
        return None


def block_dates(heading: str, path: PurePath | None) -> list[date]:
    """The dates a block is about: its `## YYYY-MM-DD` heading's, and its daily note's (`YYYYMMDD.md`)."""
    found: list[date] = []
    in_heading = _DATE_HEADING.match(heading) if heading[3:4].isdigit() else None
    day = _as_date(in_heading.groups()) if in_heading else None
    if day is not None:
        found.append(day)
    day = _note_date(path) if path is not None else None
    if day is not None and day not in found:
        found.append(day)
    return found


@lru_cache(maxsize=1024)  # every block of a file asks again
def _note_date(path: PurePath) -> date | None:
    in_name = _NOTE_NAME.fullmatch(path.name)
    return _as_date(in_name.groups()) if in_name else None


def block_terms(text: str, heading: str = "", path: PurePath | None = None) -> list[str]:
    """The terms a block is indexed under: its text's, plus its date in words (see `block_dates`)."""
    out = terms(text)
    for day in block_dates(heading, path):
        out.extend(date_terms(day))
    return out


_SPACE = re.compile(r"\s+")


def normalize(text: str) -> str:
    """Lower-cased text with runs of whitespace collapsed, for exact-phrase checks."""
    return _SPACE.sub(" ", text.lower()).strip()


_QUOTED = re.compile(r"\"([^\"]{2,})\"|“([^”]{2,})”|「([^」]{2,})」|'([^']{2,})'")
_EDGE_PUNCT = re.compile(r"^[\s\W_]+|[\s\W_]+$")


def phrases(query: str) -> list[str]:
    """Phrases whose exact occurrence earns a bonus: quoted parts, else the whole query."""
    quoted = [next(g for g in m.groups() if g) for m in _QUOTED.finditer(query)]
    found = quoted or [query]
    cleaned = (normalize(_EDGE_PUNCT.sub("", p)) for p in found)
    return [p for p in cleaned if len(p) >= 2]
