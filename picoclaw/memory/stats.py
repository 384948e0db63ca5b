"""`picoclaw memory stats`: what one memory scope holds, how it is used and what it costs, as measured.

Each number comes from the one place that records it: the documents (MEMORY.md, LEARNINGS.md, the daily
notes) as the keyword search splits them into blocks; how often each block was injected into a prompt
(search/access_counts.py); the time each turn spent on retrieval (turn_metrics.py); the providers' own
prompt and cache token reports in the session transcripts (transcripts/session_store.py, as `/status` reads them);
the ledger of background model calls (model_usage.py); what the memory flush proposed, wrote, found known
and refused, by reason (flush_counts.py); and what the last compression and reflection did (job_outcomes.py).
What nothing has measured yet is None, never a made-up 0; a soft-state file that cannot be read gives a
warning and None. `memory_stats` only reads (MEMORY.md's reader, like every reader,
first removes an append a crash cut off): it records nothing and moves no transcript.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from picoclaw.disk.bounded_read import read_regular
from picoclaw.errors import ConfigError
from picoclaw.memory.entries import SUPERSEDED, is_superseded
from picoclaw.memory.eval.run_log import TREND_RUNS, EvalRun, logged_runs
from picoclaw.memory.feedback import FeedbackCounts, FeedbackLedger
from picoclaw.memory.flush_counts import FlushCounts, FlushTally, tally_since
from picoclaw.memory.job_outcomes import COMPRESSION, REFLECTION, JobOutcome, last_compression, last_outcome
from picoclaw.memory.learnings import LEARNINGS_FILE, SOURCE_PREFIX, stands
from picoclaw.memory.model_usage import ModelUsage, Usage, used_since
from picoclaw.memory.reading import decode
from picoclaw.memory.search.access_counts import AccessCounts
from picoclaw.memory.search.blocks import Block, entry_blocks, is_title, lesson_blocks, split_blocks
from picoclaw.memory.search.turn_memory import block_key
from picoclaw.memory.store import MemoryStore
from picoclaw.memory.turn_metrics import TurnMetrics
from picoclaw.memory.workspace import Workspace
from picoclaw.storage import Documents, Storage, StorageError
from picoclaw.tokens import count_tokens
from picoclaw.transcripts import SessionStore, StoredMessage, reported_usage

log = logging.getLogger(__name__)

WINDOW_DAYS = 30  # "not injected lately" and background model use look this many days back, today included
MOST_INJECTED = 3  # entries listed per document
PREVIEW_CHARS = 60
CACHE_REPLIES = 200  # the newest model replies with a token report that the cache share is taken over
# The ledger's purposes that are always shown (drafting lessons; skill drafts are a template and call no model);
# any other the ledger holds is shown too.
BACKGROUND_PURPOSES = ("learning",)

NOTES = "notes"


@dataclass(frozen=True)
class EntryUse:
    """An entry and how often a prompt carried it (the most any of its blocks was injected)."""

    file: str  # relative to the memory folder
    line: int
    heading: str
    preview: str
    injected: int
    last_injected: str  # ISO day


@dataclass(frozen=True)
class DocumentStats:
    """One document (the daily notes count as one): its size, and how its entries were used."""

    name: str  # "MEMORY.md", "LEARNINGS.md" or "notes"
    files: int
    entries: int
    characters: int
    tokens: int
    superseded: int
    not_injected_30d: int | None  # entries none of whose blocks was injected in the window; None: unknown
    most_injected: list[EntryUse] | None  # best first, only entries injected at least once; None: unknown


@dataclass(frozen=True)
class RetrievalStats:
    """Retrieval time per turn over the newest turns recorded (None: no turn measured, or unreadable)."""

    turns: int | None
    p50_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True)
class CacheStats:
    """The prompt-cache hit share over the newest model replies, from the providers' own reports."""

    replies: int  # replies whose provider reported both the prompt size and its cached part
    prompt_tokens: int  # the prompt tokens of those replies
    cached_tokens: int
    share: float | None  # cached / prompt tokens; None when no reply reported a cached part
    unreported: int  # replies with a prompt size but no cached part reported


@dataclass(frozen=True)
class BackgroundUse:
    """One purpose's background model calls and tokens (None: no ledger yet, or unreadable)."""

    last_30d: Usage | None
    today: Usage | None


@dataclass(frozen=True)
class MemoryStats:
    """Everything `picoclaw memory stats` shows about one memory scope."""

    memory_dir: str
    today: str
    timezone: str
    documents: list[DocumentStats]
    retrieval: RetrievalStats
    prompt_cache: CacheStats
    background: dict[str, BackgroundUse]
    flush: FlushTally | None  # the memory flush's facts over the window; None: its counts cannot be read
    last_compression: JobOutcome | None
    last_reflection: JobOutcome | None
    compression_enabled: bool
    evolution_enabled: bool
    learning_enabled: bool
    flush_enabled: bool
    # The field above ("documents", "retrieval", "background", "last_compression", …) whose numbers are unknown
    # or partial because what records them cannot be read → why; "notes" for a daily note left out.
    warnings: dict[str, str] = field(default_factory=dict)
    # Reactions on the assistant's replies (Telegram): each user's newest verdict on a reply (memory/feedback.py).
    feedback: FeedbackCounts = field(default_factory=FeedbackCounts)
    # The newest `memory eval` runs under the policy in force, oldest first (memory/eval/run_log.py); None: unreadable.
    eval_runs: list[EvalRun] | None = field(default_factory=list)

    @property
    def last_eval(self) -> EvalRun | None:
        return self.eval_runs[-1] if self.eval_runs else None

    def to_json(self) -> dict[str, Any]:
        """The same numbers as plain JSON values (None for what is not known)."""
        return asdict(self)


def memory_stats(workspace: Workspace) -> MemoryStats:
    """Measure `workspace`'s memory scope (the shared one, or one user's) as it stands now."""
    store = workspace.store
    today = store.today()
    first_day = today - timedelta(days=WINDOW_DAYS - 1)
    warnings: dict[str, str] = {}
    uses = _read_uses(AccessCounts(store.memory_dir, storage=store.storage), warnings)
    long_term = store.read_long_term()
    learnings = store.read_learnings()
    files = {
        "MEMORY.md": [_file(store.long_term_path, long_term, entry_blocks)]
        if store.local(store.long_term_path).exists() else [],
        "LEARNINGS.md": [_file(store.learnings_path, learnings, lesson_blocks)]
        if store.local(store.learnings_path).exists() else [],
        NOTES: _notes(workspace, warnings),
    }
    policy = workspace.policy.current()
    return MemoryStats(
        memory_dir=str(store.memory_dir), today=today.isoformat(), timezone=workspace.config.timezone,
        documents=[_document(name, found, store.memory_dir, uses, first_day) for name, found in files.items()],
        retrieval=_retrieval(TurnMetrics(store.memory_dir, storage=store.storage), warnings),
        prompt_cache=_prompt_cache(workspace.layout.sessions_dir, workspace.storage),
        # The workspace's ledger: the daily cap is shared by every user's scope (curation/lesson_drafting.py).
        background=_background(ModelUsage(workspace.layout.shared_memory_dir, storage=workspace.storage), today,
                               first_day, warnings),
        flush=_flush(FlushCounts(store.memory_dir, storage=store.storage), first_day, warnings),
        last_compression=_last_compression(workspace, warnings),
        # Beside the policy it tunes, which is the owner's: the same for every scope.
        last_reflection=_outcome(workspace.policy.documents, workspace.policy.memory_dir, REFLECTION, workspace,
                                 warnings),
        compression_enabled=policy.long_term_compress_char_threshold > 0,
        evolution_enabled=policy.evolution_enabled, learning_enabled=policy.learning_enabled,
        flush_enabled=policy.memory_flush_enabled, warnings=warnings,
        feedback=FeedbackLedger(store.memory_dir, storage=store.storage).counts(),
        eval_runs=_eval_runs(store, warnings))


def _eval_runs(store: MemoryStore, warnings: dict[str, str]) -> list[EvalRun] | None:
    try:
        return logged_runs(store.documents)[-TREND_RUNS:]
    except (OSError, StorageError) as exc:
        warnings["eval_runs"] = f"the eval run log cannot be read: {exc}"
        return None


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile: the smallest of `values` that at least `share` (0–1) of them do not exceed."""
    ordered = sorted(values)
    return ordered[max(math.ceil(share * len(ordered)), 1) - 1]


# -- documents -------------------------------------------------------------------------------------------


@dataclass
class _File:
    """A memory file as read, with its blocks as the keyword search splits it (so their keys are the keys
    the access counts were recorded under)."""

    path: Path
    text: str
    blocks: list[Block]
    entries: list[list[Block]] = field(default_factory=list)  # the blocks grouped by entry (`_entries`)
    marked: list[bool] = field(default_factory=list)  # which entries are marked superseded
    tokens: int = 0


def _notes(workspace: Workspace, warnings: dict[str, str]) -> list[_File]:
    found = []
    problems = []
    for path, local in workspace.store.notes():
        try:
            text = decode(read_regular(local)).text
        except OSError as exc:  # one unreadable note (a link to nothing, a FIFO): the others still count
            problems.append(str(exc))
            continue
        found.append(_file(path, text, _note_blocks, keep=False))
    if problems:
        warnings[NOTES] = f"{'; '.join(problems)}; left out of the notes' numbers"
    return found


def _note_blocks(text: str, path: Path) -> list[Block]:
    return [block for block in split_blocks(text, path) if not is_title(block)]


# The numbers of MEMORY.md and LEARNINGS.md that only their text decides (blocks, entries, which are superseded,
# tokens), by path and digest of the text: asking again about an unchanged 10,000-entry MEMORY.md (the console's
# stats page) skips 60 ms. Daily notes are small and many: parsed each time, they never push these out.
_PARSED: OrderedDict[tuple[Path, str], _File] = OrderedDict()
_PARSED_KEPT = 8


def _file(path: Path, text: str, split: Callable[[str, Path], list[Block]], *, keep: bool = True) -> _File:
    """`path`'s text as `_File`; with `keep`, parsed once per version of the text."""
    key = (path, hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest())
    found = _PARSED.get(key) if keep else None
    if found is None:
        blocks = split(text, path)
        found = _File(path, text, blocks)
        entries = _entries(found)
        found.entries = entries
        found.marked = [is_superseded("\n".join(block.text for block in entry)) for entry in entries]
        found.tokens = count_tokens(text)
        if keep:
            _PARSED[key] = found
            while len(_PARSED) > _PARSED_KEPT:
                _PARSED.popitem(last=False)
    else:
        _PARSED.move_to_end(key)
    return found


def _entries(file: _File) -> list[list[Block]]:
    """The file's blocks grouped by entry: a `## ` section split at blank lines is one entry again. A block
    that does not start on its heading's line continues the entry before it (two entries with the same
    heading, such as two notes of one minute, stay two)."""
    lines = file.text.split("\n")
    entries: list[list[Block]] = []
    for block in file.blocks:
        continued = (block.heading and entries and entries[-1][0].heading == block.heading
                     and lines[block.start_line - 1].rstrip() != block.heading)
        if continued:
            entries[-1].append(block)
        else:
            entries.append([block])
    return entries


def _preview(entry: list[Block], superseded: bool) -> str:
    """The entry's first words, without its heading, a superseded mark or a lesson's `Source:` line."""
    first = entry[0]
    body = first.text.removeprefix(first.heading) if first.heading else first.text
    said = [line for line in body.split("\n") if not line.startswith((SUPERSEDED, SOURCE_PREFIX))]
    text = ("(superseded) " if superseded else "") + " ".join(" ".join(said).split())
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS - 1] + "…"


def _document(name: str, files: list[_File], memory_dir: Path, uses: dict[str, tuple[int, str]] | None,
              first_day: date) -> DocumentStats:
    entries = [(file, entry) for file in files for entry in file.entries]
    marked = [mark for file in files for mark in file.marked]
    not_injected: int | None = None
    most: list[EntryUse] | None = None
    if uses is not None:
        used: list[EntryUse] = []
        not_injected = 0
        for (file, entry), superseded in zip(entries, marked):
            counted = [uses[key] for key in (block_key(block) for block in entry) if key in uses]
            last = max((day for _, day in counted), default="")
            # ISO days compare as days do; "" is never. A standing lesson is in every system prompt, uncounted.
            if last < first_day.isoformat() and not _standing(entry):
                not_injected += 1
            if counted:
                used.append(EntryUse(file.path.relative_to(memory_dir).as_posix(), entry[0].start_line,
                                     entry[0].heading, _preview(entry, superseded), max(n for n, _ in counted), last))
        most = sorted(used, key=lambda use: (use.injected, use.last_injected), reverse=True)[:MOST_INJECTED]
    return DocumentStats(name, len(files), len(entries), sum(len(file.text) for file in files),
                         sum(file.tokens for file in files), sum(marked), not_injected, most)


def _standing(entry: list[Block]) -> bool:
    """A standing lesson (search/keyword.py's rule): one every system prompt carries."""
    return any(block.path.name == LEARNINGS_FILE and stands(block.text) for block in entry)


def entry_injections(store: MemoryStore, entries: Sequence[str], *, lessons: bool = False
                     ) -> list[tuple[int, str]] | None:
    """How often a prompt carried each of `entries` (MEMORY.md's entries' text as read, or LEARNINGS.md's with
    `lessons`) and the last day it did ("" never), as `picoclaw memory stats` counts them; None when the counts
    cannot be read."""
    try:
        uses = AccessCounts(store.memory_dir, storage=store.storage).read()
    except ConfigError:
        return None
    split, path = (lesson_blocks, store.learnings_path) if lessons else (entry_blocks, store.long_term_path)
    found = []
    for text in entries:
        counted = [uses[key] for key in (block_key(block) for block in split(text, path)) if key in uses]
        found.append((max((n for n, _ in counted), default=0), max((day for _, day in counted), default="")))
    return found


def _read_uses(counts: AccessCounts, warnings: dict[str, str]) -> dict[str, tuple[int, str]] | None:
    try:
        return counts.read()
    except ConfigError as exc:
        warnings["documents"] = f"{exc}; how often entries were injected is unknown"
        return None


# -- turns, the prompt cache, background calls -----------------------------------------------------------


def _retrieval(metrics: TurnMetrics, warnings: dict[str, str]) -> RetrievalStats:
    read = metrics.read()
    if read.problem is not None:
        warnings["retrieval"] = f"{read.problem}; retrieval times are unknown"
        return RetrievalStats(None, None, None)
    values = [turn.retrieval_ms for turn in read.turns]
    if read.damaged:
        unknown = "" if values else "; retrieval times are unknown"
        warnings["retrieval"] = f"{metrics.path}: {read.damaged} damaged line(s) skipped{unknown}"
    if not values:
        # A file of damaged lines only is unknown; no file, or an empty one, means no turn was measured yet.
        return RetrievalStats(None if read.damaged else 0, None, None)
    return RetrievalStats(len(values), percentile(values, 0.50), percentile(values, 0.99))


def _prompt_cache(sessions_dir: Path, storage: Storage) -> CacheStats:
    """Over the newest CACHE_REPLIES replies with a token report, newest transcripts first (archived too)."""
    sessions = SessionStore(sessions_dir, storage=storage)  # only read: no lock is taken, nothing is moved
    replies: list[StoredMessage] = []
    for path in sorted(sessions.transcripts(), key=sessions.modified, reverse=True):
        try:
            session = sessions.read(path)
        except (OSError, StorageError) as exc:
            log.warning("%s: cannot read (%s); left out of the prompt-cache share", path, exc)
            continue
        replies.extend(reported_usage(session.messages))
        if len(replies) >= CACHE_REPLIES:
            break
    replies = replies[:CACHE_REPLIES]
    reported = [reply for reply in replies if reply.cached_tokens is not None]
    prompt = sum(reply.prompt_tokens or 0 for reply in reported)
    cached = sum(reply.cached_tokens or 0 for reply in reported)
    return CacheStats(len(reported), prompt, cached, cached / prompt if prompt else None,
                      len(replies) - len(reported))


def _background(ledger: ModelUsage, today: date, first_day: date, warnings: dict[str, str]
                ) -> dict[str, BackgroundUse]:
    try:
        days = ledger.read()
    except ConfigError as exc:
        warnings["background"] = f"{exc}; background model use is unknown"
        days = None
    if days is None:
        return {purpose: BackgroundUse(None, None) for purpose in BACKGROUND_PURPOSES}
    others = sorted({purpose for purposes in days.values() for purpose in purposes} - set(BACKGROUND_PURPOSES))
    return {purpose: BackgroundUse(used_since(days, purpose, first_day), used_since(days, purpose, today))
            for purpose in (*BACKGROUND_PURPOSES, *others)}


def _flush(counts: FlushCounts, first_day: date, warnings: dict[str, str]) -> FlushTally | None:
    """The flushes' counts from `first_day` on (all zero when none ran yet); None when they cannot be read."""
    try:
        days = counts.read()
    except ConfigError as exc:
        warnings["flush"] = f"{exc}; what the memory flush did is unknown"
        return None
    return tally_since(days or {}, first_day)


# -- the last compression and reflection -----------------------------------------------------------------


def _outcome(documents: Documents, memory_dir: Path, job: str, workspace: Workspace, warnings: dict[str, str]
             ) -> JobOutcome | None:
    """`job`'s last recorded outcome, its time in the workspace's timezone."""
    try:
        outcome = last_outcome(documents, memory_dir, job)
    except ConfigError as exc:
        warnings[f"last_{job}"] = f"{exc}; what the last {job} did is unknown"
        return None
    if outcome is None:
        return None
    try:
        local = datetime.fromisoformat(outcome.time).astimezone(workspace.tz).isoformat(timespec="seconds")
    except ValueError:  # a hand-edited time: shown as it is
        local = outcome.time
    return JobOutcome(job, local, outcome.status, outcome.detail)


def _last_compression(workspace: Workspace, warnings: dict[str, str]) -> JobOutcome | None:
    """The last recorded outcome; or, when a compression started after it (the gate file's time) and left no
    outcome, that one, as unknown: it is running, it was stopped, or an older version ran it."""
    outcome = _outcome(workspace.store.documents, workspace.store.memory_dir, COMPRESSION, workspace, warnings)
    started = last_compression(workspace.store)
    if started is None or f"last_{COMPRESSION}" in warnings:
        return outcome
    if outcome is not None:
        try:
            if datetime.fromisoformat(outcome.time) >= started:
                return outcome
        except (ValueError, TypeError):  # a time that cannot be compared: the recorded outcome stands
            return outcome
    return JobOutcome(COMPRESSION, started.astimezone(workspace.tz).isoformat(timespec="seconds"), "unknown",
                      "started, but left no outcome: still running, stopped before it ended, or run by an older "
                      "version")
