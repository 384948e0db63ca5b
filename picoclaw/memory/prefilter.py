"""Cheap tests on raw text before it is tokenised: which text could hold a term at all.

Tokenising is what makes a scan of a large MEMORY.md slow, so the update check of an append and the search of
a large file first look for each term's *needle*, a lower-case substring that every word giving the term
(`terms.terms`) contains, with plain substring search. Text holding no needle of a term cannot hold the term.

The needle of a word's term is the term itself, but for the English stems: Snowball only rewrites the end
of a word, and what it puts there that the word did not have is at most an "e" (relational → relate → relat,
ization → ize), "le" or "l" (ability → able → abl) or an "i" (happy → happi), save its exceptional forms
(dying → die, skies → sky). So the needle is the stem without such an ending. The rule held for every word
of a 178,000-word English vocabulary; tests/test_big_memory.py checks it on the repository's own words with
every ending Snowball rewrites.
"""

from __future__ import annotations

import re

from picoclaw.memory.terms import terms

_ASCII_WORD = re.compile(r"[a-z]+")
# Snowball's exceptional forms whose stem is no prefix of the word: dying → die, skies → sky.
_EXCEPTIONS = {"die": "d", "lie": "l", "tie": "t", "sky": "sk"}


def needle(term: str) -> str:
    """A lower-case substring of every word (lower-cased as `fold` does) that gives `term`."""
    if not _ASCII_WORD.fullmatch(term):  # not a stem: the word as lower-cased, a CJK run, a number
        return fold(term)
    if term in _EXCEPTIONS:
        return _EXCEPTIONS[term]
    for ending in ("le", "bl", "e", "i"):
        if term.endswith(ending) and len(term) > len(ending):
            return term[:-2] if ending == "le" else term[:-1]
    return term


def fold(text: str) -> str:
    """`text` lower-cased as the tokenizer lowers a word, wherever it stands in the text: one sigma."""
    return text.lower().replace("ς", "σ")


def needles(text: str) -> dict[str, str]:
    """Every distinct term of `text` with its needle."""
    return {term: needle(term) for term in dict.fromkeys(terms(text))}


def shares_two(needles_of: dict[str, str], folded: str) -> bool:
    """Whether `folded` (a `fold`ed text) holds the needles of at least two of the terms: a text sharing
    two terms with the one the needles came from always does."""
    found = 0
    for wanted in needles_of.values():
        if wanted in folded:
            found += 1
            if found == 2:
                return True
    return False
