"""Moving a workspace between backends: `picoclaw memory export DIR` and `picoclaw memory import DIR`.

Both speak the files layout (storage/stored_files.py): an export holds the bytes the files backend would hold,
so a user can start embedded, move to a server, and back. An import into a target that already holds memory,
conversations or jobs is refused unless asked to replace them; importing what is already there changes nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from picoclaw.fsutil import read_regular
from picoclaw.layout import SESSIONS_DIR
from picoclaw.storage.backend import Storage
from picoclaw.storage.errors import StorageError
from picoclaw.storage.stored_files import JOBS_NAME, stored_files

_NOTE = re.compile(r"(^|/)memory/\d{6}/\d{8}\.md$")
_ENTRY = re.compile(rb"(^|\n)## ")


@dataclass(frozen=True)
class Moved:
    """What an export or import moved: files and bytes; `changed` False when the target already held it."""

    files: int
    size: int
    changed: bool = True


def read_layout(root: Path) -> dict[str, bytes]:
    """The stored files under `root` in the files layout: name → bytes."""
    return {name: read_regular(path) for name, path in stored_files(root).items()}


def holds_content(layout: dict[str, bytes]) -> bool:
    """Whether a workspace holds anything a person would miss: an entry or lesson, a note, a chat, a job.

    A freshly onboarded workspace (templates, an empty MEMORY.md) holds none of it and may be imported into.
    """
    for name, data in layout.items():
        if name == JOBS_NAME or name.startswith(f"{SESSIONS_DIR}/") or f"/{SESSIONS_DIR}/" in name:
            return True
        if _NOTE.search(name):
            return True
        if name.endswith(("memory/MEMORY.md", "memory/LEARNINGS.md")) and _ENTRY.search(data):
            return True
    return False


def export_workspace(storage: Storage, dest: Path) -> Moved:
    """Write every stored file of `storage` into `dest` (a new or empty folder) in the files layout."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise StorageError(f"{dest}: not an empty folder; export writes into a new or empty one, so nothing of "
                           "yours is overwritten")
    storage.refresh()
    dest.mkdir(parents=True, exist_ok=True)
    storage.export_files(dest)
    written = read_layout(dest)
    return Moved(len(written), sum(map(len, written.values())))


def import_workspace(storage: Storage, src: Path, *, replace: bool) -> Moved:
    """Make `storage` hold exactly the stored files of the files workspace `src`."""
    if not src.is_dir():
        raise StorageError(f"{src}: no such folder (import reads a workspace folder, e.g. one `picoclaw "
                           "memory export` wrote)")
    incoming = read_layout(src)
    if not incoming:
        raise StorageError(f"{src}: holds no memory, sessions or jobs of a picoclaw workspace; nothing was "
                           "imported")
    storage.refresh()
    current = storage.stored_layout()
    size = sum(map(len, incoming.values()))
    if current == incoming:
        return Moved(len(incoming), size, changed=False)
    if holds_content(current) and not replace:
        raise StorageError(f"the {storage.backend} workspace already holds memory, conversations or jobs; "
                           "use --replace to replace them with the import (nothing was changed)")
    storage.import_files(src)
    return Moved(len(incoming), size)
