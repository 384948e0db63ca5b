"""AgentLoop: the only place that calls the model. One turn = context → model → tools → … → reply.

Turns of one session run one at a time; different sessions run concurrently. After the reply is
saved, background work (session summary, long-term compression, reflection, the lesson a turn taught and
the skill drafts of workflows that keep working: curation/lesson_drafting.py) runs without holding up the next message.
A history too long for the request's budget is summarised inside the turn instead (or, when that fails, set aside
on record after its facts are flushed): `_fit_history`.
Nothing here waits on the event loop: session files are read and appended (fsync, cross-process lock) in
worker threads, and memory search is awaited. Loaded sessions are kept in a bounded LRU cache and per-session
locks exist only while in use, so a bot that sees thousands of chats stays small.

A summary the model fails to write (refused as malformed, or the call failed) is not asked for again on
the next turn: the next automatic attempt, in the background or inside a turn, waits until `wait` more messages
have arrived, where `wait` starts at `session_summary_keep_count` and doubles after each further failure (a success
resets it; /compact always tries); a turn over its budget meanwhile sets the range aside. A turn that does not
attempt sends no "Memory threshold reached" notice.

Every write to MEMORY.md or LEARNINGS.md that no command of the user's made (the memory flush, the model's
memory_append, a lesson) is shown once in the conversation, after the reply (agent/receipt_delivery.py), and logged
for `/memory recent`. A turn's memory_append calls are grounded in what the user said in the conversation
so far (`current_turn`, memory/receipts.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from picoclaw import clock
from picoclaw.agent.allowance import (
    CHAT,
    COMPRESSION,
    FLUSH,
    LESSON,
    QUERY_REWRITE,
    REFLECTION,
    SUMMARY,
    TURN_PURPOSES,
    Allowance,
    MeteredProvider,
)
from picoclaw.agent.background_room import WindowedProvider, flush_pieces
from picoclaw.agent.budget import (
    REPLY_FLOOR,
    RESULT_FLOOR,
    PromptSplit,
    Shares,
    cut_to_fit,
    json_tokens,
    keep_within,
    memory_cap,
    message_tokens,
    over_history_share,
    refusal,
    reply_reserve,
    reply_tokens,
    stored_tokens,
    text_tokens,
    usable,
)
from picoclaw.agent.cache_prefix import LAST_REQUESTS_KEPT, LastRequests
from picoclaw.agent.context import BuiltContext, ChosenMemory, ContextBuilder, RequestShape, turn_start
from picoclaw.agent.context_echo import without_context_echo
from picoclaw.agent.empty_reply import (
    EmptyAnswer,
    is_answer,
    is_empty,
    plain_request,
    previous_answer,
    repeats_last_answer,
    repeats_last_call,
    retry_requests,
)
from picoclaw.agent.history import keep_last
from picoclaw.agent.images import turn_images, with_images
from picoclaw.agent.model_slots import ModelSlot, SlottedProvider, turn_model_slot
from picoclaw.agent.query_rewrite import QueryRewriter
from picoclaw.agent.receipt_delivery import MemorySink, NoticeSink, Receipts
from picoclaw.agent.slash_commands import (
    HELP,
    RECENT,
    Command,
    compact_reply,
    context_report,
    memory_report,
    new_reply,
    parse_command,
    policy_report,
    recent_report,
    status_report,
    unknown_reply,
)
from picoclaw.agent.streaming import StreamGate, TextSink
from picoclaw.config import CLOUD_DEFAULT_WINDOW
from picoclaw.curation import (
    CUT_SHORT,
    CompactResult,
    DeferredFlushes,
    FinishedTurn,
    Learner,
    LongTermCompressor,
    Reflector,
    accept_summary,
    continued_summary_request,
    flush_facts,
    reflection_due,
    render_transcript,
    summary_request,
    unseen_answer_claims,
)
from picoclaw.errors import ConfigError
from picoclaw.memory import (
    MemoryWrite,
    TurnMetrics,
    TurnWrites,
    Workspace,
    WriteLog,
    check_change,
    current_turn,
    record_use,
    same_words,
    user_texts,
)
from picoclaw.per_key import KeyedLocks, LruCache
from picoclaw.policy_schema import MemoryPolicy
from picoclaw.providers.base import (
    ChatProvider,
    ChatReply,
    ContextWindow,
    ContextWindows,
    Continuation,
    FixedWindow,
    Message,
    ProviderError,
    ToolCall,
    ask_between_turns,
)
from picoclaw.storage import StorageError, StorageUnavailable
from picoclaw.tokens import count_tokens
from picoclaw.tools import (
    Approver,
    Chooser,
    Toolset,
    current_approver,
    current_chooser,
    current_session,
    find_text_tool_call,
    offered_tools,
    without_response_wrapper,
)
from picoclaw.transcripts import Session, StoredMessage

log = logging.getLogger(__name__)

# Sessions kept loaded. A loaded session is its active history (bounded by the summary thresholds, at most
# a context window of text, typically 10–100 KB) plus a few compacted messages: 256 of them stay well under
# 100 MB even at their largest, and cover every chat a family's or a team's bot has going at once. An
# evicted session is read again from its file (a few ms) when its chat next speaks.
SESSION_CACHE_SIZE = 256
SHOWN_REQUESTS = 8  # sessions whose last turn's first request is kept for the console's why page
METRICS_SETTLE_SECONDS = 1.0  # how long a turn's metrics line waits, at most, to share a write with the next turns'

ToolSink = Callable[[str, str], Awaitable[None]]  # (tool name, arguments as JSON text)

SUMMARY_NOTICE = "Memory threshold reached. Optimizing conversation history..."
TRIMMED_NOTICE = "(The conversation was too long for the model, so I set aside its oldest half.)"
SUMMARISED_NOTICE = "(The conversation had outgrown the model's window, so I summarised its earlier part.)"
# How long a turn whose history is over the window waits for a summary already being written (a CPU model's
# summary takes a minute or two) before it summarises or sets aside on its own.
SUMMARY_WAIT = 120.0
SET_ASIDE_NOTICE = "(The conversation had outgrown the model's window, so I set aside its oldest messages.)"

# What the turn under way is for ("chat", or "heartbeat" and "agent_job" for the scheduler's turns): the budget its
# model calls are claimed against (agent/allowance.py).
turn_purpose: contextvars.ContextVar[str] = contextvars.ContextVar("turn_purpose", default=CHAT)

# How a flush went: its messages read; the model call failed; or the day's budget had no room (it waits).
FlushStatus = str
READ, FAILED, WAITS = "read", "failed", "waits"


@dataclass(frozen=True)
class SummaryBackoff:
    """After a failed summary: no automatic attempt before message id `retry_at`; `wait` grows per failure."""

    retry_at: int
    wait: int


def clean_text(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD (pairs joined into their character).

    A byte that is not UTF-8 in argv or stdin (`chat -m $'\\udcff'`) reaches Python as a lone surrogate,
    which no JSON encoder accepts: left in, it would fail the model call (looking like a provider failure)
    or the session write after tools already ran.
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def clean_message(value: Any) -> Any:
    """A message (nested dicts, lists, strings) with `clean_text` applied to every string in it."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {key: clean_message(item) for key, item in value.items()}
    if isinstance(value, list):
        return [clean_message(item) for item in value]
    return value


@dataclass(frozen=True)
class Reply:
    """The answer to one message; `error` is set when it is an apology because the model (or the storage) could
    not answer. `turn`: the stored id of the turn's user message, which names the turn (None: no turn was stored,
    as for a command)."""

    text: str
    error: ProviderError | StorageError | None = None
    turn: int | None = field(default=None, compare=False)  # which turn, not what was answered


def history_load(session: Session) -> tuple[int, int, int] | None:
    """The history's tokens now (the last request's history part and the turn stored after it), its room in
    that request (from the turn's `why` record) and the last turn's tokens; None before any such record."""
    active = session.active()
    for index in range(len(active) - 1, -1, -1):
        record = (active[index].why or {}).get("context") if active[index].message.get("role") == "user" else None
        split = PromptSplit.from_record(record) if isinstance(record, dict) else None
        if split is not None:
            # Our count, not the provider's: the budget cuts by it, and this is to come before the cut.
            last_turn = sum(stored_tokens(m) for m in active[index:])
            return split.parts.get("history", 0) + last_turn, split.history_room, last_turn
    return None


def _log_failure(task: asyncio.Future[Any]) -> None:
    """A background job's failure, in one line (the metrics file's write when the storage just went away):
    never asyncio's "exception was never retrieved" with a traceback. An unreachable storage is no news: whoever
    watches it (a webhook worker) has said so."""
    if task.cancelled() or (exc := task.exception()) is None:
        return
    log.log(logging.INFO if isinstance(exc, StorageUnavailable) else logging.WARNING, "background work failed: %s",
            exc)


class AgentLoop:
    """Runs turns for every session of one workspace against one provider."""

    def __init__(self, workspace: Workspace, provider: ChatProvider, tools: Toolset, *,
                 session_cache_size: int = SESSION_CACHE_SIZE, status: Callable[[], list[str]] | None = None,
                 windows: ContextWindows | None = None, continue_background: bool = False,
                 allowance: Allowance | None = None, background: ChatProvider | None = None,
                 background_windows: ContextWindows | None = None):
        """`allowance`: the day's budget every model call is claimed from (by default the workspace's own);
        `background`: the provider of the calls beside the conversation (agents.background), by default `provider`,
        with its own window `background_windows`."""
        self.workspace = workspace
        self.provider = provider
        # Every call is claimed against the day's budget, tagged with what it is for (agent/allowance.py).
        self.allowance = allowance if allowance is not None else Allowance.of(workspace)
        max_tokens = workspace.config.agents.defaults.max_tokens
        # Each call in the turn's model slot (agent/model_slots.py), claimed against the budget before it waits there.
        self._turn_providers = {purpose: MeteredProvider(SlottedProvider(provider), self.allowance, purpose, max_tokens)
                                for purpose in TURN_PURPOSES}
        self.deferred = DeferredFlushes(workspace.memory_dir, storage=workspace.storage)
        # The model's context window (providers: asked of the server); None: config.json's number as it stands
        # (no server asked: 128,000 when config.json has none, as before windows were found).
        configured = workspace.config.agents.defaults.context_window
        fixed = (ContextWindow(configured, "config") if configured is not None else
                 ContextWindow(CLOUD_DEFAULT_WINDOW, "default", "no server was asked"))
        self.windows: ContextWindows = windows or FixedWindow(fixed)
        # The window in force at the last turn (or learnt since), for the sync checks between turns (needs_summary).
        self.window: ContextWindow = fixed
        self.tools = tools
        self._status = status  # more lines for /status (the MCP servers' states), read at each /status
        self._offered = offered_tools(tools)  # tool name → its Args model, for calls written as text
        self.context = ContextBuilder(workspace)
        # The calls beside the conversation, each reply's room fitted to the window (agent/background_room.py), each
        # purpose's claimed as such.
        side = background if background is not None else provider
        side_windows = background_windows if background is not None and background_windows is not None else self.windows

        def beside(purpose: str) -> WindowedProvider:
            return WindowedProvider(MeteredProvider(SlottedProvider(side), self.allowance, purpose, max_tokens),
                                    side_windows)

        self.background = beside(SUMMARY)
        self.flusher = beside(FLUSH)
        self.rewriter = QueryRewriter(beside(QUERY_REWRITE))  # used when the policy's query_rewrite_enabled is on
        self.sessions = workspace.sessions()
        # Files: whether a transcript or the policy changed is one stat, asked on the event loop (a worker thread's
        # hop costs more than that), and a read round lists nothing first; on PostgreSQL each is a statement, asked
        # in a worker thread.
        self._local_reads = workspace.storage.backend == "files"
        self.compressor = LongTermCompressor(workspace.store, beside(COMPRESSION))
        # A change reflection proposes is first tried against the memory's eval set, when it has one.
        self.reflector = Reflector(workspace.policy, beside(REFLECTION),
                                   check=lambda changes: check_change(workspace, changes))
        self.learner = Learner(workspace, beside(LESSON), self._offered)
        # retrieval ms for `memory stats`: a bot answering many chats writes them about once a second, not at every
        # turn (a lock and an append each; on PostgreSQL, transactions)
        self.metrics = TurnMetrics(workspace.memory_dir, storage=workspace.storage, settle_after=METRICS_SETTLE_SECONDS)
        self.written = WriteLog(workspace.memory_dir, storage=workspace.storage)  # automatic writes, `/memory recent`
        self._locks: KeyedLocks[str] = KeyedLocks()
        self._summarizing: set[str] = set()
        self._summary_backoff: dict[str, SummaryBackoff] = {}  # kept only for sessions in the cache
        self._flushed: dict[str, int] = {}  # per session, the newest message id whose facts the flush has seen
        # A session in use (a turn or a summary under way) is never evicted under its user's feet.
        self._loaded: LruCache[str, Session] = LruCache(
            session_cache_size, keep=lambda key: self._locks.busy(key) or key in self._summarizing,
            on_evict=self._forget)
        self._background: set[asyncio.Future[Any]] = set()
        # Each session's last request as sent: background calls ask after it (agent/cache_prefix.py), when the model
        # is served locally (`continue_background`, app.py) and answers them too (no agents.background); else nothing
        # is kept and they use their own prompts.
        self.last_requests = LastRequests(min(session_cache_size, LAST_REQUESTS_KEPT)
                                          if continue_background and background is None else 0)
        # Each of the newest few sessions' last turn's first request as sent: what the console's why page shows as
        # the exact request (the turn's record keeps its split, not its text). A few sessions only: it is for a look.
        self.shown_requests = LastRequests(SHOWN_REQUESTS)

    # -- sessions ----------------------------------------------------------------------------------

    async def session(self, key: str) -> Session:
        """The session for `key`, from the cache or its file, with what another process (a `chat -m` next
        to an open chat) appended to the file since taken in."""
        session = self._loaded.get(key)
        if session is None:
            session = await asyncio.to_thread(self.sessions.load, key)
            self._loaded.put(key, session)
        elif not self._local_reads or self.sessions.changed(session):  # reading it again waits for the disk
            await asyncio.to_thread(self.sessions.refresh, session)
        return session

    async def _turn_start(self, key: str, text: str) -> tuple[Session, MemoryPolicy, ChosenMemory | None]:
        """What a turn starts from: the session, as `session` gives it, the policy and, on PostgreSQL, the memory
        its prompt carries when memory is searched with the message itself (None: chosen when the prompt is
        built). There the session and the policy are a statement each, and memory is read from this machine's
        cached files: all in one worker-thread call, as a thread call costs the turn more than that work."""
        self.window = await self.windows.current()  # the first turn of a process may ask the server
        if self._local_reads:
            return await self.session(key), self.workspace.policy.current(), None
        cached = self._loaded.get(key)
        window = self.window.tokens
        # Made at its first use: here, on the event loop, so that two first turns at once never make two.
        searcher = self.workspace.searcher

        def read() -> tuple[Session, MemoryPolicy, ChosenMemory | None]:
            if cached is None:
                session = self.sessions.load(key)
            else:
                session = cached
                self.sessions.refresh(session)
            policy = self.workspace.policy.current()
            # Not chosen ahead of a query rewrite (a model call), nor by a search that waits on the event loop.
            chosen = (None if policy.query_rewrite_enabled or not searcher.blocking
                      else self.context.select_memory_now(policy, window, text, session.injected_blocks()))
            return session, policy, chosen
        session, policy, chosen = await asyncio.to_thread(read)
        if cached is None:
            self._loaded.put(key, session)
        return session, policy, chosen

    async def _as_last_seen(self, key: str) -> Session:
        """The session as this process last read or wrote it, storage not asked (loaded if it left the cache): for
        a first look whether background work is due, which that work looks at again, up to date, under its lock."""
        session = self._loaded.get(key)
        return session if session is not None else await self.session(key)

    def hold(self, key: str) -> AbstractAsyncContextManager[None]:
        """The lock that keeps one session's turns in order (`async with loop.hold(key):`)."""
        return self._locks.hold(key)

    def idle(self) -> bool:
        """No turn, summary or other background work under way, and no turn's metrics line waiting for its write
        (an agent let go of now would never write it: its timer's thread dies with the process)."""
        return not self._locks and not self._summarizing and not self._background and not self.metrics.waiting()

    async def reset_session(self, key: str) -> str | None:
        """Archive the session's file and start it afresh; returns the archive's name."""
        archived = await asyncio.to_thread(self.sessions.archive, key)
        self._loaded.pop(key)
        self._summary_backoff.pop(key, None)
        self._flushed.pop(key, None)
        self.last_requests.forget(key)
        return archived.name if archived else None

    def _forget(self, key: str, session: Session) -> None:
        self._summary_backoff.pop(key, None)
        self._flushed.pop(key, None)
        self.last_requests.forget(key)

    async def _append(self, session: Session, messages: list[StoredMessage]) -> None:
        await asyncio.to_thread(self.sessions.append_messages, session, messages)

    # -- a turn ------------------------------------------------------------------------------------

    async def handle(self, key: str, text: str, *, notify: NoticeSink | None = None,
                     on_text: TextSink | None = None, on_tool: ToolSink | None = None,
                     remembered: MemorySink | None = None, ask_again: bool = True,
                     images: Sequence[bytes] = (), purpose: str = CHAT, approver: Approver | None = None,
                     chooser: Chooser | None = None, model_slot: ModelSlot | None = None) -> Reply:
        """Answer one user message of session `key` (slash commands included).

        `on_text` receives the answer as it is written (streamed), `on_tool(name, arguments)` each tool call
        as it starts, and `notify(key, text)`, shaped like a channel's `deliver`, work done after the reply
        (a summary starting). `remembered(key, write)`, shaped the same, the receipt of each automatic write to
        long-term memory the turn and its background work made (agent/receipt_delivery.py). `ask_again` False: an empty
        answer is not asked again but is the reply, "" (the heartbeat's "nothing to report"; agent/empty_reply.py).
        `images`: what the message shows, sent with it to a model that sees (agent/images.py); the text names them.
        `purpose`: what the turn is for, the budget its calls count against ("chat"; the scheduler's "heartbeat",
        "agent_job"). `approver` asks the user before an ask-first tool call runs (tools/approval.py; None: no one
        to ask), and `chooser` shows ask_user's options (tools/choices.py; None: the model asks in its reply).
        `model_slot`: held around each model call the turn makes (agent/model_slots.py; None: none waited for).
        Channels call this through `picoclaw.channels.run_turn`.
        """
        if purpose not in TURN_PURPOSES:
            raise ValueError(f"a turn's purpose is one of {', '.join(TURN_PURPOSES)}, not {purpose!r}")
        token = turn_purpose.set(purpose)  # the turn's own calls read it (`_ask`)
        slot_token = turn_model_slot.set(model_slot)  # every model call of the turn holds it (SlottedProvider)
        try:
            return await self._handle(key, text, notify, on_text, on_tool, remembered, ask_again, images, approver,
                                      chooser)
        finally:
            turn_model_slot.reset(slot_token)
            turn_purpose.reset(token)

    async def _handle(self, key: str, text: str, notify: NoticeSink | None, on_text: TextSink | None,
                      on_tool: ToolSink | None, remembered: MemorySink | None, ask_again: bool,
                      images: Sequence[bytes], approver: Approver | None, chooser: Chooser | None) -> Reply:
        text = clean_text(text)
        receipts = Receipts(notify, remembered)
        # One read round per turn: on PostgreSQL each memory document is checked once, not at every read.
        async with self.hold(key):
            with self.workspace.storage.read_round():
                current_session.set(key)  # for tools acting on "this chat" (cron); the turn's own task's context
                current_approver.set(approver)  # for ask-first calls and ask_user: whom this turn's tools ask
                current_chooser.set(chooser)
                command = parse_command(text)
                if command is not None:
                    return Reply(await self.command(key, command, receipts))
                writes = TurnWrites(key)
                try:
                    answer, finished = await self._turn(key, text, on_text, on_tool, writes, ask_again, images)
                except StorageError as exc:  # a summary or set-aside inside the turn could not be recorded
                    log.warning("session %s: memory storage: %s", key, exc)
                    self._spawn(receipts.show(key, writes.writes, self.written))
                    return Reply(f"Sorry, I cannot reach my memory right now: {exc}", error=exc)
                except ProviderError as exc:
                    self._learn_window(exc)  # whichever request of the turn overflowed, the window it named holds
                    # Info, not a warning: the channel shows the failure itself, once.
                    log.info("session %s: model call failed (%s): %s", key, exc.kind, exc)
                    # What memory_append wrote before the failure is written all the same: the user hears of it.
                    self._spawn(receipts.show(key, writes.writes, self.written))
                    if isinstance(exc, EmptyAnswer):
                        apology = f"Sorry, {exc}." if exc.asked_again else ""  # not asked again: silence was an answer
                    elif exc.kind == "over_budget":  # no call was made: the cap's own line says what to do
                        apology = str(exc)
                    else:
                        apology = f"Sorry, I could not get an answer from the model: {exc}"
                    return Reply(apology, error=exc)
        self._spawn(self._after_turn(key, receipts, finished, writes.writes))
        return Reply(answer, turn=finished.user_id)

    async def sees_images(self) -> bool:
        """Whether this agent's model can be sent images (agents.defaults.vision; "auto": providers/vision.py)."""
        return await self.provider.sees_images()

    async def command(self, key: str, command: Command, receipts: Receipts = Receipts()) -> str:
        """The reply to a slash command of session `key`; `receipts`: where the writes of the memory flush that
        /new and /compact run are shown."""
        if command.name in ("/help", "/start"):
            return HELP
        if command.name == "/new":
            session = await self.session(key)
            active = session.active()
            set_aside = [m.message for m in active]
            # Asked after the conversation's last request: the fresh conversation's first turn finds the tools and
            # the system prompt still in a local server's prompt cache.
            fold = self.last_requests.for_history(key, active, len(active), session.summary)
            reply = new_reply(await self.reset_session(key))
            if set_aside and self.workspace.policy.current().memory_flush_enabled:
                self._spawn(self._flush(key, set_aside, receipts, fold, defer=True))
            return reply
        if command.name == "/compact":
            return compact_reply(await self.compact(key, receipts))
        if command.name == "/memory" and command.argument.lower() == RECENT:
            try:
                recent = await asyncio.to_thread(self.written.recent)
            except ConfigError as exc:
                return f"The log of memory writes cannot be read: {exc}"
            return recent_report(recent, self.workspace.tz)
        if command.name == "/memory":
            memory = await self.context.select_memory(self.workspace.policy.current(), command.argument,
                                                      count_use=False)
            stored = bool(memory.blocks) or bool(await asyncio.to_thread(self.workspace.searcher.long_term_blocks))
            return memory_report(memory, command.argument, self.workspace.root, stored)
        if command.name == "/policy":
            return policy_report(self.workspace.policy.effective())
        if command.name == "/context":
            return await self.describe_context(key)
        if command.name == "/status":
            extra = [await self.allowance.status_line(), *(self._status() if self._status else ())]
            return status_report(self.provider.model, self.provider.name, await self.session(key),
                                 self.workspace.policy.effective(), extra, timezone=self.workspace.config.timezone)
        return unknown_reply(command)

    async def _turn(self, key: str, text: str, on_text: TextSink | None, on_tool: ToolSink | None,
                    writes: TurnWrites, ask_again: bool = True, images: Sequence[bytes] = ()
                    ) -> tuple[str, FinishedTurn]:
        """The answer to `text`, and the turn as stored (for the review after the reply); what memory_append
        wrote is added to `writes`."""
        session, policy, chosen = await self._turn_start(key, text)
        # What the user said in the conversation so far: the ground of a fact memory_append saves.
        writes.heard([m.message for m in session.active()], text)
        token, counted = current_turn.set(writes), turn_images.set(len(images))
        try:
            return await self._answer(session, policy, key, text, on_text, on_tool, ask_again, images, chosen)
        finally:
            current_turn.reset(token)
            turn_images.reset(counted)

    async def _answer(self, session: Session, policy: MemoryPolicy, key: str, text: str, on_text: TextSink | None,
                      on_tool: ToolSink | None, ask_again: bool = True, images: Sequence[bytes] = (),
                      chosen: ChosenMemory | None = None) -> tuple[str, FinishedTurn]:
        now = clock.now(self.workspace.tz)
        defaults = self.workspace.config.agents.defaults
        notice = ""
        query = await self._search_query(session, policy, text)
        started = time.perf_counter()  # after the query rewrite: a model call is not retrieval
        shape = await self._shape()
        built = await self._build(session, policy, text, now, query, chosen=chosen, shape=shape)
        retrieval_ms = (time.perf_counter() - started) * 1000
        if chosen is not None and chosen.serves(query, shape.window.tokens):  # chosen as the turn started
            retrieval_ms += chosen.seconds * 1000
        built, fitted = await self._fit_history(session, built, policy, text, now, query)
        if fitted and on_text is not None:
            await on_text(f"{fitted}\n\n")
        schemas = built.tools
        messages = [*built.messages[:-1], with_images(built.messages[-1], images)]
        first = (list(messages), schemas)  # the request the turn's record of why describes
        max_tokens = built.max_tokens
        turn: list[StoredMessage] = [built.user]  # what is stored: each message as it was sent
        final: str | None = None
        try:
            for _ in range(defaults.max_tool_iterations):
                try:
                    reply = await self._ask(messages, schemas, on_text, max_tokens)
                except ProviderError as exc:
                    self._learn_window(exc)
                    # Nothing set aside means the same request again: it could only fail the same way.
                    if exc.kind != "context_too_long" or notice or not await self.force_compress(session):
                        raise
                    notice = TRIMMED_NOTICE
                    if on_text is not None:
                        await on_text(f"{notice}\n\n")
                    # The first prompt's blocks were counted already: this one is the same turn's.
                    built = await self._build(session, policy, text, now, query, count_use=False)
                    turn[0] = built.user
                    # A window learnt from the overflow may want the tools' short form and a smaller reply.
                    schemas, max_tokens = built.tools, built.max_tokens
                    messages = [*built.messages[:-1], with_images(built.messages[-1], images)]
                    first = (list(messages), schemas)
                    if len(turn) > 1:  # the turn's tool steps: their results cut again to the window, their room
                        messages, schemas = await self._refit_steps(key, messages, turn, schemas)
                        max_tokens = await self._reply_room(messages, schemas)
                    # The one retry happens here, not as a loop step: it must not use up a tool step.
                    reply = await self._ask(messages, schemas, on_text, max_tokens)
                if is_empty(reply) and not ask_again:
                    raise EmptyAnswer(asked_again=False)
                if (is_empty(reply) or repeats_last_call(messages, reply)
                        or (ask_again and repeats_last_answer(messages, reply))):  # a heartbeat may say it again
                    reply = await self._ask_again(key, messages, reply, on_text, max_tokens,
                                                  room=lambda attempt: self._reply_room(attempt, []))
                assistant = clean_message(reply.as_message())
                messages.append(assistant)
                usage = reply.usage
                turn.append(StoredMessage(0, assistant, usage.prompt_tokens if usage else None,
                                          usage.cached_tokens if usage else None))
                if not reply.tool_calls:
                    final = reply.content or ""
                    break
                results = await self._run_tools(key, reply.tool_calls, on_tool)
                # Cut to what the window leaves, and stored as sent (agent/budget.py).
                results, schemas = await self._fit_results(key, messages, results, schemas)
                messages.extend(results)
                turn.extend(StoredMessage(0, result) for result in results)
                max_tokens = await self._reply_room(messages, schemas)
        except ProviderError as exc:
            if len(turn) > 1:  # tools ran: what they did stays on record, so nothing is done twice
                note = f"{CUT_SHORT}{exc}. The tool calls above did run.)"
                turn.append(StoredMessage(0, {"role": "assistant", "content": note}))
                await self._append(session, turn)
            raise
        answered = final is not None
        if final is None:
            final = (f"I stopped after {defaults.max_tool_iterations} tool steps without finishing. "
                     "Tell me to go on if you want me to continue.")
            turn.append(StoredMessage(0, {"role": "assistant", "content": final}))
            messages.append({"role": "assistant", "content": final})  # as `turn` ends (cache_prefix.for_turn)
            if on_text is not None:
                await on_text(final)
        await self._append(session, turn)
        finished = FinishedTurn.of(session, len(turn), answered and bool(final.strip()))
        self.last_requests.keep(key, messages, schemas, finished.user_id)
        self.shown_requests.keep(key, *first, finished.user_id)
        # Kept for a turn that was answered (a failed one leaves no trace), in the background: the reply does
        # not wait for the metrics file. A busy agent's lines wait for the timer's shared write: no thread here.
        if self.metrics.add(retrieval_ms, now):
            self._spawn(asyncio.to_thread(self.metrics.flush))
        answer = final.strip()
        notice = "\n\n".join(line for line in (fitted, notice) if line)
        return (f"{notice}\n\n{answer}" if notice else answer), finished

    # -- the request's budget (agent/budget.py) ---------------------------------------------------------------

    async def _shape(self) -> RequestShape:
        """What this turn's request is fitted to: the model's window now, the tools, the reply, the images."""
        return RequestShape(await self.windows.current(), self.tools.schemas(),
                            self.workspace.config.agents.defaults.max_tokens, images=turn_images.get())

    async def _build(self, session: Session, policy: MemoryPolicy, text: str, now: datetime, query: str | None = None,
                     *, count_use: bool = True, chosen: ChosenMemory | None = None,
                     shape: RequestShape | None = None) -> BuiltContext:
        """This turn's request fitted to the model's window (`shape`: as `_shape` gives it); a user message that
        alone leaves no room for a reply is refused in one line (ProviderError "context_too_long") rather than
        sent. `chosen`: the memory `_turn_start` chose, taken when it is still for this query and window."""
        shape = shape or await self._shape()
        built = await self.context.build(policy, session, text, now, query, count_use=count_use, shape=shape,
                                         chosen=chosen)
        if built.memory.used:
            # Beside the model call, not before it: the reply does not wait for the counts' lock and write.
            self._spawn(asyncio.to_thread(record_use, self.workspace.searcher, built.memory))
        if not built.fits and built.split is not None:
            raise ProviderError("context_too_long", refusal(built.split))
        return built

    async def _fit_history(self, session: Session, built: BuiltContext, policy: MemoryPolicy, text: str,
                           now: datetime, query: str) -> tuple[BuiltContext, str]:
        """When the history does not fit beside the rest: the range cut summarised (a summary call now, or the
        background one under way, waited for), or when that fails the range set aside on record, its facts flushed
        to memory first as /new does; the request built again, and the notice saying which. The flush's writes go
        to the turn's, shown after the reply. Never silently dropped: the session file keeps every message."""
        if built.cut_through is None:
            return built, ""
        key = session.key
        before = len(session.active())
        turn = current_turn.get()
        writes = turn.writes if turn is not None else None
        if await self._summary_finished(key):
            built = await self._build(session, policy, text, now, query, count_use=False)
        backoff = self._summary_backoff.get(key)
        backing_off = backoff is not None and session.last_id < backoff.retry_at  # a summary failed not long ago
        if built.cut_through is not None and not backing_off:
            if await self.compact(key, through=built.cut_through, collect=writes) is not None:
                built = await self._build(session, policy, text, now, query, count_use=False)
        notice = SUMMARISED_NOTICE if len(session.active()) < before else ""
        if built.cut_through is not None:
            notice = SET_ASIDE_NOTICE
            through = built.cut_through
            active = session.active()
            head = [m for m in active if m.id <= through]
            unflushed = [m.message for m in head if m.id > self._flushed.get(key, 0)]  # a failed summary's flush ran
            if unflushed and policy.memory_flush_enabled:  # as /new does: their facts go to MEMORY.md first
                fold = (self.last_requests.for_history(key, active, len(head), session.summary)
                        if len(unflushed) == len(head) else None)
                await self._flush(key, unflushed, Receipts(), fold, collect=writes, defer=True)
            await self._set_aside(session, through, "over_budget")
            built = await self._build(session, policy, text, now, query, count_use=False)
        moved = before - len(session.active())
        if built.split is not None and built.user.why is not None:  # the record says what this request moved
            split = replace(built.split, history_set_aside=moved)
            built.user.why["context"] = split.record()
            built = replace(built, split=split)
        return built, notice

    async def _summary_finished(self, key: str) -> bool:
        """Wait (at most SUMMARY_WAIT seconds) for a background summary of `key` under way; whether there was one.
        After the wait it may still be under way: the caller's own summary is then refused and the range set aside."""
        if key not in self._summarizing:
            return False
        log.info("session %s: the history is over the window's budget; waiting for the summary under way", key)
        deadline = time.monotonic() + SUMMARY_WAIT
        while key in self._summarizing and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return True

    async def _set_aside(self, session: Session, through: int, reason: str) -> None:
        """Set aside the active history through message `through` on record (never deleted: the file keeps it)."""
        count = sum(1 for m in session.active() if m.id <= through)
        await asyncio.to_thread(self.sessions.add_compaction, session, through, None, reason)
        log.info("session %s: %s: set aside %d oldest messages (through message %d)", session.key, reason, count,
                 through)

    async def _reply_room(self, messages: list[Message], schemas: list[dict[str, Any]]) -> int:
        """The max_tokens of the next request of a turn: config's, lowered to what its prompt leaves of the window;
        ProviderError "context_too_long" when that is below the reply's floor (the request is not sent)."""
        prompt = sum(message_tokens(m) for m in messages) + (json_tokens(schemas) if schemas else 0)
        window = await self.windows.current()
        room = reply_tokens(window.tokens, prompt, self.workspace.config.agents.defaults.max_tokens)
        if room is None:
            raise ProviderError("context_too_long", f"the turn's request ({prompt:,} tokens) leaves no room for an "
                                f"answer in the model's window of {window.tokens:,} tokens ({window.source})")
        return room

    async def _refit_steps(self, key: str, messages: list[Message], turn: list[StoredMessage],
                           schemas: list[dict[str, Any]]) -> tuple[list[Message], list[dict[str, Any]]]:
        """The turn's steps after `messages` (rebuilt for a window learnt from an overflow), each tool result cut
        again to what that window leaves (and kept as sent in `turn`); and the tools the request still offers."""
        for index in range(1, len(turn)):
            sent = turn[index].as_sent()
            if sent.get("role") == "tool":
                [sent], schemas = await self._fit_results(key, messages, [sent], schemas)
                turn[index] = StoredMessage(0, sent)
            messages.append(sent)
        return messages, schemas

    async def _fit_results(self, key: str, messages: list[Message], results: list[Message],
                           schemas: list[dict[str, Any]]) -> tuple[list[Message], list[dict[str, Any]]]:
        """Tool results cut to what the window leaves beside the request and the reply's reserve, and the tools
        the next request offers: none when even cut results leave the reply less than its floor (the model then
        answers with the results in view)."""
        window = (await self.windows.current()).tokens
        max_tokens = self.workspace.config.agents.defaults.max_tokens
        reserve = reply_reserve(window, max_tokens, Shares.of(self.workspace.policy.current()))
        prompt = sum(message_tokens(m) for m in messages)
        tools = json_tokens(schemas) if schemas else 0
        fitted: list[Message] = []
        for result in results:
            room = usable(window) - prompt - tools - reserve
            if room < RESULT_FLOOR and schemas:
                log.info("session %s: the tool results leave no room for the tool schemas; asking without tools", key)
                schemas, tools = [], 0
                room = usable(window) - prompt - reserve
            kept = cut_to_fit(result, max(room, 0))
            if kept is not result:
                log.info("session %s: a tool result cut to fit the window (%d tokens left for it)", key, room)
            fitted.append(kept)
            prompt += message_tokens(kept)
        if schemas and usable(window) - prompt - tools < min(REPLY_FLOOR, reserve):
            schemas = []
        return fitted, schemas

    async def describe_context(self, key: str) -> str:
        """/context (and `chat --show-context`): the split of the session's last request (kept in its turn's
        record), or of the next one when there is none yet."""
        session = await self.session(key)
        last = next((m for m in reversed(session.active()) if m.message.get("role") == "user"), None)
        record = (last.why or {}).get("context") if last is not None else None
        split = PromptSplit.from_record(record) if isinstance(record, dict) else None
        if split is not None:
            return context_report(split, sent=True)
        policy = self.workspace.policy.current()
        built = await self.context.build(policy, session, "", clock.now(self.workspace.tz), count_use=False,
                                         shape=await self._shape())
        assert built.split is not None
        window, max_tokens = built.split.window.tokens, self.workspace.config.agents.defaults.max_tokens
        shares = Shares.of(policy)
        # The reply's part of a request not yet written: its share (what the message leaves may raise it).
        split = replace(built.split, parts={**built.split.parts, "reply": reply_reserve(window, max_tokens, shares)})
        return context_report(split, sent=False, memory_cap=memory_cap(window, policy.memory_token_budget, shares))

    async def _search_query(self, session: Session, policy: MemoryPolicy, text: str) -> str:
        """What memory is searched with for `text`: the message, or with its rewrite when the policy asks.

        The rewrite call is not part of the turn: it is never stored, and when it fails the message is used.
        """
        if not policy.query_rewrite_enabled:
            return text
        rewrite = await self.rewriter.rewrite(text, [m.message for m in session.active()])
        return rewrite.query

    async def _run_tools(self, key: str, calls: list[ToolCall], on_tool: ToolSink | None) -> list[Message]:
        """Run the model's tool calls in order; their results as tool messages (a tool never raises)."""
        results: list[Message] = []
        for call in calls:
            if on_tool is not None:
                await on_tool(call.name, call.arguments)
            result = clean_text(await self.tools.execute(call.name, call.arguments))
            log.info("session %s: tool %s → %d chars", key, call.name, len(result))
            results.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return results

    async def _ask_again(self, key: str, messages: list[Message], reply: ChatReply, on_text: TextSink | None,
                         max_tokens: int | None = None, *,
                         room: Callable[[list[Message]], Awaitable[int]] | None = None) -> ChatReply:
        """The answer after an empty reply or a repeated tool call (agent/empty_reply.py): asked without tools, the
        turn's tool results in view, then plainly; EmptyAnswer when both come back empty too. After the previous
        answer given again: the plain try alone, and that answer (held back, not yet shown) when the try is empty."""
        if repeats_last_answer(messages, reply):
            log.info("session %s: the model gave the previous turn's answer again; asking with the message alone", key)
            plain = plain_request(messages)
            again = await self._ask(plain, [], on_text, await room(plain) if room is not None else max_tokens,
                                    conversation=[])
            if is_answer(again):  # the same answer once more, to the message alone, was meant: taken as it is
                return replace(again, usage=reply.usage or again.usage)
            if on_text is not None:
                await on_text(reply.content or "")
            return reply
        why = "repeated its last tool call" if reply.tool_calls else "returned an empty answer"
        if on_text is not None and reply.tool_calls and (reply.content or "").strip():
            # The text beside the repeated call was shown as it streamed ("Let me check again."): the answer
            # starts on a line of its own, not glued to it.
            await on_text("\n\n")
        for attempt in retry_requests(messages):
            log.info("session %s: the model %s; asking again without tools", key, why)
            # Without tools: a chat template that writes the schemas into the prompt then sees a new prefix (the
            # cache is lost there); the same schemas with tool_choice "none" would keep it. Each try's own room
            # (its prompt is not the tool step's): `room` says it when given.
            try:
                tokens = await room(attempt) if room is not None else max_tokens
            except ProviderError as exc:  # the results written into the message leave no room: the plain try next
                if exc.kind != "context_too_long":
                    raise
                continue
            # conversation=[]: a try's answer is taken even when it is the previous answer again, so it is shown.
            again = await self._ask(attempt, [], on_text, tokens, conversation=[])
            if is_answer(again):
                # The first reply's usage: its prompt was the whole conversation, which the summary threshold reads.
                return ChatReply(again.content, [], reply.usage or again.usage, again.finish_reason)
            why = "gave no answer to that either"  # to the try: after an empty answer or a repeated call alike
        raise EmptyAnswer()

    async def _ask(self, messages: list[Message], schemas: list[dict[str, Any]], on_text: TextSink | None,
                   max_tokens: int | None = None, *, conversation: list[Message] | None = None) -> ChatReply:
        """One model call; a tool call the model wrote as text (small local models do) becomes a real one, an
        echo of the <context> block at the start of the reply is removed (agent/context_echo.py), and so are the
        tags of a plain answer wrapped in <response>…</response>. `conversation` (a retry's): the turn whose previous
        answer must not be shown again (agent/empty_reply.py); by default `messages`."""
        text_calls = self.provider.text_tool_calls == "auto"
        conversation = messages if conversation is None else conversation
        gate = (StreamGate(on_text, hold_calls=text_calls, previous=previous_answer(conversation))
                if on_text is not None else None)
        provider = self._turn_providers[turn_purpose.get()]
        reply = await provider.chat(messages, schemas, max_tokens=max_tokens,
                                    on_text=gate.feed if gate is not None else None)
        if reply.content and (shown := without_context_echo(reply.content)) != reply.content:
            log.info("the model's reply began by echoing the <context> block; the echo is removed")
            reply = replace(reply, content=shown)
        call = None
        if text_calls and not reply.tool_calls:
            call = find_text_tool_call(reply.content, self._offered)
        if gate is not None:  # a repeat of the previous answer is asked again, not shown
            unwrapped = replace(reply, content=without_response_wrapper(reply.content or ""))
            await gate.finish(was_call=call is not None or repeats_last_answer(conversation, unwrapped))
        if call is None:
            if reply.content and (shown := without_response_wrapper(reply.content)) != reply.content:
                reply = replace(reply, content=shown)  # shown without the tags as it streamed (agent/streaming.py)
            return reply
        log.info("the model wrote a call of %s as text; running it as a tool call", call.name)
        return ChatReply(call.before or None, [ToolCall(f"call_text_{len(messages)}", call.name, call.arguments)],
                         reply.usage, "tool_calls")

    def _learn_window(self, exc: ProviderError) -> None:
        """An overflow answer that names the window: budget (and summarise) against it from now on."""
        if exc.kind == "context_too_long" and exc.window is not None:
            self.window = self.windows.learn(exc.window)

    async def force_compress(self, session: Session) -> int:
        """Set aside the oldest half of the active history (never splitting a tool call from its results)."""
        active = session.active()
        cut = turn_start([m.message for m in active], len(active) // 2)  # at a turn's start
        if cut == 0:
            return 0
        await self._set_aside(session, active[cut - 1].id, "context_too_long")
        return cut

    # -- background work ---------------------------------------------------------------------------

    def _spawn(self, job: Coroutine[Any, Any, Any]) -> None:
        # Background work holds no model slot of the turn that set it off (agent/model_slots.py): its calls were
        # never bounded by the channel's, and a slot waited for there would delay the next turns' answers.
        context = contextvars.copy_context()
        context.run(turn_model_slot.set, None)
        task = asyncio.get_running_loop().create_task(job, context=context)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_log_failure)

    async def wait_background(self) -> None:
        """Wait until every background job (summaries …) has finished, and every call's count is in the ledger
        and every turn's metrics in their file."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        await self.allowance.drain()
        await asyncio.to_thread(self.metrics.flush)

    async def _after_turn(self, key: str, receipts: Receipts, finished: FinishedTurn,
                          written: list[MemoryWrite]) -> None:
        with self.workspace.storage.read_round():  # the work after a reply reads in one round of its own
            if not self._local_reads:  # PostgreSQL: the round's first read (its one listing) off the event loop
                with suppress(Exception):  # each job reads the policy again, and answers for what that raises
                    await asyncio.to_thread(self.workspace.policy.current)
            await self._after_turn_jobs(key, receipts, finished, written)

    async def _after_turn_jobs(self, key: str, receipts: Receipts, finished: FinishedTurn,
                               written: list[MemoryWrite]) -> None:
        # Each job on its own: a bug in one must not stop the others. Each checks whether it is due. At the day's
        # background cap none starts (a summary's notice would promise one); they run once budget returns.
        jobs: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("memory receipts", lambda: receipts.show(key, written, self.written))]
        if await self.allowance.background_open():
            jobs += [
                ("deferred memory flushes", lambda: self.run_deferred_flushes(key, receipts)),
                ("session summary", lambda: self._summarize_if_needed(key, receipts)),
                ("long-term compression", lambda: self.compressor.run_if_due(self.workspace.policy.current())),
                ("reflection", lambda: self._reflect_if_due(key)),
                ("lesson review", lambda: self._learn(finished, receipts)),
            ]
        else:
            log.info("session %s: the day's background budget is spent; background work waits", key)
        for name, job in jobs:
            try:
                await job()
            except StorageUnavailable as exc:  # an outage: one line, not a traceback per job and turn
                log.info("session %s: background %s skipped: %s", key, name, exc)
            except Exception:
                log.exception("session %s: background %s failed", key, name)

    async def _learn(self, finished: FinishedTurn, receipts: Receipts) -> None:
        """Write the lesson the turn taught, if any, with its receipt; tell the chat, once, about a skill drafted
        meanwhile."""
        learned = await self.learner.learn(finished, self.last_requests.for_turn(finished))
        if learned.write is not None:
            await receipts.show(finished.key, [learned.write], self.written)
        if learned.draft is not None and receipts.notify is not None:
            await receipts.notify(finished.key, learned.draft.notice)

    async def disliked(self, key: str, turn: int) -> None:
        """A 👎 on the reply to turn `turn` of session `key` (the stored id of its user message): the turn is
        reviewed for a lesson as a correction is, in the background, at most once (curation/lesson_drafting.py)."""
        finished = FinishedTurn.at(await self.session(key), turn)
        if finished is None:
            log.info("session %s: a 👎 on a turn the session no longer holds (%s): no lesson", key, turn)
            return
        self._spawn(self.learner.learn_disliked(finished, self.last_requests.for_turn(finished)))

    async def _reflect_if_due(self, key: str) -> None:
        if not reflection_due(self.workspace.policy.current(), await self._as_last_seen(key)):
            return
        async with self._alone(f"reflection:{key}") as ours:
            if ours:  # looked at again, brought up to date: another worker may have just reflected on it
                await self.reflector.maybe_reflect(self.sessions, await self.session(key),
                                                   lambda stored: self.last_requests.for_newest(key, stored))

    @asynccontextmanager
    async def _alone(self, work: str) -> AsyncIterator[bool]:
        """Whether this process has background work `work` to itself, across processes and worker machines
        (storage/work.py); held until the block ends."""
        lock = self.workspace.storage.work_lock(work)
        taking = asyncio.ensure_future(asyncio.to_thread(lock.try_acquire))
        try:
            ours = await asyncio.shield(taking)
        except asyncio.CancelledError:  # the thread takes it all the same: let go of it as soon as it has
            taking.add_done_callback(lambda done: lock.release() if not done.cancelled() and done.exception() is None
                                     and done.result() else None)
            raise
        if not ours:
            log.info("%s: already under way in another process", work)
        try:
            yield ours
        finally:
            if ours:
                await asyncio.to_thread(lock.release)

    async def _summarize_if_needed(self, key: str, receipts: Receipts) -> None:
        # A summary already being written covers this turn's check too: no second notice, no second call.
        # So does a failed summary not long ago (see SummaryBackoff): no attempt, so no notice either.
        # Storage is not asked here: what another process appended since is its own turn's to check.
        session = await self._as_last_seen(key)
        backoff = self._summary_backoff.get(key)
        if backoff is not None and session.last_id < backoff.retry_at:
            return
        if key in self._summarizing or not self.needs_summary(session, self.workspace.policy.current()):
            return
        if not await self.allowance.background_open():
            return  # the day's budget is spent: no notice of a summary that would not be written
        # Claimed before the first await: a turn arriving meanwhile waits for this summary instead of writing its own.
        self._summarizing.add(key)
        try:
            async with self._alone(f"summary:{key}") as ours:
                # Looked at again once ours, brought up to date: another worker may have just summarised it.
                if not ours or not self.needs_summary(await self.session(key), self.workspace.policy.current()):
                    return
                if receipts.notify is not None:
                    await receipts.notify(key, SUMMARY_NOTICE)
                await self.compact(key, receipts, claimed=True)
        finally:
            self._summarizing.discard(key)

    def needs_summary(self, session: Session, policy: MemoryPolicy) -> bool:
        """History over the message threshold, or over the token share of the history's room in the last request
        (on a small window the budget would cut it before the window's share is reached), or of the window."""
        active = session.active()
        if len(active) > policy.session_summary_message_threshold:
            return True
        load = history_load(session) if self._budget_cuts_first(policy) else None
        if load is not None:
            history, room, last_turn = load
            # Over the share of its room, or a turn like the last would not fit: summarise before the budget cuts.
            if over_history_share(history, room, policy.session_summary_token_percent) or history + last_turn > room:
                return True
        tokens = session.last_prompt_tokens()
        if tokens is None:  # no provider count yet: the local count (it drifts, above all for Chinese)
            tokens = sum(count_tokens(str(m.message.get("content") or "")) for m in active)
        return tokens > self.window.tokens * policy.session_summary_token_percent / 100

    def _budget_cuts_first(self, policy: MemoryPolicy) -> bool:
        """Whether the budget would cut the history before the window's token share is reached: the largest prompt
        it allows (the window less the reply's reserve) is below that share (windows up to about 4×max_tokens)."""
        window = self.window.tokens
        reserve = reply_reserve(window, self.workspace.config.agents.defaults.max_tokens, Shares.of(policy))
        return usable(window) - reserve <= window * policy.session_summary_token_percent / 100

    async def _flush(self, key: str, messages: list[Message], receipts: Receipts, fold: Continuation | None = None,
                     *, collect: list[MemoryWrite] | None = None, defer: bool = False) -> FlushStatus:
        """Store the lasting facts the user stated in `messages` in MEMORY.md (curation/flush.py), and show what
        was written (or add it to `collect`, a turn's writes shown after its reply); never raises. `fold`: ask
        after the conversation's last request, which carries them. READ when the model read them all (only then
        are they flushed), WAITS when the day's budget had no room for a piece (with `defer`, for messages leaving
        the conversation, that piece is kept for a later day: DeferredFlushes), else FAILED. A range too long for
        one request is read in window-sized pieces, newest first."""
        pieces = flush_pieces(messages, (await self.windows.current()).tokens)
        statuses = []
        for piece in pieces:  # several: each in its own prompt (the last request carries the whole range only)
            status = await self._flush_piece(key, piece, receipts, fold if len(pieces) == 1 else None,
                                             collect=collect)
            if status == WAITS and defer:
                await self._defer_flush(key, piece)
            statuses.append(status)
        return WAITS if WAITS in statuses else FAILED if FAILED in statuses else READ

    async def _defer_flush(self, key: str, messages: list[Message]) -> None:
        stamp = clock.now(self.workspace.tz).isoformat(timespec="seconds")
        try:
            await asyncio.to_thread(self.deferred.add, key, messages, stamp)
        except (OSError, StorageError) as exc:
            log.warning("session %s: the flush that waits for the budget cannot be kept (%s); its %d messages stay "
                        "in the session file only", key, exc, len(messages))
            return
        log.info("session %s: the day's budget is spent; the flush of %d messages waits for it", key, len(messages))

    async def run_deferred_flushes(self, key: str, receipts: Receipts = Receipts()) -> int:
        """Flush what waited for the budget (DeferredFlushes), oldest first, until the budget runs out again; how
        many were done. What a flush of session `key` writes is shown through `receipts`."""
        pending = await asyncio.to_thread(self.deferred.pending)
        done = 0
        for entry in pending:
            async with self._alone(f"deferred-flush:{entry.id}") as ours:
                if not ours:
                    continue
                status = await self._flush(entry.session, entry.messages,
                                           receipts if entry.session == key else Receipts())
                if status == WAITS:
                    break
                # Read, or failed for another reason (a model down): a failure is not kept for ever, as a turn's
                # own flush is not asked again either.
                await asyncio.to_thread(self.deferred.done, entry.id)
                done += 1
        return done

    async def _flush_piece(self, key: str, messages: list[Message], receipts: Receipts, fold: Continuation | None,
                           *, collect: list[MemoryWrite] | None) -> FlushStatus:
        """One flush request of `_flush`; how its model call went."""
        try:
            result = await flush_facts(self.flusher, self.workspace.store, render_transcript(messages),
                                       user_texts(messages), session=key, after=fold)
        except Exception:  # a bug here must not cost the summary
            log.exception("session %s: memory flush failed", key)
            return FAILED
        if result.failed_kind == "over_budget":
            return WAITS
        if result.refused:
            log.info("session %s: memory flush stored nothing: %s", key, result.refused)
        else:
            log.info("session %s: memory flush stored %d fact(s), %d already known, %d rejected", key,
                     len(result.stored), len(result.known), len(result.rejected))
        read = READ if result.failed_kind is None else FAILED
        if collect is not None:
            collect.extend(result.writes())
            return read
        try:
            await receipts.show(key, result.writes(), self.written)
        except Exception:
            log.exception("session %s: the memory flush's receipts failed", key)
        return read

    def _back_off(self, key: str, session: Session, policy: MemoryPolicy) -> None:
        """After a failed summary: the next automatic attempt waits for more messages (see the module doc)."""
        previous = self._summary_backoff.get(key)
        wait = previous.wait * 2 if previous is not None else max(policy.session_summary_keep_count, 2)
        self._summary_backoff[key] = SummaryBackoff(session.last_id + wait, wait)
        log.info("session %s: next summary attempt after message %d", key, session.last_id + wait)

    async def compact(self, key: str, receipts: Receipts = Receipts(), *, through: int | None = None,
                      collect: list[MemoryWrite] | None = None, claimed: bool = False) -> CompactResult | None:
        """Summarise all but the last `session_summary_keep_count` messages (`through`: exactly those up to that
        id, the range a request must cut); None when nothing was done.

        In the background (and for /compact) the model call runs without the session lock: messages that arrive
        meanwhile are newer than the compacted range and are kept; with `through` it runs inside the turn, which
        holds the lock. What the memory flush before it writes is shown through `receipts` (or added to `collect`, a
        turn's writes). `claimed`: the caller has put `key` in _summarizing already.
        """
        if not claimed:  # claimed: the caller holds `key` in _summarizing already (and lets go of it)
            if key in self._summarizing:
                return None
            self._summarizing.add(key)
        try:
            session = await self.session(key)
            policy = self.workspace.policy.current()
            active = session.active()
            if through is None:
                cut = keep_last([m.message for m in active], policy.session_summary_keep_count)
                load = history_load(session)
                if load is not None and load[1] > 0:
                    # On a small window keep_count messages can be over the history's room by themselves: keep no
                    # more than a third of it less the summary, which shares it, from a turn's start; the rest is
                    # the room of the turns to come (a half kept summarised after most turns of ~300 tokens in 4k).
                    kept_room = max(0, load[1] // 3 - text_tokens(session.summary or ""))
                    within = keep_within([stored_tokens(m) for m in active], kept_room)
                    cut = max(cut, turn_start([m.message for m in active], within))
            else:
                cut = sum(1 for m in active if m.id <= through)
            if cut == 0:
                return None
            folded = active[:cut]
            # Both calls are asked after the conversation's last request when it is this history, so a single-slot
            # local server keeps the conversation cached (agent/cache_prefix.py).
            fold = self.last_requests.for_history(key, active, cut, session.summary)
            if policy.memory_flush_enabled:  # the facts in what is folded away go to MEMORY.md first
                flushed = await self._flush(key, [m.message for m in folded], receipts, fold, collect=collect)
                if flushed == WAITS:  # no summary of what was not flushed: both wait for the budget
                    log.info("session %s: the day's budget is spent; the summary waits", key)
                    return None
                if flushed == READ:
                    self._flushed[key] = max(self._flushed.get(key, 0), folded[-1].id)
            try:
                own = summary_request(session.summary, [m.message for m in folded])
                reply = await ask_between_turns(self.background, own, fold,
                                                lambda after: continued_summary_request(after, session.summary))
            except ProviderError as exc:
                if exc.kind == "over_budget":  # not the model's failure: no back-off, tried again once there is room
                    log.info("session %s: summary not written: %s", key, exc)
                    return None
                log.warning("session %s: summary failed (%s); history kept as it was", key, exc)
                self._back_off(key, session, policy)
                return None
            summary = accept_summary(reply.content)
            if summary is None:
                log.warning("session %s: the model's summary was empty or malformed; history kept as it was", key)
                self._back_off(key, session, policy)
                return None
            claims = unseen_answer_claims(summary, [m.message for m in folded], session.summary)
            if claims:
                log.warning("session %s: the model's summary claims an answer the user never saw (%s); history "
                            "kept as it was", key, "; ".join(claims)[:300])
                self._back_off(key, session, policy)
                return None
            if self._loaded.get(key) is not session:
                # /new archived the session meanwhile: the record would land in the fresh file and hide
                # its first messages.
                log.info("session %s was reset while its summary was written; summary dropped", key)
                return None
            self._summary_backoff.pop(key, None)
            previous = session.summary or ""
            await asyncio.to_thread(self.sessions.add_compaction, session, folded[-1].id, summary, "summary")
            if same_words(previous, summary):
                # A small model often gives back the previous summary word for word (a 1.5B one did three
                # compactions in a row): the history still shrinks, but the daily note gets nothing new.
                log.info("session %s: the summary repeats the previous one word for word; not noted again", key)
            else:
                await asyncio.to_thread(self.workspace.store.append_note, f"Summary of session {key}:\n{summary}")
            return CompactResult(len(folded), summary)
        finally:
            if not claimed:
                self._summarizing.discard(key)
