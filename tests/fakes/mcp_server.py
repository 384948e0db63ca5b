"""A small MCP server for the tests, written with the official SDK's server side (MCPServer, once FastMCP).

Run over stdio: `python tests/fakes/mcp_server.py`. Run over streamable HTTP on 127.0.0.1:
`python tests/fakes/mcp_server.py --http`; it binds a free port itself and prints `PORT <n>` on stdout, so
there is no race for the port between picking it and binding it. `--header NAME=VALUE` makes the HTTP
server refuse requests without that header (for the `headers` setting).
"""

from __future__ import annotations

import argparse
import os
import socket
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent

server = MCPServer("picoclaw-test", log_level="WARNING")


@server.tool()
def echo(text: str, times: int = 1) -> str:
    """Say the text back, `times` times."""
    return " ".join([text] * times)


@server.tool()
def add(a: int, b: int) -> str:
    """Add two whole numbers."""
    return str(a + b)


@server.tool()
def picture(caption: str) -> list[TextContent | ImageContent]:
    """A caption and a tiny image."""
    return [TextContent(text=caption), ImageContent(data="iVBORw0KGgo=", mime_type="image/png")]


@server.tool()
def fail(reason: str) -> str:
    """Always fails with `reason` (the SDK's ToolError: the client gets isError and this text)."""
    raise ToolError(reason)


@server.tool()
def sleep(seconds: float) -> str:
    """Wait, then answer."""
    time.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def pid() -> str:
    """The server's process id (so a test can end the server between calls, as a crash or the OOM killer would)."""
    return str(os.getpid())


@server.tool()
def crash() -> str:
    """End the server process at once, mid-call (a server that dies under the client)."""
    os._exit(3)


def serve_http(required_header: str | None) -> None:
    """Streamable HTTP on 127.0.0.1 at a port the OS picks; the port goes to stdout."""
    import anyio
    import uvicorn
    from starlette.types import ASGIApp, Receive, Scope, Send

    app: ASGIApp = server.streamable_http_app()
    if required_header:
        name, _, value = required_header.partition("=")
        inner = app

        async def checked(scope: Scope, receive: Receive, send: Send) -> None:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            if scope["type"] == "http" and headers.get(name.lower()) != value:
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"missing header"})
                return
            await inner(scope, receive, send)

        app = checked
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    anyio.run(lambda: uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--header")
    options = parser.parse_args()
    if options.http:
        serve_http(options.header)
    else:
        server.run()
