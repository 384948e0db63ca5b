"""The documents port: the Markdown and JSON documents of one memory scope, read and written by name.

A name is a "/"-separated path under the scope's root (`memory/MEMORY.md`, `memory/202612/20261202.md`,
`AGENTS.md`). Every write lands in the backend's truth when the call returns: files (storage/files_documents.py)
write the file itself, atomically; PostgreSQL (storage/postgres/documents.py) writes the row in one statement.
Every read asks the truth too: `read` for the bytes; `local` (and `local_folder` for a listing) for a file on
this machine holding the document as it is at that moment, for the readers that stream a large file or keep
what they derived from it keyed by the file's stat. On files that is the file itself, at no cost; on PostgreSQL
a cache file under .picoclaw-work/documents/, rewritten only when the row's revision moved (one small statement
otherwise). No lock and no earlier call decides what a read sees. A replace may name the revision it was based
on: a stale one is refused, never merged.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from picoclaw.storage.errors import StorageError

MISSING = ""  # the revision of a document that does not exist


@dataclass(frozen=True)
class Document:
    """A document's bytes (None: there is no such document) and the revision they are at."""

    name: str
    data: bytes | None
    revision: str


@dataclass(frozen=True)
class Changes:
    """The documents written since a mark (`Documents.changes_since`), and the mark to ask from next time."""

    names: list[str]
    mark: str


class StaleRevision(StorageError):
    """A replace expected a revision the document no longer has: someone wrote it meanwhile; nothing was written."""


class Documents(Protocol):
    """One scope's documents (its root: the workspace folder, or users/<key>/ of a per-user scope)."""

    scope: str
    root: Path  # the scope's folder in the workspace: documents are named by their place under it

    def path(self, name: str) -> Path:
        """Document `name`'s place in the workspace (on files, its file; on PostgreSQL, a name only)."""
        ...

    def name(self, path: Path) -> str:
        """The name of the document whose place in the workspace is `path` (under `root`)."""
        ...

    def local(self, name: str) -> Path:
        """A file on this machine that holds document `name` as it is now (none there: no such document), to
        read, never to write: files, the file itself; PostgreSQL, its cache, brought to the row's revision."""
        ...

    def local_folder(self, prefix: str) -> Path:
        """The folder on this machine whose files are, as they are now, the documents named `prefix` + their
        path under it (`prefix` a folder, "memory/"): files, that folder; PostgreSQL, the cache's, brought up to
        date in one statement (content only for the documents that moved, files of removed ones gone)."""
        ...

    def read(self, name: str) -> Document:
        """The document with its current revision, from the backend's truth (MISSING revision: none)."""
        ...

    def replace(self, name: str, data: bytes | str, *, expect: str | None = None, durable: bool = True) -> str:
        """Make `data` the document's content; its new revision. With `expect` (a revision read earlier, MISSING
        for "must not exist yet"), StaleRevision and nothing written when the document is no longer at it.
        `durable` False: soft state (counters, caches) a power cut may roll back."""
        ...

    def create(self, name: str, data: bytes | str) -> bool:
        """Write a first version of `name`; False, and nothing written, when it exists."""
        ...

    def append(self, name: str, data: bytes) -> str:
        """Add `data` at the end of an existing document, crash-safe (the old or the new, never half); its revision."""
        ...

    def append_records(self, name: str, records: Sequence[dict[str, Any]], *, durable: bool = True) -> int:
        """Append JSON lines to `name` (created if missing), each record on a line of its own; its size in bytes
        after the append (a log trims itself past a size without reading itself back)."""
        ...

    def delete(self, name: str) -> None:
        """Remove the document, if it exists."""
        ...

    def names(self, prefix: str = "") -> list[str]:
        """The names of the scope's documents that start with `prefix`, sorted."""
        ...

    def changes_since(self, mark: str) -> Changes:
        """The documents written since `mark` (MISSING: all of them), for a reader that follows what changed."""
        ...

    def keep_version(self, name: str, data: bytes, suffix: str, keep: int) -> str:
        """Keep `data` (what `name` held before a rewrite) as a new version labelled `<UTC stamp><suffix>`;
        only the newest `keep` with that suffix stay. Its label."""
        ...

    def versions(self, suffix: str) -> list[str]:
        """The labels of the kept versions with `suffix`, oldest first."""
        ...

    def version_sizes(self, suffix: str) -> list[tuple[str, int]]:
        """(label, size in bytes) of the kept versions with `suffix`, oldest first."""
        ...

    def read_version(self, label: str) -> bytes:
        """The bytes of the version `label` (StorageError if there is none)."""
        ...

    def exclusive(self, timeout: float | None = None) -> AbstractContextManager[object]:
        """A section no other writer of the scope's memory enters meanwhile, for a read-modify-write."""
        ...

