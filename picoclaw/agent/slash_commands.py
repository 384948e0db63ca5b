"""Slash commands, answered without the model: /new /compact /memory /policy /status /context /help.

The command table (`SLASH_COMMANDS`, from which /help's text and Telegram's command menu are made), parsing and
the replies' wording live here; the loop runs a command with its own parts (AgentLoop.command).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, tzinfo
from pathlib import Path

from picoclaw.agent.budget import PromptSplit, split_report
from picoclaw.clock import describe_timezone
from picoclaw.curation import CompactResult
from picoclaw.memory import EffectivePolicy, InjectedMemory, MemoryWrite
from picoclaw.policy_schema import POLICY_KEYS
from picoclaw.tokens import is_exact
from picoclaw.transcripts import Session


@dataclass(frozen=True)
class CommandEntry:
    """One line of the command table: /help shows every entry, Telegram's menu those with a `menu` text."""

    name: str  # as typed after the slash, and as Telegram's menu registers it: "memory"
    usage: str  # what follows the name in /help: "[query]", "recent", or nothing
    help: str  # /help's description
    menu: str | None  # the shorter description in Telegram's menu (1 to 256 characters); None: not in the menu


# The one list of slash commands: /help's text and the menu the Telegram bot registers are both made from it.
# `/start` (what a Telegram client sends first) is answered as /help is, and listed in neither.
SLASH_COMMANDS: tuple[CommandEntry, ...] = (
    CommandEntry("new", "", "start a fresh conversation (the old one is archived)", "start a fresh conversation"),
    CommandEntry("compact", "", "summarise the conversation now to free context", "summarise the conversation now"),
    CommandEntry("memory", "[query]", "show what memory would be put in front of the model for a query",
                 "what memory a query would bring up"),
    CommandEntry("memory", "recent", "what was written to memory lately without a command of yours, and from where",
                 None),  # a form of /memory, which the menu lists
    CommandEntry("policy", "", "show the memory policy in force", "the memory policy in force"),
    CommandEntry("status", "", "the model, this conversation's size, the last prompt's tokens (and how many were "
                 "cached)", "model, conversation size, cached tokens"),
    CommandEntry("context", "", "where the last request's tokens went: each part's share of the model's window",
                 "where the last request's tokens went"),
    CommandEntry("help", "", "this list", "the commands"),
)

HELP = "\n".join(["Commands:",
                  *(f"/{entry.name}{f' {entry.usage}' if entry.usage else ''} — {entry.help}"
                    for entry in SLASH_COMMANDS),
                  "Anything else goes to the assistant."])


@dataclass(frozen=True)
class Command:
    """A slash command as typed: its name ("/memory") and the rest of the line."""

    name: str
    argument: str


def parse_command(text: str) -> Command | None:
    """The command in `text`, or None when it is not one."""
    stripped = text.strip()
    if not stripped.startswith("/"):
        return None
    name, _, argument = stripped.partition(" ")
    return Command(name.split("@", 1)[0].lower(), argument.strip())  # Telegram appends @botname in groups


def unknown_reply(command: Command) -> str:
    return f"Unknown command {command.name}; see /help."


def new_reply(archived: str | None) -> str:
    return "Started a new conversation." + (f" The previous one is archived as {archived}." if archived else "")


def compact_reply(result: CompactResult | None) -> str:
    if result is None:
        return "Nothing to compact (or the summary was refused); the conversation is unchanged."
    return f"Compact complete: {result.compacted} messages compacted.\n\n{result.summary}"


RECENT = "recent"  # `/memory recent`: the automatic writes, not a search for "recent"


def recent_report(writes: list[MemoryWrite], tz: tzinfo) -> str:
    """The automatic memory writes, newest first: when (in `tz`), which file, from where, whose words, the text."""
    if not writes:
        return "Nothing has been written to memory without a command of yours yet."
    lines = ["Written to memory lately (newest first):"]
    for write in writes:
        try:
            when = datetime.fromisoformat(write.time).astimezone(tz).strftime("%Y-%m-%d %H:%M")
        except ValueError:  # a hand-edited time: shown as it is
            when = write.time
        whose = "" if write.by_user else ", the assistant's words"
        session = f", session {write.session}" if write.session else ""
        lines.append(f"- {when}  {write.document}  {write.source}{session}{whose}: {' '.join(write.text.split())}")
    return "\n".join(lines)


def policy_report(effective: EffectivePolicy) -> str:
    """Each policy key with its value and the layer it comes from."""
    return "\n".join(f"{k} = {getattr(effective.policy, k)} ({effective.sources[k]})" for k in POLICY_KEYS)


def memory_report(memory: InjectedMemory, query: str, root: Path, stored: bool = True) -> str:
    """What would be injected for `query`, with scores and where each block lives (relative to `root`);
    `stored` says whether MEMORY.md holds any block at all. The lessons that would come along are listed last."""
    lessons = _lessons_report(memory, root)
    if not memory.blocks and not memory.notes:
        if query and stored:
            return (f"No block matches {query!r}, so no memory would be injected "
                    "(memory_fallback_blocks > 0 would add the newest few)." + lessons)
        return "No memory would be injected (MEMORY.md and recent notes are empty)." + lessons
    lines = [f"Memory for {query!r}:" if memory.ranked else
             ("No block matches; the newest blocks memory_fallback_blocks allows:" if query and memory.blocks else
              "No block matches; only the recent notes:" if query else "Whole memory (no query):")]
    for hit in memory.blocks:
        where = f"{hit.block.path.relative_to(root)}:{hit.block.start_line}-{hit.block.end_line}"
        score = f"score {hit.score:.2f}  " if memory.ranked else ""
        lines.append(f"- {score}{where}\n  {hit.block.text.strip().replace(chr(10), chr(10) + '  ')}")
    if memory.notes:
        lines.append("Recent notes:")
        for block in memory.notes:
            lines.append(f"- {block.path.relative_to(root)}:{block.start_line}-{block.end_line}  "
                         f"{block.text.strip().splitlines()[-1]}")
    return "\n".join(lines) + lessons


def _lessons_report(memory: InjectedMemory, root: Path) -> str:
    """The lessons part of `memory_report`: the standing ones (in the system prompt), then those found."""
    if not memory.lessons and not memory.standing:
        return ""
    lines = ["", "Lessons (LEARNINGS.md):"]
    for why, hits in (("standing", memory.standing), ("", memory.lessons)):
        for hit in hits:
            where = f"{hit.block.path.relative_to(root)}:{hit.block.start_line}-{hit.block.end_line}"
            lines.append(f"- {why or f'score {hit.score:.2f}'}  {where}\n  "
                         f"{hit.block.text.strip().replace(chr(10), chr(10) + '  ')}")
    return "\n".join(lines)


def status_report(model: str, provider: str, session: Session, effective: EffectivePolicy,
                  extra: Sequence[str] = (), *, timezone: str = "") -> str:
    """The model, the conversation's size, the last prompt (cached share), the last turn's memory, the policy,
    the configured `timezone` (resolved when "local"), then `extra` lines (the MCP servers' states)."""
    active = session.active()
    lines = [f"model: {model} (provider {provider})",
             f"conversation {session.key}: {session.last_id} messages, {len(active)} since the last summary"
             + ("" if session.summary else " (none yet)")]
    usage = session.last_usage()
    if usage is None or usage.prompt_tokens is None:
        # Some servers (llama-cpp-python's) send no usage in a streamed answer, even when asked for it.
        answered = any(m.message.get("role") == "assistant" for m in session.active())
        lines.append("last prompt: the server reports no token usage for streamed answers" if answered
                     else "last prompt: no token count from the provider yet")
    else:
        cached = ("the provider did not say how many were cached" if usage.cached_tokens is None
                  else f"{usage.cached_tokens:,} of them cached by the provider")
        lines.append(f"last prompt: {usage.prompt_tokens:,} tokens, {cached}")
    last_user = next((m for m in reversed(active) if m.message.get("role") == "user"), None)
    if last_user is not None:
        carried = len(session.injected_blocks())
        lines.append(f"last turn: {len(last_user.blocks)} new blocks of memory and notes injected "
                     f"({carried} in the conversation so far)")
    layers: dict[str, list[str]] = {}
    for key, source in effective.sources.items():
        layers.setdefault(source, []).append(key)
    described = [f"{', '.join(layers['overrides'])} from policy_overrides.json"] if "overrides" in layers else []
    described += [f"{len(layers['config'])} key(s) from config.json"] if "config" in layers else []
    described += [f"{len(layers['default'])} default(s)"] if "default" in layers else []
    lines.append("policy: " + "; ".join(described) + " (/policy shows each value)")
    if not is_exact():
        lines.append("token counts: estimated (tiktoken's encoding is not available offline; see docs/setup.md)")
    if timezone:  # which zone dates and daily notes follow: "local" alone would not say
        lines.append(f"timezone: {describe_timezone(timezone)}")
    lines += extra
    return "\n".join(lines)


LAST_REQUEST = "The last turn's first request (the one with your message; tool steps add to it):"
NEXT_REQUEST = ("No request in this conversation yet. The next one would hold, before your message and the memory "
                "it brings up:")


def context_report(split: PromptSplit, *, sent: bool, memory_cap: int = 0) -> str:
    """/context: the split of the last request `sent`, or of the next one (without the message and its memory,
    which may take up to `memory_cap` tokens)."""
    if sent:
        return split_report(split, LAST_REQUEST)
    shown = {name: tokens for name, tokens in split.parts.items() if name not in ("memory", "user")}
    return (split_report(PromptSplit(split.window, shown, split.tools_short), NEXT_REQUEST)
            + f"\nmemory and notes: up to {memory_cap:,} tokens, chosen for your message")
