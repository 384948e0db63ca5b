"""`picoclaw memory edit`: a document into $EDITOR and back, and where an edit that could not be saved is kept."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
from datetime import UTC
from pathlib import Path, PurePosixPath

from picoclaw import clock
from picoclaw.disk.stamped import write_stamped
from picoclaw.errors import PicoclawError
from picoclaw.storage import Documents, is_stored_name

EDITS_DIR = "edits"  # under the picoclaw home: edits refused because the document changed meanwhile
_DAY = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$")


def editable_name(documents: Documents, given: str) -> str:
    """The document `given` names: a name under the scope's folder, a memory file by its own name, or a day."""
    day = _DAY.match(given)
    if day:
        year, month, date = day.groups()
        given = f"memory/{year}{month}/{year}{month}{date}.md"
    candidates = [given] if "/" in given else [f"memory/{given}", given]
    for name in candidates:
        if PurePosixPath(name).name.startswith("."):
            raise PicoclawError(f"{given} is picoclaw's own bookkeeping, not a document to edit by hand")
        if is_stored_name(name, shared=not documents.scope) and documents.read(name).data is not None:
            return name
    raise PicoclawError(f"no memory document {given!r}: name MEMORY.md, LEARNINGS.md, a bootstrap file such as "
                        "USER.md, or a daily note (YYYY-MM-DD)")


def edit_in_editor(data: bytes, name: str) -> bytes:
    """`data` after the user edited it in $VISUAL / $EDITOR (vi if neither is set); an editor that cannot start or
    fails is one line, and nothing is written."""
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.TemporaryDirectory(prefix="picoclaw-edit-") as folder:
        path = Path(folder) / PurePosixPath(name).name
        path.write_bytes(data)
        try:
            finished = subprocess.run([*shlex.split(editor), str(path)], check=False)
        except (OSError, ValueError) as exc:
            raise PicoclawError(f"cannot start the editor {editor!r} ({exc}); set $EDITOR; nothing was written"
                                ) from None
        if finished.returncode != 0:
            raise PicoclawError(f"the editor {editor!r} exited with status {finished.returncode}; nothing was "
                                "written")
        return path.read_bytes()


def keep_rejected_edit(home: Path, name: str, edited: bytes) -> Path:
    """Keep an edit that could not be saved in <home>/edits/, under a name never used before; its path."""
    return write_stamped(home / EDITS_DIR, clock.stamp(clock.now(UTC)), f"_{PurePosixPath(name).name}", edited)
