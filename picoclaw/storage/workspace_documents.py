"""Which document a file of the workspace is: its scope's documents and its name there, and writing one."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from picoclaw.disk.atomic import atomic_write
from picoclaw.layout import MEMORY_DIR
from picoclaw.storage.backend import Storage
from picoclaw.storage.documents import Documents
from picoclaw.storage.files_documents import FilesDocuments
from picoclaw.storage.stored_files import is_stored_name, scope_of


def document_of(storage: Storage, path: Path) -> tuple[Documents, str]:
    """The documents holding the file `path` of a workspace kept by `storage`, and its name there.

    A file outside a workspace's memory/ and root documents (a store made on a bare folder, as tests do) is a
    document of the files around it, with its backups beside it.
    """
    try:
        scope, scope_root = scope_of(storage.root, path)
    except ValueError:
        return FilesDocuments("", path.parent, lock_wait=storage.lock_wait, memory=""), path.name
    name = Path(os.path.abspath(path)).relative_to(os.path.abspath(scope_root)).as_posix()
    folder = name.split("/", 1)[0] if "/" in name else ""
    if folder in ("", MEMORY_DIR):
        return storage.documents(scope), name
    return FilesDocuments(scope, scope_root, lock_wait=storage.lock_wait, memory=folder), name


def write_file(storage: Storage, path: Path, data: bytes | str) -> None:
    """Write a file of the workspace at once: a stored document through its scope's documents (so it lands in
    the backend's truth), any other file (a skill, a script) in place, atomically."""
    if is_stored_document(storage, path):
        documents, name = document_of(storage, path)
        documents.replace(name, data)
    else:
        atomic_write(path, data)


def edit_file(storage: Storage, path: Path, change: Callable[[bytes | None], bytes]) -> None:
    """Rewrite a file of the workspace as `change(its bytes, None if missing)`: a stored document is read from the
    backend's truth and replaced only if no one wrote it meanwhile (StaleRevision, nothing written); any other
    file in place, atomically."""
    if is_stored_document(storage, path):
        documents, name = document_of(storage, path)
        found = documents.read(name)
        documents.replace(name, change(found.data), expect=found.revision)
        return
    try:
        data: bytes | None = path.read_bytes()
    except FileNotFoundError:
        data = None
    atomic_write(path, change(data))


def local_file(storage: Storage, path: Path) -> Path:
    """The file on this machine to read for the workspace file `path`: a stored document's `local` file (on files
    `path` itself; on PostgreSQL the cache of its row, brought up to date), any other file itself."""
    if not is_stored_document(storage, path):
        return path
    documents, name = document_of(storage, path)
    return documents.local(name)


def local_folder(storage: Storage, path: Path) -> Path:
    """The folder on this machine to list for the workspace folder `path`: a scope's memory/ (or a folder in it)
    as `Documents.local_folder` gives it, any other folder itself."""
    try:
        scope, scope_root = scope_of(storage.root, path)
    except ValueError:
        return path
    name = Path(os.path.abspath(path)).relative_to(os.path.abspath(scope_root)).as_posix()
    if name != MEMORY_DIR and not is_stored_name(f"{name}/{MEMORY_DIR}.md", shared=not scope):  # a file in it
        return path
    return storage.documents(scope).local_folder(f"{name}/")


def is_stored_document(storage: Storage, path: Path) -> bool:
    """Whether the file `path` is one of the stored documents of a workspace kept by `storage`."""
    try:
        scope, scope_root = scope_of(storage.root, path)
    except ValueError:
        return False
    name = Path(os.path.abspath(path)).relative_to(os.path.abspath(scope_root)).as_posix()
    return is_stored_name(name, shared=not scope)
