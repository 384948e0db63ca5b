"""MCP tools: the tools of Model Context Protocol servers (config `tools.mcp.servers`), offered to the model.

Built on the official `mcp` SDK's `Client` (stdio or streamable HTTP; the SDK does the protocol). Each server's
connection lives in a task of its own, because the SDK's context managers hold anyio task groups that must be
entered and left by one task; tool calls from any turn go through that connection. A server that cannot
start, times out or dies is one log line and a `failed` state (shown by /status and `picoclaw mcp list`); its
tools then answer the model with an error, and every other tool keeps working.

The SDK is imported only when a server starts, so commands without MCP servers do not pay for it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TextIO

import orjson
from pydantic import BaseModel, ConfigDict

from picoclaw.config import McpConfig, McpServerConfig
from picoclaw.tools.base import Tool, ToolError

if TYPE_CHECKING:
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

    def __init__(self, name: str, config: McpServerConfig):
        self.name = name
        self.config = config
        self.state: State = "disabled" if not config.enabled else "starting"
        self.reason = ""  # why it failed, or a note on a ready server (an allow-listed tool it lacks)
        self.tools: list[ListedMcpTool] = []
        self._client: Client | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def describe(self) -> str:
        """Where the server is: its command line or its URL."""
        if self.config.command is not None:
            return "stdio: " + " ".join(self.config.command)
        return f"http: {self.config.url}"

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
        """The connection's own task: open it, list the tools, then keep it open until stop()."""
        from mcp import Client

        try:
            async with Client(self._transport(), read_timeout_seconds=self.config.timeout) as client:
                self._accept(await _list_tools(client))
                self._client = client
                self._ready.set()
                await self._stop.wait()
        except Exception as exc:  # any failure of one server is contained: recorded and logged, not raised
            self._fail(_reason(exc, self.config))
        finally:
            self._client = None
            if self.state == "ready":
                self.state = "stopped"
            self._ready.set()

    def _transport(self) -> Any:
        from mcp import StdioServerParameters, stdio_client

        if self.config.command is not None:
            program, *arguments = self.config.command
            parameters = StdioServerParameters(command=program, args=arguments, env=self.config.env or None)
            return stdio_client(parameters, errlog=_server_stderr())
        assert self.config.url is not None  # the config allows exactly one of command and url
        return _http_transport(self.config.url, self.config.headers)

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
        if self.state == "failed":
            return
        self.state, self.reason = "failed", reason
        log.warning("MCP server %s failed: %s", self.name, reason)

    async def call(self, tool: ListedMcpTool, arguments: dict[str, Any]) -> str:
        """Run `tool` with `arguments`; the text of its result, or ToolError with what went wrong."""
        import anyio
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        client = self._client
        if self.state != "ready" or client is None:
            raise ToolError(f"MCP server {self.name} is not available ({self.status()}); "
                            f"{tool.name} cannot run now")
        try:
            result = await client.call_tool(tool.remote_name, arguments)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self._fail(_reason(exc, self.config))
                raise ToolError(f"MCP server {self.name} stopped during the call: {self.reason}") from None
            if exc.code == REQUEST_TIMEOUT:
                log.warning("MCP server %s: %s timed out after %g s", self.name, tool.remote_name,
                            self.config.timeout)
                raise ToolError(f"{tool.name} timed out after {self.config.timeout:g} s") from None
            raise ToolError(f"{tool.name}: the server refused the call: {exc.message}") from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            self._fail(f"the connection broke ({type(exc).__name__})")
            raise ToolError(f"MCP server {self.name} stopped during the call: {self.reason}") from None
        except Exception as exc:  # e.g. a result that breaks the protocol: this call fails, the server stays
            log.warning("MCP server %s: %s failed: %s", self.name, tool.remote_name, _reason(exc, self.config))
            raise ToolError(f"{tool.name} failed: {_reason(exc, self.config)}") from None
        text = result_text(result)
        if result.is_error:
            raise ToolError(text)
        return text

    async def stop(self) -> None:
        """Close the connection (the SDK stops a stdio server's process) and wait for the task to end."""
        self._stop.set()
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


def result_text(result: CallToolResult) -> str:
    """The text the model gets: text blocks joined, a short note for each block it cannot read."""
    parts = [_block_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts.append(orjson.dumps(result.structured_content).decode("utf-8"))
    text = "\n".join(parts) if parts else "(the tool returned nothing)"
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


def _reason(exc: BaseException, config: McpServerConfig) -> str:
    """A one-line reason for a failure, from the innermost exception of the SDK's exception groups."""
    from mcp import MCPError
    from mcp.types import CONNECTION_CLOSED

    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, OSError) and config.command is not None:
        why = "program not found" if isinstance(exc, FileNotFoundError) else (exc.strerror or str(exc))
        return f"cannot run {config.command[0]!r}: {why}"
    if isinstance(exc, MCPError):
        if exc.code == CONNECTION_CLOSED:
            return "the server closed the connection (it exited; its own output may say why)"
        return exc.message
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """Streamable HTTP with the configured headers, on the SDK's own HTTP client (its timeouts for long-lived
    streams); the client is closed with the transport (the SDK closes only a client it made itself)."""
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async with create_mcp_http_client(headers=headers or None) as http, \
            streamable_http_client(url, http_client=http) as streams:
        yield streams
