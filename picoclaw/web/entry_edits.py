"""Editing one MEMORY.md entry from the console safely: the entry is found by its fingerprint (`entry_version`,
the digest of its text), not by the line the page saw it at, so an edit elsewhere in the file (an entry above it
that grew, an append, a compression that kept it) does not refuse it. Only a change of *that* entry is a conflict,
and then the entry as it is now (the most similar one) is found to show beside the user's text. A delete can be
undone: the entry comes back from the backup the delete took, at its place, whatever else changed meanwhile.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from picoclaw.memory import LongTermEntry, MemoryStore

SIMILAR = 0.5  # how alike an entry now must be to the one the page showed to be taken for its current version
NEAR_LINES = 400  # around the line the page saw it at, where that current version is looked for


@dataclass(frozen=True)
class Edited:
    """An edit or delete that was written: the backup it took, and the line the entry was at."""

    backup: str
    line: int


@dataclass(frozen=True)
class Conflict:
    """An edit refused because its entry changed or went: the entry as it is now, if one is like it."""

    current: LongTermEntry | None


def find_entry(entries: list[LongTermEntry], version: str, line: int) -> LongTermEntry | None:
    """The entry whose text has the fingerprint `version`; of several alike, the one nearest `line`."""
    from picoclaw.memory import entry_version

    found = [entry for entry in entries if entry_version(entry.text) == version]
    return min(found, key=lambda entry: abs(entry.line - line)) if found else None


def current_version(entries: list[LongTermEntry], original: str, line: int) -> LongTermEntry | None:
    """The entry now most like `original` (the text the page showed) near `line`; None when none is alike."""
    near = [entry for entry in entries if abs(entry.line - line) <= NEAR_LINES] or entries
    best, score = None, SIMILAR
    wanted = _body(original)  # not the heading: every entry of a day shares it
    for entry in near:
        matcher = difflib.SequenceMatcher(None, wanted, _body(entry.text), autojunk=False)
        if matcher.real_quick_ratio() < score or matcher.quick_ratio() < score:
            continue
        ratio = matcher.ratio()
        if ratio >= score:
            best, score = entry, ratio
    return best


def _body(text: str) -> str:
    return text.split("\n", 1)[1].strip() if "\n" in text else ""


def replace_entry(store: MemoryStore, line: int, version: str, content: str | None, original: str
                  ) -> Edited | Conflict:
    """Write `content` over (None: delete) the entry with fingerprint `version`, wherever it is now. The store
    checks the fingerprint again under its lock; an entry that moved between the read and the write is looked
    for once more. MemoryStoreError for content the store refuses (empty, not Unicode)."""
    from picoclaw.errors import MemoryStoreError
    from picoclaw.memory import long_term_entries

    entries: list[LongTermEntry] = []
    for _ in range(3):
        entries = list(long_term_entries(store.read_long_term()))
        entry = find_entry(entries, version, line)
        if entry is None:
            break
        try:
            backup = store.replace_long_term_entry(entry.line, version, content)
        except MemoryStoreError as exc:
            if "changed since" in str(exc):
                continue  # moved by a write that came in between: find it again
            raise
        return Edited(backup.name if backup is not None else "", entry.line)
    return Conflict(current_version(entries, original, line) if original else None)


def undo_delete(store: MemoryStore, backup: str, line: int, version: str) -> bool:
    """Put back the entry a delete removed (at `line`, fingerprint `version` in the backup it took) before the
    entry that followed it then, or at the end when none of those is left; False when it is there already.
    MemoryStoreError when the backup or the entry is not there, or the file was changed (not just appended to)
    while this was written."""
    from picoclaw.errors import MemoryStoreError
    from picoclaw.memory import entry_version, long_term_entries

    before = list(long_term_entries(store.read_backup(backup).decode("utf-8", "replace")))
    deleted = next((entry for entry in before if entry.line == line and entry_version(entry.text) == version), None)
    if deleted is None:
        raise MemoryStoreError(f"the backup {backup} holds no such entry at line {line}")
    text = store.read_long_term()
    now = list(long_term_entries(text))
    if find_entry(now, version, line) is not None:
        return False
    followers = {entry_version(entry.text) for entry in before if entry.line > line}
    following = next((entry for entry in now if entry_version(entry.text) in followers), None)
    body = deleted.text.rstrip("\n").split("\n")
    lines = text.split("\n")
    if following is None:
        restored = (text.rstrip("\n") + "\n\n" if text.strip() else "") + "\n".join(body) + "\n"
    else:
        at = following.line - 1
        restored = "\n".join([*lines[:at], *body, "", *lines[at:]])
    store.replace_long_term_keeping_appends(text, restored)
    return True
