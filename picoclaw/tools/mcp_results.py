"""What comes back from an MCP server, put into words: a tool's result as the text the model gets, and a
failure as the one-line reason that /status, the log and the model see (in the words of its transport).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import orjson

from picoclaw.config import McpServerConfig
from picoclaw.redact import redact

if TYPE_CHECKING:
    from mcp.types import CallToolResult, ContentBlock

__all__ = ["MAX_RESULT_CHARS", "closed_reason", "failure_reason", "result_text"]

MAX_RESULT_CHARS = 50_000  # as read_file: one call must not fill the context window


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


def closed_reason(config: McpServerConfig) -> str:
    """Why a server's connection closed, as far as picoclaw can tell."""
    if config.command is not None:
        return "the server closed the connection (it exited; its own output may say why)"
    return "the HTTP connection closed (the server stopped or dropped it)"


def failure_reason(exc: BaseException, config: McpServerConfig, http_error: str = "") -> str:
    """A one-line reason for a failure, from the innermost exception of the SDK's exception groups, not yet
    redacted nor cut. `http_error` is the status of the last failed POST, which the SDK's errors leave out."""
    import httpx2
    from mcp import MCPError
    from mcp.types import CONNECTION_CLOSED, PARSE_ERROR

    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, OSError) and config.command is not None:
        why = "program not found" if isinstance(exc, FileNotFoundError) else (exc.strerror or str(exc))
        return f"cannot run {config.command[0]!r}: {why}"
    if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED:
        return closed_reason(config)
    if isinstance(exc, MCPError) and exc.code == PARSE_ERROR:
        # The SDK quotes the page in pydantic's words, already cut (maybe inside a credential): not shown.
        return "the server's answer is not MCP (JSON-RPC) at all"
    if isinstance(exc, MCPError) and http_error:
        return _http_status(http_error, exc.message)
    if isinstance(exc, MCPError):
        return exc.message
    if isinstance(exc, httpx2.HTTPStatusError):
        return _http_status(f"{exc.response.status_code} {exc.response.reason_phrase}".strip(), "")
    if isinstance(exc, httpx2.ConnectError):
        return f"cannot reach the server: {str(exc) or type(exc).__name__}"
    if isinstance(exc, httpx2.TimeoutException):
        return f"the HTTP request timed out ({type(exc).__name__})"
    if isinstance(exc, httpx2.TransportError):
        return f"the HTTP connection broke ({type(exc).__name__}: {exc})"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _http_status(status: str, message: str) -> str:
    # The SDK's stand-ins for a status ("Not Found", "Server returned an error response") add nothing to it.
    detail = "" if message in status or message == "Server returned an error response" else f": {message}"
    hint = {"401": " (check its headers)", "403": " (check its headers)", "404": " (check its url)"}
    return f"the server answered HTTP {status}{detail}{hint.get(status[:3], '')}"
