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

A server gets MIN_START_TIMEOUT seconds to start even when its `timeout` is shorter: that setting is each
call's limit, and starting a program (a Python server spends a second or more importing the SDK on a busy
machine) is another matter. A longer `timeout` is the start-up limit too.

The SDK is imported only when a server starts, so commands without MCP servers do not pay for it. How a
server is reached is `mcp_transport.py`; how its results and failures read is `mcp_results.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from picoclaw.config import McpConfig, McpServerConfig
from picoclaw.redact import excerpt
from picoclaw.tools.base import Tool, ToolError
from picoclaw.tools.mcp_results import closed_reason, failure_reason, result_text
from picoclaw.tools.mcp_transport import open_transport, server_secrets, watched

if TYPE_CHECKING:
    import httpx2
    from mcp import Client
    from mcp.types import Tool as ListedTool

log = logging.getLogger(__name__)

PREFIX = "mcp__"
# OpenAI-compatible APIs take function names of at most 64 characters from this set.
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# The least time a server gets to start (run, connect, list its tools), however short its call timeout; the
# default timeout, so a server with the default is not affected.
MIN_START_TIMEOUT = 30.0
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

    def __init__(self, name: str, config: McpServerConfig, probe_interval: float = PROBE_INTERVAL,
                 start_timeout: float | None = None):
        self.name = name
        self.config = config
        self.probe_interval = probe_interval
        # Calls keep `config.timeout`; starting gets at least MIN_START_TIMEOUT (see the module docstring).
        self.start_timeout = max(config.timeout, MIN_START_TIMEOUT) if start_timeout is None else start_timeout
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
        """Connect and list the tools, within `start_timeout`; a failure is recorded, never raised."""
        if self.state != "starting":
            return
        self._task = asyncio.create_task(self._hold(), name=f"mcp server {self.name}")
        try:
            await asyncio.wait_for(self._ready.wait(), self.start_timeout)
        except TimeoutError:
            self._fail(f"no answer within {self.start_timeout:g} s while starting")
            self._task.cancel()  # the SDK's exits then stop the process or close the HTTP session

    async def _hold(self) -> None:
        """The connection's own task: open it, list the tools, then keep it open until stop() or its end."""
        from mcp import Client

        try:
            # The client's own timeout covers the handshake and the listing; calls and checks pass their own.
            async with Client(watched(open_transport(self.config, self._note_response), self._wake.set),
                              read_timeout_seconds=self.start_timeout) as client:
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
            return closed_reason(self.config)

    async def _probe(self, client: Client) -> str:
        """Ask for the tools, bypassing the SDK's cache: "" when the server answers, else why it does not."""
        # Not a ping: the 2026-07-28 protocol dropped it, and every server answers tools/list. Sent through the
        # session, which takes a timeout per request (the client's is the longer start-up one) and has no cache.
        from mcp import MCPError
        from mcp.types import REQUEST_TIMEOUT, ListToolsRequest, ListToolsResult

        try:
            await client.session.send_request(ListToolsRequest(), ListToolsResult,
                                              request_read_timeout_seconds=self.config.timeout)
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                return f"no answer within {self.config.timeout:g} s to a check that it is still there"
            return self._reason(exc)
        return ""

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

    def _reason(self, exc: BaseException) -> str:
        """A one-line reason for a failure, in the words of the server's transport, from the innermost
        exception of the SDK's exception groups; the server's credentials redacted, then cut."""
        return self._said(failure_reason(exc, self.config, self._http_error))

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
