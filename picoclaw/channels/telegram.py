"""`picoclaw telegram`: the assistant as a Telegram bot (aiogram 3, long polling).

Each chat is a session (`telegram:<chat_id>`); one chat's messages are answered in order, different chats
at once. Only users in `channels.telegram.allow_from` are served; a stranger is told their id once and
nothing they wrote is kept. With memory_scope "per_user" each user has a memory folder of their own.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import weakref
from collections.abc import Awaitable, Callable

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
    TelegramRetryAfter,
    TelegramUnauthorizedError,
)
from aiogram.methods import Response, TelegramMethod
from aiogram.methods.base import TelegramType
from aiogram.types import BotCommand, Message, User
from aiogram.utils.token import TokenValidationError

from picoclaw.agent.loop import AgentLoop
from picoclaw.agent.scheduler import Scheduler
from picoclaw.channels.telegram_format import EMPTY_REPLY, MessagePart, telegram_parts
from picoclaw.config import TelegramConfig
from picoclaw.errors import ConfigError, PicoclawError
from picoclaw.keyed import KeyedLocks, LruCache

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


def redact(text: str, token: str) -> str:
    """`text` with the bot token replaced (aiohttp's URL errors quote the request URL, token included).

    The secret half (after the colon) is replaced on its own too: a server that echoes the request path
    may percent-encode the colon (`123456%3AABC…`), and the bot id before it is public anyway.
    """
    if not token:
        return text
    text = text.replace(token, "<token>")
    _, _, secret = token.partition(":")
    return text.replace(secret, "<token>") if len(secret) >= 8 else text


def _page_excerpt(content: object) -> str:
    """The gist of a non-JSON reply (usually an HTML error page) on one short line: tags dropped, capped."""
    text = re.sub(r"<[^>]*>", " ", str(content))
    text = " ".join(text.split())
    return text if len(text) <= 80 else text[:79] + "…"


class TokenRedactor(logging.Filter):
    """Keeps the bot token out of log lines and tracebacks of the loggers it is added to."""

    def __init__(self, token: str):
        super().__init__()
        self.token = token

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact(message, self.token)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info), self.token)
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
                                f"{self._method_name(exc)} with: {redact(exc.message, self.bot.token)}") from None
        except ClientDecodeError as exc:  # e.g. a reverse proxy's 502 page: aiogram's text is the whole page
            raise PicoclawError(f"cannot start the Telegram bot: {self._where()} gave a reply that is not a Bot "
                                f"API answer (a proxy's error page?): "
                                f"{redact(_page_excerpt(exc.data), self.bot.token)}") from None
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

    async def run(self, *, handle_signals: bool = True, polling_timeout: int = 10,
                  scheduler: Scheduler | None = None) -> None:
        """Poll until stopped, then let in-flight turns finish (bounded) and close everything.

        A `scheduler` (reminders, recurring jobs, the heartbeat) runs beside polling once the bot has
        started, delivering through `deliver`; it stops with the bot, after the job under way.
        """
        redactor = TokenRedactor(self.bot.token)
        guarded = _guarded_loggers()
        for logger in guarded:
            logger.addFilter(redactor)
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
        finally:
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
        typing = asyncio.create_task(self._keep_typing(chat_id))
        try:
            reply = (await self._loop_for(user).handle(key, text, notify=self._notify)).text
        except Exception:
            log.exception("telegram: chat %s user %s: the turn failed", chat_id, user.id)
            reply = APOLOGY
        finally:
            typing.cancel()
        await self.send_reply(chat_id, reply)

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

    async def send_reply(self, chat_id: int, markdown: str, *, strict: bool = False) -> None:
        """The model's Markdown as HTML messages of at most 4,096 characters each, in order."""
        for part in telegram_parts(markdown) or [MessagePart(EMPTY_REPLY, EMPTY_REPLY)]:
            await self._send(chat_id, part.plain, html=part.html, strict=strict)

    async def _send(self, chat_id: int, plain: str, *, html: str | None = None, strict: bool = False) -> None:
        """`html` if given, else (or when Telegram refuses the HTML) `plain`; a failure is logged, and raised
        again when `strict`."""
        try:
            if html is not None:
                try:
                    await self.bot.send_message(chat_id, html, parse_mode="HTML")
                    return
                except TelegramBadRequest as exc:
                    if "parse entities" not in exc.message.lower():
                        raise
                    log.warning("telegram: chat %s: Telegram refused the HTML (%s); sent as plain text",
                                chat_id, exc.message)
            await self.bot.send_message(chat_id, plain, parse_mode=None)
        except TelegramAPIError as exc:
            log.error("telegram: chat %s: could not send a reply: %s", chat_id, exc)
            if strict:
                raise
        except ClientDecodeError as exc:  # a proxy's error page: logged short, and the bot serves on
            log.error("telegram: chat %s: could not send a reply: not a Bot API answer: %s", chat_id,
                      _page_excerpt(exc.data))
            if strict:
                raise
