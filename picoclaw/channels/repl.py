"""`picoclaw chat`: the assistant in a terminal, its answers printed as they are written.

On a terminal, prompt_toolkit reads the lines (editing, history, Ctrl-C and Ctrl-D that act at once); from a
pipe, a reader thread does. Ctrl-C at the prompt leaves; Ctrl-C during an answer cancels that answer (nothing
of it is stored) and returns to the prompt. While it runs, the session's scheduled jobs (and its heartbeat)
are delivered here, between answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Protocol, TextIO

from picoclaw.agent.loop import AgentLoop, Notify, Reply
from picoclaw.agent.scheduler import Deliver, Scheduler
from picoclaw.printable import PrintablePieces, printable

PROMPT = "you> "
EXIT_WORDS = {"exit", "quit", "/exit", "/quit"}
DEFAULT_SESSION = "cli:default"
TOOL_LINE_CHARS = 100
CANCELLED = "(cancelled; nothing of this answer was kept)"
SCHEDULED_MARK = "⏰ "
SCHEDULER_STOP_SECONDS = 10.0

# Made by the composition root: the scheduler for one session, delivering through the given callback.
SchedulerFor = Callable[[Deliver, str], Scheduler]


class LineReader(Protocol):
    """Where the REPL's lines come from; `read` raises EOFError at the end, KeyboardInterrupt on Ctrl-C."""

    async def read(self, prompt: str) -> str: ...


async def chat(agent: AgentLoop, *, session_key: str | None = None, message: str | None = None,
               out: TextIO | None = None, err: TextIO | None = None, scheduler: SchedulerFor | None = None) -> int:
    """Run the REPL (or answer one `message`) with `agent`; returns the exit code. The REPL runs the
    session's jobs with the `scheduler` made for it, if one is given."""
    # The streams of the moment, not of import time (a caller may have replaced sys.stdout since).
    out, err = out or sys.stdout, err or sys.stderr
    session_key = await _terminal_session(agent, session_key or DEFAULT_SESSION)
    if message is not None:
        return await run_once(agent, session_key, message, out, err)
    return await run_interactive(agent, session_key, out, err, scheduler=scheduler)


async def _terminal_session(agent: AgentLoop, given: str) -> str:
    """`--session work` is the session `cli:work` (a key jobs can name); a transcript that older versions
    kept under the bare name is carried over."""
    if ":" in given:
        return given
    key = f"cli:{given}"
    await asyncio.to_thread(agent.sessions.rename, given, key)
    return key


async def run_once(loop: AgentLoop, session_key: str, text: str, out: TextIO = sys.stdout,
                   err: TextIO = sys.stderr) -> int:
    """Answer one message, wait for its background work (summary …); 1 when no answer could be had."""
    reply = await answer(loop, session_key, text, out, err)
    await loop.wait_background()
    return 1 if reply.error is not None else 0


async def run_interactive(loop: AgentLoop, session_key: str, out: TextIO = sys.stdout, err: TextIO = sys.stderr,
                          lines: LineReader | None = None, scheduler: SchedulerFor | None = None) -> int:
    """Read lines until EOF or `exit`, answering each; background work finishes before returning."""
    interactive = lines is None and sys.stdin.isatty()
    reader = lines or (_TerminalLines() if interactive else _PipedLines())
    if interactive:
        out.write(f"picoclaw chat — session {printable(session_key)}. /help for commands, Ctrl-D or Ctrl-C to leave.\n")
    answering = asyncio.Lock()  # a scheduled message waits for the answer being written, not cut into it

    async def deliver(_key: str, text: str) -> None:
        async with answering:
            await _print_above_prompt(out, SCHEDULED_MARK + printable(text))

    jobs = scheduler(deliver, session_key) if scheduler is not None else None
    running = asyncio.create_task(jobs.run()) if jobs is not None else None
    try:
        with _logs_above_prompt() if interactive else contextlib.nullcontext():
            await _read_and_answer(loop, session_key, reader, PROMPT if interactive else "", answering, out, err)
    except BaseException:
        if running is not None:
            running.cancel()  # leaving on Ctrl-C or an error: a job cut short is marked interrupted next time
        raise
    if jobs is not None:
        await jobs.stop(SCHEDULER_STOP_SECONDS)
    await loop.wait_background()
    return 0


async def _read_and_answer(loop: AgentLoop, session_key: str, reader: LineReader, prompt: str,
                           answering: asyncio.Lock, out: TextIO, err: TextIO) -> None:
    while True:
        try:
            line = await reader.read(prompt)
        except EOFError:
            break
        text = line.strip()
        if not text:
            continue
        if text.lower() in EXIT_WORDS:
            break
        async with answering:
            turn = asyncio.ensure_future(answer(loop, session_key, text, out, err))
            with _ctrl_c_cancels(turn):
                try:
                    await turn
                except asyncio.CancelledError:
                    if not turn.cancelled():
                        raise  # we were cancelled ourselves, not the answer
                    out.write(f"\n{CANCELLED}\n")
                    out.flush()


async def answer(loop: AgentLoop, session_key: str, text: str, out: TextIO, err: TextIO) -> Reply:
    """One message: the answer streamed to `out` (tool calls as one short line each), a failure as one line
    on `err`. Everything shown is `printable`: a model's text must not drive the terminal."""
    streamed = False
    visible = False  # some streamed text was more than white space
    notify = _printer(out)
    # An escape sequence may be cut between two streamed pieces: the pieces are cleaned as one text.
    pieces = PrintablePieces()

    async def on_text(delta: str) -> None:
        nonlocal streamed, visible
        streamed = True
        visible = visible or bool(delta.strip())
        out.write(pieces.feed(delta))
        out.flush()

    async def on_tool(name: str, arguments: str) -> None:
        nonlocal streamed, visible
        shown = " ".join(printable(arguments).split())
        if len(shown) > TOOL_LINE_CHARS:
            shown = shown[:TOOL_LINE_CHARS] + "…"
        out.write(f"{pieces.end()}{chr(10) if streamed else ''}· {printable(name)} {shown}\n")
        out.flush()
        streamed = visible = False  # the answer starts on a line of its own

    reply = await loop.handle(session_key, text, notify=notify, on_text=on_text, on_tool=on_tool)
    if reply.error is not None:
        if streamed:
            out.write(pieces.end() + "\n")
        out.flush()
        err.write(f"picoclaw: error: {printable(str(reply.error))}\n")
        err.flush()
    elif streamed and visible:
        out.write(pieces.end() + "\n")
    else:
        # A command's reply, or an answer with no text (or only white space): the reply says so.
        out.write(pieces.end() + printable(reply.text) + "\n")
    out.flush()
    return reply


async def _print_above_prompt(out: TextIO, text: str) -> None:
    """Print a line that comes unasked; on a terminal, prompt_toolkit redraws its prompt below it."""
    from prompt_toolkit.application import run_in_terminal

    def show() -> None:
        out.write(text + "\n")
        out.flush()
    await run_in_terminal(show)


def _printer(out: TextIO) -> Notify:
    async def notify(_key: str, text: str) -> None:
        # Background work (a summary starting) may speak while the prompt waits for a line.
        await _print_above_prompt(out, printable(text))
    return notify


@contextlib.contextmanager
def _logs_above_prompt() -> Iterator[None]:
    """Log lines (a failed summary's warning) go above the prompt, which is drawn again below them.

    The CLI's log handler writes to the terminal's stderr as it was at start; while the prompt waits, a
    line written there lands on the prompt line and the prompt looks gone until Enter is pressed.
    """
    from prompt_toolkit.patch_stdout import patch_stdout

    terminal = (sys.stderr, sys.stdout)
    with patch_stdout(raw=True):
        moved = [handler for handler in logging.getLogger().handlers
                 if isinstance(handler, logging.StreamHandler) and handler.stream in terminal]
        old = [handler.setStream(sys.stderr) for handler in moved]  # sys.stderr is the proxy now
        try:
            yield
        finally:
            for handler, stream in zip(moved, old, strict=True):
                if stream is not None:
                    handler.setStream(stream)


@contextlib.contextmanager
def _ctrl_c_cancels(task: asyncio.Future[Reply]) -> Iterator[None]:
    """While `task` runs, Ctrl-C cancels it instead of ending the program; once it is done, Ctrl-C leaves."""
    loop = asyncio.get_running_loop()
    late: list[bool] = []

    def on_ctrl_c() -> None:
        # The answer may be printed and its task done before this context is left: a Ctrl-C in that gap
        # is meant for the prompt, so it must end the program rather than cancel nothing and be lost.
        if task.done():
            late.append(True)
        else:
            task.cancel()

    try:
        loop.add_signal_handler(signal.SIGINT, on_ctrl_c)
    except (NotImplementedError, RuntimeError):  # no signal handlers here (Windows, or not the main thread)
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    if late:
        raise KeyboardInterrupt


class _TerminalLines:
    """prompt_toolkit: line editing and history; Ctrl-C raises KeyboardInterrupt at once, Ctrl-D EOFError."""

    def __init__(self) -> None:
        from prompt_toolkit import PromptSession

        self._session: PromptSession[str] = PromptSession()

    async def read(self, prompt: str) -> str:
        return await self._session.prompt_async(prompt)


class _PipedLines:
    """Lines from a pipe, read by a daemon thread: waiting for one never keeps the program from exiting
    (a worker of asyncio's default executor would, until the next line came)."""

    def __init__(self) -> None:
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._pump, name="picoclaw-stdin", daemon=True).start()

    def _pump(self) -> None:
        try:
            for line in sys.stdin:
                self._loop.call_soon_threadsafe(self._lines.put_nowait, line)
            self._loop.call_soon_threadsafe(self._lines.put_nowait, None)
        except RuntimeError:  # the event loop is closed: the program is ending
            return

    async def read(self, prompt: str) -> str:
        line = await self._lines.get()
        if line is None:
            raise EOFError
        return line
