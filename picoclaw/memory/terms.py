"""Search terms for English, Chinese and mixed text.

Latin-script text gives lower-cased words (stop words dropped); identifiers, e-mail addresses, paths and
error codes are kept whole (`handleWebSocketReconnect`, `ECONNREFUSED`, `alice@example.com`) and their
parts are added too. CJK text has no spaces, so each run of CJK characters gives its characters and its
character bigrams ("宠物狗叫" → 宠 宠物 物 物狗 狗 狗叫 叫). The bigrams carry most of the meaning; the single
characters catch what bigrams miss: one-character words (猫, 画) and names transliterated differently in
different places (梅拉妮 / 梅兰妮). Very common characters (的, 了, 我, 什, 么 …) are not kept on their own,
only inside bigrams; a lone CJK character is always kept.
"""

from __future__ import annotations

import re
from functools import lru_cache

_CJK_RANGES = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_WORD = rf"[^\W{_CJK_RANGES}]+"
_TOKEN = re.compile(rf"(?P<cjk>[{_CJK_RANGES}]+)|(?P<word>{_WORD}(?:[.@/:\-]{_WORD})*)")
_PART_SPLIT = re.compile(r"[.@/:\-_]+")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")

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


@lru_cache(maxsize=1 << 16)  # words repeat a lot (Zipf); splitting each one again dominated indexing time
def _word_terms(word: str) -> tuple[str, ...]:
    whole = word.lower()
    terms = [] if whole in STOP_WORDS else [whole]
    pieces = [p for chunk in _PART_SPLIT.split(word) for p in _CAMEL.findall(chunk) or [chunk]]
    if len(pieces) > 1:
        terms.extend(p.lower() for p in pieces if p and p.lower() not in STOP_WORDS)
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


def terms(text: str) -> list[str]:
    """All search terms of `text`, in order, with repeats (BM25 needs term frequencies)."""
    out: list[str] = []
    for match in _TOKEN.finditer(text):
        run = match.group("cjk")
        if run is not None:
            out.extend(_cjk_terms(run))
        else:
            out.extend(_word_terms(match.group("word")))
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
