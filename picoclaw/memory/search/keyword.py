"""KeywordSearch: BM25 over one memory folder's files, read directly (no index configured, or the index
cannot answer).

Each document is parsed and indexed once and reused until its file (`MemoryStore.local`: on files the file
itself, on PostgreSQL this machine's cache of the row, checked against its revision) changes size, mtime or
inode, so a query on an unchanged MEMORY.md costs one stat per file (and on PostgreSQL one small statement per
document, one for all the notes) plus the scoring. A MEMORY.md that only grew by entries (a memory written)
has those entries indexed alone. A daily-note entry is indexed together with
the entry before it, since an entry so often answers what came just before it. The matching blocks are
ranked again with the query expanded by its best hits' telling terms (search/query_expansion.py). A
MEMORY.md larger than LARGE_FILE is searched as a stream instead (memory/search/large_files.py).

Async callers (a turn, a tool) use `search_async`, which never blocks their event loop: file reads and
scoring run in a worker thread. Sync callers (the CLI) use `search`.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from picoclaw.disk.bounded_read import read_regular
from picoclaw.disk.file_identity import FileCache, FileKey, file_key
from picoclaw.disk.links import NotAFileError
from picoclaw.memory.learnings import stands
from picoclaw.memory.reading import decode, warn_unreadable
from picoclaw.memory.search.blocks import (
    Block,
    Hit,
    appended_entry_blocks,
    entry_blocks,
    is_title,
    lesson_blocks,
    split_blocks,
)
from picoclaw.memory.search.bm25 import NEIGHBOUR_WEIGHT, DictScores, FileIndex, FileScores, rank
from picoclaw.memory.search.large_files import LARGE_FILE, LargeMemory, large_neighbours, large_tail
from picoclaw.memory.store import MemoryStore

log = logging.getLogger(__name__)

# Standing lessons ("always answer in Chinese") a turn may carry whatever it is about, newest first.
STANDING_LESSONS = 5
# Blocks from which a file searched again is scored in arrays (array_scores.py): below, numpy's cost per call
# outweighs what it saves per posting (a MEMORY.md of 1,000 blocks takes the same time either way, of 10,000
# half as long with arrays; daily notes, a few dozen blocks each, are slower in arrays). A file searched once,
# as by a short command, never imports numpy.
ARRAYS_FROM = 2000


def _text(data: bytes) -> str:
    # As open() in text mode reads it: bad bytes as U+FFFD, every line break as "\n".
    text = data.decode("utf-8", errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _read_text(file: Path) -> str:
    return _text(read_regular(file))


def _digest(data: bytes | memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


@dataclass(frozen=True)
class _Source:
    """What MEMORY.md's cached index was made from, as much as telling an append from another change needs: the
    bytes' length and digest, and the text's line count."""

    size: int
    digest: bytes
    lines: int


def _appended(before: FileIndex, source: _Source, data: bytes, path: Path) -> tuple[FileIndex, int] | None:
    """`before` (made from `source`) extended by the entries appended since, and the file's line count, when
    `data`, the file now, is `source`'s bytes, ending in a line break, and then entries; else None."""
    size = source.size
    if not (0 < size < len(data) and data[size - 1:size] == b"\n"):
        return None
    if _digest(memoryview(data)[:size]) != source.digest:
        return None
    tail = _text(data[size:])
    blocks = appended_entry_blocks(tail, path, source.lines + 1)
    return None if blocks is None else (before.extended(blocks), source.lines + tail.count("\n"))


def _file_scores(index: FileIndex, avg_length: float, neighbours: float) -> FileScores:
    """A search's sums over one file: in arrays for a whole file of ARRAYS_FROM blocks or more that was searched
    before, else in a dict."""
    if index.searches > 1 and len(index.blocks) >= ARRAYS_FROM and index.doc_freqs is None:
        from picoclaw.memory.search.array_scores import ArrayScores  # only now: numpy

        return ArrayScores(index, avg_length, neighbours)
    return DictScores(index, avg_length, neighbours)


def _index_note(path: Path, file: Path) -> FileIndex:
    blocks = split_blocks(_read_text(file), path)
    # The title is left out: with the note's date in words it would match every question about that day.
    # An entry is indexed with the one before it: on LoCoMo's dev notes turn recall@10 +0.035 EN, +0.014 ZH.
    return FileIndex.build([block for block in blocks if not is_title(block)], with_previous=True)


def _index_learnings(path: Path, file: Path) -> FileIndex:
    read = decode(read_regular(file))
    warn_unreadable(path, read)  # once per version of the file: the cache calls this only when it changed
    return FileIndex.build(lesson_blocks(read.text, path))


class KeywordSearch:
    """Searches one memory folder's MEMORY.md (and optionally its daily notes) with a warm cache."""

    blocking = True  # search_async is search in a worker thread

    def __init__(self, store: MemoryStore, *, neighbour_weight: float = NEIGHBOUR_WEIGHT):
        self.store = store
        self.neighbour_weight = neighbour_weight  # the share of an adjacent block's score a block gains (bm25.py)
        self.cache: FileCache[FileIndex] = FileCache(self._index_long_term)  # MEMORY.md
        self._sources: dict[Path, _Source] = {}  # what each index of `cache` was made from
        self.notes_cache: FileCache[FileIndex] = FileCache(_index_note)
        self.learnings_cache: FileCache[FileIndex] = FileCache(_index_learnings)
        self.large_cache: FileCache[LargeMemory | None] = FileCache(LargeMemory.scan)  # MEMORY.md over LARGE_FILE
        self._lock = threading.Lock()  # the caches are filled by whichever thread searches first

    def _index_long_term(self, path: Path, file: Path) -> FileIndex:
        """MEMORY.md's index. When the file only grew by entries since its index was made (a memory was written),
        the new entries alone are indexed: the next search does not tokenise every entry again."""
        data = read_regular(file)
        source, before = self._sources.get(path), self.cache.held(path)
        grown = _appended(before, source, data, path) if source is not None and before is not None else None
        if grown is None:
            text = _text(data)
            grown = FileIndex.build(entry_blocks(text, path)), text.count("\n")
        index, lines = grown
        self._sources[path] = _Source(len(data), _digest(data), lines)
        return index

    def _is_large(self, path: Path, key: FileKey | None) -> bool:
        """Whether MEMORY.md (`path`; `key`, its file's) is searched as a stream (larger than LARGE_FILE); its
        index, if it was cached while the file was smaller, is dropped then (and the other way round)."""
        large = key is not None and key[1] > LARGE_FILE
        (self.cache if large else self.large_cache).discard(path)
        return large

    def _long_term(self) -> tuple[Path, Path, FileKey | None]:
        """MEMORY.md's path, the file holding it and that file's key; repaired first when it changed since it
        was read (an append cut off by a crash: MemoryStore.repair), so a warm search stats it once."""
        path = self.store.long_term_path
        file = self.store.local(path)
        key = file_key(file)
        if not (self.cache.holds(path, key) or self.large_cache.holds(path, key)):
            # A whole file that did not change needs no repair: an append changes its size.
            self.store.repair()
            key = file_key(file)
        return path, file, key

    def long_term_blocks(self) -> list[Block]:
        """MEMORY.md's blocks in file order (of a MEMORY.md larger than LARGE_FILE, the newest ones)."""
        with self._lock:
            path, file, key = self._long_term()
            if self._is_large(path, key):
                return large_tail(path, file)
            index = self.cache.get_known(path, file, key, loaded=self.store.repair)
            return list(index.blocks) if index else []

    def neighbours(self, block: Block, before: int = 1, after: int = 1) -> list[Block]:
        """`block` with up to `before` blocks above it and `after` below it in its file, in file order
        (a daily note's title left out); [] when the block is no longer in its file as it is now."""
        with self._lock:
            if block.path != self.store.long_term_path:
                index = self.notes_cache.get(block.path, self.store.local(block.path))
            else:
                path, file, key = self._long_term()
                if self._is_large(path, key):
                    return large_neighbours(path, block, before, after, file)
                index = self.cache.get_known(path, file, key, loaded=self.store.repair)
            at = index.position(block) if index is not None else None
            if index is None or at is None:
                return []
            return index.blocks[max(at - before, 0):at + after + 1]

    def search(self, query: str, limit: int, *, include_notes: bool = False) -> list[Hit]:
        """The best `limit` blocks for `query`, best first; daily notes join when `include_notes`."""
        with self._lock:
            path, file, key = self._long_term()
            weight = self.neighbour_weight
            if self._is_large(path, key):
                # After a load, MEMORY.md is checked again: an append begun and cut off while it was read is
                # undone, and the file (changed) read again at the next search.
                large = self.large_cache.get_known(path, file, key, loaded=self.store.repair)
                found = [large.index(query, limit, neighbours=weight) if large is not None else None]
            else:
                found = [self.cache.get_known(path, file, key, loaded=self.store.repair)]
            if include_notes:
                for note, note_file in self.store.notes():
                    try:
                        found.append(self.notes_cache.get(note, note_file))
                    except NotAFileError as exc:  # a note linked to a device or a FIFO: the other notes still count
                        log.warning("%s", exc)
            indexes = [index for index in found if index is not None]
            for index in indexes:
                index.searches += 1
            return rank(indexes, query, limit, neighbours=weight, feedback=True, scores=_file_scores)

    async def search_async(self, query: str, limit: int, *, include_notes: bool = False,
                           below_floor: list[Hit] | None = None) -> list[Hit]:
        """`search` in a worker thread, so the caller's event loop serves others meanwhile (BM25 ranks with no
        score floor: `below_floor` gets nothing)."""
        import asyncio  # not at the top: a short command that only reads memory never starts an event loop

        return await asyncio.to_thread(self.search, query, limit, include_notes=include_notes)

    def search_learnings(self, query: str, limit: int, *, standing: bool = False) -> list[Hit]:
        """The best `limit` lessons of LEARNINGS.md for `query`, best first; with `standing`, then the standing
        lessons (that say they always hold, and that a person gave: memory/learnings.py) that did not match,
        newest first, at most STANDING_LESSONS, score 0.

        Each lesson stands alone: no neighbour's share and no expansion (a few dozen short entries give
        feedback nothing to learn from)."""
        with self._lock:
            try:
                index = self.learnings_cache.get(self.store.learnings_path,
                                                 self.store.local(self.store.learnings_path))
            except NotAFileError as exc:
                log.warning("%s", exc)
                return []
            if index is None:
                return []
            hits = rank([index], query, limit) if query.strip() else []
            if standing:
                found = {hit.block for hit in hits}
                always = [block for block in reversed(index.blocks)
                          if block not in found and stands(block.text)]
                hits += [Hit(block, 0.0) for block in always[:STANDING_LESSONS]]
            return hits

    async def search_learnings_async(self, query: str, limit: int, *, standing: bool = False) -> list[Hit]:
        """`search_learnings` in a worker thread."""
        import asyncio

        return await asyncio.to_thread(self.search_learnings, query, limit, standing=standing)

    def close(self) -> None:
        """Nothing to close: the caches are plain memory (the index-backed search has a database)."""
