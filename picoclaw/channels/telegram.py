"""`picoclaw telegram`: the assistant as a Telegram bot (aiogram 3, long polling).

Each chat is a session (`telegram:<chat_id>`); one chat's messages are answered in order, different chats
at once. Only users in `channels.telegram.allow_from` are served; a stranger is told their id once and
nothing they wrote is kept. With memory_scope "per_user" each user has a memory folder of their own.

One process polls a bot token at a time: `polling_lock` refuses a second one on the same workspace, and a
409 Conflict from Telegram (a poller elsewhere, or a webhook) stops polling with one clear line. A reply
Telegram refuses to deliver (403: the user blocked the bot) is marked in the session as not delivered.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiogram import Bot, Dispatcher, Router
from aiogram import loggers as aiogram_loggers
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.session.middlewares.base import BaseRequestMiddleware, NextRequestMiddlewareType
from aiogram.client.telegram import TelegramAPIServer
from aiogram.enums import ChatAction, ChatType
from aiogram.exceptions import (
    ClientDecodeError,
    TelegramAPIError,
    TelegramBadRequest,
    TelegramConflictError,
    TelegramRetryAfter,
    TelegramUnauthorizedError,
)
from aiogram.methods import GetUpdates, Response, TelegramMethod
from aiogram.methods.base import TelegramType
from aiogram.types import BotCommand, Message, User
from aiogram.utils.token import TokenValidationError
from filelock import FileLock, Timeout

from picoclaw.agent.commands import parse_command
from picoclaw.agent.loop import AgentLoop
from picoclaw.agent.scheduler import Scheduler
from picoclaw.channels.telegram_format import EMPTY_REPLY, MessagePart, telegram_parts
from picoclaw.config import TelegramConfig
from picoclaw.errors import ConfigError, PicoclawError
from picoclaw.keyed import KeyedLocks, LruCache
from picoclaw.secrets import excerpt, redact

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
# The agent of the shared memory (None) or of one user's memory (a user key): App.agent.
AgentFor = Callable[[str | None], AgentLoop]

COMMANDS = [
    BotCommand(command="start", description="what I can do"),
    BotCommand(command="new", description="start a fresh conversation"),
    BotCommand(command="compact", description="summarise the conversation now"),
    BotCommand(command="memory", description="what memory a query would bring up"),
    BotCommand(command="policy", description="the memory policy in force"),
    BotCommand(command="status", description="model, conversation size, cached tokens"),
    BotCommand(command="help", description="the commands"),
]
APOLOGY = "Sorry, something went wrong on my side while answering. Please try again in a moment."
NOT_TEXT = "I can only read text messages."
RETRY_AFTER_ATTEMPTS = 3  # tries of one Bot API call while Telegram answers 429, before it is given up
RETRY_AFTER_MAX_WAIT = 60.0  # seconds: a longer retry_after (a flood ban) is not sat out by one call
# Strangers already told their id: enough to cover any real crowd of unknown users, and small (ints).
TOLD_SIZE = 10_000
TYPING_INTERVAL = 4.0  # Telegram shows "typing…" for about 5 s
PAGE_EXCERPT = 80  # characters of a proxy's error page quoted in an error line
ERROR_EXCERPT = 200  # characters of a Bot API server's error description quoted in an error line


def chat_of(session_key: str) -> int | None:
    """The chat id in a session key `telegram:<chat_id>` or `telegram:<chat_id>:<user_id>`, else None."""
    channel, _, rest = session_key.partition(":")
    chat, _, _ = rest.partition(":")
    try:
        return int(chat) if channel == "telegram" else None
    except ValueError:
        return None


def not_authorised(user_id: int) -> str:
    return f"not authorised — your id is {user_id}; add it to channels.telegram.allow_from"


def token_secrets(token: str) -> tuple[str, str]:
    """What of a bot token must never be shown (aiohttp's URL errors quote the request URL, token included).

    The secret half (after the colon) on its own too: a server that echoes the request path may
    percent-encode the colon (`123456%3AABC…`), and the bot id before it is public anyway.
    """
    _, _, secret = token.partition(":")
    return token, secret


def _page_excerpt(content: object, secrets: tuple[str, ...]) -> str:
    """The gist of a non-JSON reply (usually an HTML error page) on one short line: tags dropped, secrets
    masked, capped (a proxy's page may quote the request path, token and all)."""
    return excerpt(re.sub(r"<[^>]*>", " ", str(content)), PAGE_EXCERPT, secrets)


class TokenRedactor(logging.Filter):
    """Keeps the bot token out of log lines and tracebacks of the loggers it is added to."""

    def __init__(self, token: str):
        super().__init__()
        self.secrets = token_secrets(token)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact(message, self.secrets)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info), self.secrets)
        return True


def _guarded_loggers() -> list[logging.Logger]:
    """aiogram's loggers (they report network errors) and this module's."""
    return [log, *(value for value in vars(aiogram_loggers).values() if isinstance(value, logging.Logger))]


class Allowlist:
    """`allow_from`: numeric user ids and @usernames (case-insensitive). Empty lets nobody in."""

    def __init__(self, entries: list[int | str]):
        self.ids = {int(e) for e in entries if isinstance(e, int) or str(e).lstrip("-").isdigit()}
        # Blank entries ("", "@", " ") are dropped: they would equal the "" of a user without a username.
        # Config validation refuses them already; this keeps a Config built in code from letting all in.
        self.usernames = {name for e in entries if isinstance(e, str) and not e.lstrip("-").isdigit()
                          if (name := e.strip().lstrip("@").strip().lower())}

    def allows(self, user: User) -> bool:
        return user.id in self.ids or bool(user.username and user.username.lower() in self.usernames)


def make_bot(settings: TelegramConfig, token: str) -> Bot:
    """An aiogram Bot; `api_base` points it at a self-hosted Bot API server."""
    if not token:
        raise ConfigError("no Telegram bot token: set channels.telegram.token in config.json or the "
                          "TELEGRAM_BOT_TOKEN environment variable (create a bot with @BotFather)")
    if settings.api_base and not re.match(r"https?://[^/\s]+", settings.api_base):
        raise ConfigError(f"channels.telegram.api_base must be an http(s) URL such as http://localhost:8081, "
                          f"got {settings.api_base!r}")
    session = AiohttpSession(api=TelegramAPIServer.from_base(settings.api_base)) if settings.api_base else None
    try:
        return Bot(token, session=session)
    except TokenValidationError:
        raise ConfigError("the Telegram bot token is malformed (expected the form 123456:ABC… that "
                          "@BotFather gives)") from None


class RetryAfterMiddleware(BaseRequestMiddleware):
    """Flood control for every Bot API call: on Telegram's 429 wait `retry_after` (capped), then retry (bounded)."""

    def __init__(self, sleep: Sleep = asyncio.sleep, *, attempts: int = RETRY_AFTER_ATTEMPTS,
                 max_wait: float = RETRY_AFTER_MAX_WAIT):
        self.sleep = sleep
        self.attempts = attempts
        self.max_wait = max_wait

    async def __call__(self, make_request: NextRequestMiddlewareType[TelegramType], bot: Bot,
                       method: TelegramMethod[TelegramType]) -> Response[TelegramType]:
        for attempt in range(1, self.attempts + 1):
            try:
                return await make_request(bot, method)
            except TelegramRetryAfter as exc:
                if attempt == self.attempts:
                    raise
                wait = min(float(exc.retry_after), self.max_wait)
                log.warning("telegram: %s rate limited (429, retry after %s s); retrying in %s s (try %d of %d)",
                            method.__api_method__, exc.retry_after, wait, attempt + 1, self.attempts)
                await self.sleep(wait)
        raise AssertionError("unreachable")


def install_retry_after(bot: Bot, sleep: Sleep = asyncio.sleep) -> RetryAfterMiddleware:
    """Give `bot` exactly one RetryAfterMiddleware (replacing one installed before), using `sleep`."""
    for middleware in list(bot.session.middleware):
        if isinstance(middleware, RetryAfterMiddleware):
            bot.session.middleware.unregister(middleware)
    middleware = RetryAfterMiddleware(sleep)
    bot.session.middleware(middleware)
    return middleware


class ConflictWatch(BaseRequestMiddleware):
    """Stops polling at Telegram's 409 Conflict on getUpdates, which only another poller of the token (or a
    webhook set for it) causes: aiogram would retry, logging an error every few seconds for ever."""

    def __init__(self, stop: Callable[[], Coroutine[Any, Any, None]]):
        self.stop = stop
        self.conflict: TelegramConflictError | None = None
        self._stopping: asyncio.Task[None] | None = None

    async def __call__(self, make_request: NextRequestMiddlewareType[TelegramType], bot: Bot,
                       method: TelegramMethod[TelegramType]) -> Response[TelegramType]:
        try:
            return await make_request(bot, method)
        except TelegramConflictError as exc:
            if not isinstance(method, GetUpdates):
                raise
            if self.conflict is None:
                self.conflict = exc
                self._stopping = asyncio.create_task(self.stop())
            # Not raised: aiogram would log it and poll again. The poll waits here until the stop cancels it.
            await asyncio.Event().wait()
        raise AssertionError("unreachable")


def conflict_message(where: str, exc: TelegramConflictError, token: str) -> str:
    """The one line that says what a 409 Conflict means and what to do about it."""
    return (f"{where} answered 409 Conflict while polling: another program is polling this bot token, or a "
            f"webhook is set for it; stop the other bot (or delete the webhook), then start again "
            f"(Telegram said: {excerpt(exc.message, ERROR_EXCERPT, token_secrets(token))})")


@contextmanager
def polling_lock(path: Path) -> Iterator[None]:
    """Held while this process polls a bot; a second poller of the same lock is refused in one line.

    Two pollers of one token would each answer, and store, every message (or take turns at 409 Conflict).
    The lock file holds the holder's pid, for the refusal to name (it may be stale, hence the "?").
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(blocking=False)
    except Timeout:
        raise PicoclawError(f"another picoclaw is already polling this bot ({_lock_holder(path)}) on this "
                            "workspace; stop it first: two would answer every message twice") from None
    try:
        # Written in place, never replaced by an atomic write: the lock is on this file's inode.
        path.write_text(f"{os.getpid()}\n", encoding="utf-8")
        yield
    finally:
        lock.release()


def _lock_holder(path: Path) -> str:
    try:
        pid = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        pid = ""
    return f"pid {pid}?" if pid.isdigit() else "pid unknown"


class TelegramChannel:
    """Serves the assistant to Telegram; `run()` polls until SIGINT/SIGTERM or `stop()`."""

    def __init__(self, settings: TelegramConfig, bot: Bot, agent_for: AgentFor, *,
                 typing_interval: float = TYPING_INTERVAL, shutdown_timeout: float = 30.0,
                 sleep: Sleep = asyncio.sleep):
        self.settings = settings
        self.bot = bot
        self.agent_for = agent_for
        self.allowlist = Allowlist(self.settings.allow_from)
        self.typing_interval = typing_interval
        self.shutdown_timeout = shutdown_timeout
        # Every call this bot makes, polling included, waits out a 429 instead of failing.
        install_retry_after(bot, sleep)
        self.dispatcher = Dispatcher()
        router = Router(name="picoclaw")
        router.message.register(self.on_message)
        self.dispatcher.include_router(router)
        self.me: User | None = None
        # The agents this channel used, to wait for their background work at the end. Weak: the app keeps
        # a bounded number of them and drops idle ones, which need no waiting.
        self._agents_used: weakref.WeakSet[AgentLoop] = weakref.WeakSet()
        # One lock per session key while a turn holds or awaits it: an idle chat costs nothing.
        self._chat_locks: KeyedLocks[str] = KeyedLocks()
        self._told: LruCache[int, bool] = LruCache(TOLD_SIZE)  # strangers told their id (in memory only)
        self._in_flight: set[asyncio.Task[object]] = set()

    # -- life cycle ---------------------------------------------------------------------------------

    async def start(self) -> User:
        """Check the token, drop any webhook, register the command menu."""
        try:
            self.me = await self.bot.get_me()
            await self.bot.delete_webhook(drop_pending_updates=False)  # long polling gets nothing while set
        except TelegramUnauthorizedError:
            raise PicoclawError("Telegram rejected the bot token (401 Unauthorized): it is wrong or was revoked; "
                                "check channels.telegram.token or TELEGRAM_BOT_TOKEN") from None
        except TelegramAPIError as exc:  # network errors included; they may quote the URL, token and all
            raise PicoclawError(f"cannot start the Telegram bot: {self._where()} answered "
                                f"{self._method_name(exc)} with: {self._excerpt(exc.message)}") from None
        except ClientDecodeError as exc:  # e.g. a reverse proxy's 502 page: aiogram's text is the whole page
            raise PicoclawError(f"cannot start the Telegram bot: {self._where()} gave a reply that is not a Bot "
                                f"API answer (a proxy's error page?): "
                                f"{_page_excerpt(exc.data, self._secrets)}") from None
        try:
            await self.bot.set_my_commands(COMMANDS)
        except TelegramAPIError as exc:  # only the menu is missing; the commands still work when typed
            log.warning("telegram: could not register the command menu: %s", exc)
        log.info("telegram: serving as @%s (id %s), memory scope %s", self.me.username, self.me.id,
                 self.settings.memory_scope)
        return self.me

    def _where(self) -> str:
        """The server start-up errors name, so a self-hosted Bot API's failure is not blamed on Telegram."""
        return self.settings.api_base or "api.telegram.org"

    @staticmethod
    def _method_name(exc: TelegramAPIError) -> str:
        """The Bot API method that failed (getMe or deleteWebhook): start-up makes more than one call."""
        return exc.method.__api_method__

    @property
    def _secrets(self) -> tuple[str, ...]:
        return token_secrets(self.bot.token)

    def _excerpt(self, text: str) -> str:
        """A server's error text on one line, capped, without the token."""
        return excerpt(text, ERROR_EXCERPT, self._secrets)

    async def run(self, *, handle_signals: bool = True, polling_timeout: int = 10,
                  scheduler: Scheduler | None = None) -> None:
        """Poll until stopped, then let in-flight turns finish (bounded) and close everything.

        A `scheduler` (reminders, recurring jobs, the heartbeat) runs beside polling once the bot has
        started, delivering through `deliver`; it stops with the bot, after the job under way. A 409
        Conflict (another poller of the token) stops polling too; `run` then raises PicoclawError saying so.
        """
        redactor = TokenRedactor(self.bot.token)
        guarded = _guarded_loggers()
        for logger in guarded:
            logger.addFilter(redactor)
        watch = ConflictWatch(self.stop)
        self.bot.session.middleware(watch)  # for this run only: a bot may be run again
        try:
            await self.start()
            # Everything loaded so far (modules, config, the model client) lives as long as the process:
            # frozen, it is left out of the garbage collector's full passes, which otherwise stop every
            # chat for ~250 ms each time (bench/telegram.py's open loop).
            gc.freeze()
            jobs = asyncio.create_task(scheduler.run()) if scheduler is not None else None
            try:
                await self.dispatcher.start_polling(self.bot, handle_signals=handle_signals,
                                                    close_bot_session=False, polling_timeout=polling_timeout)
            finally:
                gc.unfreeze()  # back to normal collection: the process may go on to do other things
                if scheduler is not None and jobs is not None:
                    await scheduler.stop(self.shutdown_timeout)
                    await asyncio.gather(jobs, return_exceptions=True)
                await self.finish()
            if watch.conflict is not None:
                raise PicoclawError(conflict_message(self._where(), watch.conflict, self.bot.token))
        finally:
            self.bot.session.middleware.unregister(watch)
            for logger in guarded:
                logger.removeFilter(redactor)

    async def stop(self) -> None:
        """Stop polling (what SIGINT/SIGTERM do); `run()` then finishes the turns under way."""
        await self.dispatcher.stop_polling()

    async def finish(self) -> None:
        """Wait for turns under way (at most `shutdown_timeout`) and background work, then close the bot."""
        await asyncio.sleep(0)  # updates handed out just before the stop reach on_message and count
        deadline = asyncio.get_running_loop().time() + self.shutdown_timeout
        if self._in_flight:
            log.info("telegram: waiting for %d turn(s) to finish", len(self._in_flight))
        # Loop, not one wait: an update handed out just before the stop may join the set after it began.
        while self._in_flight and (left := deadline - asyncio.get_running_loop().time()) > 0:
            await asyncio.wait(set(self._in_flight), timeout=left)
        if self._in_flight:
            log.warning("telegram: %d turn(s) still running after %.0f s; stopping anyway",
                        len(self._in_flight), self.shutdown_timeout)
        for agent in list(self._agents_used):
            await agent.wait_background()
        await self.bot.session.close()

    # -- messages -------------------------------------------------------------------------------------

    async def on_message(self, message: Message) -> None:
        """Every message update: check who and whether it is for us, then answer it in chat order."""
        user, chat = message.from_user, message.chat
        if user is None or user.is_bot or not self._addressed(message):
            return
        if not self.allowlist.allows(user):
            await self._refuse(chat.id, user.id)
            return
        key = self._session_key(chat.id, chat.type, user.id)
        task = asyncio.current_task()
        if task is not None:
            self._in_flight.add(task)
        try:
            # The lock is the first thing awaited, so one chat's updates queue in the order they came.
            async with self._chat_locks.hold(key):
                await self._answer(message, user, key)
        finally:
            if task is not None:
                self._in_flight.discard(task)

    async def _answer(self, message: Message, user: User, key: str) -> None:
        chat_id = message.chat.id
        if message.text is None:
            await self.send_reply(chat_id, NOT_TEXT)
            return
        text = self._without_mention(message.text)
        log.info("telegram: chat %s user %s: message of %d chars", chat_id, user.id, len(text))
        agent = self._loop_for(user)
        stored = False  # whether the session keeps this reply: a model's answer, not a command's or an apology
        typing = asyncio.create_task(self._keep_typing(chat_id))
        try:
            answer = await agent.handle(key, text, notify=self._notify)
            reply, stored = answer.text, answer.error is None and parse_command(text) is None
        except Exception:
            log.exception("telegram: chat %s user %s: the turn failed", chat_id, user.id)
            reply = APOLOGY
        finally:
            typing.cancel()
        failure = await self.send_reply(chat_id, reply)
        if failure is not None and stored:
            await self._mark_undelivered(agent, key, reply, failure)

    async def _mark_undelivered(self, agent: AgentLoop, key: str, reply: str, reason: str) -> None:
        """Record that the reply of the session's newest turn did not reach the user, so that neither a later
        turn nor a summary takes it as read."""
        try:
            async with agent.hold(key):  # no turn of this session is built meanwhile
                session = await agent.session(key)
                stored = session.last_reply(reply)
                if stored is None:
                    log.warning("telegram: session %s: the undelivered reply is not in the session", key)
                    return
                await asyncio.to_thread(agent.sessions.mark_undelivered, session, stored.id, reason)
        except Exception:  # the bot serves on; the log says the session still counts the reply as read
            log.exception("telegram: session %s: could not mark a reply as not delivered", key)
            return
        log.info("telegram: session %s: message %d marked as not delivered", key, stored.id)

    async def _refuse(self, chat_id: int, user_id: int) -> None:
        log.info("telegram: refused chat %s user %s (not in allow_from)", chat_id, user_id)
        if user_id in self._told:
            return
        self._told.put(user_id, True)
        await self._send(chat_id, not_authorised(user_id))

    def _addressed(self, message: Message) -> bool:
        if message.chat.type == ChatType.PRIVATE or self.settings.group_trigger == "always":
            return True
        assert self.me is not None
        replied = message.reply_to_message
        if replied is not None and replied.from_user is not None and replied.from_user.id == self.me.id:
            return True
        return f"@{self.me.username}".lower() in (message.text or "").lower()

    def _without_mention(self, text: str) -> str:
        if self.me is None or not self.me.username:
            return text.strip()
        mention = f"@{self.me.username}"
        start = text.lower().find(mention.lower())
        return (text[:start] + text[start + len(mention):]).strip() if start >= 0 else text.strip()

    def _session_key(self, chat_id: int, chat_type: str, user_id: int) -> str:
        # Per-user memory in a group: each member keeps a history of their own, so no one's
        # remembered facts reach the others through the shared conversation.
        if self.settings.memory_scope == "per_user" and chat_type != ChatType.PRIVATE:
            return f"telegram:{chat_id}:{user_id}"
        return f"telegram:{chat_id}"

    def _loop_for(self, user: User) -> AgentLoop:
        scope = None if self.settings.memory_scope == "shared" else str(user.id)
        agent = self.agent_for(scope)  # the app's, made once per scope and kept while in use
        self._agents_used.add(agent)
        return agent

    async def _notify(self, key: str, text: str) -> None:
        chat_id = chat_of(key)
        if chat_id is not None:
            await self._send(chat_id, text)

    async def _keep_typing(self, chat_id: int) -> None:
        while True:
            try:
                await self.bot.send_chat_action(chat_id, ChatAction.TYPING)
            except (TelegramAPIError, ClientDecodeError) as exc:
                log.debug("telegram: chat %s: typing action failed: %s", chat_id, exc)
            await asyncio.sleep(self.typing_interval)

    # -- sending ------------------------------------------------------------------------------------

    async def deliver(self, session_key: str, markdown: str) -> None:
        """A scheduled job's text to the chat of `session_key` (a per-user key's chat too); raises on failure,
        so the job's outcome says it was not delivered."""
        chat_id = chat_of(session_key)
        if chat_id is None:
            raise PicoclawError(f"{session_key} is not a Telegram session")
        await self.send_reply(chat_id, markdown, strict=True)

    async def send_reply(self, chat_id: int, markdown: str, *, strict: bool = False) -> str | None:
        """The model's Markdown as HTML messages of at most 4,096 characters each, in order.

        None when every part arrived, else what went wrong, for the session's record (one line, no token).
        """
        parts = telegram_parts(markdown) or [MessagePart(EMPTY_REPLY, EMPTY_REPLY)]
        sent, failure = 0, None
        for part in parts:
            why = await self._send(chat_id, part.plain, html=part.html, strict=strict)
            if why is None:
                sent += 1
            elif failure is None:
                failure = why
        if failure is None:
            return None
        if sent == 0:
            return f"sending failed ({failure}); the user has not seen this reply"
        return f"only {sent} of {len(parts)} parts reached the user; sending the rest failed ({failure})"

    async def _send(self, chat_id: int, plain: str, *, html: str | None = None, strict: bool = False) -> str | None:
        """`html` if given, else (or when Telegram refuses the HTML) `plain`; None when sent, else why not.

        A failure is logged, and raised again when `strict`.
        """
        try:
            if html is not None:
                try:
                    await self.bot.send_message(chat_id, html, parse_mode="HTML")
                    return None
                except TelegramBadRequest as exc:
                    if "parse entities" not in exc.message.lower():
                        raise
                    log.warning("telegram: chat %s: Telegram refused the HTML (%s); sent as plain text",
                                chat_id, exc.message)
            await self.bot.send_message(chat_id, plain, parse_mode=None)
            return None
        except TelegramAPIError as exc:
            log.error("telegram: chat %s: could not send a reply: %s", chat_id, exc)
            if strict:
                raise
            return self._excerpt(exc.message)
        except ClientDecodeError as exc:  # a proxy's error page: logged short, and the bot serves on
            page = _page_excerpt(exc.data, self._secrets)
            log.error("telegram: chat %s: could not send a reply: not a Bot API answer: %s", chat_id, page)
            if strict:
                raise
            return f"not a Bot API answer: {page}"
