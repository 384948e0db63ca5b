"""Memory tools for the model: memory_search (BM25 over MEMORY.md and daily notes) and memory_append."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from picoclaw.memory import Hit
from picoclaw.printable import has_controls, printable
from picoclaw.tools.files import WorkspaceTool, already_stored, check_size, os_errors

MAX_SEARCH_LIMIT = 50
MAX_SNIPPET_CHARS = 2_000


class MemorySearch(WorkspaceTool):
    """memory_search: the best-matching memory passages, each with its file, lines and score."""

    name = "memory_search"
    description = "Search memory (MEMORY.md, daily notes) by keywords or a question, any language."

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
        with os_errors("search", "memory"):
            hits = await self.workspace.searcher.search_async(args.query, args.limit, include_notes=True)
        return self._report(args, hits)

    def run_sync(self, args: MemorySearch.Args) -> str:
        with os_errors("search", "memory"):
            hits = self.workspace.searcher.search(args.query, args.limit, include_notes=True)
        return self._report(args, hits)

    def _report(self, args: MemorySearch.Args, hits: list[Hit]) -> str:
        if not hits:
            return f"no matches in memory for {args.query!r}; try other keywords"
        found = "1 match" if len(hits) == 1 else f"{len(hits)} matches"
        parts = [f"{found} for {args.query!r} (best first):"]
        parts.extend(self._format(number, hit) for number, hit in enumerate(hits, start=1))
        return "\n\n".join(parts)

    def _format(self, number: int, hit: Hit) -> str:
        block = hit.block
        lines = f"{block.start_line}" if block.start_line == block.end_line else f"{block.start_line}-{block.end_line}"
        text = block.text
        if len(text) > MAX_SNIPPET_CHARS:
            text = text[:MAX_SNIPPET_CHARS] + "… [cut; read_file for the rest]"
        return f"[{number}] {self.files.shown(block.path)}:{lines} (score {hit.score:.2f})\n{text}"


class MemoryAppend(WorkspaceTool):
    """memory_append: save a fact to MEMORY.md (dated entry) or a note to today's daily note."""

    name = "memory_append"
    description = "Save to memory: slot long_term for lasting facts and preferences, today for today's note."

    class Args(BaseModel):
        model_config = ConfigDict(extra="forbid")
        content: str = Field(min_length=1, description="one short self-contained statement")
        slot: Literal["long_term", "today"] = "long_term"

    def run_sync(self, args: MemoryAppend.Args) -> str:
        check_size(args.content)
        # Memory is shown on terminals again and again: escape sequences in it would act every time.
        content = printable(args.content)
        cleaned = " (terminal control characters were removed)" if has_controls(args.content) else ""
        store = self.workspace.store
        if args.slot == "long_term":
            shown = self.files.shown(self.files.long_term)
            with os_errors("save to", shown):
                entry = store.append_long_term(content)
            if not entry.new:
                return already_stored(entry, shown)
            return f"saved to {shown} under '{entry.heading}'{cleaned}"
        with os_errors("save to", "today's daily note"):
            path = store.append_note(content)
        return f"saved to today's daily note {self.files.shown(path)}{cleaned}"
