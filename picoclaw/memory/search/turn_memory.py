"""Which memory a turn's prompt carries: the lessons of LEARNINGS.md that apply, the blocks found for the
user's message (or, with no hit, the newest of MEMORY.md) and the recent daily notes, all held to the policy's
token budget. Lessons have their own share of it (`learning_token_percent`): first the standing lessons
(`standing_lessons`: "always …", which the system prompt carries, so they change no turn's bytes), then the
lessons found for the message; what they leave of the share goes to facts and notes.

The agent's ContextBuilder (agent/context.py) puts what `select_turn_memory` chooses into the data block
of the turn's user message. A block the conversation already carries is not chosen again. A search that
weighs use (`CountsUse`, search/reranking.py) is told which of the blocks it found the prompt now carries.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence, Set
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from picoclaw.memory.search.blocks import Block, Hit, split_blocks
from picoclaw.memory.search.protocol import MemorySearch
from picoclaw.memory.store import DailyNote, MemoryStore
from picoclaw.tokens import count_tokens

if TYPE_CHECKING:
    from picoclaw.policy_schema import MemoryPolicy

# Entries of a daily note injected on each side of a note entry that was found (when the budget allows).
NOTE_NEIGHBOURS = 2
# Lessons found for a message that a turn may carry (standing lessons come on top, see KeywordSearch).
LESSONS_PER_TURN = 3
# A turn's record of why it remembered: the policy keys that decide what and how much memory it carries, and
# how much of each block's text it keeps (the block itself is in the turn's data block).
WHY_POLICY_KEYS = ("retrieve_limit", "memory_token_budget", "learning_token_percent", "recent_days",
                   "memory_fallback_blocks", "memory_recency_boost_percent", "memory_access_boost_percent")
WHY_SNIPPET = 300


def block_key(block: Block) -> str:
    """What identifies a memory block in the history: its text (an edited block is a new one)."""
    return hashlib.blake2b(block.text.encode("utf-8"), digest_size=8).hexdigest()


@runtime_checkable
class CountsUse(Protocol):
    """A search that weighs how often a block was used (search/reranking.py): told what each turn injected."""

    def record_injected(self, blocks: Sequence[Block]) -> None: ...


@dataclass(frozen=True)
class LeftOut:
    """A block the search found that the turn's prompt does not carry, and why: "in_conversation" (an earlier
    turn's prompt carries it), "over_budget" (the memory budget was spent), "over_window" (the window had no room),
    "below_floor" (the hybrid search's score floor, `memory.index.min_score`, dropped it)."""

    block: Block
    reason: str
    score: float | None
    found_by: str = "search"  # or "lessons", "fallback", "recent notes": as the turn's record names them


@dataclass(frozen=True)
class InjectedMemory:
    """What a turn's prompt carries from memory: MEMORY.md blocks (with scores when ranked), notes, the lessons
    found for the message, and the standing lessons (in the system prompt, not in the turn's data block)."""

    blocks: list[Hit]
    notes: list[Block]
    ranked: bool  # False: the fallback (whole file or newest blocks) was used
    lessons: list[Hit] = field(default_factory=list)
    standing: list[Hit] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)
    # The blocks this turn counts as used (what the search found and the prompt carries, and its lessons), for
    # `record_use`: the agent records them beside the model call, so the reply does not wait for the write.
    used: tuple[Block, ...] = ()

    def leaving_out(self, blocks: Sequence[Block], reason: str) -> InjectedMemory:
        """This memory with `blocks` (of its own) recorded as left out for `reason`, with their scores."""
        found: dict[int, tuple[float | None, str]] = {id(hit.block): (hit.score, "lessons") for hit in self.lessons}
        found.update({id(hit.block): (hit.score if self.ranked else None, "search" if self.ranked else "fallback")
                      for hit in self.blocks})
        return replace(self, left_out=[*self.left_out, *(LeftOut(block, reason, *found.get(id(block), (
            None, "recent notes"))) for block in blocks)])

    def keys(self) -> tuple[str, ...]:
        chosen = [*(hit.block for hit in self.lessons), *(hit.block for hit in self.blocks), *self.notes]
        return tuple(block_key(block) for block in chosen)

    def explained(self, root: Path, policy: MemoryPolicy, method: str) -> dict[str, Any]:
        """Why the turn carries what it carries, for its record: each block with what found it, its score and its
        tokens, the blocks found but left out and why, the search, and the policy values that decided how much."""
        places: dict[Path, str] = {}  # most blocks are of one file: its place is worked out once

        def item(block: Block, found_by: str, score: float | None) -> dict[str, Any]:
            where = places.get(block.path)
            if where is None:
                try:
                    where = block.path.relative_to(root).as_posix()
                except ValueError:
                    where = block.path.name
                places[block.path] = where
            return {"key": block_key(block), "found_by": found_by, "score": None if score is None else round(score, 4),
                    "path": where, "lines": [block.start_line, block.end_line], "text": block.text[:WHY_SNIPPET],
                    "tokens": count_tokens(block.text)}

        items = [item(hit.block, "lessons", hit.score) for hit in self.lessons]
        items += [item(hit.block, "search" if self.ranked else "fallback", hit.score if self.ranked else None)
                  for hit in self.blocks]
        items += [item(block, "recent notes", None) for block in self.notes]
        left = [{**item(out.block, out.found_by, out.score), "reason": out.reason} for out in self.left_out]
        return {"search": method, "items": items, "left_out": left,
                "policy": {key: getattr(policy, key) for key in WHY_POLICY_KEYS}}


async def select_turn_memory(search: MemorySearch, store: MemoryStore, policy: MemoryPolicy, query: str,
                             present: Set[str] = frozenset(), *, count_use: bool = True) -> InjectedMemory:
    """Retrieved blocks and recent notes for `query`, held to the policy's token budget.

    Blocks whose keys are in `present` (already in the conversation) are left out and cost nothing. With
    `count_use` off (a `/memory` preview, a turn's prompt built again) the found blocks are not counted as used.
    """
    import asyncio  # not at the top: a short command that only reads memory never starts an event loop

    if search.blocking:  # nothing to wait for but the CPU and the disk: the whole choice in one worker thread
        return await asyncio.to_thread(select_turn_memory_now, search, store, policy, query, present, count_use)
    floored: list[Hit] = []
    hits = (await search.search_async(query, policy.retrieve_limit, include_notes=True, below_floor=floored)
            if query.strip() else [])
    floored = floored[:max(0, policy.retrieve_limit - len(hits))]  # those that would have been results
    lessons = (await search.search_learnings_async(query, LESSONS_PER_TURN)
               if lesson_share(policy) and query.strip() else [])
    # Reading notes (and MEMORY.md for the fallback) waits for the disk: in a worker thread.
    memory = await asyncio.to_thread(_fit_memory, search, store, policy, hits, lessons, present,
                                     bool(query.strip()), count_use)
    if not floored:
        return memory
    return replace(memory, left_out=[*memory.left_out, *(LeftOut(hit.block, "below_floor", hit.score)
                                                         for hit in floored)])


def select_turn_memory_now(search: MemorySearch, store: MemoryStore, policy: MemoryPolicy, query: str,
                           present: Set[str] = frozenset(), count_use: bool = True) -> InjectedMemory:
    """`select_turn_memory` for a blocking search (`search.blocking`, which has no score floor), in the calling
    thread (a worker thread's: it reads files)."""
    queried = bool(query.strip())
    hits = search.search(query, policy.retrieve_limit, include_notes=True) if queried else []
    lessons = search.search_learnings(query, LESSONS_PER_TURN) if lesson_share(policy) and queried else []
    return _fit_memory(search, store, policy, hits, lessons, present, queried, count_use)


def record_use(search: MemorySearch, memory: InjectedMemory) -> None:
    """Count `memory.used` as used once more, when the search weighs use (CountsUse)."""
    if memory.used and isinstance(search, CountsUse):
        search.record_injected(memory.used)


def lesson_share(policy: MemoryPolicy) -> int:
    """The tokens of the memory budget kept for lessons."""
    return policy.memory_token_budget * policy.learning_token_percent // 100


def standing_lessons(search: MemorySearch, policy: MemoryPolicy) -> list[Hit]:
    """The standing lessons ("always …") that fit the lesson share, newest first: the system prompt's.

    Not counted as uses: every prompt carries them, so a count would say nothing about them.
    """
    share = lesson_share(policy)
    return _fit_lessons(search.search_learnings("", 0, standing=True), frozenset(), share)[0] if share else []


def _fit_lessons(lessons: list[Hit], present: Set[str], budget: int) -> tuple[list[Hit], int]:
    """The lessons that fit in `budget` tokens (best first, none already in the conversation); tokens used."""
    chosen: list[Hit] = []
    used = 0
    for hit in lessons:
        cost = count_tokens(hit.block.text)
        if block_key(hit.block) in present or used + cost > budget:
            continue
        chosen.append(hit)
        used += cost
    return chosen, used


def _fit_memory(search: MemorySearch, store: MemoryStore, policy: MemoryPolicy, hits: list[Hit],
                lessons: list[Hit], present: Set[str], queried: bool, count_use: bool) -> InjectedMemory:
    # Lessons take at most their share, standing ones first; what they leave of it goes to facts and notes.
    standing = standing_lessons(search, policy)
    standing_cost = sum(count_tokens(hit.block.text) for hit in standing)
    always = {block_key(hit.block) for hit in standing}
    chosen_lessons, used = _fit_lessons(lessons, {*present, *always}, lesson_share(policy) - standing_cost)
    # What the search found that this prompt does not carry, and why: shown by the console's why page.
    picked = {id(hit.block) for hit in chosen_lessons}
    left_out = [LeftOut(hit.block, "in_conversation" if block_key(hit.block) in present else "over_budget",
                        hit.score, "lessons")
                for hit in lessons if id(hit.block) not in picked and block_key(hit.block) not in always]
    budget = policy.memory_token_budget - standing_cost - used
    ranked = bool(hits)
    chosen: list[Hit] = []
    counted: list[Block] = []  # the blocks to count as used
    taken = set(present)
    recent = store.read_recent_notes(policy.recent_days)
    if ranked:
        # The recent days' notes come whole in <notes> below, newest first: not again as hits.
        recent_files = {note.path for note in recent}
        for hit in hits:
            if hit.block.path not in recent_files:
                key = block_key(hit.block)
                if key in present:
                    left_out.append(LeftOut(hit.block, "in_conversation", hit.score))
                    continue
                group, budget = _fit_hit(search, store, hit, taken, budget)
                chosen.extend(group)
                if not group and key not in taken:
                    left_out.append(LeftOut(hit.block, "over_budget", hit.score))
        if count_use and isinstance(search, CountsUse):
            # What the search found and the prompt carries; a note entry's neighbours were not found.
            found = {block_key(hit.block) for hit in hits}
            counted += [hit.block for hit in chosen if block_key(hit.block) in found]
    else:
        # No query: the whole file if it fits, else its newest contiguous run of blocks. A message that
        # matches nothing gets at most `memory_fallback_blocks` of the newest (none by default): a small
        # model takes whatever memory it is shown as the answer, or mixes two entries into a new "fact".
        most = policy.memory_fallback_blocks if queried else None
        blocks = search.long_term_blocks() if most != 0 else []
        for block in reversed(blocks):
            if most is not None and len(chosen) >= most:
                break
            if block_key(block) in taken:
                continue
            cost = count_tokens(block.text)
            if cost > budget:
                break
            chosen.append(Hit(block, 0.0))
            budget -= cost
        chosen.reverse()
    if count_use and chosen_lessons and isinstance(search, CountsUse):
        counted += [hit.block for hit in chosen_lessons]
    notes: list[Block] = []
    for note in reversed(recent):
        for block in reversed(_note_blocks(note)):
            if block_key(block) in present:
                continue
            cost = count_tokens(block.text)
            if cost > budget:
                break
            notes.append(block)
            budget -= cost
        else:
            continue
        break
    notes.reverse()
    return InjectedMemory(chosen, notes, ranked, chosen_lessons, standing, left_out, used=tuple(counted))


def _fit_hit(search: MemorySearch, store: MemoryStore, hit: Hit, taken: set[str], budget: int
             ) -> tuple[list[Hit], int]:
    """`hit` and, for a daily-note entry, its neighbouring entries (nearest first while the budget lasts),
    in file order; what is taken and the budget left. A note entry is one moment of a day: what was
    said around it is often the answer."""
    if block_key(hit.block) in taken:
        return [], budget
    cost = count_tokens(hit.block.text)
    if cost > budget:
        return [], budget
    taken.add(block_key(hit.block))
    group, budget = [hit], budget - cost
    if hit.block.path == store.long_term_path:
        return group, budget  # a MEMORY.md entry stands on its own
    around = search.neighbours(hit.block, NOTE_NEIGHBOURS, NOTE_NEIGHBOURS)
    at = next((n for n, block in enumerate(around) if block.start_line == hit.block.start_line), None)
    if at is None:
        return group, budget
    nearest_first = sorted(((abs(n - at), block) for n, block in enumerate(around) if n != at),
                           key=lambda pair: pair[0])
    for _, block in nearest_first:
        cost = count_tokens(block.text)
        if block_key(block) in taken or cost > budget:
            continue
        taken.add(block_key(block))
        group.append(Hit(block, 0.0))
        budget -= cost
    return sorted(group, key=lambda h: h.block.start_line), budget


def _note_blocks(note: DailyNote) -> list[Block]:
    """A daily note's entries, each whole: a session summary (several paragraphs under one `## HH:MM`) is
    shown as one piece or not at all, never as fragments that lose their sense."""
    entries: list[Block] = []
    lines = note.text.splitlines()
    for block in split_blocks(note.text, note.path):
        if block.text.startswith("# ") and "\n" not in block.text:
            continue  # the "# YYYY-MM-DD" title of a note file carries no content of its own
        last = entries[-1] if entries else None
        # A block that does not start on its heading's line is a further paragraph of the same entry (two
        # entries of the same minute have the same heading, and stay two).
        continued = block.heading and lines[block.start_line - 1].rstrip() != block.heading
        if last is not None and continued and block.heading == last.heading:
            body = block.text.removeprefix(block.heading).lstrip("\n")
            entries[-1] = Block(last.path, last.heading, f"{last.text}\n\n{body}", last.start_line, block.end_line)
        else:
            entries.append(block)
    return entries
