"""What memory is searched in: blocks, and hits (a block with its score).

A block is a `## ` section of a memory file, split further at blank lines with every part keeping its
heading (a date heading stays with its entry); blank lines inside fenced code do not split. Every search
returns blocks with their file and 1-based line range, so a hit points at the text as a person sees it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from picoclaw.memory.entries import is_fence

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Block:
    """One retrieval unit: its text (heading included) and where it sits in its file (1-based lines)."""

    path: Path
    heading: str
    text: str
    start_line: int
    end_line: int


@dataclass(frozen=True)
class Hit:
    """A block that matched a query, with its score (higher is better)."""

    block: Block
    score: float


def _is_section_heading(line: str) -> bool:
    return line.startswith("## ") or line.rstrip() == "##"


_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def _lines(text: str) -> list[str]:
    # Lines as editors and `sed -n N,Mp` count them. str.splitlines also breaks at \u2028, \x0c, \x85 …,
    # which would shift the line numbers of every later block and rewrite the block's text.
    lines = _LINE_BREAK.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def split_blocks(text: str, path: Path, first_line: int = 1) -> list[Block]:
    """Split Markdown into blocks; blank lines inside fenced code do not split. `text` starts on line
    `first_line` of its file (a part of a large MEMORY.md).

    A `## ` line at the start of a line is a section heading wherever it is, and closes a fence left
    open before it: one entry's unclosed ``` must not swallow every later entry. (The store demotes
    `## ` lines inside the entries it writes, so only a hand edit puts one inside a fence.)
    """
    blocks: list[Block] = []
    heading = ""
    heading_line = 0
    paragraph: list[str] = []
    para_start = 0
    heading_used = True
    in_fence = False

    def flush() -> None:
        nonlocal paragraph, heading_used
        while paragraph and not paragraph[-1].strip():  # blank lines of a fence a heading closed
            paragraph.pop()
        if paragraph:
            start = heading_line if (heading and not heading_used) else para_start
            body = "\n".join(paragraph)
            blocks.append(Block(path, heading, f"{heading}\n{body}" if heading else body, start,
                                para_start + len(paragraph) - 1))
            heading_used = True
            paragraph = []

    def close_section() -> None:
        flush()
        if heading and not heading_used:  # a heading with nothing under it is still a block
            blocks.append(Block(path, heading, heading, heading_line, heading_line))

    for number, line in enumerate(_lines(text), start=first_line):
        if _is_section_heading(line):
            close_section()
            heading, heading_line, heading_used, in_fence = line.rstrip(), number, False, False
            continue
        if is_fence(line):
            in_fence = not in_fence
        if not in_fence and not line.strip():
            flush()
            continue
        if not paragraph:
            para_start = number
        paragraph.append(line)
    close_section()
    return blocks


def entry_blocks(text: str, path: Path) -> list[Block]:
    """MEMORY.md's blocks without its title and intro (everything above the first `## `): they describe
    the file, they are not memories, and must never be injected or found."""
    return [block for block in split_blocks(text, path) if block.heading]


def appended_entry_blocks(tail: str, path: Path, first_line: int) -> list[Block] | None:
    """The entry blocks of `tail`, text appended to a MEMORY.md that ended with a line break, its first line
    `first_line`: what `entry_blocks` of the whole file gives after the blocks it gave before. None unless the tail
    begins (blank lines aside) with a section heading: else its first lines may belong to the file's last block."""
    opening = tail.lstrip("\n")
    if not (opening and _is_section_heading(_lines(opening)[0])):
        return None
    return [block for block in split_blocks(tail, path, first_line) if block.heading]


def is_title(block: Block) -> bool:
    """A lone `# Title` line (a daily note's `# YYYY-MM-DD`): it carries nothing to find."""
    return not block.heading and "\n" not in block.text and block.text.startswith("# ")


_COMMENT = re.compile(r"\A\s*<!--.*?-->\s*\Z", re.DOTALL)
_warned_headless: set[Path] = set()


def lesson_blocks(text: str, path: Path) -> list[Block]:
    """The lessons of LEARNINGS.md (memory/learnings.py) as blocks, one a paragraph: those of its `## ` entries,
    and any written above the first heading or in a file without one (the title and HTML comments, the
    header onboarding writes, aside), so a hand edit that lost or never had headings is still used; such
    paragraphs get one warning naming the file."""
    blocks = split_blocks(text, path)
    lessons = [block for block in blocks if block.heading or not (is_title(block) or _COMMENT.match(block.text))]
    if path not in _warned_headless and any(not block.heading for block in lessons):
        _warned_headless.add(path)
        log.warning("%s has paragraphs outside a '## YYYY-MM-DD' entry; each is read as a lesson", path)
    return lessons
