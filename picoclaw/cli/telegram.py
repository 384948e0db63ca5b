"""`picoclaw telegram`: run the assistant as a Telegram bot until Ctrl-C or SIGTERM: long polling (the default),
or a webhook worker (`--webhook URL --listen HOST:PORT`), one of several behind a load balancer on PostgreSQL.

The handler imports what it uses: building this command's parser (for `--help`) loads no config and no aiogram.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING

from picoclaw.cli.command import UsageError, opened_app
from picoclaw.session_key import channel_of

if TYPE_CHECKING:
    from picoclaw.app import App
    from picoclaw.config import TelegramConfig


def register(parser: argparse.ArgumentParser) -> None:
    """Fill in the `telegram` command's parser."""
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--webhook", metavar="URL",
                      help="take updates from Telegram at this public https URL instead of polling (overrides "
                           "channels.telegram.webhook.url)")
    mode.add_argument("--polling", action="store_true",
                      help="long-poll even if channels.telegram.webhook.url is set (the default without one)")
    parser.add_argument("--listen", metavar="HOST:PORT",
                        help="where a webhook worker listens (default channels.telegram.webhook.listen, "
                             "127.0.0.1:8080)")
    parser.add_argument("--worker", metavar="NAME",
                        help="this worker's name in logs and /status (default: host name and process id)")
    parser.set_defaults(handler=cmd_telegram)


def cmd_telegram(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from picoclaw.channels import TelegramChannel, Webhook, make_bot, webhook_secret
    from picoclaw.errors import ConfigError

    with opened_app() as app:
        settings = webhook_settings(app.config.channels.telegram, args)
        if not settings.enabled:  # the config's switch wins: a bot turned off must not answer anyone
            raise ConfigError("channels.telegram.enabled is false in config.json; set it to true to run the bot")
        app.worker = args.worker or f"{socket.gethostname()}:{os.getpid()}"
        hook = settings.webhook

        async def run() -> None:
            bot = make_bot(settings, app.config.telegram_token())
            try:
                async with app:
                    app.provider()  # a missing key or URL stops the bot now, not at the first message
                    app.transcriber()  # the transcriber's too
                    # Before anything talks to Telegram or starts: a second worker that cannot share is refused.
                    with one_worker_only(app, bot.token, webhook=bool(hook.url)):
                        await app.start_mcp()  # the same MCP tools as in chat: one code path
                        webhook = None
                        if hook.url:
                            webhook = Webhook(hook, app.storage, worker=app.worker or "",
                                              secret_token=hook.secret_token or webhook_secret(bot.token))
                        channel = TelegramChannel(settings, bot, app.agent, replies=app.storage.telegram_replies,
                                                  transcriber=app.transcriber())
                        owner = app.config.heartbeat.session
                        if owner and channel.name == channel_of(owner):  # the owner's chat hears of a spent budget
                            app.tell_owner(channel.deliver, owner)
                        await channel.run(scheduler=app.scheduler(channel), webhook=webhook)
            finally:
                await bot.session.close()

        # A bot runs unattended: its log says which chat and user each turn came from, even without -v.
        picoclaw_log = logging.getLogger("picoclaw")
        level = picoclaw_log.level
        picoclaw_log.setLevel(logging.INFO)
        try:
            asyncio.run(run())
        except OSError as exc:  # the webhook's port: taken, or not ours to listen on
            if not hook.url:
                raise
            raise UsageError(f"cannot listen on {hook.listen}: {exc.strerror or exc}") from None
        finally:
            picoclaw_log.setLevel(level)
    return 0


def webhook_settings(settings: TelegramConfig, args: argparse.Namespace) -> TelegramConfig:
    """channels.telegram with the command line's --webhook, --polling and --listen applied (and validated)."""
    from pydantic import ValidationError

    from picoclaw.config import WebhookConfig
    from picoclaw.pydantic_errors import describe_error

    values = settings.webhook.model_dump()
    if args.polling:
        values["url"] = ""
    elif args.webhook is not None:
        values["url"] = args.webhook
    if args.listen is not None:
        values["listen"] = args.listen
    try:
        hook = WebhookConfig.model_validate(values)
    except ValidationError as exc:
        raise UsageError(describe_error(WebhookConfig, exc, "channels.telegram.webhook.")) from None
    return settings.model_copy(update={"webhook": hook})


@contextlib.contextmanager
def one_worker_only(app: App, token: str, *, webhook: bool) -> Iterator[None]:
    """Refuse a second process where it cannot share: a second poller of the bot anywhere on this workspace, and
    a second webhook worker on the files backend. Webhook workers on PostgreSQL share the inbox: no lock."""
    from picoclaw.channels import polling_lock

    if webhook and app.storage.backend != "files":
        yield
        return
    refusal = ("several workers need storage.backend: postgres (the files backend serves one)" if webhook
               else None)
    with polling_lock(app.workspace.layout.telegram_lock_path(token), refusal=refusal):
        yield
