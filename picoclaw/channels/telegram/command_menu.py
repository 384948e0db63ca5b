"""The slash commands in Telegram: the menu the bot registers (`COMMANDS`, made from the agent's `SLASH_COMMANDS`
as /help's text is), and the filter of the router that takes them (`SlashCommand`). The agent answers them itself
(agent/slash_commands.py), without the model; the channel keeps their replies out of the conversation's history of
delivered answers.
"""

from __future__ import annotations

from aiogram.filters import BaseFilter
from aiogram.types import BotCommand, Message

from picoclaw.agent import SLASH_COMMANDS, parse_command
from picoclaw.channels.telegram.access import BotIdentity, without_mention

# The agent's command table, as the menu shows it: the commands of /help, each once, with its shorter description.
COMMANDS = [BotCommand(command=entry.name, description=entry.menu) for entry in SLASH_COMMANDS if entry.menu]


class SlashCommand(BaseFilter):
    """A text message that is a slash command as the agent reads one (`/name`, `/name@bot`, unknown names
    too), once a mention of the bot around it is dropped."""

    def __init__(self, me: BotIdentity):
        self.me = me

    async def __call__(self, message: Message) -> bool:
        return message.text is not None and parse_command(without_mention(message.text, self.me())) is not None
