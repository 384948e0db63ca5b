"""The composition root: config → storage → workspace → provider → tools → agent loops, and their lifetimes.

The CLI makes one App per command; channels receive what it built (an AgentLoop, or `App.agent` to get
one per memory scope) and never build a provider or tools themselves. The storage is opened here once and
handed to everything that keeps bytes (nothing looks a backend up by path), so two Apps in one process never
share state. The model client is made on first use, inside the event loop that will close it (its connection
pool belongs to that loop). The agent stack and the openai client are imported only then too, so
`picoclaw memory show` starts quickly.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from picoclaw.config import Config, home_dir, load_config, turns_held, workspace_dir
from picoclaw.hosts import is_local_host
from picoclaw.memory import Workspace
from picoclaw.per_key import LruCache
from picoclaw.storage import open_storage, switch_warning

if TYPE_CHECKING:
    import asyncio

    from picoclaw.agent import AgentLoop, Allowance
    from picoclaw.channels import Channel, Transcriber
    from picoclaw.jobs import JobStore, Scheduler, Sleep
    from picoclaw.memory import Embedder
    from picoclaw.providers import ChatProvider, ContextWindows, OpenAICompatProvider
    from picoclaw.tools import McpServers, Tool, Toolset

ProviderFactory = Callable[[Config], "OpenAICompatProvider"]

HEARTBEAT_RUNS_FILE = ".heartbeat.json"  # when each HEARTBEAT.md task last ran (jobs/heartbeat_due.py)

# Per-user agents kept open ("per_user" memory scope): each holds a workspace and, with the index on, a
# database connection. A bot used by thousands of people keeps the most recent ones; an idle agent that
# falls out is closed and made again (cheaply) when its user comes back. Idle means no turn, no background
# job and no embedding under way (a turn may stop waiting for new memory's embeddings before they are made).
AGENT_CACHE_SIZE = 64

log = logging.getLogger(__name__)

# The threads of the executor an App makes its event loop's default (`use_threads`): every asyncio.to_thread (the
# storage calls of turns, background jobs and console pages; file tools) and the DNS lookups of the model's and
# Telegram's hosts run on them. Python's own default is min(32, CPUs + 4), 6 on a 2-core machine: 6 turns waiting
# for a storage lock whose holder was stuck (each wait ends only after storage.lock_wait_seconds) took every
# thread, and no other chat's turn, no reply's DNS lookup could run. A turn waits on one thread at a time, and so
# does each background job it leaves (summary, flush, lessons, reflection, metrics): THREADS_PER_TURN for each of
# the turns a worker answers at once (`turns_held`) leaves threads free while all of them wait for the same lock.
THREADS_PER_TURN = 4
MIN_THREADS = 32


def executor_threads(config: Config) -> int:
    """How many threads the app's executor has: enough that turns waiting for a stuck lock cannot take them all."""
    return max(MIN_THREADS, THREADS_PER_TURN * turns_held(config.channels.telegram.webhook.max_parallel))


class App:
    """One configured picoclaw: the workspace, the model client, and an agent per memory scope."""

    def __init__(self, config: Config, home: Path, *, make_provider: ProviderFactory | None = None,
                 agent_cache_size: int = AGENT_CACHE_SIZE):
        self.config = config
        self.home = home
        self.storage = open_storage(config, workspace_dir(config, home))
        try:
            # Before the workspace opens: on PostgreSQL its first memory lock brings the rows into the folder.
            warning = switch_warning(self.storage)
            if warning:
                log.warning(warning)
            self.embedder = build_embedder(config)
            self.workspace = Workspace.from_config(config, home, self.storage, self.embedder)
        except BaseException:
            self._close_storage()
            raise
        self._make_provider = make_provider
        self._provider: OpenAICompatProvider | None = None
        self._background: OpenAICompatProvider | None = None  # agents.background's client, when there is one
        self._background_windows: ContextWindows | None = None
        self._allowance: Allowance | None = None
        self._transcription: OpenAICompatProvider | None = None  # the transcriber's client, when there is one
        self._windows: ContextWindows | None = None
        self._shared: AgentLoop | None = None
        self._mcp: McpServers | None = None
        self.worker: str | None = None  # this process's name among several bot workers, shown by /status
        self.executor: ThreadPoolExecutor | None = None  # the running loop's default executor (`use_threads`)
        self._executor_loop: asyncio.AbstractEventLoop | None = None
        self._agents: LruCache[str, AgentLoop] = LruCache(
            agent_cache_size, keep=lambda key: self._busy(key), on_evict=lambda key, agent: agent.workspace.close())

    @classmethod
    def open(cls, home: Path | None = None) -> App:
        """The app of `<home>/config.json` (home from PICOCLAW_HOME, else ~/.picoclaw)."""
        home = home or home_dir()
        return cls(load_config(home), home)

    def use_threads(self) -> ThreadPoolExecutor:
        """Make this app's sized executor (executor_threads) the running event loop's default one, where
        asyncio.to_thread runs storage calls; once per loop. The loop shuts it down when it closes, App.close too."""
        import asyncio  # not at the top: the short commands never start an event loop

        loop = asyncio.get_running_loop()
        if self.executor is None or self._executor_loop is not loop:
            # A loop before this one (an earlier asyncio.run of the same app) shut its own down as it closed.
            self.executor = ThreadPoolExecutor(executor_threads(self.config), thread_name_prefix="picoclaw-worker")
            self._executor_loop = loop
            loop.set_default_executor(self.executor)
        return self.executor

    def provider(self) -> OpenAICompatProvider:
        """The chat model's client, made on the first call: a missing key or URL is a ConfigError then."""
        if self._provider is None:
            make = self._make_provider or _configured_provider
            self._provider = make(self.config)
        return self._provider

    def background_provider(self) -> OpenAICompatProvider | None:
        """The client of `agents.background` (made on the first call), or None: background calls use the chat model."""
        settings = self.config.agents.background
        if settings is None:
            return None
        if self._background is None:
            from picoclaw.providers import from_config

            self._background = from_config(self.config, settings.provider, model=settings.model)
            self._background_windows = self._background.context_windows(None)
        return self._background

    def background_call(self, purpose: str) -> ChatProvider:
        """A provider for background calls of `purpose` made outside an agent (`memory eval`): the background model
        (else the chat model), each call claimed against the day's budget and its reply fitted to the window."""
        from picoclaw.agent import MeteredProvider, WindowedProvider

        background = self.background_provider()
        provider = background if background is not None else self.provider()
        windows = self._background_windows if background is not None and self._background_windows is not None \
            else self.windows()
        return WindowedProvider(MeteredProvider(provider, self.allowance(), purpose,
                                                self.config.agents.defaults.max_tokens), windows)

    def allowance(self) -> Allowance:
        """The day's budget (config.json `budget`), shared by every agent of this app: its caps are the workspace's."""
        if self._allowance is None:
            from picoclaw.agent import Allowance

            self._allowance = Allowance.of(self.workspace)
        return self._allowance

    def tell_owner(self, deliver: Callable[[str, str], Awaitable[None]], session_key: str) -> None:
        """Where the day's notice that the background budget is spent goes: `deliver(session_key, text)` (a channel's
        deliver; the heartbeat's chat, or the terminal's session)."""
        async def notify(text: str) -> None:
            await deliver(session_key, text)

        self.allowance().owner = notify

    def transcriber(self) -> Transcriber | None:
        """The transcriber of config.json's `transcription` (its client made on the first call: a missing key or
        URL is a ConfigError then), or None when none is configured."""
        settings = self.config.transcription
        if settings is None:
            return None
        from picoclaw.channels import MediaRefused, Transcriber
        from picoclaw.providers import ProviderError, from_config

        if self._transcription is None:
            # Its own timeout, and no re-sending of a whole upload the server may still be working on.
            self._transcription = from_config(self.config, settings.provider, timeout=settings.timeout, max_retries=0)
        client, model, language = self._transcription, settings.model, settings.language

        async def transcribe(audio: bytes, filename: str) -> str:
            try:
                return await client.transcribe(audio, filename, model, language)
            except ProviderError as exc:
                log.warning("transcription: %s", exc)
                raise MediaRefused(f"I could not transcribe that: {exc}") from None

        return Transcriber(transcribe, settings.max_seconds, settings.max_megabytes * 1_000_000)

    def windows(self) -> ContextWindows:
        """The chat model's context window, shared by every agent of this app: its server is asked once per
        process (at the first turn), and an overflow one agent meets lowers it for all."""
        if self._windows is None:
            self._windows = self.provider().context_windows(self.config.agents.defaults.context_window)
        return self._windows

    async def start_mcp(self) -> McpServers:
        """Start the MCP servers of `tools.mcp` (once per process), so their tools join every agent's. A server
        that fails is logged and shown by /status, never raised. Chat and the bot call this before `agent`."""
        from picoclaw.tools import McpServers

        if self._mcp is None:
            self._mcp = McpServers(self.config.tools.mcp)
            await self._mcp.start()
        return self._mcp

    def _mcp_tools(self) -> Sequence[Tool]:
        if self._mcp is not None:
            return self._mcp.tools()
        if any(server.enabled for server in self.config.tools.mcp.servers.values()):
            # One code path for every front end: an agent without its configured MCP tools is a bug here,
            # never a mode in which they are silently missing.
            raise RuntimeError("MCP servers are configured: await App.start_mcp() before App.agent()")
        return ()

    def agent(self, user_key: str | None = None) -> AgentLoop:
        """The agent of the shared memory (None), or of one user's memory (memory_scope "per_user")."""
        from picoclaw.agent import AgentLoop

        extra = self._mcp_tools()  # first: MCP servers not started is the error to raise, before any other
        status = self._status_lines
        background = self.background_provider()
        if user_key is None:
            if self._shared is None:
                self._shared = AgentLoop(self.workspace, self.provider(), self._tools(self.workspace, extra),
                                         status=status, windows=self.windows(), continue_background=self._local(),
                                         allowance=self.allowance(), background=background,
                                         background_windows=self._background_windows)
            return self._shared
        loop = self._agents.get(user_key)
        if loop is None:
            workspace = self.workspace.for_user(user_key)
            loop = AgentLoop(workspace, self.provider(), self._tools(workspace, extra), status=status,
                             windows=self.windows(), continue_background=self._local(), allowance=self.allowance(),
                             background=background, background_windows=self._background_windows)
            self._agents.put(user_key, loop)
        return loop

    def _tools(self, workspace: Workspace, extra: Sequence[Tool]) -> Toolset:
        """The workspace's tools and the MCP servers', the calls `tools.approval.ask_first` names waiting for the
        user's yes (tools/approval.py)."""
        from picoclaw.tools import ApprovingTools, build_tools

        return ApprovingTools(build_tools(workspace, extra), self.config.tools.approval,
                              secrets=config_secrets(self.config))

    def _local(self) -> bool:
        """Whether the model is served on this machine or its network: only there do background calls continue the
        conversation's request (agent/cache_prefix.py); a cloud API would bill the conversation again for each."""
        return is_local_host(self.provider().api_base)

    def _status_lines(self) -> list[str]:
        """What /status adds to the agent's own lines: this worker's name, the MCP servers' states."""
        lines = [f"worker: {self.worker}"] if self.worker else []
        return lines + (self._mcp.status_lines() if self._mcp is not None else [])

    def jobs(self) -> JobStore:
        """The scheduled jobs of this workspace (`cron/jobs.json`, every scope's)."""
        from picoclaw.jobs import JobStore

        return JobStore(self.workspace.layout.jobs_path, self.workspace.tz, storage=self.storage)

    def scheduler(self, channel: Channel, *, channels: tuple[str, ...] | None = None,
                  poll_interval: float | None = None, sleep: Sleep | None = None) -> Scheduler:
        """The scheduler of jobs and the heartbeat, running agent jobs on this app's agents and handing
        what is due to `channel.deliver(session_key, text)` for the sessions of `channels` (channel names
        such as "telegram", or single session keys such as "cli:default"; by default the channel's own)."""
        from picoclaw.jobs import POLL_INTERVAL, Scheduler

        return Scheduler(self.jobs(), self.agent, channel, storage=self.storage,
                         memory_scope=self.config.channels.telegram.memory_scope,
                         channels=(channel.name,) if channels is None else channels, heartbeat=self.config.heartbeat,
                         heartbeat_path=self.workspace.layout.heartbeat_path,
                         heartbeat_runs=self.workspace.layout.memory_dir / HEARTBEAT_RUNS_FILE,
                         poll_interval=POLL_INTERVAL if poll_interval is None else poll_interval, sleep=sleep)

    def _busy(self, user_key: str) -> bool:
        agent = self._agents.peek(user_key)
        return agent is not None and (not agent.idle() or _embedding(agent))

    def _loops(self) -> list[AgentLoop]:
        return ([self._shared] if self._shared is not None else []) + self._agents.values()

    async def write_waiting(self) -> None:
        """Write what this process holds back to share a write (the calls' counts, the agents' turn metrics), for
        a page that shows them: the console's stats."""
        import asyncio

        await self.allowance().drain()
        for loop in self._loops():
            await asyncio.to_thread(loop.metrics.flush)

    async def aclose(self) -> None:
        """Let background work (summaries …) finish, then stop the MCP servers and close the model client,
        indexes and embedder."""
        for loop in self._loops():
            await loop.wait_background()
        if self._allowance is not None:  # the counts of calls made outside an agent (`memory eval`)
            await self._allowance.drain()
        if self._mcp is not None:
            await self._mcp.aclose()
        for client in (self._provider, self._transcription, self._background):
            if client is not None:
                await client.aclose()
        self._provider = self._transcription = self._background = None
        # The embedder's close waits for its own thread's loop. The executor stays: the loop may still use it, and
        # shuts it down itself as it closes.
        import asyncio

        await asyncio.to_thread(self._close_parts)

    def close(self) -> None:
        """Close what needs no event loop: the indexes' databases, the embedding model, the storage, and the
        executor's threads."""
        self._close_parts()
        if self.executor is not None:
            # Not waited for: a storage call still under way ends within its bound, and the interpreter joins it.
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.executor = self._executor_loop = None

    def _close_parts(self) -> None:
        for loop in self._loops():
            loop.workspace.close()
        self.workspace.close()
        if self.embedder is not None:
            self.embedder.close()
        self._close_storage()

    def _close_storage(self) -> None:
        self.storage.close()

    async def __aenter__(self) -> App:
        self.use_threads()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _embedding(agent: AgentLoop) -> bool:
    """Whether the agent's memory index is still embedding: closing it then would cut the work short."""
    if not agent.workspace.config.memory.index.enabled:
        return False
    from picoclaw.memory import index_of

    index = index_of(agent.workspace.searcher)
    return index is not None and index.embedding


def config_secrets(config: Config) -> list[str]:
    """The keys and tokens config.json (or the environment) holds: never shown in an approval request."""
    secrets = [config.api_key_for(name) for name in config.providers]
    search = config.tools.web.search
    return [s for s in secrets + [config.telegram_token(), search.api_key if search else ""] if s]


def _configured_provider(config: Config) -> OpenAICompatProvider:
    from picoclaw.providers import from_config

    return from_config(config)


def build_embedder(config: Config) -> Embedder | None:
    """The embedder `memory.index.embeddings` asks for; None for keyword-only search (or no index)."""
    settings = config.memory.index.embeddings
    if settings is None or not config.memory.index.enabled:
        return None
    # Imported only when asked for: the index brings numpy (and, for local embeddings, torch) with it.
    from picoclaw.memory import (
        DEFAULT_LOCAL_MODEL,
        LOCAL,
        REMOTE_RETRIES,
        REMOTE_TIMEOUT,
        E5Embedder,
        LocalEmbedder,
        OpenAICompatEmbedder,
    )
    from picoclaw.providers import from_config

    if settings.provider == LOCAL:
        if settings.model in ("", DEFAULT_LOCAL_MODEL):
            return E5Embedder()
        return LocalEmbedder(settings.model, settings.batch_size)
    return OpenAICompatEmbedder(settings, lambda: from_config(config, settings.provider, timeout=REMOTE_TIMEOUT,
                                                              max_retries=REMOTE_RETRIES))
