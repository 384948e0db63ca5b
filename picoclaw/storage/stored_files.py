"""Which files of a workspace are stored content, in the files layout every backend exports and imports.

Stored: each scope's `memory/` folder (MEMORY.md, LEARNINGS.md, daily notes, backups, policy files and the
bookkeeping dot files), the bootstrap files at the workspace root, `sessions/*.jsonl` and `cron/jobs.json`.
Not stored: what is derived or local to one process and rebuilt when missing — lock files, temp files, an
append's journal, MEMORY.md's entry table, and the index folder.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from picoclaw.disk.folder_entries import folder_entries
from picoclaw.layout import (
    BOOTSTRAP_FILES,
    CRON_DIR,
    HEARTBEAT_FILE,
    INDEX_DIR,
    JOBS_FILE,
    MEMORY_DIR,
    SESSIONS_DIR,
    USERS_DIR,
)

ROOT_DOCUMENTS = (*BOOTSTRAP_FILES, HEARTBEAT_FILE)
JOBS_NAME = f"{CRON_DIR}/{JOBS_FILE}"
# Derived or per-process files inside memory/: locks, atomic_write's temp files, in-place append journals,
# the entry table of MEMORY.md (".MEMORY.md.entries"), and the marks (".storage.*") that earlier versions of the
# PostgreSQL backend left in the folder it kept its read copy in.
_DERIVED = re.compile(r"(\.lock|\.tmp|\.append|\.entries)$|^\.storage\.")


def is_derived(name: str) -> bool:
    """Whether the memory file `name` (a path under a scope root) is derived data, never stored."""
    parts = PurePosixPath(name).parts
    return (len(parts) > 1 and parts[1] == INDEX_DIR) or bool(_DERIVED.search(parts[-1]))


def is_stored_name(name: str, *, shared: bool) -> bool:
    """Whether `name` (a path under a scope root) is a stored document: a root document of the shared scope,
    or a file of memory/ that is not derived."""
    if shared and name in ROOT_DOCUMENTS:
        return True
    return name.startswith(f"{MEMORY_DIR}/") and not is_derived(name)


def scope_roots(root: Path) -> Iterator[tuple[str, Path]]:
    """("", the workspace root), then (user key, users/<key>/) for every per-user scope on disk."""
    yield "", root
    users = root / USERS_DIR
    if users.is_dir():
        for entry in sorted(users.iterdir()):
            if entry.is_dir():
                yield entry.name, entry


def scope_of(root: Path, path: Path) -> tuple[str, Path]:
    """The scope holding `path` (under `root`) and that scope's root folder."""
    relative = Path(os.path.abspath(path)).relative_to(os.path.abspath(root)).parts
    if len(relative) >= 2 and relative[0] == USERS_DIR:
        return relative[1], root / USERS_DIR / relative[1]
    return "", root


def document_names(scope_root: Path, *, shared: bool) -> list[str]:
    """The stored documents of one scope, as "/"-separated names under its root (sorted). A turn lists them:
    under memory/ the folders' entries say which are files, so a note costs no stat of its own. (The bootstrap
    files are asked for by name: on a case-insensitive disk "agents.md" is AGENTS.md.)"""
    names = [name for name in ROOT_DOCUMENTS if shared and (scope_root / name).is_file()]
    return sorted(names + memory_document_names(scope_root))


def memory_document_names(scope_root: Path) -> list[str]:
    """The stored documents under the scope's memory/ folder (as `document_names` lists them, in no order)."""
    return _memory_files(str(scope_root / MEMORY_DIR), MEMORY_DIR, top=True)


def _memory_files(folder: str, name: str, *, top: bool) -> list[str]:
    """The stored files under memory folder `folder` (named `name` under the scope root), the index folder left
    out. As os.walk goes: a linked folder is not entered; a link to a file counts, a broken one does not."""
    found = []
    for entry in folder_entries(folder):
        inner = f"{name}/{entry.name}"
        try:
            if entry.is_dir():
                if not entry.is_symlink() and not (top and entry.name == INDEX_DIR):
                    found += _memory_files(entry.path, inner, top=False)
            elif not is_derived(inner) and entry.is_file():
                found.append(inner)
        except OSError:  # an entry that cannot be looked at (as os.walk: not a folder, and not a file either)
            continue
    return found


def session_names(scope_root: Path) -> list[str]:
    """The transcripts of one scope, as names under its root: sessions/<file>.jsonl."""
    folder = scope_root / SESSIONS_DIR
    if not folder.is_dir():
        return []
    return sorted(f"{SESSIONS_DIR}/{p.name}" for p in folder.iterdir() if p.suffix == ".jsonl" and p.is_file())


def stored_files(root: Path) -> dict[str, Path]:
    """Every stored file of the workspace at `root`: its name in the files layout → its path."""
    found: dict[str, Path] = {}
    for scope, scope_root in scope_roots(root):
        prefix = f"{USERS_DIR}/{scope}/" if scope else ""
        for name in [*document_names(scope_root, shared=not scope), *session_names(scope_root)]:
            found[prefix + name] = scope_root / name
    jobs = root / JOBS_NAME
    if jobs.is_file():
        found[JOBS_NAME] = jobs
    return found
