"""The documents port on files: each document is the file itself, written atomically under the scope's root.

A revision is the file's (size, mtime, inode): cheap to read at 50 MB, and changed by every write (an atomic
replace makes a new inode; an append moves size and mtime). A document's `local` file is the file itself, so a
reader that reads through the port costs what reading the file always did. Versions are stamped files in
memory/backups/.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC
from pathlib import Path, PurePosixPath
from typing import Any

from picoclaw import clock
from picoclaw.disk.appends import append_bytes, append_jsonl
from picoclaw.disk.atomic import atomic_write
from picoclaw.disk.bounded_read import read_regular
from picoclaw.disk.links import write_target
from picoclaw.disk.stamped import stamped_files, write_new, write_stamped
from picoclaw.layout import MEMORY_DIR
from picoclaw.storage.documents import MISSING, Changes, Document, StaleRevision
from picoclaw.storage.errors import StorageError
from picoclaw.storage.stored_files import document_names, memory_document_names
from picoclaw.storage.waits import LOCK_WAIT_SECONDS, BoundedFileLock

BACKUPS = "backups"
VERSIONS_DIR = f"{MEMORY_DIR}/{BACKUPS}"
# The lock of a read-modify-write of the scope's memory: the memory store's own (memory/store.py).
MEMORY_LOCK_FILE = ".memory.lock"
MEMORY_LOCK = f"{MEMORY_DIR}/{MEMORY_LOCK_FILE}"


def file_revision(path: Path) -> str:
    """The revision of the file at `path` (MISSING when there is none)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return MISSING
    return f"{info.st_size}.{info.st_mtime_ns}.{info.st_ino}"


class FilesDocuments:
    """The documents of the scope rooted at `root`, as the files under it."""

    def __init__(self, scope: str, root: Path, *, lock_wait: float = LOCK_WAIT_SECONDS,
                 workspace: Path | None = None, shared: bool = True, memory: str = MEMORY_DIR):
        self.scope = scope
        self.root = root
        # The memory folder (relative to root) whose backups/ holds the versions: memory/ in a workspace; the
        # folder itself ("") for a store made on a bare folder.
        self.versions_dir = f"{memory}/{BACKUPS}" if memory else BACKUPS
        self.lock_wait = lock_wait
        self.workspace = workspace or root  # for the lock's name in a failed wait
        self.shared = shared  # the shared scope also holds the bootstrap documents at the root
        self._paths: dict[str, Path] = {}

    def path(self, name: str) -> Path:
        """The file of `name`; a name that leaves the root is refused."""
        found = self._paths.get(name)
        if found is None:  # remembered: every read asks for its file, and a turn reads a dozen documents
            relative = PurePosixPath(name)
            if relative.is_absolute() or ".." in relative.parts or not relative.parts:
                raise StorageError(f"{name!r} is not the name of a document (a path under the scope's folder)")
            found = self._paths.setdefault(name, self.root.joinpath(*relative.parts))
        return found

    def name(self, path: Path) -> str:
        return Path(os.path.abspath(path)).relative_to(os.path.abspath(self.root)).as_posix()

    def local(self, name: str) -> Path:
        return self.path(name)

    def local_folder(self, prefix: str) -> Path:
        return self.path(prefix) if prefix.strip("/") else self.root

    def read(self, name: str) -> Document:
        path = self.path(name)
        revision = file_revision(path)
        try:
            data = read_regular(path)
        except FileNotFoundError:
            return Document(name, None, MISSING)
        return Document(name, data, revision)

    def replace(self, name: str, data: bytes | str, *, expect: str | None = None, durable: bool = True) -> str:
        path = self.path(name)
        if expect is None:
            atomic_write(path, data, durable=durable)
            return file_revision(path)
        # The memory lock, on a lock object of its own: a caller already holding the store's lock compares the
        # revision itself (MemoryStore.replace_document) rather than wait here for its own lock.
        with self.exclusive():
            found = file_revision(path)
            if found != expect:
                raise StaleRevision(f"{name} was changed since it was read; nothing was written")
            atomic_write(path, data, durable=durable)
            return file_revision(path)

    def create(self, name: str, data: bytes | str) -> bool:
        return write_new(self.path(name), data)

    def append(self, name: str, data: bytes) -> str:
        real = write_target(self.path(name))
        try:
            info = os.stat(real)
        except FileNotFoundError:
            raise StorageError(f"{name} does not exist: there is nothing to append to") from None
        append_bytes(real, info, data)
        return file_revision(real)

    def append_records(self, name: str, records: Sequence[dict[str, Any]], *, durable: bool = True) -> int:
        append_jsonl(self.path(name), list(records), durable=durable)
        return self.path(name).stat().st_size

    def delete(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)

    def names(self, prefix: str = "") -> list[str]:
        # Under memory/ (the notes' folder, listed every turn) only that folder is walked: no stat of the
        # bootstrap files beside it.
        found = (sorted(memory_document_names(self.root)) if prefix.startswith(f"{MEMORY_DIR}/")
                 else document_names(self.root, shared=self.shared))
        return [name for name in found if name.startswith(prefix)]

    def changes_since(self, mark: str) -> Changes:
        """Files modified after the mark (a modification time in ns; MISSING: all)."""
        since = int(mark) if mark else -1
        newest, names = since, []
        for name in self.names():
            try:
                modified = os.stat(self.path(name)).st_mtime_ns
            except FileNotFoundError:
                continue
            if modified > since:
                names.append(name)
                newest = max(newest, modified)
        return Changes(names, str(newest) if newest >= 0 else mark)

    def keep_version(self, name: str, data: bytes, suffix: str, keep: int) -> str:
        # write_stamped, not reserve-then-write: a crash must not leave an empty "backup" to restore.
        folder = self.path(self.versions_dir)
        written = write_stamped(folder, clock.stamp(clock.now(UTC)), suffix, data)
        for stale in stamped_files(folder, suffix)[:-keep]:
            stale.unlink(missing_ok=True)
        return written.name

    def versions(self, suffix: str) -> list[str]:
        return [path.name for path in stamped_files(self.path(self.versions_dir), suffix)]

    def version_sizes(self, suffix: str) -> list[tuple[str, int]]:
        found = []
        for path in stamped_files(self.path(self.versions_dir), suffix):
            try:
                found.append((path.name, path.stat().st_size))
            except FileNotFoundError:  # pruned meanwhile
                continue
        return found

    def read_version(self, label: str) -> bytes:
        if "/" in label or label.startswith("."):
            raise StorageError(f"no version named {label!r}")
        try:
            return read_regular(self.path(f"{self.versions_dir}/{label}"))
        except FileNotFoundError:
            raise StorageError(f"no version named {label!r}") from None

    def exclusive(self, timeout: float | None = None) -> BoundedFileLock:
        return BoundedFileLock(self.path(MEMORY_LOCK), self.lock_wait if timeout is None else timeout,
                               self.workspace)
