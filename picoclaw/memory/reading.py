"""Reading memory files that a person edits: bytes that are not UTF-8 read as U+FFFD (never an error),
with one warning naming the file and line, and another when a rewrite replaces such bytes."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from picoclaw.disk.file_identity import FileKey, file_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileText:
    """A memory file as read: its raw bytes and its text (bytes that are not UTF-8 read as U+FFFD)."""

    raw: bytes
    text: str
    bad_line: int | None  # the line of the first byte that is not UTF-8; None when all of it is UTF-8


def decode(raw: bytes, *, translate_newlines: bool = True) -> FileText:
    """`raw` as text; with `translate_newlines`, every line break as "\\n" (as open() in text mode reads it)."""
    try:
        text = raw.decode("utf-8")
        bad_line = None
    except UnicodeDecodeError as exc:
        # A hand edit saved in another encoding must not make memory unreadable: the rest of the file is
        # still good, so the bad bytes become replacement characters and one warning names the line.
        text = raw.decode("utf-8", errors="replace")
        bad_line = raw.count(b"\n", 0, exc.start) + 1
    if translate_newlines:  # what open()'s universal newlines did for the strict read
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return FileText(raw, text, bad_line)


_warned: set[tuple[Path, FileKey | None]] = set()


def warn_unreadable(path: Path, read: FileText) -> None:
    """Warn once per version of the file (a chat reads the recent notes every turn, it must not nag)."""
    if read.bad_line is None:
        return
    key = (path, file_key(path))
    if key in _warned:
        return
    _warned.add(key)
    log.warning("%s line %d holds bytes that are not UTF-8; they are read as U+FFFD (\ufffd) and the file "
                "is left as it is (save it as UTF-8 to fix it)", path, read.bad_line)


def warn_rewritten(path: Path, read: FileText, backup: Path | None) -> None:
    """Say that `path`, read as `read`, was rewritten with U+FFFD for its bytes that were not UTF-8."""
    if read.bad_line is None:
        return
    kept = f"the original bytes are kept in {backup}" if backup is not None else "no backup was possible"
    log.warning("%s line %d held bytes that are not UTF-8; the file was rewritten as UTF-8 with U+FFFD "
                "(\ufffd) in their place; %s", path, read.bad_line, kept)
