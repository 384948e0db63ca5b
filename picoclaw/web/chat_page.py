"""Chat in the browser: `web:<name>` conversations, the answer streamed in as it is written (one JSON line an
event), each tool call one line, Stop, slash commands (the agent's own), and what the scheduler delivers to the
conversation while its page is open (server-sent events)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from picoclaw.web.render import APP_KEY, render
from picoclaw.web.security import secured

if TYPE_CHECKING:
    from picoclaw.channels import WebChannel

CHANNEL_KEY: web.AppKey[list[WebChannel]] = web.AppKey("picoclaw_web_channel", list)  # made on first use
DEFAULT_NAME = "console"
MAX_MESSAGE = 20_000  # characters of one message typed in the console
HISTORY_SHOWN = 200  # messages of the conversation the page shows when it opens
KEEP_ALIVE_SECONDS = 15.0


def channel(app: web.Application) -> WebChannel:
    """The console's WebChannel, made the first time a conversation needs it (it builds the agent); a model
    that is not configured yet is one line for the page (HTTP 503), not a traceback."""
    from picoclaw.channels import WebChannel
    from picoclaw.errors import PicoclawError

    made = app[CHANNEL_KEY]
    if not made:
        try:
            made.append(WebChannel(app[APP_KEY].agent()))
        except PicoclawError as exc:
            raise web.HTTPServiceUnavailable(text=f"the chat needs a model: {exc}\n") from None
    return made[0]


def session_of(name: str) -> str:
    """`web:<name>`; HTTPBadRequest for a name a session key cannot hold."""
    from picoclaw.session_key import SessionKey

    try:
        return str(SessionKey.web(name or DEFAULT_NAME))
    except ValueError as exc:
        raise web.HTTPBadRequest(text=f"{exc}\n") from None


async def chat_page(request: web.Request) -> web.Response:
    """The conversation so far and the box to write in."""
    key = session_of(request.query.get("name", ""))
    app = request.app[APP_KEY]
    sessions = app.workspace.sessions()
    session = await asyncio.to_thread(sessions.read, sessions.path_for(key))
    shown = [(m.message.get("role"), str(m.message.get("content") or "")) for m in session.messages
             if m.message.get("role") in ("user", "assistant") and m.message.get("content")][-HISTORY_SHOWN:]
    return render(request, "chat.html", key=key, name=key.partition(":")[2], messages=shown,
                  transcript=sessions.path_for(key).name)


async def chat_turn(request: web.Request) -> web.StreamResponse:
    """Run a turn and stream its events, one JSON object a line: {"kind": "text" | "tool" | …, "text": …}."""
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        body = None
    # Strings only: str() of a null or a number would send the model the message "None" or "5".
    name, text = (body.get("name", ""), body.get("text")) if isinstance(body, dict) else (None, None)
    if not isinstance(name, str) or not isinstance(text, str):
        raise web.HTTPBadRequest(text='expected a JSON object {"name": "…", "text": "…"} (name may be left out); '
                                      "nothing was sent\n")
    key = session_of(name)
    if not text.strip():
        raise web.HTTPBadRequest(text="an empty message is not sent\n")
    if len(text) > MAX_MESSAGE:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_MESSAGE, actual_size=len(text))
    conversations = channel(request.app)
    response = secured(web.StreamResponse(headers={"Content-Type": "application/x-ndjson; charset=utf-8"}))
    await response.prepare(request)
    # Closed at once when the page goes away (a write fails): closing the turn's events stops the turn.
    async with contextlib.aclosing(conversations.turn(key, text)) as events:
        try:
            async for event in events:
                await response.write(orjson.dumps({"kind": event.kind, "text": event.text}) + b"\n")
        except ConnectionResetError:
            return response
    await response.write_eof()
    return response


async def chat_stop(request: web.Request) -> web.Response:
    """Stop the conversation's running turn, as Ctrl-C does in the terminal."""
    form = await request.post()
    stopped = channel(request.app).stop_turn(session_of(str(form.get("name", ""))))
    return web.json_response({"stopped": stopped})


async def chat_events(request: web.Request) -> web.StreamResponse:
    """What the scheduler delivers to the conversation, and the receipts of its memory writes, while this page is
    open (server-sent events)."""
    key = session_of(request.query.get("name", ""))
    conversations = channel(request.app)
    response = secured(web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}))
    # Following before the page hears back: once it has the stream (or its ": open"), nothing sent is missed.
    with conversations.listening(key) as queue:
        await response.prepare(request)
        await response.write(b": open\n\n")
        # A keep-alive comment now and then finds a page that went away (its write fails), so a page closed
        # stops counting as open within KEEP_ALIVE_SECONDS; the stream ends when the channel stops.
        while not conversations.closed:
            try:
                event = await asyncio.wait_for(queue.get(), KEEP_ALIVE_SECONDS)
                if event.kind == "closed":
                    break
                chunk = b"data: " + orjson.dumps({"kind": event.kind, "text": event.text}) + b"\n\n"
            except TimeoutError:
                chunk = b": keep-alive\n\n"
            try:
                await response.write(chunk)
            except ConnectionResetError:
                break
    return response
