"""What the index stores for a file: chunks that follow the store's own blocks, cut to the embedder's limit.

A Markdown file is split exactly as the keyword search splits it (`split_blocks`: a `## date` heading
stays with its entry). A block longer than the token limit is cut at line breaks (a single overlong line
at characters), each piece repeating the block's heading, because an embedding model silently keeps only
the start of a longer input. A session file (`sessions/*.jsonl`) gives one chunk per user turn with the
assistant's replies to it, its line range being the JSONL lines.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from picoclaw.memory.search.blocks import Block, entry_blocks, is_title, split_blocks
from picoclaw.memory.terms import TERMS_VERSION, block_terms
from picoclaw.tokens import count_tokens
from picoclaw.transcripts import said_lines

DEFAULT_CHUNK_TOKENS = 400
CHUNKING_RULES = 2  # bumped when what becomes a chunk changes (2: MEMORY.md's title and intro are left out)


@dataclass(frozen=True)
class TokenLimit:
    """How chunk size is measured: a token counter and the most tokens one chunk may have."""

    name: str
    limit: int
    count: Callable[[str], int] = count_tokens

    def fits(self, text: str) -> bool:
        # Every tokenizer here gives at most one token per UTF-8 byte, so short texts need no count.
        return len(text.encode("utf-8")) <= self.limit or self.count(text) <= self.limit

    @property
    def key(self) -> str:
        """Changes whenever chunk boundaries or their search terms could: stored in the index so a change
        re-chunks (and re-tokenises) every file."""
        return f"{self.name}:{self.limit}:{CHUNKING_RULES}:terms{TERMS_VERSION}"


DEFAULT_LIMIT = TokenLimit("o200k", DEFAULT_CHUNK_TOKENS)


@dataclass(frozen=True)
class Chunk:
    """One indexed unit: its lines in the file (1-based, inclusive), heading, text and text hash."""

    start_line: int
    end_line: int
    heading: str
    text: str
    path: Path | None = None  # its file: a daily note's name gives the chunk's date (see `terms`)

    @property
    def hash(self) -> str:
        return text_hash(self.text)

    @property
    def terms(self) -> str:
        """The text as FTS tokens: the keyword search's terms of the same block (date words included),
        joined by spaces."""
        return " ".join(block_terms(self.text, self.heading, self.path))


def text_hash(text: str) -> str:
    """sha256 of the UTF-8 text, hex."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _cut_line(line: str, budget: int, limit: TokenLimit) -> Iterator[str]:
    """`line` in pieces of at most `budget` tokens, cut at characters."""
    rest = line
    while rest:
        size = len(rest)
        while size > 1 and limit.count(rest[:size]) > budget:
            size = max(1, size * budget // max(limit.count(rest[:size]), 1) - 1)
        yield rest[:size]
        rest = rest[size:]


def _pieces(block: Block, limit: TokenLimit) -> list[Chunk]:
    """The block as one chunk, or cut into chunks that each fit `limit`, each keeping the heading."""
    if limit.fits(block.text):
        return [Chunk(block.start_line, block.end_line, block.heading, block.text, block.path)]
    lines = block.text.split("\n")
    has_heading = bool(block.heading) and lines[0] == block.heading and len(lines) > 1
    body = lines[1:] if has_heading else lines
    first_line = block.end_line - len(body) + 1
    # The heading is repeated in every piece, unless it would take most of the room itself.
    prefix = f"{block.heading}\n" if has_heading and limit.count(block.heading) <= limit.limit // 2 else ""
    budget = limit.limit - (limit.count(prefix) if prefix else 0)
    chunks: list[Chunk] = []
    parts: list[tuple[int, str]] = []  # (line number, text)
    used = 0

    def emit() -> None:
        nonlocal used
        if parts:
            start = block.start_line if not chunks else parts[0][0]
            chunks.append(Chunk(start, parts[-1][0], block.heading if has_heading else "",
                                prefix + "\n".join(text for _, text in parts), block.path))
            parts.clear()
            used = 0

    for offset, line in enumerate(body):
        cost = limit.count(line) + 1  # + the line break
        pieces = [(line, cost)] if cost <= budget else [
            (piece, limit.count(piece) + 1) for piece in _cut_line(line, budget - 1, limit)]
        for piece, piece_cost in pieces:
            if parts and used + piece_cost > budget:
                emit()
            parts.append((first_line + offset, piece))
            used += piece_cost
    emit()
    return chunks


def markdown_chunks(text: str, path: Path, limit: TokenLimit, *, entries_only: bool = False) -> list[Chunk]:
    """The chunks of a Markdown memory file: a daily note, or MEMORY.md (`entries_only`: its title and
    intro above the first `## ` are left out, as the keyword search leaves them out)."""
    blocks = entry_blocks(text, path) if entries_only else split_blocks(text, path)
    return [chunk for block in blocks if not is_title(block) for chunk in _pieces(block, limit)]


def session_chunks(text: str, path: Path, limit: TokenLimit) -> list[Chunk]:
    """The chunks of a session file: each user message with the assistant's replies up to the next one."""
    turns: list[tuple[int, int, list[str]]] = []
    for number, role, content in said_lines(text):
        if role == "user" or not turns:
            turns.append((number, number, [f"{role}: {content}"]))
        else:
            start, _, parts = turns[-1]
            parts.append(f"{role}: {content}")
            turns[-1] = (start, number, parts)
    blocks = (Block(path, "", "\n".join(parts), start, end) for start, end, parts in turns)
    return [chunk for block in blocks for chunk in _pieces(block, limit)]
