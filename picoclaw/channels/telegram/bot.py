"""The aiogram Bot and what guards its calls: the token kept out of sight, 429 waited out, 409 turned into one
clear stop, "typing…" that never fails a turn, and one poller per bot token on a workspace.

`make_bot` checks the token and `api_base` and makes the Bot; `install_middlewares` gives it the request
middlewares every call goes through; `polling_lock` is held while a process polls.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, cast

from aiogram import Bot
from aiogram import loggers as aiogram_loggers
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.session.middlewares.base import BaseRequestMiddleware, NextRequestMiddlewareType
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import ClientDecodeError, TelegramAPIError, TelegramConflictError, TelegramRetryAfter
from aiogram.methods import GetUpdates, Response, SendChatAction, TelegramMethod
from aiogram.methods.base import TelegramType
from aiogram.utils.token import TokenValidationError
from filelock import FileLock, Timeout

from picoclaw.config import TelegramConfig
from picoclaw.errors import ConfigError, PicoclawError
from picoclaw.html_text import one_line
from picoclaw.redact import excerpt, redact

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]

RETRY_AFTER_ATTEMPTS = 3  # tries of one Bot API call while Telegram answers 429, before it is given up
RETRY_AFTER_MAX_WAIT = 60.0  # seconds: a longer retry_after (a flood ban) is not sat out by one call
PAGE_EXCERPT = 80  # characters of a proxy's error page quoted in an error line
ERROR_EXCERPT = 200  # characters of a Bot API server's error description quoted in an error line

# False in a task whose calls must not sit out a 429 (the answer's previews, stream.py): the 429 is raised at
# once, and the caller skips its updates until retry_after is over.
waits_out_429: ContextVar[bool] = ContextVar("telegram_waits_out_429", default=True)


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


# -- the token ------------------------------------------------------------------------------------------------


def token_secrets(token: str) -> tuple[str, str]:
    """What of a bot token must never be shown (aiohttp's URL errors quote the request URL, token included).

    The secret half (after the colon) on its own too: a server that echoes the request path may
    percent-encode the colon (`123456%3AABC…`), and the bot id before it is public anyway.
    """
    _, _, secret = token.partition(":")
    return token, secret


def page_excerpt(content: object, secrets: tuple[str, ...]) -> str:
    """The gist of a non-JSON reply (usually an HTML error page) on one short line: tags dropped, secrets
    masked, capped (a proxy's page may quote the request path, token and all)."""
    return excerpt(one_line(str(content)), PAGE_EXCERPT, secrets)


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


def guarded_loggers(*ours: logging.Logger) -> list[logging.Logger]:
    """The loggers a TokenRedactor goes on: `ours`, this module's, and aiogram's (they report network errors).
    A logger's filter sees only the records made on it, not those its children pass up."""
    return [*ours, log, *(value for value in vars(aiogram_loggers).values() if isinstance(value, logging.Logger))]


# -- request middlewares --------------------------------------------------------------------------------------


class BestEffortChatActions(BaseRequestMiddleware):
    """"typing…" is best effort: a chat action that fails (Telegram refused it, a proxy's error page) is logged
    and taken as sent. aiogram's ChatActionSender would stop at the first failure and leave its task's error
    unread, and no answer should be lost for want of "typing…"."""

    async def __call__(self, make_request: NextRequestMiddlewareType[TelegramType], bot: Bot,
                       method: TelegramMethod[TelegramType]) -> Response[TelegramType]:
        try:
            return await make_request(bot, method)
        except (TelegramAPIError, ClientDecodeError) as exc:
            if not isinstance(method, SendChatAction):
                raise
            log.debug("telegram: chat %s: typing action failed: %s", method.chat_id, exc)
            # What the chain hands back is the method's result (sendChatAction's is True), typed as a Response.
            return cast("Response[TelegramType]", True)


class RetryAfterMiddleware(BaseRequestMiddleware):
    """Flood control for every Bot API call: on Telegram's 429 wait `retry_after` (capped), then retry (bounded);
    not where `waits_out_429` is False (a preview, which is skipped rather than queued)."""

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
                if attempt == self.attempts or not waits_out_429.get():
                    raise
                wait = min(float(exc.retry_after), self.max_wait)
                log.warning("telegram: %s rate limited (429, retry after %s s); retrying in %s s (try %d of %d)",
                            method.__api_method__, exc.retry_after, wait, attempt + 1, self.attempts)
                await self.sleep(wait)
        raise AssertionError("unreachable")


class KeptResponseModels(BaseRequestMiddleware):
    """Keeps the model aiogram parses each method's answer with (`Response[Message]`, …) for the bot's life.
    pydantic holds parametrised generic models only weakly: once the garbage collector frees one, the next
    call builds it again, and `Response[Message]` takes the event loop for a tenth of a second or more."""

    def __init__(self) -> None:
        self._models: dict[type[TelegramMethod[Any]], type[Response[Any]]] = {}

    async def __call__(self, make_request: NextRequestMiddlewareType[TelegramType], bot: Bot,
                       method: TelegramMethod[TelegramType]) -> Response[TelegramType]:
        kind = type(method)
        if kind not in self._models:
            self._models[kind] = Response[method.__returning__]  # type: ignore[name-defined]
        return await make_request(bot, method)


def install_middlewares(bot: Bot, sleep: Sleep = asyncio.sleep) -> RetryAfterMiddleware:
    """Give `bot` exactly one of each request middleware (replacing those installed before), waiting out a
    429 with `sleep`. Best-effort typing goes outside the retry: a chat action is retried before given up."""
    for middleware in list(bot.session.middleware):
        if isinstance(middleware, KeptResponseModels | BestEffortChatActions | RetryAfterMiddleware):
            bot.session.middleware.unregister(middleware)
    bot.session.middleware(KeptResponseModels())
    bot.session.middleware(BestEffortChatActions())
    retry = RetryAfterMiddleware(sleep)
    bot.session.middleware(retry)
    return retry


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


# -- one poller per token -------------------------------------------------------------------------------------


@contextmanager
def polling_lock(path: Path, *, refusal: str | None = None) -> Iterator[None]:
    """Held while this process polls a bot (or serves its webhook on the files backend); a second process
    taking the same lock is refused in one line, ending in `refusal` when given.

    Two pollers of one token would each answer, and store, every message (or take turns at 409 Conflict).
    The lock file holds the holder's pid, for the refusal to name (it may be stale, hence the "?").
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(blocking=False)
    except Timeout:
        if refusal is not None:
            raise PicoclawError(f"another picoclaw already serves this bot ({_lock_holder(path)}) on this "
                                f"workspace; {refusal}") from None
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
