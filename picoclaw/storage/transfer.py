"""Moving a workspace between backends: `picoclaw memory export DIR` and `picoclaw memory import DIR`.

Both speak the files layout (storage/stored_files.py): an export holds the bytes the files backend would hold,
so a user can start embedded, move to a server, and back. An import is refused, before anything is written, only
when it would overwrite or remove something a person would miss (an entry, a note, a chat, a job) unless asked to
replace it: a target holding just what onboarding writes, or content the import holds byte for byte, takes it.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson

from picoclaw.disk.atomic import atomic_write
from picoclaw.disk.bounded_read import read_regular
from picoclaw.layout import SESSIONS_DIR
from picoclaw.storage.backend import Storage
from picoclaw.storage.errors import StorageError
from picoclaw.storage.jobs import due_of, records_of
from picoclaw.storage.stored_files import JOBS_NAME, stored_files
from picoclaw.storage.switching import ENTRY, remember_imported

SHOWN_NAMES = 3  # names a refusal quotes of what the import would overwrite or remove

_NOTE = re.compile(r"(^|/)memory/\d{6}/\d{8}\.md$")


@dataclass(frozen=True)
class Moved:
    """What an export or import moved: files and bytes; `changed` False when the target already held it."""

    files: int
    size: int
    changed: bool = True


def read_layout(root: Path) -> dict[str, bytes]:
    """The stored files under `root` in the files layout: name → bytes."""
    return {name: read_regular(path) for name, path in stored_files(root).items()}


def is_content(name: str, data: bytes) -> bool:
    """Whether the stored file `name` holding `data` is something a person would miss: an entry or lesson, a
    note, a chat, a job. Templates and an entry-less MEMORY.md (a freshly onboarded workspace) are not."""
    if name == JOBS_NAME:
        return holds_jobs(data)
    if name.startswith(f"{SESSIONS_DIR}/") or f"/{SESSIONS_DIR}/" in name or _NOTE.search(name):
        return True
    return name.endswith(("memory/MEMORY.md", "memory/LEARNINGS.md")) and bool(ENTRY.search(data))


def holds_jobs(data: bytes) -> bool:
    """Whether jobs.json's bytes hold a job: an empty list is what removing the last job leaves; a file that
    does not parse counts as holding some, so it is never overwritten unasked."""
    if not data.strip():
        return False
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError:
        return True
    return not (isinstance(document, dict) and document.get("jobs") == [])


def at_risk(current: dict[str, bytes], incoming: dict[str, bytes]) -> list[str]:
    """The stored files of the target an import of `incoming` would overwrite or remove and that hold content.

    A file the import holds byte for byte, or extends (a transcript or MEMORY.md with more appended), loses
    nothing; neither do templates, an entry-less MEMORY.md or an empty jobs list.
    """
    return sorted(name for name, data in current.items()
                  if not incoming.get(name, b"").startswith(data) and is_content(name, data))


def export_workspace(storage: Storage, dest: Path) -> Moved:
    """Write every stored file of `storage` into `dest` (a new or empty folder) in the files layout."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise StorageError(f"{dest}: not an empty folder; export writes into a new or empty one, so nothing of "
                           "yours is overwritten")
    dest.mkdir(parents=True, exist_ok=True)
    storage.export_files(dest)
    written = read_layout(dest)
    return Moved(len(written), sum(map(len, written.values())))


def import_workspace(storage: Storage, src: Path, *, replace: bool) -> Moved:
    """Make `storage` hold exactly the stored files of the files workspace `src`.

    Everything is read and checked before the first write, so a refusal has changed nothing.
    """
    if not src.is_dir():
        what = "not a folder" if src.exists() else "no such folder"
        raise StorageError(f"{src}: {what} (import reads a workspace folder, e.g. one `picoclaw memory export` "
                           "wrote); nothing was imported")
    incoming = read_layout(src)
    if not incoming:
        raise StorageError(f"{src}: holds no memory, sessions or jobs of a picoclaw workspace; nothing was "
                           "imported")
    _check_jobs(src, incoming)
    # Read straight from the store (on PostgreSQL the rows, not this machine's copy of them), writing nothing.
    current = storage.stored_layout()
    size = sum(map(len, incoming.values()))
    if current == incoming:
        remember_imported(storage)
        return Moved(len(incoming), size, changed=False)
    lost = at_risk(current, incoming)
    if lost and not replace:
        shown = ", ".join(lost[:SHOWN_NAMES]) + (f" and {len(lost) - SHOWN_NAMES} more" if len(lost) > SHOWN_NAMES
                                                  else "")
        raise StorageError(f"the {storage.backend} storage holds memory, conversations or jobs that the import "
                           f"would overwrite or remove ({shown}); use --replace to replace them with the import "
                           "(nothing was changed)")
    with tempfile.TemporaryDirectory(prefix="picoclaw-import-") as folder:
        # The import loads what was checked, from a copy: on PostgreSQL `src` may be the workspace folder itself,
        # which `refresh` overwrites with the rows.
        checked = Path(folder)
        for name, data in incoming.items():
            atomic_write(checked / name, data)
        storage.import_files(checked)
    remember_imported(storage)
    return Moved(len(incoming), size)


def _check_jobs(src: Path, incoming: dict[str, bytes]) -> None:
    """A jobs file the import could not load is refused now, before anything is written (StorageError)."""
    data = incoming.get(JOBS_NAME, b"")
    if not data.strip():
        return
    where = str(src / JOBS_NAME)
    try:
        document = orjson.loads(data)
        for record in records_of(document, where):
            due_of(record)
    except orjson.JSONDecodeError as exc:
        raise StorageError(f"{where}: not valid JSON ({exc.msg}); nothing was imported") from None
    except StorageError as exc:
        raise StorageError(f"{exc}; nothing was imported") from None
