"""A real local HTTP server speaking enough of the Telegram Bot API for aiogram's long polling.

Tests point aiogram at it (`channels.telegram.api_base`), feed it user messages, and read back every
call the bot made:

    with FakeTelegramServer() as telegram:
        telegram.send_text(chat_id=42, user_id=42, text="hello")
        ...  # run the bot against telegram.origin
        assert telegram.sent_texts(42) == ["hi!"]

Users send text, stickers, photos, voice notes, audio, video notes or documents. In a forum supergroup
(`forum=True`, or `topic=N`: a message in topic N, with its `message_thread_id`, `is_topic_message` and, as
Telegram sends it, a `reply_to_message` that is the topic's creation) each sendMessage's `message_thread_id` is
recorded: `sent_in(chat_id)` lists (topic, text) pairs. Methods: getMe, getUpdates (long
polling; an `offset` confirms earlier updates, as Telegram does), sendMessage, sendChatAction, setMyCommands,
setWebhook, getWebhookInfo, deleteWebhook, getFile, setMessageReaction (`reactions(chat_id)` lists the
(message_id, emoji list) pairs set; `fail_next("setMessageReaction", 400, ...)` refuses one).

Streaming: sendMessageDraft is recorded (`drafts(chat_id)` lists their texts; `drafts_available
= False` answers it 404 "method not found", as an older server does), editMessageText changes a sent message's
text (`edits(chat_id)` lists the texts), deleteMessage removes one: `sent_texts` and `sent_in` list only messages
still in the chat, so a preview the bot deleted is not counted as a reply.

Reactions: `send_reaction(chat_id, user_id, message_id, ["👎"])` queues a `message_reaction` update. As Telegram
does, getUpdates hands one out only when its `allowed_updates` names "message_reaction" (Telegram's default list
leaves it out).

Buttons: sendMessage's `reply_markup` is kept with the message (`keyboard(chat_id, message_id)`, the rows of
button texts and data it shows now); editMessageText replaces it (left out: the buttons go, as Telegram does).
`press(chat_id, user_id, message_id, data)` queues a `callback_query` update on a message the bot sent, as
Telegram sends it (the message as it looks now, keyboard included); `press_button(..., text)` presses the button
of that text. answerCallbackQuery is recorded: `callback_answers()` lists (callback id, text or None).

Files: every media message stores its bytes (`add_file` stores any), getFile answers with the file's `file_path`,
and GET /file/bot<token>/<file_path> serves the bytes, as Telegram does. A file whose `file_size` is over the Bot
API's 20 MB download limit gets getFile's 400 "file is too big"; `downloads()` lists every file path asked for;
`fail_next_download` makes the next downloads fail.

While a webhook is set, getUpdates gets Telegram's 409, and `deliver_to(ports)` POSTs each
update in turn to the workers' ports, round-robin as a load balancer would, trying the next port on a refused
connection or an answer other than 200 (as Telegram retries). Errors can be
scripted for any method (400 "can't parse entities", 403 blocked, 409 Conflict, 429 with retry_after, or a
non-JSON page such as a proxy's 502); a wrong or revoked token gets 401 Unauthorized.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.fakes.http_server import BackgroundHTTPServer

TOKEN = "123456:TEST-fake-telegram-token"
BOT_ID = 123456
BOT_USERNAME = "picoclaw_test_bot"
ENTITY_ERROR = "Bad Request: can't parse entities: Unsupported start tag \"x\" at byte offset 0"
# How often `wait_until` looks again when no API call came: a condition on the inbox or a file is seen within
# this, not at the 60 s bound (a look costs a query or a read).
RECHECK_SECONDS = 0.05
DOWNLOAD_LIMIT = 20 * 1024 * 1024  # bytes: the Bot API's getFile refuses bigger files
TOO_BIG = "Bad Request: file is too big"
INVALID_FILE_ID = "Bad Request: invalid file_id"
# What getUpdates hands out when not told: every kind but these (Telegram's default for allowed_updates).
DEFAULT_UPDATES = {"message", "edited_message", "channel_post", "edited_channel_post", "callback_query",
                   "inline_query", "chosen_inline_result", "my_chat_member"}


@dataclass(frozen=True)
class ApiCall:
    """One request the bot made: method name and its parameters (JSON-decoded where they were JSON)."""

    method: str
    params: dict[str, Any]
    at: float


@dataclass(frozen=True)
class ScriptedError:
    status: int
    description: str
    retry_after: int | None = None
    page: str | None = None  # sent as text/html instead of the Bot API's JSON error (a proxy's page)


@dataclass(frozen=True)
class StoredFile:
    """A file users sent: its ids, where getFile says it lies, its bytes, and the size Telegram reports."""

    file_id: str
    file_unique_id: str
    file_path: str
    data: bytes
    file_size: int


class FakeTelegramServer(BackgroundHTTPServer):
    """Bot API stand-in on 127.0.0.1; thread-safe for the test thread and the bot's loop."""

    name = "fake-telegram"

    def __init__(self, token: str = TOKEN) -> None:
        super().__init__()
        self.token = token
        self.revoked = False  # every call then gets 401, as after /revoke in @BotFather
        self._lock = threading.Condition()
        self._updates: list[dict[str, Any]] = []
        self._confirmed = 0  # updates below this id were confirmed by an offset and are gone
        self._calls: list[ApiCall] = []
        self._errors: dict[str, deque[ScriptedError | None]] = {}  # None: that call is served
        self._message_ids = 0
        self._files: dict[str, StoredFile] = {}  # by file_id
        self._downloads: list[str] = []  # file paths asked for at /file/bot<token>/..., in order
        self._download_errors: deque[int] = deque()  # HTTP statuses for the next downloads
        self._arrived: asyncio.Event | None = None
        # Called on the server's loop after each successful sendMessage with its params (a bench uses it
        # to send a chat's next message as soon as the answer arrives).
        self.on_sent: Callable[[dict[str, Any]], None] | None = None
        self.on_draft: Callable[[dict[str, Any]], None] | None = None  # each sendMessageDraft answered ok
        self.webhook: dict[str, Any] | None = None  # setWebhook's params while one is set
        self.webhook_posts: list[tuple[int, int, int]] = []  # (update_id, port, HTTP status or 0: refused)
        self._delivered = 0  # updates below this index were accepted by a worker
        self._deliver_wake: asyncio.Event | None = None
        self._delivery: asyncio.Future[None] | None = None
        self.drafts_available = True  # False: sendMessageDraft gets 404, as from a server before Bot API 9
        self._deleted: set[tuple[int, int]] = set()  # (chat id, message id) of messages the bot deleted

    # -- what users do ----------------------------------------------------------------------------

    def send_text(self, chat_id: int, user_id: int, text: str, *, username: str | None = None,
                  chat_type: str = "private", reply_to_bot: bool = False, topic: int | None = None,
                  forum: bool = False) -> int:
        """Queue a text message from a user; returns its update_id. `topic`: sent in that topic of a forum
        supergroup; `forum` without a topic: in the forum's General topic."""
        return self._queue_message(chat_id, user_id, {"text": text}, username=username, chat_type=chat_type,
                                   reply_to_bot=reply_to_bot, topic=topic, forum=forum)

    def send_sticker(self, chat_id: int, user_id: int, *, chat_type: str = "private") -> int:
        """Queue a sticker (a message without text); returns its update_id."""
        sticker = {"file_id": "sticker-1", "file_unique_id": "s1", "type": "regular", "width": 512,
                   "height": 512, "is_animated": False, "is_video": False, "emoji": "👍"}
        return self._queue_message(chat_id, user_id, {"sticker": sticker}, chat_type=chat_type)

    def send_photo(self, chat_id: int, user_id: int, *, caption: str | None = None,
                   chat_type: str = "private", data: bytes | None = None, username: str | None = None,
                   reply_to_bot: bool = False, sizes: list[tuple[bytes, int, int, int | None]] | None = None) -> int:
        """Queue a photo, with a caption if given (still no text); returns its update_id. The photo's bytes
        (`data`, else a few placeholder bytes) are stored: getFile and the download serve them. `sizes`: the
        photo in several sizes instead, as Telegram sends one, each (bytes, width, height, file_size or None)."""
        data = PLACEHOLDER_JPEG if data is None else data
        photo = []
        for size_data, width, height, file_size in sizes or [(data, 90, 60, None)]:
            file_id = self.add_file(size_data, file_path=self._next_path("photos", ".jpg"), file_size=file_size)
            photo.append({**self._file_fields(file_id), "width": width, "height": height})
        return self._queue_message(chat_id, user_id, {"photo": photo, **_caption(caption)}, username=username,
                                   chat_type=chat_type, reply_to_bot=reply_to_bot)

    def send_voice(self, chat_id: int, user_id: int, data: bytes, *, duration: int = 3,
                   mime_type: str = "audio/ogg", file_size: int | None = None, chat_type: str = "private",
                   caption: str | None = None, username: str | None = None, reply_to_bot: bool = False) -> int:
        """Queue a voice note (OGG/Opus as Telegram records them); returns its update_id. `file_size` (default:
        the bytes' length) may be set larger to play a file over the download limit."""
        file_id = self.add_file(data, file_path=self._next_path("voice", ".oga"), file_size=file_size)
        voice = {**self._file_fields(file_id), "duration": duration, "mime_type": mime_type}
        return self._queue_message(chat_id, user_id, {"voice": voice, **_caption(caption)}, username=username,
                                   chat_type=chat_type, reply_to_bot=reply_to_bot)

    def send_audio(self, chat_id: int, user_id: int, data: bytes, *, duration: int = 3,
                   file_name: str = "song.mp3", mime_type: str = "audio/mpeg", file_size: int | None = None,
                   chat_type: str = "private", caption: str | None = None, username: str | None = None,
                   reply_to_bot: bool = False) -> int:
        """Queue an audio file (music, sent as a file to play); returns its update_id."""
        file_id = self.add_file(data, file_path=self._next_path("music", _suffix(file_name, ".mp3")),
                                file_size=file_size)
        audio = {**self._file_fields(file_id), "duration": duration, "file_name": file_name, "mime_type": mime_type}
        return self._queue_message(chat_id, user_id, {"audio": audio, **_caption(caption)}, username=username,
                                   chat_type=chat_type, reply_to_bot=reply_to_bot)

    def send_video_note(self, chat_id: int, user_id: int, data: bytes, *, duration: int = 3, length: int = 240,
                        file_size: int | None = None, chat_type: str = "private", username: str | None = None,
                        reply_to_bot: bool = False) -> int:
        """Queue a video note (a round video; Telegram gives these no caption); returns its update_id."""
        file_id = self.add_file(data, file_path=self._next_path("video_notes", ".mp4"), file_size=file_size)
        video_note = {**self._file_fields(file_id), "length": length, "duration": duration}
        return self._queue_message(chat_id, user_id, {"video_note": video_note}, username=username,
                                   chat_type=chat_type, reply_to_bot=reply_to_bot)

    def send_document(self, chat_id: int, user_id: int, data: bytes, *, file_name: str,
                      mime_type: str | None = None, file_size: int | None = None, caption: str | None = None,
                      chat_type: str = "private", username: str | None = None, reply_to_bot: bool = False) -> int:
        """Queue a document (any file sent as a file); returns its update_id. `mime_type` None leaves it out,
        as Telegram does when it cannot tell."""
        file_id = self.add_file(data, file_path=self._next_path("documents", _suffix(file_name, "")),
                                file_size=file_size)
        document = {**self._file_fields(file_id), "file_name": file_name,
                    **({"mime_type": mime_type} if mime_type is not None else {})}
        return self._queue_message(chat_id, user_id, {"document": document, **_caption(caption)}, username=username,
                                   chat_type=chat_type, reply_to_bot=reply_to_bot)

    # -- files ------------------------------------------------------------------------------------

    def add_file(self, data: bytes, *, file_path: str | None = None, file_size: int | None = None) -> str:
        """Store a file as Telegram would hold it; returns its new file_id (`file(file_id)` has the rest: its
        file_unique_id, the file_path getFile gives, e.g. "voice/file_1.oga", and `file_size`, by default
        the bytes' length, which may be set larger to play an oversized file)."""
        with self._lock:
            serial = len(self._files) + 1
            path = file_path if file_path is not None else f"documents/file_{serial}"
            stored = StoredFile(file_id=f"file-{serial}-{path.rsplit('/', 1)[0]}", file_unique_id=f"u{serial}",
                                file_path=path, data=bytes(data),
                                file_size=len(data) if file_size is None else file_size)
            self._files[stored.file_id] = stored
            return stored.file_id

    def file(self, file_id: str) -> StoredFile:
        """A stored file by its file_id (KeyError when there is none)."""
        with self._lock:
            return self._files[file_id]

    def downloads(self) -> list[str]:
        """The file paths the bot asked to download (failed attempts too), in order."""
        with self._lock:
            return list(self._downloads)

    def fail_next_download(self, status: int = 500, *, times: int = 1) -> None:
        """The next `times` downloads answer with HTTP `status` and no file (as when Telegram's file server
        has a bad moment); they are still listed in `downloads()`."""
        with self._lock:
            self._download_errors.extend([status] * times)

    def _next_path(self, folder: str, suffix: str) -> str:
        with self._lock:
            return f"{folder}/file_{len(self._files) + 1}{suffix}"

    def _file_fields(self, file_id: str) -> dict[str, Any]:
        stored = self.file(file_id)
        return {"file_id": stored.file_id, "file_unique_id": stored.file_unique_id, "file_size": stored.file_size}

    def _queue_message(self, chat_id: int, user_id: int, content: dict[str, Any], *, username: str | None = None,
                       chat_type: str = "private", reply_to_bot: bool = False, topic: int | None = None,
                       forum: bool = False) -> int:
        user = {"id": user_id, "is_bot": False, "first_name": f"user{user_id}",
                **({"username": username} if username else {})}
        forum = forum or topic is not None
        chat: dict[str, Any] = {"id": chat_id, "type": "supergroup" if forum else chat_type}
        if forum:
            chat["is_forum"] = True
        if chat["type"] != "private":
            chat["title"] = f"group {chat_id}"
        with self._lock:
            self._message_ids += 1
            message: dict[str, Any] = {"message_id": self._message_ids, "date": int(time.time()),
                                       "chat": chat, "from": user, **content}
            if topic is not None:
                # As Telegram sends a topic's message: its thread, and, unless it replies to another message,
                # a reply to the topic's creation (here by the bot, which must not make it a reply to the bot).
                message.update(message_thread_id=topic, is_topic_message=True,
                               reply_to_message={"message_id": topic, "date": int(time.time()), "chat": chat,
                                                 "from": self._bot_user(), "message_thread_id": topic,
                                                 "forum_topic_created": {"name": f"topic {topic}",
                                                                         "icon_color": 7322096}})
            if reply_to_bot:
                message["reply_to_message"] = {"message_id": 1, "date": int(time.time()), "chat": chat,
                                               "from": self._bot_user(), "text": "earlier answer",
                                               **({"message_thread_id": topic} if topic is not None else {})}
            update_id = len(self._updates) + 1
            self._updates.append({"update_id": update_id, "message": message})
        if self._arrived is not None:
            self.call_in_loop(self._arrived.set)
        if self._deliver_wake is not None:
            self.call_in_loop(self._deliver_wake.set)
        return update_id

    def send_reaction(self, chat_id: int, user_id: int, message_id: int, emoji_new: list[str],
                      emoji_old: list[str] | None = None, *, chat_type: str = "private") -> int:
        """A user changes their reaction on a message: a `message_reaction` update; its update_id."""
        chat: dict[str, Any] = {"id": chat_id, "type": chat_type}
        if chat_type != "private":
            chat["title"] = f"group {chat_id}"
        with self._lock:
            update_id = len(self._updates) + 1
            self._updates.append({"update_id": update_id, "message_reaction": {
                "chat": chat, "message_id": message_id, "date": int(time.time()),
                "user": {"id": user_id, "is_bot": False, "first_name": f"user{user_id}"},
                "old_reaction": [{"type": "emoji", "emoji": e} for e in emoji_old or []],
                "new_reaction": [{"type": "emoji", "emoji": e} for e in emoji_new]}})
        if self._arrived is not None:
            self.call_in_loop(self._arrived.set)
        if self._deliver_wake is not None:
            self.call_in_loop(self._deliver_wake.set)
        return update_id

    def message_id_of(self, update_id: int) -> int:
        """The message_id of the message queued as update `update_id` (a draft answering it carries it)."""
        with self._lock:
            return int(self._updates[update_id - 1]["message"]["message_id"])

    def press(self, chat_id: int, user_id: int, message_id: int, data: str) -> int:
        """A user presses a button with `data` on the bot's message `message_id` (any data: a forged one too); the
        update_id of the `callback_query`."""
        with self._lock:
            sent = self._sent_message(chat_id, message_id)
            assert sent is not None, f"the bot sent no message {message_id} to chat {chat_id}"
            thread = sent.params.get("message_thread_id")
            message: dict[str, Any] = {
                "message_id": message_id, "date": int(time.time()), "from": self._bot_user(),
                "chat": {"id": chat_id, "type": "private" if chat_id > 0 else "supergroup",
                         **({} if chat_id > 0 else {"title": f"group {chat_id}"})},
                "text": sent.params.get("_text", sent.params["text"]),
                **({"message_thread_id": int(thread), "is_topic_message": True} if thread is not None else {}),
                **({"reply_markup": markup} if (markup := sent.params.get("_markup")) else {})}
            update_id = len(self._updates) + 1
            self._updates.append({"update_id": update_id, "callback_query": {
                "id": f"cb{update_id}", "chat_instance": f"ci{chat_id}", "data": data, "message": message,
                "from": {"id": user_id, "is_bot": False, "first_name": f"user{user_id}"}}})
        if self._arrived is not None:
            self.call_in_loop(self._arrived.set)
        if self._deliver_wake is not None:
            self.call_in_loop(self._deliver_wake.set)
        return update_id

    def press_button(self, chat_id: int, user_id: int, message_id: int, text: str) -> int:
        """Press the button labelled `text` on the bot's message `message_id`; the update_id."""
        [data] = [d for row in self.keyboard(chat_id, message_id) for t, d in row if t == text]
        return self.press(chat_id, user_id, message_id, data)

    def keyboard(self, chat_id: int, message_id: int) -> list[list[tuple[str, str]]]:
        """The inline keyboard the bot's message shows now: rows of (text, callback_data); [] when it has none."""
        with self._lock:
            sent = self._sent_message(chat_id, message_id)
            markup = sent.params.get("_markup") if sent is not None else None
        rows = (markup or {}).get("inline_keyboard", [])
        return [[(button["text"], button.get("callback_data", "")) for button in row] for row in rows]

    def shown(self, chat_id: int, message_id: int) -> str:
        """The text the bot's message shows now (after its edits)."""
        with self._lock:
            sent = self._sent_message(chat_id, message_id)
            assert sent is not None
            return str(sent.params.get("_text", sent.params["text"]))

    def with_buttons(self, chat_id: int) -> list[int]:
        """Ids of the bot's messages in `chat_id` that were sent with an inline keyboard, in order."""
        return [int(c.params["_message_id"]) for c in self.calls("sendMessage")
                if c.params.get("_ok") and int(c.params["chat_id"]) == chat_id and c.params.get("reply_markup")]

    def callback_answers(self) -> list[tuple[str, str | None]]:
        """(callback_query_id, text or None) of each answerCallbackQuery, in order."""
        return [(str(c.params["callback_query_id"]), c.params.get("text")) for c in self.calls("answerCallbackQuery")
                if c.params.get("_ok")]

    def _sent_message(self, chat_id: int, message_id: int) -> ApiCall | None:
        return next((c for c in self._calls if c.method == "sendMessage" and c.params.get("_ok")
                     and c.params.get("_message_id") == message_id and int(c.params["chat_id"]) == chat_id), None)

    def resend(self, update_id: int) -> int:
        """The update `update_id` again, under a new update_id (as a redelivery would bring it); the new id."""
        with self._lock:
            again = dict(next(u for u in self._updates if u["update_id"] == update_id))
            again["update_id"] = len(self._updates) + 1
            self._updates.append(again)
        if self._arrived is not None:
            self.call_in_loop(self._arrived.set)
        return int(again["update_id"])

    def reactions(self, chat_id: int) -> list[tuple[int, list[str]]]:
        """The reactions the bot set in a chat, in order: (message_id, [emoji, ...]) for each successful call."""
        return [(int(c.params["message_id"]), [r["emoji"] for r in c.params.get("reaction") or []])
                for c in self.calls("setMessageReaction") if int(c.params["chat_id"]) == chat_id
                and c.params.get("_ok")]

    # -- webhook delivery ---------------------------------------------------------------------------

    def deliver_to(self, ports: list[int], path: str = "/tg", *, secret: str | None = None,
                   retry_pause: float = 0.05) -> None:
        """POST every update, in order, to the workers on `ports` (127.0.0.1) until the server stops: round-robin
        from one update to the next, and on a refused connection or a non-200 answer the next port, after
        `retry_pause` once every port was tried. `secret` (default: setWebhook's) goes in the header."""
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(self._deliver(ports, path, secret, retry_pause), self._loop)
        self._delivery = asyncio.wrap_future(future, loop=self._loop)

    def stop(self) -> None:
        """Stop delivering (the delivery's task ends on the server's loop), then stop the server."""
        delivery, loop = self._delivery, self._loop
        if delivery is not None and loop is not None:
            async def cancel() -> None:
                delivery.cancel()
                await asyncio.gather(delivery, return_exceptions=True)
            asyncio.run_coroutine_threadsafe(cancel(), loop).result(10)
            self._delivery = None
        super().stop()

    def delivered(self) -> int:
        """How many updates a worker has accepted (answered 200)."""
        with self._lock:
            return self._delivered

    async def _deliver(self, ports: list[int], path: str, secret: str | None, retry_pause: float) -> None:
        import aiohttp

        self._deliver_wake = asyncio.Event()
        turn = 0
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not self.stopping():
                with self._lock:
                    pending = self._updates[self._delivered] if self._delivered < len(self._updates) else None
                    token = secret if secret is not None else (self.webhook or {}).get("secret_token", "")
                if pending is None:
                    self._deliver_wake.clear()
                    with self._lock:
                        if self._delivered < len(self._updates):
                            continue
                    await self._wait_or_close(self._deliver_wake, 1.0)
                    continue
                for attempt in range(len(ports)):
                    port = ports[(turn + attempt) % len(ports)]
                    status = await _post_update(session, port, path, pending, token)
                    with self._lock:
                        self.webhook_posts.append((pending["update_id"], port, status))
                    if status == 200:
                        turn += attempt + 1
                        with self._lock:
                            self._delivered += 1
                            self._lock.notify_all()
                        break
                else:
                    await self.pause(retry_pause)

    async def _wait_or_close(self, event: asyncio.Event, timeout: float) -> None:
        """Until `event` is set, the server begins to stop, or `timeout` seconds pass."""
        assert self._closing is not None
        waiters = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._closing.wait())}
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)

    def fail_next(self, method: str, status: int, description: str, *, retry_after: int | None = None,
                  times: int = 1, after: int = 0) -> None:
        """The next `times` calls of `method` (any method, even one the fake does not serve) fail like
        Telegram would: e.g. 429 with `retry_after`, 400 "can't parse entities", 403 when the user blocked
        the bot, 409 while another poller or a webhook holds the token. `after` calls are served first."""
        with self._lock:
            self._errors.setdefault(method, deque()).extend(
                [None] * after + [ScriptedError(status, description, retry_after)] * times)

    def fail_next_with_page(self, method: str, status: int, page: str) -> None:
        """The next call of `method` gets an HTML page, as from a reverse proxy whose upstream is down."""
        with self._lock:
            self._errors.setdefault(method, deque()).append(ScriptedError(status, "", page=page))

    # -- what the bot did ---------------------------------------------------------------------------

    def calls(self, method: str | None = None) -> list[ApiCall]:
        with self._lock:
            return [c for c in self._calls if method is None or c.method == method]

    def sent_texts(self, chat_id: int | None = None) -> list[str]:
        """Texts of sendMessage calls that succeeded, in order (for one chat when given), but for messages the
        bot deleted since."""
        with self._lock:
            return [c.params["text"] for c in self._calls
                    if c.method == "sendMessage" and c.params.get("_ok") and not self._was_deleted(c.params)
                    and (chat_id is None or int(c.params["chat_id"]) == chat_id)]

    def _was_deleted(self, params: dict[str, Any]) -> bool:
        return (int(params["chat_id"]), params.get("_message_id")) in self._deleted

    def drafts(self, chat_id: int) -> list[str]:
        """Texts of sendMessageDraft calls to `chat_id` that succeeded, in order."""
        return [c.params.get("text", "") for c in self.calls("sendMessageDraft")
                if c.params.get("_ok") and int(c.params["chat_id"]) == chat_id]

    def edits(self, chat_id: int) -> list[str]:
        """Texts of editMessageText calls to `chat_id` that succeeded, in order."""
        return [c.params["text"] for c in self.calls("editMessageText")
                if c.params.get("_ok") and int(c.params["chat_id"]) == chat_id]

    def deleted(self, chat_id: int) -> list[int]:
        """Ids of the messages the bot deleted in `chat_id`."""
        with self._lock:
            return sorted(message for chat, message in self._deleted if chat == chat_id)

    def sent_in(self, chat_id: int) -> list[tuple[int | None, str]]:
        """(message_thread_id or None, text) of each sendMessage to `chat_id` that succeeded, in order: where in a
        forum each went."""
        with self._lock:
            return [(None if (thread := c.params.get("message_thread_id")) is None else int(thread), c.params["text"])
                    for c in self._calls
                    if c.method == "sendMessage" and c.params.get("_ok") and int(c.params["chat_id"]) == chat_id
                    and not self._was_deleted(c.params)]

    def wait_until(self, condition: Callable[[], bool], timeout: float = 60.0) -> None:
        """Block until `condition()` holds (re-checked after every API call, and every RECHECK_SECONDS for what
        no call announces: an inbox row, a file), or fail after `timeout` (generous: it only bounds a hang, a busy
        machine may take seconds)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not condition():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout} s waiting for the bot")
                self._lock.wait(min(left, RECHECK_SECONDS))

    # -- the API ------------------------------------------------------------------------------------

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/bot{token}/{method}", self._api)
        app.router.add_get("/file/bot{token}/{file_path:.*}", self._download)

    async def _api(self, request: web.Request) -> web.Response:
        if self._arrived is None:
            self._arrived = asyncio.Event()
        method = request.match_info["method"]
        params = await _params(request)
        if request.match_info["token"] != self.token or self.revoked:
            return _error(ScriptedError(401, "Unauthorized"))
        scripted = self._take_error(method)
        handler = {"getMe": self._get_me, "getUpdates": self._get_updates, "sendMessage": self._send_message,
                   "sendChatAction": _true, "setMyCommands": _true, "deleteWebhook": self._delete_webhook,
                   "setWebhook": self._set_webhook, "getWebhookInfo": self._webhook_info,
                   "getFile": self._get_file, "setMessageReaction": _true, "editMessageText": self._edit_message,
                   "deleteMessage": self._delete_message, "answerCallbackQuery": _true,
                   **({"sendMessageDraft": self._send_draft} if self.drafts_available else {})}.get(method)
        if method == "getUpdates" and self.webhook is not None and scripted is None:
            scripted = ScriptedError(409, "Conflict: can't use getUpdates method while webhook is active; "
                                          "use deleteWebhook to delete the webhook first")
        if scripted is None and handler is None:
            scripted = ScriptedError(404, "Not Found: method not found")
        # Recorded on arrival (a test can wait for the first long poll), marked "_ok" once it succeeded.
        self._record(method, params)
        if scripted is not None:
            return _error(scripted)
        assert handler is not None
        try:
            result = await handler(params)
        except ApiError as refused:
            return _error(refused.error)
        self._record(method, params, ok=True)
        if method == "sendMessage" and self.on_sent is not None:
            self.on_sent(params)
        elif method == "sendMessageDraft" and self.on_draft is not None:
            self.on_draft(params)
        return web.json_response({"ok": True, "result": result})

    def _record(self, method: str, params: dict[str, Any], *, ok: bool = False) -> None:
        with self._lock:
            if ok:
                params["_ok"] = True
            else:
                self._calls.append(ApiCall(method, params, time.monotonic()))
            self._lock.notify_all()

    def _take_error(self, method: str) -> ScriptedError | None:
        with self._lock:
            queue = self._errors.get(method)
            return queue.popleft() if queue else None

    def _bot_user(self) -> dict[str, Any]:
        return {"id": BOT_ID, "is_bot": True, "first_name": "picoclaw", "username": BOT_USERNAME}

    async def _get_me(self, params: dict[str, Any]) -> dict[str, Any]:
        return {**self._bot_user(), "can_join_groups": True, "can_read_all_group_messages": False,
                "supports_inline_queries": False}

    async def _get_updates(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        assert self._arrived is not None
        offset = int(params.get("offset") or 0)
        asked = params.get("allowed_updates")
        allowed = set(asked) if isinstance(asked, list) and asked else DEFAULT_UPDATES

        def wanted(update: dict[str, Any]) -> bool:
            return update["update_id"] >= max(self._confirmed, 1) and any(kind in allowed for kind in update)

        deadline = time.monotonic() + min(float(params.get("timeout") or 0), 5.0)
        while True:
            with self._lock:
                self._confirmed = max(self._confirmed, offset)
                pending = [u for u in self._updates if wanted(u)]
            left = deadline - time.monotonic()
            if pending or left <= 0:
                return pending
            self._arrived.clear()
            with self._lock:  # an update may have landed between the check and the clear
                if any(wanted(u) for u in self._updates):
                    continue
            # Stopping the server ends a long poll at once instead of making shutdown wait it out.
            await self._wait_or_close(self._arrived, left)
            if self.stopping():
                return []

    async def _set_webhook(self, params: dict[str, Any]) -> bool:
        with self._lock:
            self.webhook = params
        return True

    async def _delete_webhook(self, params: dict[str, Any]) -> bool:
        with self._lock:
            self.webhook = None
        return True

    async def _webhook_info(self, params: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            url = (self.webhook or {}).get("url", "")
            pending = len(self._updates) - self._delivered if url else 0
        return {"url": url, "has_custom_certificate": False, "pending_update_count": pending}

    async def _get_file(self, params: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            stored = self._files.get(str(params.get("file_id") or ""))
        if stored is None:
            raise ApiError(ScriptedError(400, INVALID_FILE_ID))
        if stored.file_size > DOWNLOAD_LIMIT:
            raise ApiError(ScriptedError(400, TOO_BIG))
        return {"file_id": stored.file_id, "file_unique_id": stored.file_unique_id, "file_size": stored.file_size,
                "file_path": stored.file_path}

    async def _download(self, request: web.Request) -> web.Response:
        """GET /file/bot<token>/<file_path>: the file's bytes, as Telegram's file server sends them."""
        path = request.match_info["file_path"]
        with self._lock:
            self._downloads.append(path)
            failure = self._download_errors.popleft() if self._download_errors else None
            stored = next((f for f in self._files.values() if f.file_path == path), None)
            self._lock.notify_all()
        if request.match_info["token"] != self.token or self.revoked:
            return _error(ScriptedError(401, "Unauthorized"))
        if failure is not None:
            return web.Response(status=failure, text=f"{failure}: scripted download failure")
        if stored is None:
            return _error(ScriptedError(404, "Not Found"))
        return web.Response(body=stored.data, content_type="application/octet-stream")

    async def _send_draft(self, params: dict[str, Any]) -> bool:
        if int(params.get("draft_id") or 0) == 0:
            raise ApiError(ScriptedError(400, "Bad Request: draft_id must be non-zero"))
        return True

    async def _edit_message(self, params: dict[str, Any]) -> dict[str, Any]:
        message_id = int(params["message_id"])
        with self._lock:
            sent = next((c for c in self._calls if c.method == "sendMessage" and c.params.get("_ok")
                         and c.params.get("_message_id") == message_id), None)
        if sent is None:
            raise ApiError(ScriptedError(400, "Bad Request: message to edit not found"))
        if sent.params.get("_text", sent.params["text"]) == params["text"]:
            raise ApiError(ScriptedError(400, "Bad Request: message is not modified"))
        with self._lock:
            sent.params["_text"] = params["text"]  # what the chat shows now; `text` stays what was sent
            sent.params["_markup"] = params.get("reply_markup")  # left out of the edit: the buttons go
        return {"message_id": message_id, "date": int(time.time()), "from": self._bot_user(),
                "chat": {"id": int(params["chat_id"]), "type": "private"}, "text": params["text"]}

    async def _delete_message(self, params: dict[str, Any]) -> bool:
        with self._lock:
            self._deleted.add((int(params["chat_id"]), int(params["message_id"])))
        return True

    async def _send_message(self, params: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._message_ids += 1
            message_id = self._message_ids
            params["_message_id"] = message_id
            params["_markup"] = params.get("reply_markup")
        thread = params.get("message_thread_id")
        return {"message_id": message_id, "date": int(time.time()), "from": self._bot_user(),
                "chat": {"id": int(params["chat_id"]), "type": "private"}, "text": params["text"],
                **({"message_thread_id": int(thread), "is_topic_message": True} if thread is not None else {})}


def free_port() -> int:
    """A port nothing listens on now, for a webhook worker to bind a moment later."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def worker_healthy(port: int) -> bool:
    """Whether the webhook worker on `port` answers /healthz with 200 (it is up and reaches its storage)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


async def _post_update(session: Any, port: int, path: str, update: dict[str, Any], secret: str) -> int:
    """POST one update to a worker as Telegram does; its HTTP status, or 0 when no answer came."""
    import aiohttp

    headers = {"X-Telegram-Bot-Api-Secret-Token": secret} if secret else {}
    try:
        async with session.post(f"http://127.0.0.1:{port}{path}", json=update, headers=headers) as response:
            await response.read()
            return response.status
    except (aiohttp.ClientError, TimeoutError, OSError):
        return 0


async def _params(request: web.Request) -> dict[str, Any]:
    # aiogram sends form fields, JSON-encoding the structured ones.
    if request.content_type == "application/json":
        return dict(await request.json())
    params: dict[str, Any] = {}
    for name, value in (await request.post()).items():
        text = value if isinstance(value, str) else ""
        try:
            params[name] = json.loads(text) if text[:1] in "[{" else text
        except ValueError:
            params[name] = text
    return params


class ApiError(Exception):
    """Raised by a method's handler to answer with a Bot API error (e.g. getFile's "invalid file_id")."""

    def __init__(self, error: ScriptedError) -> None:
        super().__init__(error.description)
        self.error = error


# A few bytes for a photo sent without `data` (a JPEG's start-of-image and end-of-image markers).
PLACEHOLDER_JPEG = b"\xff\xd8\xff\xe0fake-photo\xff\xd9"


def _caption(caption: str | None) -> dict[str, Any]:
    return {"caption": caption} if caption else {}


def _suffix(file_name: str, default: str) -> str:
    """The extension Telegram keeps in a file_path: the file name's, else `default`."""
    dot = file_name.rfind(".")
    return file_name[dot:].lower() if dot > 0 and len(file_name) - dot <= 6 else default


async def _true(params: dict[str, Any]) -> bool:
    return True


def _error(error: ScriptedError) -> web.Response:
    if error.page is not None:
        return web.Response(text=error.page, status=error.status, content_type="text/html")
    body: dict[str, Any] = {"ok": False, "error_code": error.status, "description": error.description}
    if error.retry_after is not None:
        body["parameters"] = {"retry_after": error.retry_after}
    return web.json_response(body, status=error.status)
