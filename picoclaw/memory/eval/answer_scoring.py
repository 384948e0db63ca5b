"""Answer scores: token F1 against the expected text, and a model judge's yes/no read robustly.

Token F1 is LoCoMo/SQuAD-style: lower-cased, punctuation and the words a, an, the, and dropped, English words
reduced to their Snowball stem (LoCoMo's own script uses Porter). Chinese, Japanese and Korean text has no
spaces, so each CJK character is one token; Latin words inside it stay words. (bench/answers.py scores with
these too.)
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

import snowballstemmer  # type: ignore[import-untyped]

from picoclaw.cjk import LETTERS

_TOKEN = re.compile(rf"[{LETTERS}]|[^\W{LETTERS}]+")
_DROPPED = frozenset({"a", "an", "the", "and"})
_stemmer = snowballstemmer.stemmer("english")


def answer_tokens(text: str) -> list[str]:
    """Normalised tokens: lower case, no punctuation, no a/an/the/and, Snowball stems; a CJK character each."""
    lowered = "".join(" " if unicodedata.category(c).startswith("P") else c for c in str(text).lower())
    words = [w.strip("_") for w in _TOKEN.findall(lowered)]
    return [_stemmer.stemWord(w) if w.isascii() else w for w in words if w and w not in _DROPPED]


def token_f1(answer: str, gold: str) -> float:
    """SQuAD-style token F1 of `answer` against `gold` (1.0 when both have no tokens)."""
    got, want = answer_tokens(answer), answer_tokens(gold)
    if not got or not want:
        return float(got == want)
    common = sum((Counter(got) & Counter(want)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(got), common / len(want)
    return 2 * precision * recall / (precision + recall)


_YES = frozenset({"yes", "correct", "true", "right"})
_NO = frozenset({"no", "incorrect", "wrong", "false"})
# Negative forms first: 不正确 holds 正确, 不是 holds 是.
_CJK_VERDICTS = (("不正确", False), ("不对", False), ("不是", False), ("错误", False), ("否", False), ("错", False),
                 ("正确", True), ("是", True), ("对", True))
_LEAD = re.compile(r"^[\W_]+")


def parse_verdict(reply: str | None) -> bool | None:
    """The judge's yes (True) or no (False); None when the reply is not clearly one of them.

    The verdict is the reply's first word (markdown and quotes around it ignored); failing that, "yes" or
    "no" standing alone somewhere in it when only one of the two does. Anything else is no verdict.
    """
    text = re.sub(r"<think>.*?</think>", "", reply or "", flags=re.S | re.I).strip().lower()
    text = _LEAD.sub("", text)
    for prefix, verdict in _CJK_VERDICTS:
        if text.startswith(prefix):
            return verdict
    words = re.findall(r"[a-z]+", text)
    if words and words[0] in _YES | _NO:
        return words[0] in _YES
    seen = {w for w in words if w in ("yes", "no")}
    return ("yes" in seen) if len(seen) == 1 else None
