"""Where an answer lives: every entry of a memory scope (MEMORY.md, the daily notes, LEARNINGS.md) as the keyword
search splits it, with its document and how old it is, read once for a whole eval.

An expect found in none of them is an answer gone (edited away, compressed, never stored): reported as such, not
as a miss of the search.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import date

from picoclaw.disk.links import NotAFileError
from picoclaw.memory.eval.cases import holds
from picoclaw.memory.search import Block, split_blocks
from picoclaw.memory.search.blocks import entry_blocks, is_title, lesson_blocks
from picoclaw.memory.search.reranking import block_date
from picoclaw.memory.store import MemoryStore

log = logging.getLogger(__name__)

LONG_TERM, NOTES, LEARNINGS = "MEMORY.md", "notes", "LEARNINGS.md"
DOCUMENTS = (LONG_TERM, NOTES, LEARNINGS)
# Age buckets, by the entry's date (its `## YYYY-MM-DD` heading, or its note's day): upper bound in days, name.
AGE_BUCKETS = ((7, "≤ 7 days"), (30, "8–30 days"), (365, "31–365 days"))
OLDER, UNDATED = "> 1 year", "undated"
AGES = (*(name for _, name in AGE_BUCKETS), OLDER, UNDATED)


@dataclass(frozen=True)
class Entry:
    """One block of a memory document, with the document's name and the block's age bucket."""

    document: str
    block: Block
    day: date | None
    age: str


def age_bucket(day: date | None, today: date) -> str:
    if day is None:
        return UNDATED
    days = (today - day).days
    return next((name for most, name in AGE_BUCKETS if days <= most), OLDER)


@dataclass(frozen=True)
class MemoryEntries:
    """A scope's entries, and each document's whole text (an expect may run across two of its entries)."""

    entries: list[Entry]
    texts: list[tuple[str, str]]  # (document, text) of every file read

    def locate(self, expect: str) -> Entry | str | None:
        """The first entry holding `expect` (MEMORY.md before notes before lessons); else the name of a document
        whose text holds it across entries; None when no document does: the answer is gone."""
        entry = next((entry for entry in self.entries if holds(entry.block.text, expect)), None)
        if entry is not None:
            return entry
        return next((document for document, text in self.texts if holds(text, expect)), None)


def memory_entries(store: MemoryStore) -> MemoryEntries:
    """Every entry of the scope's documents, in document then file order."""
    today = store.today()
    long_term = store.read_long_term(warn=False)
    learnings = store.read_learnings()
    texts = [(LONG_TERM, long_term)]
    blocks: list[tuple[str, Block]] = [(LONG_TERM, block) for block in entry_blocks(long_term, store.long_term_path)]
    for path in store.note_files():
        try:
            text = store.read_note(path)
        except NotAFileError as exc:  # a note linked to a device or a FIFO: the search leaves it out too
            log.warning("%s", exc)
            continue
        texts.append((NOTES, text))
        blocks += [(NOTES, block) for block in split_blocks(text, path) if not is_title(block)]
    texts.append((LEARNINGS, learnings))
    blocks += [(LEARNINGS, block) for block in lesson_blocks(learnings, store.learnings_path)]
    entries = []
    for document, block in blocks:
        day = block_date(block)
        entries.append(Entry(document, block, day, age_bucket(day, today)))
    return MemoryEntries(entries, texts)
