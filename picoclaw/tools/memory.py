"""Memory tools for the model: memory_search (BM25 over MEMORY.md, daily notes and lessons) and memory_append.

memory_append to MEMORY.md is held to the rule of every automatic write (memory/grounding.py) through
tools/saved_facts.py, the one path the file tools take too. Each write is added to the turn's receipts
(memory/receipts.py), which the agent shows the user after the reply.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from picoclaw.memory import LEARNINGS, Hit, MemoryWrite, current_turn
from picoclaw.printable import has_controls, printable
from picoclaw.tools.base import current_session
from picoclaw.tools.files import WorkspaceTool, check_size, os_errors
from picoclaw.tools.saved_facts import already_stored, save_fact

MAX_SEARCH_LIMIT = 50
MAX_SNIPPET_CHARS = 2_000
# Lessons listed after the facts of a search: a few, since they are advice about working, not the answer.
MAX_SEARCH_LESSONS = 3


class MemorySearch(WorkspaceTool):
    """memory_search: the best-matching memory passages, each with its file, lines and score."""

    name = "memory_search"
    description = "Search memory (MEMORY.md, daily notes, lessons) by keywords or a question, any language."

    class Args(BaseModel):
        model_config = ConfigDict(extra="forbid")
        query: str = Field(min_length=1, description="e.g. dog name, 我的狗叫什么")
        limit: int = Field(10, ge=1, le=MAX_SEARCH_LIMIT)

        @field_validator("query")
        @classmethod
        def _not_blank(cls, value: str) -> str:
            if not value.strip():
                raise ValueError("the query is blank")
            return value.strip()

    async def run(self, args: MemorySearch.Args) -> str:
        # Awaited, not in a worker thread like the other file tools: the search bounds its own wait for
        # embeddings and does its disk work off the event loop.
        searcher = self.workspace.searcher
        with os_errors("search", "memory"):
            hits = await searcher.search_async(args.query, args.limit, include_notes=True)
            lessons = await searcher.search_learnings_async(args.query, min(args.limit, MAX_SEARCH_LESSONS))
        return self._report(args, hits, lessons)

    def run_sync(self, args: MemorySearch.Args) -> str:
        searcher = self.workspace.searcher
        with os_errors("search", "memory"):
            hits = searcher.search(args.query, args.limit, include_notes=True)
            lessons = searcher.search_learnings(args.query, min(args.limit, MAX_SEARCH_LESSONS))
        return self._report(args, hits, lessons)

    def _report(self, args: MemorySearch.Args, hits: list[Hit], lessons: list[Hit]) -> str:
        if not hits and not lessons:
            return f"no matches in memory for {args.query!r}; try other keywords"
        found = "1 match" if len(hits) == 1 else f"{len(hits)} matches"
        parts = [f"{found} for {args.query!r} (best first):" if hits else f"no facts in memory for {args.query!r}"]
        parts.extend(self._format(number, hit) for number, hit in enumerate(hits, start=1))
        if lessons:
            parts.append("Lessons (how to work with this user, not facts about them):")
            parts.extend(self._format(number, hit, "lesson ") for number, hit in enumerate(lessons, start=1))
        return "\n\n".join(parts)

    def _format(self, number: int, hit: Hit, label: str = "") -> str:
        block = hit.block
        lines = f"{block.start_line}" if block.start_line == block.end_line else f"{block.start_line}-{block.end_line}"
        text = block.text
        if len(text) > MAX_SNIPPET_CHARS:
            text = text[:MAX_SNIPPET_CHARS] + "… [cut; read_file for the rest]"
        return f"[{label}{number}] {self.files.shown(block.path)}:{lines} (score {hit.score:.2f})\n{text}"


class MemoryAppend(WorkspaceTool):
    """memory_append: save a fact to MEMORY.md (dated entry), a note to today's daily note, or a lesson to
    LEARNINGS.md."""

    name = "memory_append"
    description = ("Save to memory: slot long_term for lasting facts and preferences, today for today's note, "
                   "learnings for a lesson on how to work (when it applies, what to do).")

    class Args(BaseModel):
        model_config = ConfigDict(extra="forbid")
        content: str = Field(min_length=1, description="one short self-contained statement")
        slot: Literal["long_term", "today", "learnings"] = "long_term"

    def run_sync(self, args: MemoryAppend.Args) -> str:
        check_size(args.content)
        # Memory is shown on terminals again and again: escape sequences in it would act every time.
        content = printable(args.content)
        cleaned = " (terminal control characters were removed)" if has_controls(args.content) else ""
        store = self.workspace.store
        session = current_session.get()
        turn = current_turn.get()
        if args.slot == "learnings":
            shown = self.files.shown(store.learnings_path)
            with os_errors("save to", shown):
                lesson = store.append_learning(content, f"session {session} (memory_append)" if session
                                               else "memory_append")
            if lesson.outcome == "known":
                return already_stored(lesson.entry, shown)
            if turn is not None:
                turn.writes.append(MemoryWrite(LEARNINGS, content, "memory_append", session, by_user=False,
                                               outcome=lesson.outcome))
            if lesson.outcome == "updated":
                return f"updated the lesson at {shown}:{lesson.entry.line}, which said the same thing{cleaned}"
            return f"saved to {shown} under '{lesson.entry.heading}'{cleaned}"
        if args.slot == "long_term":
            shown = self.files.shown(self.files.long_term)
            with os_errors("save to", shown):
                saved = save_fact(self.workspace, content, self.name)
            return saved.told(shown, lambda entry: f"saved to {shown} under '{entry.heading}'", cleaned)
        with os_errors("save to", "today's daily note"):
            path = store.append_note(content)
        return f"saved to today's daily note {self.files.shown(path)}{cleaned}"
