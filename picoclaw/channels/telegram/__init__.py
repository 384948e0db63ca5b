"""`picoclaw telegram`: the assistant as a Telegram bot (aiogram 3, long polling).

- `channel`: `TelegramChannel`, the bot's life cycle, its routers, and where a message becomes a turn;
- `access`: who may talk to it (`AllowedUser`) and what is addressed to it (`AddressedToBot`), as filters, and
  what a webhook worker keeps of an update (`screen`);
- `commands`: the slash-command menu and the router filter that takes the commands;
- `bot`: making the aiogram Bot, its request middlewares (429, 409, "typing…"), the polling lock, the token
  kept out of logs;
- `format` and `split`: the model's Markdown as Telegram HTML, in messages that fit;
- `webhook`: webhook mode, where updates are stored in the inbox before Telegram is answered and several
  workers answer them from it; `storage_watch`: whether such a worker can reach its storage, said once per
  outage.

One process polls a bot token at a time: `polling_lock` refuses a second one on the same workspace, and a
409 Conflict from Telegram (a poller elsewhere, or a webhook) stops polling with one clear line. Webhook
workers may be several on PostgreSQL; on the files backend the same lock allows one.
"""

from __future__ import annotations

from picoclaw.channels.telegram.access import AddressedToBot, AllowedUser, not_authorised, topic_of
from picoclaw.channels.telegram.bot import (
    RETRY_AFTER_ATTEMPTS,
    RETRY_AFTER_MAX_WAIT,
    BestEffortChatActions,
    KeptResponseModels,
    RetryAfterMiddleware,
    make_bot,
    polling_lock,
)
from picoclaw.channels.telegram.channel import (
    APOLOGY,
    MEMORY_BUSY,
    NOT_TEXT,
    TelegramChannel,
    chat_of,
    topic_in,
)
from picoclaw.channels.telegram.command_menu import COMMANDS, SlashCommand
from picoclaw.channels.telegram.format import render_html, telegram_parts
from picoclaw.channels.telegram.split import MESSAGE_LIMIT, MessagePart
from picoclaw.channels.telegram.webhook import Webhook, webhook_secret

__all__ = [
    "APOLOGY",
    "COMMANDS",
    "MEMORY_BUSY",
    "MESSAGE_LIMIT",
    "NOT_TEXT",
    "RETRY_AFTER_ATTEMPTS",
    "RETRY_AFTER_MAX_WAIT",
    "AddressedToBot",
    "AllowedUser",
    "BestEffortChatActions",
    "KeptResponseModels",
    "MessagePart",
    "RetryAfterMiddleware",
    "SlashCommand",
    "TelegramChannel",
    "Webhook",
    "chat_of",
    "make_bot",
    "not_authorised",
    "polling_lock",
    "render_html",
    "telegram_parts",
    "topic_in",
    "topic_of",
    "webhook_secret",
]
