"""A small MCP server for the tests, written with the official SDK's server side (MCPServer, once FastMCP).

Run over stdio: `python tests/fakes/mcp_server.py`. Run over streamable HTTP on 127.0.0.1:
`python tests/fakes/mcp_server.py --http`; it binds a free port itself and prints `PORT <n>` on stdout, so
there is no race for the port between picking it and binding it. `--header NAME=VALUE` makes the HTTP
server refuse requests without that header (for the `headers` setting). `--start-delay SECONDS` makes it
slow to start: it reads nothing for that long first (a server with a slow start-up).

The server has one worker for the tools that need it (`block`, `stubborn`, `queued`), as many real servers
serve one call at a time: `block` holds it until the call is cancelled (MCP's `notifications/cancelled`),
`stubborn` until `release` is called, whatever the client says; `queued` answers once the worker is free.
Over HTTP a gateway stands in front of the server, as a proxy would: every request under /broken-gateway,
and a call of the tool `through_gateway`, gets its 502 error page, which quotes the request's Authorization
header and query (where credentials are).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from typing import TYPE_CHECKING

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

server = MCPServer("picoclaw-test", log_level="WARNING")
worker = anyio.Lock()  # the one worker of `block`, `stubborn` and `queued`
released = anyio.Event()  # set by `release`: `stubborn` then lets the worker go
cancelled: list[str] = []  # calls that were cancelled while holding the worker


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
async def block() -> str:
    """Hold the server's one worker until this call is cancelled (it never answers otherwise)."""
    async with worker:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append("block")
            raise
    return "not reached"


@server.tool()
async def stubborn() -> str:
    """Hold the server's one worker until `release` is called, ignoring cancellation (as a server that does
    not honour it would)."""
    async with worker:
        with anyio.CancelScope(shield=True):
            await released.wait()
    return "released"


@server.tool()
def release() -> str:
    """Let `stubborn` finish (this needs no worker: it answers while the worker is busy)."""
    released.set()
    return "released"


@server.tool()
async def queued(text: str) -> str:
    """Say the text back once the server's one worker is free, with the calls cancelled so far."""
    async with worker:
        return f"{text} (cancelled before: {', '.join(cancelled) or 'none'})"


@server.tool()
def fail_env(name: str) -> str:
    """Fail with an error quoting the environment variable `name` (a server whose errors carry its keys)."""
    raise ToolError(f"the upstream refused the key {os.environ.get(name, '')!r}; check {name}")


@server.tool()
def through_gateway() -> str:
    """Never reached over HTTP: the gateway in front answers this call with its error page."""
    return "not reached"


@server.tool()
def pid() -> str:
    """The server's process id (so a test can end the server between calls, as a crash or the OOM killer would)."""
    return str(os.getpid())


@server.tool()
def crash() -> str:
    """End the server process at once, mid-call (a server that dies under the client)."""
    os._exit(3)


def gateway_page(scope: Scope) -> bytes:
    """A proxy's 502 page, in JSON-RPC as the SDK reads it, quoting (well into its text) the request's
    Authorization header and query."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    query = scope.get("query_string", b"").decode("latin-1")
    message = (f"Bad gateway: upstream http://10.0.0.7:8080/mcp did not answer within 30 s; request was "
               f"{scope['method']} {scope['path']}{'?' + query if query else ''} with Authorization: "
               f"{headers.get('authorization', '(none)')}, Accept: application/json; retry later")
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32603, "message": message}}).encode()


def behind_gateway(app: ASGIApp) -> ASGIApp:
    """`app` behind a gateway that answers /broken-gateway and calls of `through_gateway` with its 502 page."""
    async def gateway(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        body, more = b"", True
        while more:  # read the whole request, to see which tool it calls, then hand it on as it came
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        try:
            request = json.loads(body) if body else {}
        except ValueError:
            request = {}
        called = isinstance(request, dict) and request.get("method") == "tools/call" and \
            (request.get("params") or {}).get("name") == "through_gateway"
        if scope["path"].startswith("/broken-gateway") or called:
            await send({"type": "http.response.start", "status": 502,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": gateway_page(scope)})
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, replay, send)

    return gateway


def serve_http(required_header: str | None) -> None:
    """Streamable HTTP on 127.0.0.1 at a port the OS picks, behind the gateway; the port goes to stdout."""
    import uvicorn

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
    app = behind_gateway(app)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    # Listening before the port is said: a client may connect at once (uvicorn starts serving later, and a
    # connection before listen() was refused: the test that read the line then failed on a busy machine).
    sock.listen(128)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    anyio.run(lambda: uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--header")
    parser.add_argument("--start-delay", type=float, default=0.0)
    options = parser.parse_args()
    time.sleep(options.start_delay)
    if options.http:
        serve_http(options.header)
    else:
        server.run()
