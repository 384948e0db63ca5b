"""Query expansion by pseudo-relevance feedback: the best hits of a first keyword pass lend the query a few
of their most telling terms, and the blocks that match the query are ranked again with both.

A question often shares only a common word with the memory that answers it ("What does Melanie do with her
family on hikes?" against "our family camping trip … around the campfire"); the blocks a first pass ranks
highest are usually on the question's subject, so their rarer words ("camping", "campfire") lift the blocks
that talk about it. Added terms weigh FEEDBACK_WEIGHT of a query term, and they only re-order: a block that
matches none of the query's own terms is still never returned. On LoCoMo's dev split
(bench/retrieval_quality.py, MEMORY.md layout) B@10 went from 0.861 to 0.875 in English and from 0.867 to
0.871 in Chinese; the notes layout's turn R@10 did not drop.

Pure functions over terms (memory/terms.py), so the keyword search (bm25.py) and the index can share them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Iterable, Mapping

from picoclaw.cjk import is_cjk

# Dev-split choices (bench/retrieval_quality.py): 2 blocks, 5 terms, weight 0.3 were best for both languages.
# Three or more blocks drift off the subject; more terms or a larger weight outvote the question's own words.
FEEDBACK_BLOCKS = 2
FEEDBACK_TERMS = 5
FEEDBACK_WEIGHT = 0.3
# Over fewer blocks a query is not expanded: a term's document frequency then says little about it, and the
# first pass returns most of the blocks anyway.
FEEDBACK_MIN_BLOCKS = 20


def telling_terms(counts: Mapping[str, int], doc_freq: Callable[[str], int], total: int) -> list[tuple[str, float]]:
    """The terms of one feedback block (its terms' counts) that may be added, each with its weight: share of the
    block's terms × log(total / blocks holding the term); in the order of the block's terms.

    `doc_freq(term)` is how many of the `total` blocks searched hold the term. The query is not looked at, so
    a search may keep what this gives for a block while the blocks searched are the same (bm25.FileIndex).
    """
    size = sum(counts.values())
    found = []
    for term, count in counts.items():
        # A lone CJK character (the bigrams carry the meaning) would pull in every block that happens
        # to hold it, and a term of a single block says nothing about any other: both cost recall.
        if len(term) == 1 and is_cjk(term):
            continue
        df = doc_freq(term)
        if df >= 2:
            found.append((term, count / size * math.log(total / df)))
    return found


def best_terms(query: Collection[str], told: Iterable[Iterable[tuple[str, float]]],
               limit: int = FEEDBACK_TERMS) -> list[str]:
    """The `limit` terms with the highest weight summed over the feedback blocks (`telling_terms` of each), query
    terms left out. Best first; ties keep the order of first occurrence, so the result depends only on the texts."""
    weight: dict[str, float] = {}
    get = weight.get
    for block in told:
        for term, part in block:
            if term not in query:
                weight[term] = get(term, 0.0) + part
    return heapq.nlargest(limit, weight, key=weight.__getitem__)


def feedback_terms(query: Collection[str], feedback: Iterable[Mapping[str, int]], doc_freq: Callable[[str], int],
                   total: int, limit: int = FEEDBACK_TERMS) -> list[str]:
    """The `limit` terms of the `feedback` blocks (each its terms' counts) that best characterise them, by
    share of the block's terms × log(total / blocks holding the term); query terms left out (`best_terms` of
    each block's `telling_terms`)."""
    return best_terms(query, (telling_terms(counts, doc_freq, total) for counts in feedback), limit)
