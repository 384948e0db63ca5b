"""The one CJK rule: which characters are Chinese, Japanese or Korean text, for every module that asks.

CJK letters are Han (unified, extension A and the compatibility ideographs), kana and Hangul syllables.
Japanese runs its words together and Korean joins particles to its words, so both are read as Chinese is,
character by character, everywhere (search terms, key facts, updates, token estimates). CJK punctuation and
full-width forms (，。「」！ Ａ１) are not letters; callers that count or stop at them add `PUNCTUATION`.
"""

from __future__ import annotations

import re
from functools import cache

# Ranges for use inside a regex character class, e.g. f"[{LETTERS}]".
HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
KANA = "\u3040-\u30ff"
HANGUL = "\uac00-\ud7af"
LETTERS = HAN + KANA + HANGUL
PUNCTUATION = "\u3000-\u303f\uff00-\uffef"  # CJK symbols and punctuation, half- and full-width forms


@cache
def pattern(source: str, flags: int = 0) -> re.Pattern[str]:
    """`re.compile(source, flags)`, once, at first use rather than at import.

    `re` compiles a class of the ~50,000 CJK letters character by character (3 ms or more), which every short
    command importing the module would pay for patterns it never uses.
    """
    return re.compile(source, flags)


# The patterns' sources, made once: `pattern` looks each up by its text, and these keep their hash.
_LETTER = f"[{LETTERS}]"
_RUN = f"[{LETTERS}]+"
_LETTER_OR_PUNCTUATION = f"[{LETTERS}{PUNCTUATION}]"


def has_cjk(text: str) -> bool:
    """Whether `text` holds any CJK letter."""
    return pattern(_LETTER).search(text) is not None


def is_cjk(character: str) -> bool:
    """Whether the one `character` is a CJK letter."""
    return pattern(_LETTER).fullmatch(character) is not None


def letters(text: str) -> list[str]:
    """The CJK letters of `text`, in order, with repeats."""
    return pattern(_LETTER).findall(text)


def runs(text: str) -> list[str]:
    """The runs of CJK letters in `text` ("我的猫 Tom 很乖" → 我的猫, 很乖)."""
    return pattern(_RUN).findall(text)


def count_cjk(text: str) -> int:
    """How many characters of `text` are CJK letters, punctuation or full-width forms."""
    return len(pattern(_LETTER_OR_PUNCTUATION).findall(text))
