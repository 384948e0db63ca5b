"""RerankedSearch: any MemorySearch, re-ranked by each memory's standing besides its relevance: whether a
newer entry replaced it, how recent it is, and how often it was used (relevance × recency × use).

It asks the inner search for CANDIDATES_PER_RESULT times the blocks wanted, then
- multiplies each score by two mild priors, both policy keys: recency, 1 + boost × 0.5^(age / 30 days), the
  age counted from the block's date (a `## YYYY-MM-DD` heading, or a daily note's file) to today; and use,
  1 + boost × how often the block was injected before (search/access_counts.py), on a log scale that is full
  at SATURATION injections. An undated block gets no recency boost; a block never injected no use boost;
- puts the entry that replaced a superseded one right above it when the superseded one ranks higher: the
  replacement named by the "> superseded by the DATE entry: …" mark the store wrote; or, for entries never
  marked (a hand edit, an import, an update the store's conservative rule did not recognise), a newer
  MEMORY.md candidate that updates it by that rule (memory/supersede.py) or that says something about the
  same thing the query asks about (the two share two words, and both hold a word the query asks for; in
  Chinese, Japanese and Korean that word is a character pair, never one character of one: 护 is in 护士 and
  in 护照). Only one-line entries (statements) are compared so: a block of several lines is an excerpt,
  and "newer" says little about it.
  Moving a candidate up is cheap to get wrong (both stay in the results), marking an entry is not, which
  is why this is looser than the store's rule.

The replacement moves up; the superseded entry is kept where relevance put it, not dropped: the rule can
guess wrong, its mark already tells the model it is old, and "where did she live before?" needs it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from picoclaw.memory.entries import SUPERSEDED, fingerprint
from picoclaw.memory.search.access_counts import AccessCounts
from picoclaw.memory.search.blocks import Block, Hit
from picoclaw.memory.search.protocol import MemorySearch
from picoclaw.memory.search.turn_memory import block_key
from picoclaw.memory.store import MemoryStore
from picoclaw.memory.supersede import Statement
from picoclaw.memory.terms import block_dates, words

if TYPE_CHECKING:
    from picoclaw.policy_schema import MemoryPolicy

CANDIDATES_PER_RESULT = 3
RECENCY_HALF_LIFE_DAYS = 30.0
SATURATION = 20  # injections at which the use prior is full
# A block of more lines, or a longer one, is an excerpt (a conversation, a list), not one statement that a
# newer one could replace.
STATEMENT_CHARS = 280

_MARK = re.compile(rf"^{re.escape(SUPERSEDED)} by the (\d{{4}}-\d{{2}}-\d{{2}}) entry: (.*?)…?\s*$", re.MULTILINE)


def block_date(block: Block) -> date | None:
    """The day a block is from: its `## YYYY-MM-DD` heading, else its daily note's name; None if neither."""
    days = block_dates(block.heading, block.path)  # the keyword search's own reading of a block's dates
    return days[0] if days else None


def recency(day: date | None, today: date) -> float:
    """1 for a block from today (or later), halving every RECENCY_HALF_LIFE_DAYS; 0 for an undated one."""
    if day is None:
        return 0.0
    return 0.5 ** (max((today - day).days, 0) / RECENCY_HALF_LIFE_DAYS)


def use(count: int) -> float:
    """0 for a block never injected, rising on a log scale to 1 at SATURATION injections."""
    return min(math.log1p(count) / math.log1p(SATURATION), 1.0)


@dataclass(frozen=True)
class _Reading:
    """What re-ranking reads from a block's text, worked out once per block (see `_reading`)."""

    day: date | None
    key: str  # turn_memory.block_key, what the access counts are kept under
    mark: re.Match[str] | None  # its superseded mark, if it carries one
    statement: Statement | None  # for a MEMORY.md block that is one statement (see _statement_line)
    words: frozenset[str]  # that statement's words as a query's are (terms.words), when it is one


@dataclass(frozen=True, eq=False)  # compared by identity: the re-ordering looks candidates up in a list
class _Candidate:
    hit: Hit
    reading: _Reading


def _body(block: Block) -> str:
    """The block's text without its heading line."""
    return block.text.removeprefix(block.heading).lstrip("\n")


def _statement_line(body: str) -> str | None:
    """The block's one line (a superseded mark aside) when it has one of at most STATEMENT_CHARS: a fact, not
    an excerpt. Only such lines are tokenised for the update rule: tokenising is the cost here."""
    if body.count("\n") > 1 or len(body) > 2 * STATEMENT_CHARS:
        return None
    lines = [line for line in body.split("\n") if line.strip() and not line.startswith(SUPERSEDED)]
    return lines[0] if len(lines) == 1 and len(lines[0]) <= STATEMENT_CHARS else None


# The same blocks come back query after query while the file is unchanged (the index keeps them), and reading
# them (dates, hash, tokenising) was most of re-ranking's cost. A block is its text and place, so an edited
# block is a new key, never a stale reading. The key holds its block (and so the block's text) while the reading
# is kept, 4,096 blocks at most; the reading itself keeps nothing of the text but what it read from it.
@lru_cache(maxsize=4096)
def _reading(block: Block, long_term_path: Path) -> _Reading:
    body = _body(block)
    line = _statement_line(body) if block.path == long_term_path else None
    statement, said = (Statement.of(line), words(line)) if line is not None else (None, frozenset[str]())
    mark = _MARK.search(body) if SUPERSEDED in body else None
    return _Reading(block_date(block), block_key(block), mark, statement, said)


class RerankedSearch:
    """A MemorySearch whose results are re-ranked by supersession, recency and use (see the module)."""

    def __init__(self, inner: MemorySearch, store: MemoryStore, policy: Callable[[], MemoryPolicy]):
        self.inner = inner
        self.store = store
        self.policy = policy  # read at each search, so a `policy set` applies on the next turn
        self.counts = AccessCounts(store.memory_dir, storage=store.storage)

    @property
    def blocking(self) -> bool:
        return self.inner.blocking

    def search(self, query: str, limit: int, *, include_notes: bool = False) -> list[Hit]:
        """The best `limit` blocks for `query` by relevance and standing, best first."""
        hits = self.inner.search(query, limit * CANDIDATES_PER_RESULT, include_notes=include_notes)
        return self.rerank(query, hits, limit)

    async def search_async(self, query: str, limit: int, *, include_notes: bool = False,
                           below_floor: list[Hit] | None = None) -> list[Hit]:
        """`search` without blocking the event loop (the counts file is read in a worker thread)."""
        import asyncio  # not at the top: a short command that only reads memory never starts an event loop

        if self.inner.blocking:  # one worker thread for the search and the re-ranking
            return await asyncio.to_thread(self.search, query, limit, include_notes=include_notes)
        hits = await self.inner.search_async(query, limit * CANDIDATES_PER_RESULT, include_notes=include_notes,
                                             below_floor=below_floor)
        return await asyncio.to_thread(self.rerank, query, hits, limit)

    def rerank(self, query: str, hits: Sequence[Hit], limit: int) -> list[Hit]:
        """`hits` for `query` (best first by relevance) re-ordered by standing; the first `limit`."""
        policy = self.policy()
        recency_boost = policy.memory_recency_boost_percent / 100
        use_boost = policy.memory_access_boost_percent / 100
        counts = self.counts.counts() if use_boost else {}
        today = self.store.today()
        long_term = self.store.long_term_path
        candidates = []
        for hit in hits:
            reading = _reading(hit.block, long_term)
            used = counts.get(reading.key, 0)
            prior = (1 + recency_boost * recency(reading.day, today)) * (1 + use_boost * use(used))
            candidates.append(_Candidate(Hit(hit.block, hit.score * prior), reading))
        # sorted() is stable: equal scores keep the inner search's order.
        ranked = sorted(candidates, key=lambda c: c.hit.score, reverse=True)
        return [c.hit for c in self._replacements_first(ranked, words(query))][:limit]

    def search_learnings(self, query: str, limit: int, *, standing: bool = False) -> list[Hit]:
        """The inner search's lessons, by relevance alone: a lesson is advice, not a dated fact to supersede."""
        return self.inner.search_learnings(query, limit, standing=standing)

    async def search_learnings_async(self, query: str, limit: int, *, standing: bool = False) -> list[Hit]:
        return await self.inner.search_learnings_async(query, limit, standing=standing)

    def record_injected(self, blocks: Sequence[Block]) -> None:
        """Count one more use of each of `blocks`, which a turn's prompt now carries (turn_memory.CountsUse)."""
        self.counts.record((block_key(block) for block in blocks), self.store.today())

    def long_term_blocks(self) -> list[Block]:
        """The inner search's: MEMORY.md's blocks in file order."""
        return self.inner.long_term_blocks()

    def neighbours(self, block: Block, before: int, after: int) -> list[Block]:
        """The inner search's: `block` with the blocks around it in its file."""
        return self.inner.neighbours(block, before, after)

    def close(self) -> None:
        self.inner.close()

    def _replacements_first(self, ranked: list[_Candidate], asked: frozenset[str]) -> list[_Candidate]:
        """`ranked` with each replacement moved to just above the superseded entry it ranked below."""
        pairs = self._superseded_pairs(ranked, asked)
        order = list(range(len(ranked)))  # candidates by their place in `ranked`
        at = list(order)  # where each candidate is in `order` now
        for _ in range(len(pairs) + 1):  # a chain (A → B → C) settles in as many passes as it has links
            moved = False
            for old, new in pairs:
                at_old, at_new = at[old], at[new]
                if at_new > at_old:
                    order.insert(at_old, order.pop(at_new))
                    for n in range(at_old, at_new + 1):  # those between moved down one
                        at[order[n]] = n
                    moved = True
            if not moved:
                break
        # Scores follow the order, so a caller that merges results by score keeps it.
        result: list[_Candidate] = []
        for number in reversed(order):
            candidate = ranked[number]
            floor = result[-1].hit.score if result else -math.inf
            if candidate.hit.score < floor:
                candidate = _Candidate(Hit(candidate.hit.block, floor), candidate.reading)
            result.append(candidate)
        return result[::-1]

    def _superseded_pairs(self, ranked: list[_Candidate], asked: frozenset[str]) -> list[tuple[int, int]]:
        """(superseded, replacement), as places in `ranked`: by the store's mark; or, between two statements
        (short entries), when the newer updates the older by the update rule or both say something about
        what the query asks (they share two words, and both hold one of `asked`, the query's words)."""
        long_term_path = self.store.long_term_path
        long_term = sorted((n for n, c in enumerate(ranked) if c.hit.block.path == long_term_path),
                           key=lambda n: ranked[n].hit.block.start_line)
        # Word sets as bits of one int each (a bit per word of this search): most pairs are tested, and an
        # int's & and bit_count cost a fraction of a set intersection.
        bits: dict[str, int] = {}
        asked_bits = _bits(bits, asked)
        newer = []  # read once
        for n in long_term:
            reading = ranked[n].reading
            statement = reading.statement
            newer.append((n, statement, reading.day, _bits(bits, statement.words) if statement is not None else 0,
                          _bits(bits, reading.words) & asked_bits))
        pairs: list[tuple[int, int]] = []
        for k, (old, before, day, before_words, asked_old) in enumerate(newer):
            mark = ranked[old].reading.mark
            if mark is not None:
                pairs.extend((old, new) for new in long_term[k + 1:] if _named_by(mark, ranked[new]))
                continue
            if before is None:
                continue
            for new, after, new_day, after_words, asked_new in newer[k + 1:]:
                # Later in the file is newer (entries are appended), unless a date heading says otherwise.
                if after is None or (day is not None and new_day is not None and new_day < day):
                    continue
                # Shared words are counted as the update rule counts them (a Chinese character each: 猫, 叫 and
                # 住 are words), but what is asked for must be a word both hold: for 护照, 用户的护照… and
                # 用户的妹妹…护士 share 用, 户 and 护, and are not about one thing. Both tests need two shared
                # words, so a pair with fewer is left at once (most pairs, and the update rule costs more).
                if (before_words & after_words).bit_count() >= 2 and (asked_old & asked_new or after.updates(before)):
                    pairs.append((old, new))
        return pairs


def _bits(bits: dict[str, int], words: frozenset[str]) -> int:
    """`words` as an int with the bit of each set, bits given out in `bits` as words are first seen."""
    mask = 0
    for word in words:
        bit = bits.get(word)
        if bit is None:
            bit = bits[word] = 1 << len(bits)
        mask |= bit
    return mask


def _named_by(mark: re.Match[str], new: _Candidate) -> bool:
    """Whether `new` is the entry a superseded mark names: its date, and the text the mark quotes."""
    quoted = fingerprint(mark[2])
    day = new.reading.day
    return (day is not None and day.isoformat() == mark[1] and bool(quoted)
            and fingerprint(_body(new.hit.block)).startswith(quoted))
