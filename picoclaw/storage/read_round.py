"""A read round: the reads of one turn, each document checked against the database once (`Storage.read_round`).

A turn reads the same documents many times (the policy's overrides, the bootstrap files, MEMORY.md, the notes).
On files each read is the file itself and costs a stat. On PostgreSQL each would be a statement; within a round,
the first read of a scope lists its documents with their revisions in one statement, and the round's reads go
by that list (a document whose revision moved since this machine cached it is fetched, once) until the round
ends. A read made while holding the scope's lock (a read-modify-write) is never served from the round. The
round belongs to the task that opened it (and the threads it hands work to); it ends with its `with` block, so
background work spawned from it checks afresh.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class ReadRound:
    """What one round has seen: each scope's documents and their revisions, and the folders brought up to date."""

    def __init__(self) -> None:
        self.open = True
        self.listed: dict[str, dict[str, int]] = {}  # scope -> name -> revision, as listed at its first read
        self.folders: set[tuple[str, str]] = set()  # (scope, prefix) whose cached folder was brought to the list


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
