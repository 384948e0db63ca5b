"""A read round: the reads of one turn, each document checked against the database once (`Storage.read_round`).

A turn reads the same documents many times (the policy's overrides, the bootstrap files, MEMORY.md, the notes).
On files each read is the file itself and costs a stat. On PostgreSQL each would be a statement; within a round,
the first read of a scope checks every document this process holds a copy of in one statement, and a document
checked once is not asked about again until the round ends. A read made while holding the scope's lock (a
read-modify-write) is never served from the round. The round belongs to the task that opened it (and the threads
it hands work to); it ends with its `with` block, so background work spawned from it checks afresh.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

ABSENT = None  # what a round saw of a document that had no row (or a removed one)


class ReadRound:
    """What one round has seen: each checked document's revision, per scope, and the folders it listed."""

    def __init__(self) -> None:
        self.open = True
        self.seen: dict[tuple[str, str], int | None] = {}  # (scope, name) -> revision at the check, ABSENT
        self.folders: dict[tuple[str, str], frozenset[str]] = {}  # (scope, prefix) -> the names listed
        self.checked_scopes: set[str] = set()  # scopes whose cached documents were checked all at once


_current: ContextVar[ReadRound | None] = ContextVar("picoclaw_read_round", default=None)


def current_round() -> ReadRound | None:
    """The round this task (or the task that handed it this thread) is in, if it is still open."""
    found = _current.get()
    return found if found is not None and found.open else None


@contextmanager
def read_round() -> Iterator[ReadRound]:
    """Open a round for the reads of this block (within a round already open: that one)."""
    found = current_round()
    if found is not None:
        yield found
        return
    opened = ReadRound()
    token = _current.set(opened)
    try:
        yield opened
    finally:
        opened.open = False
        _current.reset(token)
