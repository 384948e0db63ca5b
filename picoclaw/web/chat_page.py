"""Chat in the browser: `web:<name>` conversations, the answer streamed in as it is written (one JSON line an
event), each tool call one line, Stop, slash commands (the agent's own), and what the scheduler delivers to the
conversation while its page is open (server-sent events).

A message may carry one file (Attach): `/chat/turn` then takes a multipart form (name, text, file) instead of
JSON, bounded by the largest file config.json's `media` and `transcription` take (a larger body is refused with
413 before it is read, and as soon as it is found over while read); the file becomes the turn as with
`chat --attach` (picoclaw/channels/attachments.py), and one it cannot take is refused with 422 and one line,
nothing sent to the model. The CSRF token comes in its header, as for every script-sent change."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING
from urllib.parse import quote

import orjson
from aiohttp import BodyPartReader, web

from picoclaw.web.chat_history import Said, history
from picoclaw.web.conversation_list import Conversation, conversations, session_key
from picoclaw.web.file_cache import FileCache
from picoclaw.web.markdown import rendered
from picoclaw.web.render import APP_KEY, render, see_other
from picoclaw.web.security import secured

if TYPE_CHECKING:
    from picoclaw.app import App
    from picoclaw.channels import Attached, Transcriber, WebChannel

log = logging.getLogger(__name__)

CHANNEL_KEY: web.AppKey[list[WebChannel]] = web.AppKey("picoclaw_web_channel", list)  # made on first use
# What a conversation's page shows, read and rendered once per version of its transcript (web/file_cache.py).
HISTORY_KEY: web.AppKey[FileCache[list[Said]]] = web.AppKey("picoclaw_chat_history")
DEFAULT_NAME = "console"
MAX_MESSAGE = 20_000  # characters of one message typed in the console
HISTORY_SHOWN = 200  # messages of the conversation the page shows when it opens
CONVERSATIONS_SHOWN = 30  # the newest current conversations the page lists (the why page lists them all)
KEEP_ALIVE_SECONDS = 15.0
MULTIPART = "multipart/form-data"
FORM_SLACK = MAX_MESSAGE * 4 + 64 * 1024  # an upload's form besides its file: the message in UTF-8, the boundaries
NAME_CHARS = 200  # of an uploaded file's name, as the turn shows it
NOT_UTF8 = "The form's text is not UTF-8; nothing was sent.\n"


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
    path = sessions.path_for(key)

    def read() -> list[Said]:
        return history([m.message for m in sessions.read(path).messages], HISTORY_SHOWN)

    shown = await asyncio.to_thread(request.app[HISTORY_KEY].get, key, lambda: sessions.log.marker(path), read)
    listed = await asyncio.to_thread(_listed, app, key)
    return render(request, "chat.html", key=key, name=key.partition(":")[2], messages=shown,
                  transcript=path.name, conversations=listed)


def _listed(app: App, key: str) -> list[Conversation]:
    """The current conversations (web ones to switch to, the others to read), newest first; this page's own
    always among them, even before its first message."""
    found = [one for one in conversations(app) if not one.archived][:CONVERSATIONS_SHOWN]
    if all(one.key != key for one in found):
        name = app.workspace.sessions().path_for(key).name
        found.insert(0, Conversation(name, session_key(name), False, 0.0))
    return found


async def chat_archive(request: web.Request) -> web.Response:
    """Archive the conversation and start it afresh: its `/new`, through the agent as the terminal does (the
    memory flush included); back to its page, or 409 and one line while a turn of it runs."""
    form = await request.post()
    name = str(form.get("name", ""))
    key = session_of(name)
    async with contextlib.aclosing(channel(request.app).turn(key, "/new")) as events:
        last = None
        async for event in events:
            last = event
    if last is None or last.kind != "done":
        raise web.HTTPConflict(text=f"{last.text if last is not None else 'nothing was archived'}\n")
    return see_other(f"/chat?name={quote(key.partition(':')[2])}")


async def chat_turn(request: web.Request) -> web.StreamResponse:
    """Run a turn and stream its events, one JSON object a line: {"kind": "text" | "tool" | …, "text": …}."""
    attached: Attached | None = None
    if request.content_type == MULTIPART:
        conversations = channel(request.app)
        transcriber = _transcriber(request.app[APP_KEY])
        name, text, upload = await _upload(request, conversations, transcriber)
    else:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            body = None
        # Strings only: str() of a null or a number would send the model the message "None" or "5".
        given = (body.get("name", ""), body.get("text")) if isinstance(body, dict) else (None, None)
        if not isinstance(given[0], str) or not isinstance(given[1], str):
            raise web.HTTPBadRequest(text='expected a JSON object {"name": "…", "text": "…"} (name may be left '
                                          "out); nothing was sent\n")
        name, text, upload = given[0], given[1], None
    key = session_of(name)
    if upload is None and not text.strip():
        raise web.HTTPBadRequest(text="an empty message is not sent\n")
    if len(text) > MAX_MESSAGE:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_MESSAGE, actual_size=len(text))
    conversations = channel(request.app)
    if upload is not None and not conversations.busy(key):  # busy: the turn says so, and the file is not taken
        from picoclaw.channels import MediaRefused

        try:
            attached = await conversations.attach(*upload, text, transcriber)
        except MediaRefused as exc:
            raise web.HTTPUnprocessableEntity(text=f"{exc}\n") from None
    response = secured(web.StreamResponse(headers={"Content-Type": "application/x-ndjson; charset=utf-8"}))
    await response.prepare(request)
    # Closed at once when the page goes away (a write fails): closing the turn's events stops the turn.
    async with contextlib.aclosing(conversations.turn(key, text, attached)) as events:
        try:
            async for event in events:
                sent: dict[str, str] = {"kind": event.kind, "text": event.text}
                if event.kind == "done":  # the whole answer, rendered: the page replaces what streamed in
                    sent["html"] = str(rendered(event.text))
                await response.write(orjson.dumps(sent) + b"\n")
        except ConnectionResetError:
            return response
    await response.write_eof()
    return response


def _transcriber(app: App) -> Transcriber | None:
    """The configured transcriber; None when there is none, or its client cannot be made (logged: an image or a
    document is still taken)."""
    from picoclaw.errors import PicoclawError

    try:
        return app.transcriber()
    except PicoclawError as exc:
        log.warning("console: audio cannot be transcribed: %s", exc)
        return None


async def _upload(request: web.Request, conversations: WebChannel,
                  transcriber: Transcriber | None) -> tuple[str, str, tuple[str, bytes] | None]:
    """The conversation's name, the message and the file (its name and bytes; None when none was chosen) of a
    multipart form; 413 for a body over the largest file taken, 400 for a form that is not one."""
    from picoclaw.channels import largest_attachment

    limit = largest_attachment(conversations.agent.workspace.config.media, transcriber)
    if request.content_length is not None and request.content_length > limit + FORM_SLACK:
        raise _too_large(limit)
    fields: dict[str, str] = {}
    upload: tuple[str, bytes] | None = None
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                raise web.HTTPBadRequest(text="a form inside the form is not taken; nothing was sent\n")
            if part.name == "file":
                if upload is not None:
                    raise web.HTTPBadRequest(text="one file a message; nothing was sent\n")
                data = await _bounded(part, limit, _too_large(limit))
                if part.filename or data:  # a form sends an empty part when no file was chosen
                    upload = (_file_name(part.filename), data)
            else:
                raw = await _bounded(part, FORM_SLACK, _too_large(limit))
                if part.name in ("name", "text"):
                    try:
                        fields[part.name] = raw.decode("utf-8").replace("\r\n", "\n")  # a form's line ends
                    except UnicodeDecodeError:
                        raise web.HTTPBadRequest(text=NOT_UTF8) from None
    except ValueError as exc:  # aiohttp on a body that is not the multipart form it says it is
        raise web.HTTPBadRequest(text=f"the form could not be read ({exc}); nothing was sent\n") from None
    return fields.get("name", ""), fields.get("text", ""), upload


async def _bounded(part: BodyPartReader, limit: int, refusal: web.HTTPException) -> bytes:
    """The bytes of a form's part, read until they pass `limit` (then `refusal` is raised)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await part.read_chunk():
        size += len(chunk)
        if size > limit:
            raise refusal
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int, size: int | None = None) -> web.HTTPRequestEntityTooLarge:
    # Older aiohttp versions (pyproject allows 3.9) require actual_size: always given.
    text = (f"That file is larger than the {limit / 1_000_000:.1f} MB I take (media.image_megabytes, "
            "media.document_kilobytes, transcription.max_megabytes); nothing was sent.\n")
    return web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=size if size is not None else limit + 1,
                                         text=text)


def _file_name(given: str | None) -> str:
    """An uploaded file's own name, without the folders a browser may send (Windows' backslashes too)."""
    name = (given or "").replace("\\", "/").rsplit("/", 1)[-1].strip()
    return name[:NAME_CHARS] or "file"


async def chat_stop(request: web.Request) -> web.Response:
    """Stop the conversation's running turn, as Ctrl-C does in the terminal."""
    form = await request.post()
    stopped = channel(request.app).stop_turn(session_of(str(form.get("name", ""))))
    return web.json_response({"stopped": stopped})


async def chat_approve(request: web.Request) -> web.Response:
    """The page's Approve or Deny of a tool call its turn asked about (`decision`: "approve" or "deny");
    {"decided": false} when that question is no longer open (answered, timed out, not this conversation's)."""
    form = await request.post()
    decision = str(form.get("decision", ""))
    if decision not in ("approve", "deny"):
        raise web.HTTPBadRequest(text='decision must be "approve" or "deny"; nothing was decided\n')
    decided = channel(request.app).decide(session_of(str(form.get("name", ""))), str(form.get("id", "")),
                                          decision == "approve")
    return web.json_response({"decided": decided})


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
