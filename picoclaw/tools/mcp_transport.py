"""How picoclaw reaches an MCP server: a program it runs (stdio) or a URL (streamable HTTP), with the end of the
connection watched, and what it sends a server that must never come back out in an error.

The SDK is imported only when a transport is opened, so commands without MCP servers do not pay for it.
"""

from __future__ import annotations

import base64
import functools
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import parse_qsl, unquote, urlsplit

from picoclaw.config import McpServerConfig

if TYPE_CHECKING:
    import httpx2

__all__ = ["HTTP_READ_TIMEOUT", "HTTP_TIMEOUT", "open_transport", "server_secrets", "watched"]

# The MCP SDK's recommended timeouts for the HTTP client it makes itself (a server may hold a response stream
# open for minutes); ours is made here, to carry the configured headers, with the same ones.
HTTP_TIMEOUT = 30.0
HTTP_READ_TIMEOUT = 300.0


def open_transport(config: McpServerConfig, on_response: Callable[[httpx2.Response], Any]) -> Any:
    """The SDK Transport for `config`: its program over stdio, or its URL over streamable HTTP, every HTTP
    response shown to `on_response`."""
    from mcp import StdioServerParameters, stdio_client

    if config.command is not None:
        program, *arguments = config.command
        parameters = StdioServerParameters(command=program, args=arguments, env=config.env or None)
        return stdio_client(parameters, errlog=_server_stderr())
    assert config.url is not None  # the config allows exactly one of command and url
    return _http_transport(config.url, config.headers, on_response)


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
    """Streamable HTTP with the configured headers, every response shown to `on_response`; the client is
    closed with the transport (the SDK closes only a client it made itself)."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    # The SDK's documented way to send headers: pass an httpx client of our own (its helper that makes one
    # lives in a private module). Redirects stay off, as there: the SDK follows same-origin ones itself.
    http = httpx2.AsyncClient(headers=headers or None, timeout=httpx2.Timeout(HTTP_TIMEOUT, read=HTTP_READ_TIMEOUT),
                              event_hooks={"response": [on_response]})
    async with http, streamable_http_client(url, http_client=http) as streams:
        yield streams


@asynccontextmanager
async def watched(transport: Any, on_end: Callable[[], None]) -> AsyncIterator[Any]:
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
