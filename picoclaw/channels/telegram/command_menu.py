"""The slash commands in Telegram: the menu the bot registers (`COMMANDS`), and the filter of the router that
takes them (`SlashCommand`). The agent answers them itself (agent/slash_commands.py), without the model; the
channel keeps their replies out of the conversation's history of delivered answers.
"""

from __future__ import annotations

from aiogram.filters import BaseFilter
from aiogram.types import BotCommand, Message

from picoclaw.agent import parse_command
from picoclaw.channels.telegram.access import BotIdentity, without_mention

COMMANDS = [
    BotCommand(command="start", description="what I can do"),
    BotCommand(command="new", description="start a fresh conversation"),
    BotCommand(command="compact", description="summarise the conversation now"),
    BotCommand(command="memory", description="what memory a query would bring up"),
    BotCommand(command="policy", description="the memory policy in force"),
    BotCommand(command="status", description="model, conversation size, cached tokens"),
    BotCommand(command="context", description="where the last request's tokens went"),
    BotCommand(command="help", description="the commands"),
]


class SlashCommand(BaseFilter):
    """A text message that is a slash command as the agent reads one (`/name`, `/name@bot`, unknown names
    too), once a mention of the bot around it is dropped."""

    def __init__(self, me: BotIdentity):
        self.me = me

    async def __call__(self, message: Message) -> bool:
        return message.text is not None and parse_command(without_mention(message.text, self.me())) is not None
