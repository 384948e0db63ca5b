"""MCP tools: the tools of Model Context Protocol servers (config `tools.mcp.servers`), offered to the model.

Built on the official `mcp` SDK's `Client` (stdio or streamable HTTP; the SDK does the protocol). Each server's
connection lives in a task of its own, because the SDK's context managers hold anyio task groups that must be
entered and left by one task; tool calls from any turn go through that connection. A server that cannot
start, times out or dies is one log line and a `failed` state (shown by /status and `picoclaw mcp list`); its
tools then answer the model with an error, and every other tool keeps working.

An idle server's death is noticed without waiting for the next call: the task watches the end of the
transport's read side (a stdio server's stdout reaching EOF), and, since an HTTP server holds nothing open
between requests, asks an HTTP server for its tools every PROBE_INTERVAL seconds while no call is running.

A call that times out is cancelled: the SDK sends MCP's `notifications/cancelled` (over streamable HTTP it
aborts the request's POST), so a server that honours it is free for the next call. Text a server sends
back in errors (an HTTP error page, an exception quoting a URL) may carry the credentials picoclaw sent it:
its configured headers, env values and URL credentials are redacted from every error before it is cut.

The SDK is imported only when a server starts, so commands without MCP servers do not pay for it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import logging
import os
import re
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TextIO
from urllib.parse import parse_qsl, unquote, urlsplit

import orjson
from pydantic import BaseModel, ConfigDict

from picoclaw.config import McpConfig, McpServerConfig
from picoclaw.secrets import excerpt, redact
from picoclaw.tools.base import Tool, ToolError

if TYPE_CHECKING:
    import httpx2
    from mcp import Client
    from mcp.types import CallToolResult, ContentBlock
    from mcp.types import Tool as ListedTool

log = logging.getLogger(__name__)

PREFIX = "mcp__"
# OpenAI-compatible APIs take function names of at most 64 characters from this set.
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_RESULT_CHARS = 50_000  # as read_file: one call must not fill the context window
# Once asked to stop, a server gets this long to exit before its task is cancelled (the SDK then kills it).
STOP_GRACE = 10.0
# How often an idle HTTP server is asked for its tools to see that it is still there (see the module docstring).
PROBE_INTERVAL = 30.0
# A call that saw the connection close waits this long for the connection's task to say why it closed.
SETTLE_WAIT = 5.0
# The most characters of a server's own words (an error message, an HTTP error page) in a reason or error.
REASON_CHARS = 200

State = Literal["disabled", "starting", "ready", "failed", "stopped"]


def tool_name(server: str, tool: str) -> str:
    """The name the model sees: mcp__<server>__<tool>, with characters models refuse replaced by "_"."""
    return f"{PREFIX}{server}__{re.sub(r'[^A-Za-z0-9_-]', '_', tool)}"


@dataclass(frozen=True)
class ListedMcpTool:
    """One tool a server offers, as registered: the model's name for it, the server's name, its schema."""

    name: str
    remote_name: str
    description: str
    parameters: dict[str, Any]


class McpServer:
    """One configured server: its state, its tools, and (when ready) the connection its task holds."""

    def __init__(self, name: str, config: McpServerConfig, probe_interval: float = PROBE_INTERVAL):
        self.name = name
        self.config = config
        self.probe_interval = probe_interval
        self.state: State = "disabled" if not config.enabled else "starting"
        self.reason = ""  # why it failed, or a note on a ready server (an allow-listed tool it lacks)
        self.tools: list[ListedMcpTool] = []
        self._client: Client | None = None
        self._ready = asyncio.Event()
        self._stopping = False
        self._wake = asyncio.Event()  # stop(), or the end of the transport's read side: the server is gone
        self._settled = asyncio.Event()  # set once a failure is recorded or the connection's task has ended
        self._calls = 0  # calls in flight; the liveness check waits for none (a call finds a dead server itself)
        self._http_error = ""  # the last HTTP error status of a POST, which the SDK's errors leave out
        self._abandoned = ""  # a call that timed out, while the server has answered nothing since
        self._secrets = server_secrets(config)
        self._task: asyncio.Task[None] | None = None

    def describe(self) -> str:
        """Where the server is: its program and how many arguments, or its URL without credentials or query;
        arguments and queries may carry tokens, and this is printed by `picoclaw mcp list`."""
        if self.config.command is not None:
            program, *arguments = self.config.command
            return f"stdio: {program} + {len(arguments)} argument" + ("" if len(arguments) == 1 else "s")
        assert self.config.url is not None  # the config allows exactly one of command and url
        parts = urlsplit(self.config.url)
        return (f"http: {parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"
                + ("?…" if parts.query else ""))

    def status(self) -> str:
        """The state as one phrase: "ready, 3 tools", "failed: why", "disabled"."""
        if self.state == "ready":
            count = f"{len(self.tools)} tool" + ("" if len(self.tools) == 1 else "s")
            return f"ready, {count}" + (f" ({self.reason})" if self.reason else "")
        if self.state == "failed":
            return f"failed: {self.reason}"
        return self.state

    async def start(self) -> None:
        """Connect and list the tools, within the configured timeout; a failure is recorded, never raised."""
        if self.state != "starting":
            return
        self._task = asyncio.create_task(self._hold(), name=f"mcp server {self.name}")
        try:
            await asyncio.wait_for(self._ready.wait(), self.config.timeout)
        except TimeoutError:
            self._fail(f"no answer within {self.config.timeout:g} s while starting")
            self._task.cancel()  # the SDK's exits then stop the process or close the HTTP session

    async def _hold(self) -> None:
        """The connection's own task: open it, list the tools, then keep it open until stop() or its end."""
        from mcp import Client

        try:
            async with Client(_watched(self._transport(), self._wake.set),
                              read_timeout_seconds=self.config.timeout) as client:
                self._accept(await _list_tools(client))
                self._client = client
                self._ready.set()
                gone = await self._watch(client)
                if gone:  # recorded before the SDK's teardown, so a call that saw the close finds the reason
                    self._fail(gone)
        except Exception as exc:  # any failure of one server is contained: recorded and logged, not raised
            # An HTTP request that cannot reach the server ends the SDK's transport and this task with it.
            self._fail(self._reason(exc))
        finally:
            self._client = None
            if self.state == "ready":
                self.state = "stopped"
            self._ready.set()
            self._settled.set()

    async def _watch(self, client: Client) -> str:
        """Wait for stop() or for the server to go away: "" when asked to stop, else why it is gone."""
        # stdio needs no check: a server that exits closes its stdout, and the read side's end wakes this.
        interval = self.probe_interval if self.config.url is not None else None
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), interval)
            except TimeoutError:
                if self._calls == 0:  # a single-threaded server may not answer during a call
                    gone = await self._probe(client)
                    if gone:
                        return gone
                continue
            if self._stopping:
                return ""
            return self._reason_closed()

    async def _probe(self, client: Client) -> str:
        """Ask for the tools, bypassing the SDK's cache: "" when the server answers, else why it does not."""
        # Not a ping: the 2026-07-28 protocol dropped it, and every server answers tools/list.
        from mcp import MCPError
        from mcp.types import REQUEST_TIMEOUT

        try:
            await client.list_tools(cache_mode="bypass")
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                return f"no answer within {self.config.timeout:g} s to a check that it is still there"
            return self._reason(exc)
        return ""

    def _transport(self) -> Any:
        from mcp import StdioServerParameters, stdio_client

        if self.config.command is not None:
            program, *arguments = self.config.command
            parameters = StdioServerParameters(command=program, args=arguments, env=self.config.env or None)
            return stdio_client(parameters, errlog=_server_stderr())
        assert self.config.url is not None  # the config allows exactly one of command and url
        return _http_transport(self.config.url, self.config.headers, self._note_response)

    async def _note_response(self, response: httpx2.Response) -> None:
        """Keep the status of a failed POST: the SDK turns it into an error without the status."""
        if response.request.method == "POST":
            # Concurrent requests can interleave here; the status is a hint in a message, not a decision.
            failed = response.status_code >= 400
            self._http_error = f"{response.status_code} {response.reason_phrase}".strip() if failed else ""

    def _accept(self, listed: list[ListedTool]) -> None:
        allowed = self.config.tools
        offered = {tool.name for tool in listed}
        tools: dict[str, ListedMcpTool] = {}
        for tool in listed:
            if allowed is not None and tool.name not in allowed:
                continue
            name = tool_name(self.name, tool.name)
            if not TOOL_NAME.match(name) or name in tools:
                log.warning("MCP server %s: tool %r left out: its name %r is too long or clashes with another",
                            self.name, tool.name, name)
                continue
            tools[name] = ListedMcpTool(name, tool.name, tool.description or f"{tool.name} (MCP server {self.name})",
                                        dict(tool.input_schema))
        self.tools = [tools[name] for name in sorted(tools)]
        missing = sorted(set(allowed or ()) - offered)
        if missing:  # an allow-list entry that matches nothing must not be silent
            self.reason = f"not offered by the server: {', '.join(missing)}"
            log.warning("MCP server %s: tools in its allow-list that it does not offer: %s",
                        self.name, ", ".join(missing))
        self.state = "ready"

    def _fail(self, reason: str) -> None:
        self._settled.set()
        if self.state == "failed":
            return
        self.state, self.reason = "failed", self._said(reason)  # one line, whatever the exception said
        log.warning("MCP server %s failed: %s", self.name, self.reason)

    def _said(self, text: str) -> str:
        """`text` from or about the server as one line: its credentials redacted, then cut to REASON_CHARS."""
        return excerpt(text, REASON_CHARS, self._secrets)

    def _reason_closed(self) -> str:
        if self.config.command is not None:
            return "the server closed the connection (it exited; its own output may say why)"
        return "the HTTP connection closed (the server stopped or dropped it)"

    def _reason(self, exc: BaseException) -> str:
        """A one-line reason for a failure, in the words of the server's transport, from the innermost
        exception of the SDK's exception groups; the server's credentials redacted, then cut."""
        return self._said(self._raw_reason(exc))

    def _raw_reason(self, exc: BaseException) -> str:
        import httpx2
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED, PARSE_ERROR

        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        if isinstance(exc, OSError) and self.config.command is not None:
            why = "program not found" if isinstance(exc, FileNotFoundError) else (exc.strerror or str(exc))
            return f"cannot run {self.config.command[0]!r}: {why}"
        if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED:
            return self._reason_closed()
        if isinstance(exc, MCPError) and exc.code == PARSE_ERROR:
            # The SDK quotes the page in pydantic's words, already cut (maybe inside a credential): not shown.
            return "the server's answer is not MCP (JSON-RPC) at all"
        if isinstance(exc, MCPError) and self._http_error:
            return self._http_status(self._http_error, exc.message)
        if isinstance(exc, MCPError):
            return exc.message
        if isinstance(exc, httpx2.HTTPStatusError):
            return self._http_status(f"{exc.response.status_code} {exc.response.reason_phrase}".strip(), "")
        if isinstance(exc, httpx2.ConnectError):
            return f"cannot reach the server: {str(exc) or type(exc).__name__}"
        if isinstance(exc, httpx2.TimeoutException):
            return f"the HTTP request timed out ({type(exc).__name__})"
        if isinstance(exc, httpx2.TransportError):
            return f"the HTTP connection broke ({type(exc).__name__}: {exc})"
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

    @staticmethod
    def _http_status(status: str, message: str) -> str:
        # The SDK's stand-ins for a status ("Not Found", "Server returned an error response") add nothing to it.
        detail = "" if message in status or message == "Server returned an error response" else f": {message}"
        hint = {"401": " (check its headers)", "403": " (check its headers)", "404": " (check its url)"}
        return f"the server answered HTTP {status}{detail}{hint.get(status[:3], '')}"

    async def call(self, tool: ListedMcpTool, arguments: dict[str, Any]) -> str:
        """Run `tool` with `arguments`; the text of its result, or ToolError with what went wrong."""
        import anyio
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        client = self._client
        if self.state != "ready" or client is None:
            raise ToolError(f"MCP server {self.name} is not available ({self.status()}); "
                            f"{tool.name} cannot run now")
        self._calls += 1
        timeout = self.config.timeout
        try:
            result = await client.call_tool(tool.remote_name, arguments, read_timeout_seconds=timeout)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                # The connection's task knows best why (an HTTP error, an exited program): let it say first.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._settled.wait(), SETTLE_WAIT)
                self._fail(self._reason(exc))
                raise ToolError(f"MCP server {self.name} stopped during the call: {self.reason}") from None
            if exc.code == REQUEST_TIMEOUT:
                raise self._timed_out(tool, timeout) from None
            self._abandoned = ""  # it answered
            raise ToolError(f"{tool.name}: the server refused the call: {self._reason(exc)}") from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            self._fail(f"the connection broke ({type(exc).__name__})")
            raise ToolError(f"MCP server {self.name} stopped during the call: {self.reason}") from None
        except Exception as exc:  # e.g. a result that breaks the protocol: this call fails, the server stays
            log.warning("MCP server %s: %s failed: %s", self.name, tool.remote_name, self._reason(exc))
            raise ToolError(f"{tool.name} failed: {self._reason(exc)}") from None
        finally:
            self._calls -= 1
        self._abandoned = ""
        if result.is_error:
            raise ToolError(result_text(result, self._secrets))
        return result_text(result)

    def _timed_out(self, tool: ListedMcpTool, timeout: float) -> ToolError:
        """The error for a call that got no answer in time; the SDK has already sent the cancellation."""
        earlier, self._abandoned = self._abandoned, tool.name
        log.warning("MCP server %s: %s timed out after %g s; the call was cancelled", self.name,
                    tool.remote_name, timeout)
        # A server that does not stop cancelled work (or serves one call at a time) may still be on an earlier one.
        busy = (f"; the server may still be busy with {earlier}, which timed out before it (the server may not "
                f"stop cancelled calls)") if earlier else ""
        return ToolError(f"{tool.name} timed out after {timeout:g} s; the call was cancelled (the server was "
                         f"asked to stop it){busy}")

    async def stop(self) -> None:
        """Close the connection (the SDK stops a stdio server's process) and wait for the task to end."""
        self._stopping = True
        self._wake.set()
        task = self._task
        if task is None or task.done():
            return
        await asyncio.wait({task}, timeout=STOP_GRACE)
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # a task cancelled at a start-up timeout ends here


class McpTool(Tool):
    """A tool of an MCP server; one small subclass per listed tool (see `make_tool`)."""

    parameters: dict[str, Any]

    class Args(BaseModel):
        # The server's JSON schema is the contract and the server checks it; here every key passes through.
        model_config = ConfigDict(extra="allow")

    def __init__(self, server: McpServer, listed: ListedMcpTool):
        self.server = server
        self.listed = listed

    @classmethod
    def schema(cls) -> dict[str, Any]:
        return {"type": "function", "function": {"name": cls.name, "description": cls.description,
                                                  "parameters": cls.parameters}}

    async def run(self, args: Any) -> str:
        return await self.server.call(self.listed, dict(args.model_extra or {}))


def make_tool(server: McpServer, listed: ListedMcpTool) -> Tool:
    """A registry Tool for `listed`: name, description and schema are class attributes, as for built-in tools."""
    # A class per tool because the registry reads them from the class; the server's schema is used as is.
    attributes = {"name": listed.name, "description": listed.description, "parameters": listed.parameters}
    cls = type(f"McpTool_{listed.name}", (McpTool,), attributes)
    return cls(server, listed)


class McpServers:
    """Every configured server: started together, their tools offered to every agent, stopped together."""

    def __init__(self, config: McpConfig):
        self.servers = [McpServer(name, settings) for name, settings in sorted(config.servers.items())]
        self.started = False
        self._tools: list[Tool] = []

    async def start(self) -> None:
        """Start every enabled server at once; each failure is logged and recorded, none raises."""
        if self.started:
            return
        self.started = True
        await asyncio.gather(*(server.start() for server in self.servers))
        # Built once per process and sorted by name, so the tool list (a prefix of every request) never changes.
        made = [make_tool(server, listed) for server in self.servers for listed in server.tools]
        self._tools = sorted(made, key=lambda tool: tool.name)

    def tools(self) -> Sequence[Tool]:
        """The tools of the servers that started, sorted by name (the same objects on every call)."""
        return self._tools

    def status_lines(self) -> list[str]:
        """One line per server for /status: "MCP files: ready, 3 tools"."""
        return [f"MCP {server.name}: {server.status()}" for server in self.servers]

    async def aclose(self) -> None:
        """Stop every server."""
        await asyncio.gather(*(server.stop() for server in self.servers))


# -- helpers -------------------------------------------------------------------------------------------------


async def _list_tools(client: Client) -> list[ListedTool]:
    """Every tool, following the server's pages."""
    tools: list[ListedTool] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            return tools


def result_text(result: CallToolResult, secrets: Sequence[str] = ()) -> str:
    """The text the model gets: text blocks joined, a short note for each block it cannot read; `secrets`
    redacted (before the text is cut)."""
    parts = [_block_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts.append(orjson.dumps(result.structured_content).decode("utf-8"))
    text = redact("\n".join(parts), secrets) if parts else "(the tool returned nothing)"
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[truncated: {len(text) - MAX_RESULT_CHARS:,} more characters]"
    return text


def _block_text(block: ContentBlock) -> str:
    from mcp.types import EmbeddedResource, ResourceLink, TextContent, TextResourceContents

    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, EmbeddedResource):
        resource = block.resource
        if isinstance(resource, TextResourceContents):
            return resource.text
        return f"[binary resource {resource.uri} not shown]"
    if isinstance(block, ResourceLink):
        return f"[resource: {block.uri}]"
    return f"[{block.type} content not shown]"  # image, audio


def server_secrets(config: McpServerConfig) -> list[str]:
    """What picoclaw sends a server that must never come back out in an error: header values (and the token
    after a scheme such as "Bearer"), env values, and the URL's password, basic credentials and query values."""
    secrets = [*config.env.values()]
    for value in config.headers.values():
        secrets += [value, *value.split()]
    if config.url is not None:
        parts = urlsplit(config.url)
        if parts.password:
            password, user = unquote(parts.password), unquote(parts.username or "")
            # httpx sends URL credentials as basic auth, which an error page may quote.
            secrets += [password, base64.b64encode(f"{user}:{password}".encode()).decode("ascii")]
        secrets += [value for _, value in parse_qsl(parts.query)]
    return secrets


@functools.cache
def _devnull() -> TextIO:
    return open(os.devnull, "w", encoding="utf-8")  # kept open: every stdio server of the process may use it


def _server_stderr() -> TextIO:
    """Where a stdio server's own stderr goes: picoclaw's stderr, where it explains a failed start. The child
    needs a real file descriptor, which a replaced sys.stderr (captured output) may not have."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (OSError, ValueError):
            continue
    return _devnull()


@asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str],
                          on_response: Callable[[httpx2.Response], Any]) -> AsyncIterator[Any]:
    """Streamable HTTP with the configured headers, on the SDK's own HTTP client (its timeouts for long-lived
    streams), every response shown to `on_response`; the client is closed with the transport (the SDK closes
    only a client it made itself)."""
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = create_mcp_http_client(headers=headers or None)
    http.event_hooks = {"response": [on_response]}
    async with http, streamable_http_client(url, http_client=http) as streams:
        yield streams


@asynccontextmanager
async def _watched(transport: Any, on_end: Callable[[], None]) -> AsyncIterator[Any]:
    """`transport` (an SDK Transport), its read side calling `on_end` when it ends: the server went away."""
    async with transport as (read_stream, write_stream):
        yield _EndWatch(read_stream, on_end), write_stream


class _EndWatch:
    """A transport's read stream, passed through; `on_end` is called when it ends (EOF or closed under it).
    The SDK offers no event for the end of a connection, and its Transport protocol lets one wrap the streams."""

    def __init__(self, inner: Any, on_end: Callable[[], None]):
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self) -> Any:  # the SDK reads the sender's context from HTTP streams through this
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        import anyio

        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    def __aiter__(self) -> _EndWatch:
        return self

    async def __anext__(self) -> Any:
        import anyio

        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _EndWatch:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
