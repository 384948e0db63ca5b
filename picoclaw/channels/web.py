"""The web console's conversations as a channel (`web:<name>` sessions): a turn streamed to the page that sent
it as `ChatEvent`s, Stop, and what the scheduler delivers to a `web:` session, and the receipts of memory writes,
shown on the pages that have it open. The HTTP side (picoclaw/web/chat_page.py) only moves these events to and
from the browser. A file sent with a message becomes its turn through picoclaw/channels/attachments.py, as
`chat --attach` does; what it shows first (the transcript heard, `NO_VISION`) are "attached" events.

Before an ask-first tool call runs (tools/approval.py), the turn shows an "approval" event (its id, the tool and
its short arguments, as JSON) and waits for `decide` — the page's Approve or Deny — at most the request's
timeout; an "approval_done" event then says what came of it. Only a decision for that turn's own session, while
the question is open, counts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import defaultdict
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import orjson

from picoclaw.agent import ApprovalRequest, Verdict
from picoclaw.channels.attachments import Attached, attach
from picoclaw.channels.message_turn import Inbound, TurnHooks, run_turn
from picoclaw.errors import PicoclawError
from picoclaw.session_key import WEB

if TYPE_CHECKING:
    from picoclaw.agent import AgentLoop
    from picoclaw.channels.voice_notes import Transcriber
    from picoclaw.jobs import Scheduler
    from picoclaw.memory import MemoryWrite

log = logging.getLogger(__name__)

CONSOLE_USER = "console"  # the sender of every console message: the one person the login link let in
SCHEDULER_STOP_SECONDS = 10.0

EventKind = Literal["attached", "text", "tool", "notice", "approval", "approval_done", "done", "error", "stopped",
                    "delivered", "closed"]


class NotOpen(PicoclawError):
    """A `web:` session that no console page has open: what the scheduler had for it was not shown."""


@dataclass(frozen=True)
class ChatEvent:
    """One thing a page shows: a piece of the answer, a tool call, a notice, the end of a turn, a delivery."""

    kind: EventKind
    text: str


@dataclass(frozen=True)
class _PageApprover:
    """The Approver of one console turn: the question goes to the page that sent the message."""

    channel: WebChannel
    session_key: str
    events: asyncio.Queue[ChatEvent | None]

    async def approve(self, request: ApprovalRequest) -> Verdict:
        return await self.channel.ask(self.session_key, self.events, request)


class WebChannel:
    """The console's conversations; `turn` runs one and yields its events, `listen` follows a session."""

    name = WEB

    def __init__(self, agent: AgentLoop):
        self.agent = agent
        self._turns: dict[str, asyncio.Task[None]] = {}
        self._listeners: defaultdict[str, set[asyncio.Queue[ChatEvent]]] = defaultdict(set)
        self._stopping: asyncio.Event | None = None
        self._closed = False
        self._questions: dict[str, tuple[str, asyncio.Future[bool]]] = {}  # id -> (session, the answer to come)

    async def run(self, *, scheduler: Scheduler | None = None) -> int:
        """Run `scheduler` (the `web:` sessions' jobs) until `stop()`; 0."""
        self._stopping = asyncio.Event()
        running = asyncio.create_task(scheduler.run()) if scheduler is not None else None
        try:
            await self._stopping.wait()
        finally:
            if running is not None and scheduler is not None:
                await scheduler.stop(SCHEDULER_STOP_SECONDS)
            for task in list(self._turns.values()):
                task.cancel()
        return 0

    async def stop(self) -> None:
        """Make `run()` return; turns still running are cancelled as a Stop would."""
        self._closed = True
        for queues in self._listeners.values():  # pages following a session: their streams end now
            for queue in queues:
                queue.put_nowait(ChatEvent("closed", ""))
        if self._stopping is not None:
            self._stopping.set()

    @property
    def closed(self) -> bool:
        """Whether `stop()` was called: pages following a session stop following it."""
        return self._closed

    async def deliver(self, session_key: str, markdown: str) -> None:
        """Show `markdown` on every page that has `session_key` open; NotOpen when none has."""
        listeners = self._listeners.get(session_key)
        if not listeners:
            raise NotOpen(f"no console page has {session_key} open")
        for queue in listeners:
            queue.put_nowait(ChatEvent("delivered", markdown))

    async def remembered(self, session_key: str, write: MemoryWrite) -> None:
        """Show the receipt of an automatic memory write (a "notice" event) on every page with `session_key` open."""
        # Receipts come after the reply (the flush, a lesson, even memory_append's are shown after the turn), when
        # the turn's own stream may have ended: the page's event stream is what is still read. With no page open
        # none is shown; the agent logged the write and `/memory recent` lists it.
        for queue in self._listeners.get(session_key, ()):
            queue.put_nowait(ChatEvent("notice", write.notice))

    @contextlib.contextmanager
    def listening(self, session_key: str) -> Iterator[asyncio.Queue[ChatEvent]]:
        """A queue of what is delivered to `session_key` while the block runs (a page's event stream)."""
        queue: asyncio.Queue[ChatEvent] = asyncio.Queue()
        self._listeners[session_key].add(queue)
        try:
            yield queue
        finally:
            self._listeners[session_key].discard(queue)
            if not self._listeners[session_key]:
                del self._listeners[session_key]

    def busy(self, session_key: str) -> bool:
        """Whether a turn of `session_key` is running."""
        task = self._turns.get(session_key)
        return task is not None and not task.done()

    def stop_turn(self, session_key: str) -> bool:
        """Cancel the running turn of `session_key` (the page's Stop); whether there was one."""
        task = self._turns.get(session_key)
        if task is None or task.done():
            return False
        task.cancel()
        return True

    def decide(self, session_key: str, question: str, approve: bool) -> bool:
        """The page's Approve (or Deny) of the open question `question` of `session_key`'s turn; False, and
        nothing decided, when there is no such open question (answered, timed out, another session's, forged)."""
        found = self._questions.get(question)
        if found is None or found[0] != session_key or found[1].done():
            return False
        found[1].set_result(approve)
        return True

    async def ask(self, session_key: str, events: asyncio.Queue[ChatEvent | None],
                       request: ApprovalRequest) -> Verdict:
        """Ask the page: an "approval" event, then the answer `decide` gives, or none within the timeout."""
        question = secrets.token_urlsafe(16)
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._questions[question] = (session_key, answer)
        events.put_nowait(ChatEvent("approval", orjson.dumps(
            {"id": question, "tool": request.tool, "arguments": request.arguments,
             "timeout": request.timeout}).decode()))
        try:
            verdict = Verdict.APPROVED if await asyncio.wait_for(answer, request.timeout) else Verdict.DENIED
        except TimeoutError:
            verdict = Verdict.TIMED_OUT
        finally:
            del self._questions[question]
        events.put_nowait(ChatEvent("approval_done", orjson.dumps({"id": question, "verdict": verdict}).decode()))
        return verdict

    async def attach(self, name: str, data: bytes, caption: str | None,
                     transcriber: Transcriber | None) -> Attached:
        """The turn a file sent with a message makes (`caption`: the message typed with it); MediaRefused, one
        line for the page, when it cannot make one."""
        return await attach(name, data, caption, agent=self.agent, transcriber=transcriber)

    async def turn(self, session_key: str, text: str,
                   attached: Attached | None = None) -> AsyncGenerator[ChatEvent, None]:
        """Run one turn of `session_key` (`text`, or the turn of the file `attached` whose lines it shows first)
        and yield what it shows, ending with "done", "error" or "stopped". A caller that stops reading (the page
        went away) stops the turn."""
        if self.busy(session_key):
            yield ChatEvent("error", "a turn of this conversation is still running: wait for it, or Stop it")
            return
        images: tuple[bytes, ...] = ()
        if attached is not None:
            text, images = attached.text, attached.images
            for notice in attached.notices:
                yield ChatEvent("attached", notice)
        events: asyncio.Queue[ChatEvent | None] = asyncio.Queue()

        async def on_text(piece: str) -> None:
            events.put_nowait(ChatEvent("text", piece))

        async def on_tool(name: str, arguments: str) -> None:
            events.put_nowait(ChatEvent("tool", f"{name} {arguments}"))

        async def on_notice(key: str, notice: str) -> None:
            events.put_nowait(ChatEvent("notice", notice))

        async def run() -> None:
            try:
                reply = await run_turn(self.agent, Inbound(CONSOLE_USER, session_key, text, images=images),
                                       TurnHooks(on_text=on_text, on_tool=on_tool, on_notice=on_notice,
                                                 on_memory=self.remembered,
                                                 approver=_PageApprover(self, session_key, events)))
                events.put_nowait(ChatEvent("error" if reply.error is not None else "done", reply.text))
            except asyncio.CancelledError:
                events.put_nowait(ChatEvent("stopped", ""))
                raise
            except Exception as exc:  # one line on the page; the details in the log
                log.exception("console turn of %s failed", session_key)
                events.put_nowait(ChatEvent("error", f"the turn failed: {exc}"))
            finally:
                events.put_nowait(None)

        task = asyncio.create_task(run())
        self._turns[session_key] = task
        try:
            while (event := await events.get()) is not None:
                yield event
        finally:
            if not task.done():
                task.cancel()
            if self._turns.get(session_key) is task:
                del self._turns[session_key]
