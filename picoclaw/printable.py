"""Text that is safe to print on a terminal or keep in memory: no control characters but newline and tab.

A model's answer or a pasted message may carry escape sequences (colours, cursor moves, a new window title,
a bell) that would rewrite the user's terminal when printed, and would do it again every time the memory
holding them is shown. Whole ANSI sequences go (their parameters are noise without the ESC); any other
C0 or C1 control character, and DEL, is removed. A lone carriage return would overwrite the visible line:
it becomes a line break, as it does when the memory store reads or appends text, and a CRLF line end
becomes a plain newline. An escape string that never ends (no BEL or ST) takes the rest of its line only.
"""

from __future__ import annotations

import re

# CSI (ESC [ … final byte), OSC / DCS / PM / APC strings (ended by BEL or ST, else by the line's end), and
# two-byte ESC sequences; also their 8-bit C1 forms (U+009B CSI, U+009D OSC …).
_ANSI = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[\]PX^_]|[\x9d\x90\x98\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_REMOVED = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # all of _CONTROL but CR
# What the end of one streamed piece may hold of a sequence the next piece completes: an introducer with
# part of its body (an OSC body up to a first ESC of its ST), or a CR whose LF may come next.
_OPEN_TAIL = re.compile(
    r"(?:(?:\x1b\[|\x9b)[0-?]*[ -/]*"
    r"|(?:\x1b[\]PX^_]|[\x9d\x90\x98\x9e\x9f])[^\x07\x1b\x9c\n\r]*\x1b?"
    r"|\x1b[ -/]*"
    r"|\r)\Z"
)
# The most a piece's end is held back for: a longer "sequence" is printed without its ESC, harmless text.
HELD_MAX_CHARS = 1024


def printable(text: str) -> str:
    """`text` without escape sequences or control characters; newlines and tabs are kept."""
    if not _CONTROL.search(text):
        return text  # the common case costs one scan
    text = _ANSI.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    return _CONTROL.sub("", text)


def has_controls(text: str) -> bool:
    """Whether `printable` would remove something from `text` (a CR, which becomes a line break, is kept)."""
    return _REMOVED.search(text) is not None


class PrintablePieces:
    """`printable` for text that comes in pieces (a streamed answer): what is printed of all the pieces is
    `printable` of their whole, since a sequence cut between two pieces is held back (up to HELD_MAX_CHARS)
    until its end comes."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, piece: str) -> str:
        """The printable text of `piece` (with anything held from before) that can be shown now."""
        text, self._held = self._held + piece, ""
        if not _CONTROL.search(text):
            return text
        open_tail = _OPEN_TAIL.search(text, max(len(text) - HELD_MAX_CHARS, 0))
        if open_tail is not None:
            self._held, text = text[open_tail.start():], text[:open_tail.start()]
        return printable(text)

    def end(self) -> str:
        """What is still held, printable: call once the last piece has been fed."""
        held, self._held = self._held, ""
        return printable(held)
