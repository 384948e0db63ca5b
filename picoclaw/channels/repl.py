"""`picoclaw chat`: the assistant in a terminal (`ReplChannel`), its answers printed as they are written.

On a terminal, prompt_toolkit reads the lines (editing, history, Ctrl-C and Ctrl-D that act at once); from a
pipe, a reader thread does. Ctrl-C at the prompt leaves; Ctrl-C during an answer cancels that answer (nothing
of it is stored) and returns to the prompt. While it runs, the session's scheduled jobs (and its heartbeat)
are delivered here, between answers.

A tool call that asks first (tools.approval.ask_first: exec by default) is asked about at the prompt, `Run exec:
ls -la? [y/N]`; where no one can answer (`chat -m`, piped input) it does not run, said in one line on stderr. The
options of ask_user are a numbered list: typing a number sends that option as the next message.

A file goes with a message (`chat --attach FILE`, or a `/attach PATH [message]` line): audio is transcribed and
its transcript shown first, an image goes to a model that sees, a document is read (picoclaw/channels/
attachments.py). A file that cannot be taken is one line on stderr, and nothing reaches the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from picoclaw.agent import AgentLoop, ApprovalRequest, Reply, Verdict, parse_command
from picoclaw.channels.attachments import attach, read_attachment
from picoclaw.channels.message_turn import Inbound, TurnHooks, run_turn
from picoclaw.channels.voice_notes import MediaRefused
from picoclaw.jobs import Scheduler
from picoclaw.memory import MemoryWrite
from picoclaw.printable import PrintablePieces, printable
from picoclaw.session_key import CLI, SessionKey, terminal_key

if TYPE_CHECKING:
    from picoclaw.channels.voice_notes import Transcriber

PROMPT = "you> "
EXIT_WORDS = {"exit", "quit", "/exit", "/quit"}
DEFAULT_SESSION = str(SessionKey.cli("default"))
TERMINAL_USER = "terminal"  # who a terminal's messages are from: whoever sits at it
TOOL_LINE_CHARS = 100
CANCELLED = "(cancelled; nothing of this answer was kept)"
SCHEDULED_MARK = "⏰ "
RECEIPT_MARK = "✍ "
SCHEDULER_STOP_SECONDS = 10.0
ATTACH_COMMAND = "/attach"
ATTACH_USAGE = "usage: /attach PATH [message] (a path with spaces in \"quotes\")"
YES = {"y", "yes", "是", "是的", "好", "对"}  # what counts as yes at a y/N question; anything else is no
CANNOT_ASK = ("picoclaw: not run: {tool} asks first (tools.approval.ask_first), and chat -m or piped input "
              "cannot ask; set tools.approval.unattended to \"allow\" to run such calls unasked")


class LineReader(Protocol):
    """Where the REPL's lines come from; `read` raises EOFError at the end, KeyboardInterrupt on Ctrl-C."""

    async def read(self, prompt: str) -> str: ...


class ReplChannel:
    """The terminal as a channel: `run()` answers the lines typed (or piped) in, `answer_once` one message
    (`chat -m`); `deliver` prints a scheduled job's text above the prompt. `show_context`: after each answer,
    where its request's tokens went (`/context`) on `err`, so `chat -m … > file` keeps the answer alone.
    `transcriber` (`App.transcriber()`): what hears an attached audio file; None, audio is refused in one line.
    What an attachment shows before the answer (its transcript, `NO_VISION`) goes to `err` as well."""

    name = CLI

    def __init__(self, agent: AgentLoop, session: str | None = None, *, out: TextIO | None = None,
                 err: TextIO | None = None, lines: LineReader | None = None, show_context: bool = False,
                 transcriber: Transcriber | None = None):
        self.agent = agent
        self.transcriber = transcriber
        self.show_context = show_context
        self._given = session or DEFAULT_SESSION
        self.session_key = terminal_key(self._given)  # `--session work` is the session cli:work
        # The streams of the moment, not of import time (a caller may have replaced sys.stdout since).
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.lines = lines
        self._answering = asyncio.Lock()  # a scheduled message waits for the answer being written, not cut into it
        # Lines that come unasked (a receipt or notice of the previous turn's background work) while an answer is
        # being written: shown after it, never cut into it. None while no answer is being written.
        self._held: list[str] | None = None
        self._late: list[str] = []  # those of an answer that was cancelled, shown after the line saying so
        self._stopping = False
        self._reading: asyncio.Task[object] | None = None  # run()'s task while it waits for a line
        # Where a y/N question is read: the lines being answered, when someone types them (None: no one can answer).
        self._asking: LineReader | None = None
        self._options: list[str] = []  # the numbered options ask_user last showed: "2" sends the second

    async def run(self, *, scheduler: Scheduler | None = None) -> int:
        """Read lines until EOF, `exit` or `stop()`, answering each, with the session's jobs run by `scheduler`
        meanwhile (`App.scheduler(channel, channels=(channel.session_key,))`); background work finishes
        before it returns the exit code, 0."""
        await self._open_session()
        interactive = self.lines is None and sys.stdin.isatty()
        reader = self.lines or (_TerminalLines() if interactive else _PipedLines())
        if interactive:
            self.out.write(f"picoclaw chat — session {printable(self.session_key)}. /help for commands, "
                           "Ctrl-D or Ctrl-C to leave.\n")
        running = asyncio.create_task(scheduler.run()) if scheduler is not None else None
        self._asking = reader if interactive or self.lines is not None else None
        try:
            with _logs_above_prompt() if interactive else contextlib.nullcontext():
                await self._read_and_answer(reader, PROMPT if interactive else "")
        except BaseException:
            if running is not None:
                running.cancel()  # leaving on Ctrl-C or an error: a job cut short is marked interrupted next time
            raise
        if scheduler is not None:
            await scheduler.stop(SCHEDULER_STOP_SECONDS)
        await self.agent.wait_background()
        return 0

    async def answer_once(self, text: str | None, attachment: Path | None = None) -> int:
        """Answer one message (with the file `attachment`, `text` its caption), wait for its background work
        (summary …); 1 when no answer could be had, or the file could not be taken (nothing sent then)."""
        await self._open_session()
        if attachment is not None:
            reply = await self.answer_with(attachment, text)
            if reply is None:
                return 1
        else:
            reply = await self.answer(text or "")
        await self.agent.wait_background()
        return 1 if reply.error is not None else 0

    async def answer_with(self, path: Path, caption: str | None) -> Reply | None:
        """One message with the file at `path`: what the file shows first (the transcript heard, `NO_VISION`),
        then the answer; None when the file could not be taken, said in one line on `err` (nothing sent)."""
        media = self.agent.workspace.config.media
        try:
            name, data = await asyncio.to_thread(read_attachment, path, media, self.transcriber)
            attached = await attach(name, data, caption, agent=self.agent, transcriber=self.transcriber)
        except MediaRefused as exc:
            logging.getLogger(__name__).info("chat: %s not attached: %s", path, exc)
            self.err.write(f"picoclaw: error: {printable(str(exc))}\n")
            self.err.flush()
            return None
        for notice in attached.notices:
            self.err.write(printable(notice) + "\n")
        self.err.flush()
        return await self.answer(attached.text, attached.images)

    async def stop(self) -> None:
        """Make `run()` return at the prompt; an answer being written is finished first."""
        self._stopping = True
        if self._reading is not None:
            self._reading.cancel()

    async def deliver(self, session_key: str, markdown: str) -> None:
        """A scheduled job's text, marked, above the prompt: after the answer being written, never inside it."""
        async with self._answering:
            await _print_above_prompt(self.out, SCHEDULED_MARK + printable(markdown))

    async def answer(self, text: str, images: tuple[bytes, ...] = ()) -> Reply:
        """One message (with `images`, for a model that sees): the answer streamed to `out` (tool calls as one
        short line each), a failure as one line on `err`."""
        shown = _ShownAnswer(self.out, self._unasked)
        self._held = []
        hooks = replace(shown.hooks(), approver=_TerminalApprover(self._asking, shown, self.err),
                        chooser=self._chooser(shown))
        try:
            reply = await run_turn(self.agent, Inbound(TERMINAL_USER, self.session_key, text, images=images), hooks)
        except BaseException:
            # Cancelled (Ctrl-C) or failed: the lines held meanwhile come after what the caller says of that.
            self._late, self._held = self._held, None
            raise
        shown.finish(reply, self.err)
        held, self._held = self._held, None
        for line in held:
            await _print_above_prompt(self.out, line)
        if self.show_context and reply.error is None and parse_command(text) is None:  # a command sent no request
            self.err.write(printable(await self.agent.describe_context(self.session_key)) + "\n")
            self.err.flush()
        return reply

    def _chooser(self, shown: _ShownAnswer) -> _TerminalChooser | None:
        """ask_user's numbered list, where a next line can answer it (not `chat -m`: the model asks in its reply)."""
        if self._asking is None:
            return None

        def remember(options: list[str]) -> None:
            self._options = options
        return _TerminalChooser(shown, remember)

    def _chosen(self, text: str) -> str:
        """The option a typed number picks from ask_user's last list (once), else the line as typed."""
        options, self._options = self._options, []
        if text.isdigit() and 1 <= int(text) <= len(options):
            return options[int(text) - 1]
        return text

    async def _unasked(self, text: str) -> None:
        """A line nobody just asked for: above the prompt, or after the answer being written."""
        if self._held is not None:
            self._held.append(text)
        else:
            await _print_above_prompt(self.out, text)

    async def _open_session(self) -> None:
        """A transcript that older versions kept under the bare `--session` name is carried over to its key."""
        if self.session_key != self._given:
            await asyncio.to_thread(self.agent.sessions.rename, self._given, self.session_key)

    async def _read_and_answer(self, reader: LineReader, prompt: str) -> None:
        while (line := await self._next_line(reader, prompt)) is not None:
            text = line.strip()
            if not text:
                continue
            if text.lower() in EXIT_WORDS:
                break
            text = self._chosen(text)
            turning: Awaitable[Reply | None]
            if text.split(maxsplit=1)[0].lower() == ATTACH_COMMAND:
                attaching = attach_line(text)
                if attaching is None:
                    self.err.write(ATTACH_USAGE + "\n")
                    self.err.flush()
                    continue
                turning = self.answer_with(*attaching)
            else:
                turning = self.answer(text)
            async with self._answering:
                turn = asyncio.ensure_future(turning)
                with _ctrl_c_cancels(turn):
                    try:
                        await turn
                    except asyncio.CancelledError:
                        if not turn.cancelled():
                            raise  # we were cancelled ourselves, not the answer
                        late, self._late = self._late, []
                        self.out.write(f"\n{CANCELLED}\n" + "".join(f"{line}\n" for line in late))
                        self.out.flush()

    async def _next_line(self, reader: LineReader, prompt: str) -> str | None:
        """The next line; None at the end of the input, or once `stop()` was called."""
        if self._stopping:
            return None
        self._reading = task = asyncio.current_task()
        try:
            with _ctrl_c_leaves(task):
                return await reader.read(prompt)
        except EOFError:
            return None
        except asyncio.CancelledError:
            if not self._stopping or task is None:
                raise  # the caller's own cancel: not a stop
            task.uncancel()  # only the read was cut short
            return None
        finally:
            self._reading = None


def attach_line(line: str) -> tuple[Path, str | None] | None:
    """The file and message of a `/attach PATH [message]` line (a PATH with spaces in double or single quotes);
    None when it names no file."""
    rest = line.strip()[len(ATTACH_COMMAND):].strip()
    if not rest:
        return None
    if rest[0] in "\"'":
        end = rest.find(rest[0], 1)
        if end < 0:
            return None
        path, message = rest[1:end], rest[end + 1:]
    else:
        path, _, message = rest.partition(" ")
    message = message.strip()
    return (Path(path).expanduser(), message or None) if path else None


class _TerminalApprover:
    """The y/N question at the prompt, before an ask-first call runs; where no line can answer, one line on
    stderr and the call does not run."""

    def __init__(self, lines: LineReader | None, shown: _ShownAnswer, err: TextIO):
        self.lines = lines
        self.shown = shown
        self.err = err

    async def approve(self, request: ApprovalRequest) -> Verdict:
        if self.lines is None:
            self.err.write(CANNOT_ASK.format(tool=printable(request.tool)) + "\n")
            self.err.flush()
            return Verdict.UNASKED
        self.shown.break_line()
        try:
            answer = await asyncio.wait_for(self.lines.read(printable(request.question()) + " [y/N] "),
                                            request.timeout)
        except TimeoutError:
            self.shown.say(f"(no answer within {request.timeout:g} s: not run)")
            return Verdict.TIMED_OUT
        except (EOFError, KeyboardInterrupt):  # Ctrl-D or Ctrl-C at the question: no
            return Verdict.DENIED
        return Verdict.APPROVED if answer.strip().lower() in YES else Verdict.DENIED


class _TerminalChooser:
    """ask_user's question and options as a numbered list; `remember` keeps them for the next line typed."""

    def __init__(self, shown: _ShownAnswer, remember: Callable[[list[str]], None]):
        self.shown = shown
        self.remember = remember

    async def offer(self, question: str, options: list[str]) -> bool:
        self.shown.break_line()
        self.shown.say("\n".join([printable(question)] + [f"  {n}. {printable(o)}" for n, o in enumerate(options, 1)]
                                 + ["(type a number to answer)"]))
        self.remember(options)
        return True


class _ShownAnswer:
    """One answer on the terminal as it is written. Everything shown is `printable`: a model's text must not
    drive the terminal."""

    def __init__(self, out: TextIO, unasked: Callable[[str], Awaitable[None]]):
        self.out = out
        self.unasked = unasked  # where a notice or receipt goes: the channel holds it while an answer is written
        self.streamed = False
        self.visible = False  # some streamed text was more than white space
        # An escape sequence may be cut between two streamed pieces: the pieces are cleaned as one text.
        self.pieces = PrintablePieces()

    def hooks(self) -> TurnHooks:
        return TurnHooks(on_text=self.on_text, on_tool=self.on_tool, on_notice=self.on_notice,
                         on_memory=self.on_memory)

    async def on_text(self, delta: str) -> None:
        self.streamed = True
        self.visible = self.visible or bool(delta.strip())
        self.out.write(self.pieces.feed(delta))
        self.out.flush()

    async def on_tool(self, name: str, arguments: str) -> None:
        shown = " ".join(printable(arguments).split())
        if len(shown) > TOOL_LINE_CHARS:
            shown = shown[:TOOL_LINE_CHARS] + "…"
        self.out.write(f"{self.pieces.end()}{chr(10) if self.streamed else ''}· {printable(name)} {shown}\n")
        self.out.flush()
        self.streamed = self.visible = False  # the answer starts on a line of its own

    def break_line(self) -> None:
        """End the streamed text's line, so what the channel prints next starts on a line of its own."""
        if self.streamed:
            self.out.write(self.pieces.end() + "\n")
            self.out.flush()
        self.streamed = self.visible = False

    def say(self, text: str) -> None:
        """A line of the channel's own inside the answer (the list of ask_user's options)."""
        self.out.write(text + "\n")
        self.out.flush()

    async def on_notice(self, _key: str, text: str) -> None:
        # Background work (a summary starting) may speak while the prompt waits for a line.
        await self.unasked(printable(text))

    async def on_memory(self, _key: str, write: MemoryWrite) -> None:
        # A write to memory no command made (the flush, memory_append, a lesson): one line above the prompt.
        await self.unasked(RECEIPT_MARK + printable(write.notice))

    def finish(self, reply: Reply, err: TextIO) -> None:
        """The end of the answer: its line ended, or the reply printed whole, or the failure on `err`."""
        out = self.out
        if reply.error is not None:
            if self.streamed:
                out.write(self.pieces.end() + "\n")
            out.flush()
            err.write(f"picoclaw: error: {printable(str(reply.error))}\n")
            err.flush()
        elif self.streamed and self.visible:
            out.write(self.pieces.end() + "\n")
        else:
            # A command's reply (nothing streams). A model's answer always has text (an empty one fails the turn:
            # agent/empty_reply.py), so this prints it whole only when none of it streamed visibly.
            out.write(self.pieces.end() + printable(reply.text) + "\n")
        out.flush()


async def _print_above_prompt(out: TextIO, text: str) -> None:
    """Print a line that comes unasked; on a terminal, prompt_toolkit redraws its prompt below it."""
    from prompt_toolkit.application import run_in_terminal

    def show() -> None:
        out.write(text + "\n")
        out.flush()
    await run_in_terminal(show)


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
def _on_ctrl_c(callback: Callable[[], None]) -> Iterator[None]:
    """Ctrl-C calls `callback` in the event loop while the block runs (nothing where the loop cannot take
    signals: Windows, or not the main thread). Through the loop's own handler, not Python's default one: the
    kernel may hand SIGINT to any thread (the stdin reader, a worker writing a file), and only the loop's
    wake-up pipe then stops its wait; with the default handler the signal waited, unseen, for the next timer."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, callback)
    except (NotImplementedError, RuntimeError):
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)


@contextlib.contextmanager
def _ctrl_c_leaves(reading: asyncio.Task[object] | None) -> Iterator[None]:
    """While the prompt waits for a line, Ctrl-C ends the program (KeyboardInterrupt)."""
    interrupted: list[bool] = []

    def on_ctrl_c() -> None:
        interrupted.append(True)
        if reading is not None:
            reading.cancel()

    try:
        with _on_ctrl_c(on_ctrl_c):
            yield
    except asyncio.CancelledError:
        if not interrupted or reading is None:
            raise
        reading.uncancel()
        raise KeyboardInterrupt from None


@contextlib.contextmanager
def _ctrl_c_cancels(task: asyncio.Future[Any]) -> Iterator[None]:
    """While `task` runs, Ctrl-C cancels it instead of ending the program; once it is done, Ctrl-C leaves."""
    late: list[bool] = []

    def on_ctrl_c() -> None:
        # The answer may be printed and its task done before this context is left: a Ctrl-C in that gap
        # is meant for the prompt, so it must end the program rather than cancel nothing and be lost.
        if task.done():
            late.append(True)
        else:
            task.cancel()

    with _on_ctrl_c(on_ctrl_c):
        yield
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
