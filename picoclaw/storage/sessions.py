"""The sessions port: a folder of transcripts, each an append-only list of JSON records (one a line).

`transcripts/session_store.py` owns what the records mean; a `SessionLog` only keeps them. Transcripts are named by
path (`<sessions folder>/<key file name>`, archived ones under `archive/`) in both backends, so the files
layout is the one names are taken from. The files backend (`FilesSessionLog`, here) keeps them as JSONL
files under a `filelock`; PostgreSQL (storage/postgres/sessions.py) as rows of the `messages` table.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Hashable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

from picoclaw.disk.appends import append_jsonl
from picoclaw.disk.atomic import atomic_write
from picoclaw.disk.file_identity import file_key
from picoclaw.disk.stamped import reserve_stamped_path
from picoclaw.storage.errors import StorageError
from picoclaw.storage.waits import LOCK_WAIT_SECONDS, BoundedFileLock

log = logging.getLogger(__name__)

ARCHIVE_DIR = "archive"
SUFFIX = ".jsonl"
LOCK_FILE = ".sessions.lock"  # the cross-process lock of one sessions folder (files backend)


@dataclass(frozen=True)
class Transcript:
    """A transcript as read: its record lines (no newlines; a torn last line left out) and its marker."""

    lines: list[bytes]
    marker: Hashable | None  # changes whenever the transcript changes; None when there is none


class SessionLog(Protocol):
    """The transcripts of one sessions folder (one scope), and the lock their writers share."""

    folder: Path

    def lock(self) -> AbstractContextManager[object]:
        """The lock every writer of this folder holds while it reads what is new, appends, archives or renames
        (an `append_unchanged` holds it for its one statement, or writes nothing).

        Held across processes (and machines, on PostgreSQL); reentrant within a thread; waits at most the
        storage's bound (storage.lock_wait_seconds), then LockWaitExpired.
        """
        ...

    def read(self, path: Path) -> Transcript:
        """The transcript at `path` as it is now (no lines and marker None when there is none)."""
        ...

    def marker(self, path: Path) -> Hashable | None:
        """What `read` would give as the marker now: compare with a kept one to learn of another writer."""
        ...

    def append(self, path: Path, records: list[dict[str, Any]]) -> Hashable | None:
        """Append `records` in one write (all or none; StorageError for one that cannot be kept); the new marker.

        Call under `lock()`, after reading what is new: a message record's id must follow the last one.
        """
        ...

    def append_unchanged(self, path: Path, records: list[dict[str, Any]], marker: Hashable) -> Hashable | None:
        """`append` without taking the lock, when no writer holds it and the transcript is still at `marker`
        (a writer that read it at `marker` numbers right); the new marker, or None when nothing was written."""
        ...

    def exists(self, path: Path) -> bool:
        """Whether a transcript is at `path`."""
        ...

    def move(self, old: Path, new: Path) -> bool:
        """Give the transcript at `old` the path `new` (another scope's too), unless `new` has one; whether it moved."""
        ...

    def archive(self, path: Path, stamp: str) -> Path | None:
        """Move the transcript at `path` to `archive/<stamp>[_n]_<name>`, a name never used; where it went."""
        ...

    def transcripts(self) -> list[Path]:
        """Every transcript of the folder, archived ones included, sorted by path."""
        ...

    def modified(self, path: Path) -> float:
        """When the transcript at `path` last changed (seconds since the epoch; 0 when unknown)."""
        ...


def record_lines(records: list[dict[str, Any]]) -> list[bytes]:
    """Each record as its JSONL line (without the newline), exactly as the files backend writes it."""
    try:
        return [orjson.dumps(record) for record in records]
    except orjson.JSONEncodeError as exc:
        raise StorageError(f"a session record cannot be stored: {exc}") from None


def transcript_files(folder: Path) -> list[Path]:
    """Every session file in `folder`, those archived by /new included, sorted by path."""
    return sorted([*folder.glob(f"*{SUFFIX}"), *(folder / ARCHIVE_DIR).glob(f"*{SUFFIX}")])


class FilesSessionLog:
    """`<folder>/<name>.jsonl` files appended under a `filelock` (beside the folder unless `lock_path` says)."""

    def __init__(self, folder: Path, lock_path: Path | None = None, *, lock_wait: float = LOCK_WAIT_SECONDS,
                 root: Path | None = None):
        self.folder = Path(folder)
        self.lock_path = Path(lock_path) if lock_path is not None else self.folder.parent / LOCK_FILE
        self.lock_wait = lock_wait
        self.root = root  # the workspace root, for the lock's name in a failed wait
        # One for every append: making a filelock is a good part of what taking it costs (each thread holds it
        # apart, so threads still wait for each other).
        self._lock = BoundedFileLock(self.lock_path, self.lock_wait, self.root)

    def lock(self) -> BoundedFileLock:
        """The folder's lock file (reentrant within a thread), waited for at most `lock_wait` s."""
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        return self._lock

    def read(self, path: Path) -> Transcript:
        key = file_key(path)  # taken first: a write after it shows as a change on the next look
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return Transcript([], None)
        lines = raw.split(b"\n")
        # The last piece is empty after a final newline; without one it is torn by a crash, or (read without
        # the lock) a line another process is writing right now: either way not a record yet. `append` cuts a
        # torn one off before appending.
        return Transcript(lines[:-1], key)

    def marker(self, path: Path) -> Hashable | None:
        return file_key(path)

    def append(self, path: Path, records: list[dict[str, Any]]) -> Hashable | None:
        record_lines(records)  # a record that cannot be written fails here, before the file is touched
        try:
            with open(path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                torn = fh.tell() > 0 and (fh.seek(-1, os.SEEK_END), fh.read(1))[1] != b"\n"
        except FileNotFoundError:
            torn = False
        if torn:  # no writer is mid-line while we hold the lock: a crash tore it
            log.warning("%s: dropping a torn last line (the writer stopped mid-line)", path)
            raw = path.read_bytes()
            atomic_write(path, raw[: raw.rfind(b"\n") + 1])
        append_jsonl(path, records)
        return file_key(path)

    def append_unchanged(self, path: Path, records: list[dict[str, Any]], marker: Hashable) -> Hashable | None:
        return None  # taking the lock file is what makes the check and the write one step: always taken

    def exists(self, path: Path) -> bool:
        return path.exists()

    def move(self, old: Path, new: Path) -> bool:
        if not old.exists() or new.exists():
            return False
        new.parent.mkdir(parents=True, exist_ok=True)
        os.replace(old, new)
        return True

    def archive(self, path: Path, stamp: str) -> Path | None:
        if not path.exists():
            return None
        target = reserve_stamped_path(self.folder / ARCHIVE_DIR, stamp, "_" + path.name)
        os.replace(path, target)
        return target

    def transcripts(self) -> list[Path]:
        return transcript_files(self.folder)

    def modified(self, path: Path) -> float:
        try:
            return path.stat().st_mtime
        except OSError:
            return 0.0
