"""An entry of MEMORY.md as text: content made safe to append, the `## ` entries of a file, their
fingerprints, and the mark an entry gets when a newer one updates it (memory/supersede.py says when).

The rules here are the store's (memory/store.py writes every byte of memory); they are apart so that the
in-place append (memory/in_place_append.py) and the text path of MemoryStore share them.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from picoclaw.errors import MemoryStoreError
from picoclaw.memory.learnings import SOURCE_PREFIX, given_by_a_person, lesson_text
from picoclaw.memory.prefilter import fold, needles, shares_two
from picoclaw.memory.supersede import supersedes
from picoclaw.printable import printable

MAX_ENTRY_CHARS = 100_000
SUPERSEDED = "> superseded"  # how a marked entry's last line begins
# A `## ` section heading line of MEMORY.md: "##" then white space or the end of the line.
SECTION_HEADING = re.compile(r"^##(?=\s|$)")
# A line inside an entry that would start a new "## " block (or a title) is demoted so the entry
# stays one block under its date heading. Matched per line (see clean_entry), "$" so that a bare
# "##" as the last line counts too.
_TOP_HEADING = re.compile(r"^#{1,2}(?=\s|$)")


def check_unicode(text: str) -> None:
    """Refuse text that cannot be written as UTF-8: a lone surrogate, which is what Python makes of a byte
    that is not UTF-8 on the command line (surrogateescape) or of a bad "\\ud800" escape in a model's JSON.

    Checked before anything is written (or backed up), so a refused write leaves the store as it was.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        byte = f" (the byte 0x{ord(bad) - 0xDC00:02X}: is the terminal set to UTF-8?)" if 0xDC80 <= ord(bad) <= 0xDCFF \
            else ""
        raise MemoryStoreError(f"the text is not valid Unicode: character {exc.start + 1} is a lone surrogate "
                               f"U+{ord(bad):04X}{byte}; nothing was stored") from None


def demote_headings(text: str) -> tuple[str, int]:
    """`text` with every line that would start a `## ` entry (or a `# ` title) demoted to `###`, and how many.

    The one rule for content put inside an entry: appended content (`clean_entry`) and edit_file's
    new text, so neither can make a fake dated entry. str.splitlines breaks lines where the block
    splitter does (also at \u2028, \x0c …), unlike "^".
    """
    lines = text.splitlines(keepends=True)
    demoted = [_TOP_HEADING.sub("###", line, count=1) for line in lines]
    return "".join(demoted), sum(1 for old, new in zip(lines, demoted) if old != new)


def is_fence(line: str) -> bool:
    """A line that opens or closes fenced code (the rule memory search splits blocks by, too)."""
    stripped = line.lstrip()
    return stripped.startswith("```") or stripped.startswith("~~~")


def _close_fence(text: str) -> str:
    """`text` plus a closing fence line if it leaves a fence open, so one entry's unclosed ``` cannot
    swallow the entries after it for a Markdown viewer (memory search closes it at the next heading anyway)."""
    opener = ""
    for line in text.split("\n"):
        if is_fence(line):
            opener = "" if opener else line.lstrip()
    if not opener:
        return text
    marker = opener[0] * (len(opener) - len(opener.lstrip(opener[0])))
    return f"{text}\n{marker}"


def clean_entry(content: str) -> str:
    """The one place appended content is made safe: valid Unicode, no NULs or terminal escapes, one entry,
    fences closed."""
    check_unicode(content)
    # A lone "\r" would come back as "\n" when the file is read (universal newlines), so store it as one.
    # NUL and other control characters have no meaning in Markdown, make tools treat the file as binary, and
    # an escape sequence would drive the terminal each time the memory is shown (whoever wrote it: the
    # model's flush, a file tool, a hand-typed CLI argument).
    text = printable(content.replace("\r\n", "\n").replace("\r", "\n")).strip()
    if not text:
        raise MemoryStoreError("nothing to store: the entry is empty")
    if len(text) > MAX_ENTRY_CHARS:
        raise MemoryStoreError(f"entry too long: {len(text)} characters (at most {MAX_ENTRY_CHARS})")
    return _close_fence(demote_headings(text)[0])


_NOT_ALNUM = re.compile(r"[\W_]+")  # exactly the characters for which str.isalnum() is False


def fingerprint(text: str) -> str:
    """What two entries must share to say the same thing: letters and digits only, in one width and case.

    NFKC folds full-width forms (ＡＢＣ１２３ → ABC123) and compatibility characters; casefold lowers
    Latin; punctuation, spaces and line breaks do not count ("My dog is Bob." = "my dog is bob").
    """
    return _NOT_ALNUM.sub("", unicodedata.normalize("NFKC", text).casefold())


def without_source(body: str) -> str:
    """An entry's body without its `Source: ` line: what the entry says, whoever said it."""
    return "\n".join(line for line in body.split("\n") if not line.startswith(SOURCE_PREFIX))


def entry_fingerprint(body: str) -> str:
    """The fingerprint two entries must share to be one (`fingerprint` of what they say, `Source:` lines aside),
    so the model saving a fact the user gave finds it already stored."""
    return fingerprint(without_source(body))


def model_source(session: str | None) -> str:
    """The `Source:` line's text of an entry the model wrote in words the user never said. It ends
    like a lesson the model saved (`lessons.MODEL_SOURCES`), so `given_by_a_person` reads both alike."""
    where = f"session {session} " if session else ""
    return f"the assistant, not the user's words; {where}(memory_append)"


def models_entry(content: str, session: str | None) -> str:
    """`content` as the model's entry: with its `Source:` line saying the words are the assistant's."""
    return lesson_text(content, model_source(session))


@dataclass(frozen=True)
class LongTermEntry:
    """An entry of MEMORY.md: its `## date` heading, its text as in the file, and its first line there."""

    heading: str
    text: str
    line: int
    new: bool = True  # False: the same content was already stored and nothing was written


def long_term_entries(text: str) -> Iterator[LongTermEntry]:
    """The `## ` sections of MEMORY.md, in file order."""
    lines = text.split("\n")
    starts = [n for n, line in enumerate(lines) if SECTION_HEADING.match(line)]
    for start, end in zip(starts, [*starts[1:], len(lines)]):
        body = "\n".join(lines[start:end]).rstrip("\n") + "\n"
        yield LongTermEntry(lines[start].rstrip(), body, start + 1, new=False)


def entry_version(entry_text: str) -> str:
    """A short digest of an entry's text as read: an edit made against it is refused once it no longer matches."""
    return hashlib.sha256(entry_text.encode("utf-8")).hexdigest()[:16]


def mark_superseded(text: str, entries: list[LongTermEntry], marker: str) -> str:
    """`text` with `marker` added as the last line of each of `entries` (found by their first line)."""
    lines = text.split("\n")
    for entry in sorted(entries, key=lambda e: e.line, reverse=True):
        end = entry.line - 1 + entry.text.rstrip("\n").count("\n") + 1  # one past the entry's last line
        lines.insert(end, marker)
    return "\n".join(lines)


def is_superseded(text: str) -> bool:
    """Whether an entry's text carries the mark of a newer entry that updates it."""
    return any(line.startswith(SUPERSEDED) for line in text.splitlines())


def updated_by(body: str, entries: Iterable[LongTermEntry]) -> list[LongTermEntry]:
    """The entries that the new entry `body` updates (memory/supersede.py), not marked already.

    What the model wrote in words the user never said (its `Source:` line says so) never marks what a person
    gave: it may only update the model's own entries. A text sharing fewer than two of the new entry's terms
    cannot be one: `shares_two` rules most of them out on their raw text before the update rule tokenises any.
    """
    models = not given_by_a_person(body)
    said = without_source(body)
    wanted = needles(said)
    older = []
    for entry in entries:
        old = entry.text.split("\n", 1)[-1]
        if models and given_by_a_person(old):
            continue
        if shares_two(wanted, fold(old)) and not is_superseded(entry.text) and supersedes(said, without_source(old)):
            older.append(entry)
    return older


def recent_entries(text: str, limit: int) -> list[LongTermEntry]:
    """The newest `limit` entries of MEMORY.md's `text` that no newer entry superseded, oldest first."""
    return [entry for entry in list(long_term_entries(text))[-limit:] if not is_superseded(entry.text)]


def entry_body(entry_text: str) -> str:
    """What an entry says: its text without the `## ` heading, a superseded mark or a `Source:` line."""
    lines = entry_text.strip("\n").split("\n")
    if lines and SECTION_HEADING.match(lines[0]):
        lines = lines[1:]
    return "\n".join(line for line in lines
                     if not line.startswith((SOURCE_PREFIX, SUPERSEDED))).strip()


def joined(existing: str, block: str) -> str:
    """`block` added after `existing` with one blank line between them (`block` alone for a blank file)."""
    if not existing.strip():
        return block
    return existing.rstrip("\n") + "\n\n" + block


def appended_since(expected: str, current: str) -> str | None:
    """The text appended to `expected` to make `current` ("" for none), or None if it was changed otherwise."""
    base = expected.rstrip("\n")
    if current.rstrip("\n") == base:
        return ""
    # Appends join at a line break (see joined); a longer last line is an edit, not an append.
    if base and not current.startswith(base + "\n"):
        return None
    return current[len(base):].strip("\n") + "\n"
