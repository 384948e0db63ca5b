"""`picoclaw chat`: the assistant in a terminal (line editing and history where readline exists)."""

from __future__ import annotations

import asyncio
import sys
from typing import TextIO

from picoclaw.agent.loop import AgentLoop, Notify

PROMPT = "you> "
EXIT_WORDS = {"exit", "quit", "/exit", "/quit"}
DEFAULT_SESSION = "cli:default"


def _enable_line_editing() -> None:
    # Importing readline gives input() arrow keys and history; it is missing on some platforms.
    try:
        import readline  # noqa: F401
    except ImportError:
        pass


async def chat(agent: AgentLoop, *, session_key: str | None = None, message: str | None = None,
               out: TextIO = sys.stdout) -> None:
    """Run the REPL (or answer one `message`) with `agent`."""
    session_key = session_key or DEFAULT_SESSION
    if message is not None:
        await run_once(agent, session_key, message, out)
    else:
        await run_interactive(agent, session_key, out)


def _printer(out: TextIO) -> Notify:
    async def notify(_key: str, text: str) -> None:
        out.write(text + "\n")
        out.flush()
    return notify


async def run_once(loop: AgentLoop, session_key: str, text: str, out: TextIO = sys.stdout) -> None:
    """Answer one message, wait for its background work (summary …), then return."""
    out.write(await loop.handle(session_key, text, notify=_printer(out)) + "\n")
    out.flush()
    await loop.wait_background()


async def run_interactive(loop: AgentLoop, session_key: str, out: TextIO = sys.stdout) -> None:
    """Read lines until EOF or `exit`, answering each; background work finishes before returning."""
    interactive = sys.stdin.isatty()
    notify = _printer(out)
    if interactive:
        _enable_line_editing()
        out.write(f"picoclaw chat — session {session_key}. /help for commands, Ctrl-D to leave.\n")
    while True:
        try:
            line = await asyncio.to_thread(input, PROMPT if interactive else "")
        except EOFError:
            break
        text = line.strip()
        if not text:
            continue
        if text.lower() in EXIT_WORDS:
            break
        out.write(await loop.handle(session_key, text, notify=notify) + "\n")
        out.flush()
    await loop.wait_background()
