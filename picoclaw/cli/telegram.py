"""`picoclaw telegram`: run the assistant as a Telegram bot (long polling) until Ctrl-C.

The handler imports what it uses: building this command's parser (for `--help`) loads no config and no aiogram.
"""

from __future__ import annotations

import argparse

from picoclaw.cli.command import opened_app


def register(parser: argparse.ArgumentParser) -> None:
    """Fill in the `telegram` command's parser."""
    parser.set_defaults(handler=cmd_telegram)


def cmd_telegram(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from picoclaw.channels import TelegramChannel, make_bot, polling_lock
    from picoclaw.errors import ConfigError

    with opened_app() as app:
        settings = app.config.channels.telegram
        if not settings.enabled:  # the config's switch wins: a bot turned off must not answer anyone
            raise ConfigError("channels.telegram.enabled is false in config.json; set it to true to run the bot")

        async def run() -> None:
            bot = make_bot(settings, app.config.telegram_token())
            try:
                async with app:
                    app.provider()  # a missing key or URL stops the bot now, not at the first message
                    # Before anything talks to Telegram or starts: a second poller of this bot is refused at once.
                    with polling_lock(app.workspace.layout.telegram_lock_path(bot.token)):
                        await app.start_mcp()  # the same MCP tools as in chat: one code path
                        channel = TelegramChannel(settings, bot, app.agent)
                        await channel.run(scheduler=app.scheduler(channel))
            finally:
                await bot.session.close()

        # A bot runs unattended: its log says which chat and user each turn came from, even without -v.
        picoclaw_log = logging.getLogger("picoclaw")
        level = picoclaw_log.level
        picoclaw_log.setLevel(logging.INFO)
        try:
            asyncio.run(run())
        finally:
            picoclaw_log.setLevel(level)
    return 0
