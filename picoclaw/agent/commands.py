"""Slash commands, answered without the model: /new /compact /memory /policy /help."""

from __future__ import annotations

from typing import TYPE_CHECKING

from picoclaw.memory.policy import POLICY_KEYS

if TYPE_CHECKING:
    from picoclaw.agent.loop import AgentLoop

HELP = """Commands:
/new — start a fresh conversation (the old one is archived)
/compact — summarise the conversation now to free context
/memory [query] — show what memory would be put in front of the model for a query
/policy — show the memory policy in force
/help — this list
Anything else goes to the assistant."""


async def run_command(loop: AgentLoop, key: str, text: str) -> str | None:
    """The reply to a slash command, or None when `text` is not one."""
    stripped = text.strip()
    if not stripped.startswith("/"):
        return None
    name, _, argument = stripped.partition(" ")
    name = name.split("@", 1)[0].lower()  # Telegram appends @botname in groups
    argument = argument.strip()
    if name in ("/help", "/start"):
        return HELP
    if name == "/new":
        archived = loop.reset_session(key)
        return "Started a new conversation." + (f" The previous one is archived as {archived}." if archived else "")
    if name == "/compact":
        result = await loop.compact(key)
        if result is None:
            return "Nothing to compact (or the summary was refused); the conversation is unchanged."
        return f"Compact complete: {result.compacted} messages compacted.\n\n{result.summary}"
    if name == "/memory":
        return memory_report(loop, argument)
    if name == "/policy":
        effective = loop.workspace.policy.effective()
        return "\n".join(f"{k} = {getattr(effective.policy, k)} ({effective.sources[k]})" for k in POLICY_KEYS)
    return f"Unknown command {name}; see /help."


def memory_report(loop: AgentLoop, query: str) -> str:
    """What would be injected for `query`, with scores and where each block lives."""
    memory = loop.context.select_memory(loop.workspace.policy.current(), query)
    if not memory.blocks and not memory.notes:
        return "No memory would be injected (MEMORY.md and recent notes are empty)."
    root = loop.workspace.root
    lines = [f"Memory for {query!r}:" if memory.ranked else
             ("No block matches; the newest blocks that fit the budget:" if query else "Whole memory (no query):")]
    for hit in memory.blocks:
        where = f"{hit.block.path.relative_to(root)}:{hit.block.start_line}-{hit.block.end_line}"
        score = f"score {hit.score:.2f}  " if memory.ranked else ""
        lines.append(f"- {score}{where}\n  {hit.block.text.strip().replace(chr(10), chr(10) + '  ')}")
    if memory.notes:
        lines.append("Recent notes:")
        for block in memory.notes:
            lines.append(f"- {block.path.relative_to(root)}:{block.start_line}-{block.end_line}  {block.text.strip().splitlines()[-1]}")
    return "\n".join(lines)
