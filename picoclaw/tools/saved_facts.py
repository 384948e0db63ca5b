"""A fact the model saves to MEMORY.md, whichever tool it uses (memory_append, write_file, append_file): the one
path that holds it to the rule of every automatic write (memory/grounding.py).

A question, advice, an apology or refusal, or a line about the assistant is not saved; a line an entry already says
is not saved again; a fact whose telling content the user never said in this conversation is saved, but marked as
the assistant's words in its `Source:` line (so it never marks an entry a person gave as superseded). Each write is
added to the turn's receipts (memory/receipts.py): the agent logs it for `/memory recent` and shows it after the
reply. A second way in that skipped this (the file tools once did) would let a model write around the rule.

An edit of an entry (edit_file) is held to it too: what the edit adds must be no junk and, within a turn, the
user's words (an edit replaces what a person gave, so the assistant's own words are refused, not marked).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from picoclaw.memory import (
    LONG_TERM,
    UNGROUNDED,
    Known,
    LongTermEntry,
    MemoryWrite,
    Said,
    Workspace,
    added_text,
    current_turn,
    grounded,
    models_entry,
    not_a_fact,
    sources_changed,
)
from picoclaw.printable import printable
from picoclaw.tools.base import current_session

# Why an edit that changes who gave an entry is refused (`FactEdit.refused`).
SOURCE_KEPT = "it drops or changes an entry's Source: line"

MARKED = (", marked as your words: the user did not say this in the conversation (save the user's own words "
          "when they give a fact)")


def already_stored(entry: LongTermEntry, shown: str) -> str:
    """The tool result for content MEMORY.md already holds: where, so the model can say so."""
    return f"already stored: {shown}:{entry.line} under '{entry.heading}' says this; nothing was added"


@dataclass(frozen=True)
class SavedFact:
    """What became of a fact: refused (why), found already stored (`entry.new` False), or written (whose words)."""

    entry: LongTermEntry | None = None
    refused: str | None = None  # a grounding reason (QUESTION, ADVICE …): nothing was written
    by_user: bool = True

    def told(self, shown: str, wrote: Callable[[LongTermEntry], str], after: str = "") -> str:
        """The tool's result: the refusal, where it is stored already, or `wrote(entry)`, the mark of the model's
        words and `after`."""
        if self.refused is not None:
            return (f"not saved: that is no fact about the user ({self.refused}); save only what the user said "
                    "about themselves, in their words")
        assert self.entry is not None
        if not self.entry.new:
            return already_stored(self.entry, shown)
        return wrote(self.entry) + ("" if self.by_user else MARKED) + after


def save_fact(workspace: Workspace, content: str, source: str) -> SavedFact:
    """Save `content` to MEMORY.md by the rule (module docstring); `source` names the tool in its receipt. The
    store's MemoryStoreError and OSError are raised as they come."""
    # Memory is shown on terminals again and again: escape sequences in it would act every time.
    content = printable(content)
    reason = not_a_fact(content)
    if reason is not None:
        return SavedFact(refused=reason)
    store = workspace.store
    session = current_session.get()
    turn = current_turn.get()
    known = Known.of_memory(store.read_long_term())
    found = known.find(content)
    stored = known.entries[found] if found is not None else None
    if stored is not None:
        return SavedFact(stored)
    # Outside a turn (no conversation to ground it in) a fact is saved as it was before the rule.
    by_user = turn is None or grounded(content, Said.of(turn.said))
    entry = store.append_long_term(content if by_user else models_entry(content, session))
    if entry.new and turn is not None:
        turn.writes.append(MemoryWrite(LONG_TERM, content, source, session, by_user=by_user))
    return SavedFact(entry, by_user=by_user)


@dataclass(frozen=True)
class FactEdit:
    """What an edit of MEMORY.md adds (`text`, "" for one that only removes) and why it is refused, if it is."""

    text: str
    refused: str | None = None

    def told(self) -> str:
        """The tool's result for a refused edit."""
        if self.refused == SOURCE_KEPT:
            return (f"not edited: {SOURCE_KEPT}, which says who gave the entry; keep it as it is, or change the "
                    "entry's text to what the user said")
        return (f"not edited: the new text is no fact the user stated ({self.refused}); change an entry only to "
                "what the user said, in their words")


def check_edit(before: str, after: str) -> FactEdit:
    """Whether an edit of MEMORY.md may turn its text `before` into `after`, by save_fact's rule: the sentences
    it adds, whole (so "217" → "305" is checked as "My gym locker is number 305."), and no entry's `Source:` line
    dropped or changed while its text stays (the model's words would pass as the user's, with no receipt)."""
    if sources_changed(before, after):
        return FactEdit("", SOURCE_KEPT)
    added = printable(added_text(before, after))
    if not added.strip():
        return FactEdit("")
    reason = not_a_fact(added)
    turn = current_turn.get()
    if reason is None and turn is not None and not grounded(added, Said.of(turn.said)):
        reason = UNGROUNDED
    return FactEdit(added, reason)


def edited(edit: FactEdit, source: str) -> None:
    """Add the receipt of an edit made (the text it added) to the turn's writes."""
    turn = current_turn.get()
    if edit.text and turn is not None:
        turn.writes.append(MemoryWrite(LONG_TERM, edit.text, source, current_session.get()))
