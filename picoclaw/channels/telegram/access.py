"""Who may talk to the bot, and which messages are meant for it: aiogram filters, each testable on its own.

`AddressedToBot` passes a person's message the bot should read at all (any in a private chat; in a group one
that mentions the bot or replies to it, unless `group_trigger` is "always"). `AllowedUser` passes the people
of `channels.telegram.allow_from`; the channel's main router carries both, and a last router, for messages
addressed to the bot by anyone else, answers with `not_authorised`.

`screen` applies the same policy to a webhook update before anything of it is stored: a stranger's message
is kept only as a `Refusal` (two ids), never as what they wrote.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiogram.enums import ChatType
from aiogram.filters import BaseFilter
from aiogram.types import Message, Update, User

# Who the bot is: known once the channel has started (getMe), before any message is handled.
BotIdentity = Callable[[], User | None]


def not_authorised(user_id: int) -> str:
    """The one reply a stranger gets: their id, for the owner to add."""
    return f"not authorised — your id is {user_id}; add it to channels.telegram.allow_from"


class AllowedUser(BaseFilter):
    """`allow_from`: numeric user ids and @usernames (case-insensitive). Empty lets nobody in."""

    def __init__(self, entries: list[int | str]):
        self.ids = {int(e) for e in entries if isinstance(e, int) or str(e).lstrip("-").isdigit()}
        # Blank entries ("", "@", " ") are dropped: they would equal the "" of a user without a username.
        # Config validation refuses them already; this keeps a Config built in code from letting all in.
        self.usernames = {name for e in entries if isinstance(e, str) and not e.lstrip("-").isdigit()
                          if (name := e.strip().lstrip("@").strip().lower())}

    async def __call__(self, message: Message) -> bool:
        return message.from_user is not None and self.allows(message.from_user)

    def allows(self, user: User) -> bool:
        return user.id in self.ids or bool(user.username and user.username.lower() in self.usernames)


class AddressedToBot(BaseFilter):
    """A message from a person (not a bot) that is meant for this bot; the rest of a group's talk is not."""

    def __init__(self, group_trigger: str, me: BotIdentity):
        self.group_trigger = group_trigger
        self.me = me

    async def __call__(self, message: Message) -> bool:
        return self.addresses(message)

    def addresses(self, message: Message) -> bool:
        user = message.from_user
        if user is None or user.is_bot:
            return False
        if message.chat.type == ChatType.PRIVATE or self.group_trigger == "always":
            return True
        me = self.me()
        assert me is not None, "a message was handled before the bot knew who it is"
        replied = message.reply_to_message
        # In a forum topic a message not replying to another one comes as a reply to the topic's creation: that
        # is no reply to the bot, even in a topic the bot created.
        if (replied is not None and replied.forum_topic_created is None and replied.from_user is not None
                and replied.from_user.id == me.id):
            return True
        # A photo's, voice note's or document's words are its caption.
        return f"@{me.username}".lower() in (message.text or message.caption or "").lower()


# The General topic of a forum: its messages carry no message_thread_id (some clients say 1); it is the chat's own.
GENERAL_TOPIC = 1


def topic_of(message: Message) -> int | None:
    """The forum topic a message was sent in (its message_thread_id), which is then a conversation of its own;
    None outside a forum's topics: a private chat, a group, a supergroup's reply thread, a forum's General topic."""
    thread = message.message_thread_id
    return thread if message.is_topic_message and thread is not None and thread != GENERAL_TOPIC else None


@dataclass(frozen=True)
class Refusal:
    """All that is kept of a stranger's message to the bot: where to tell them they are not let in (the forum
    topic too), and who."""

    chat_id: int
    user_id: int
    topic_id: int | None = None


def screen(update: Update, allowed: AllowedUser, addressed: AddressedToBot) -> Update | Refusal | None:
    """What of `update` is worth keeping to answer it: the update itself (an allowed user's message to the
    bot, or another kind of update from an allowed user), a `Refusal` (a stranger's message to the bot), or
    None (nothing will answer it: a message not meant for the bot, anything from a stranger but a message)."""
    event = update.event
    if isinstance(event, Message):
        if not addressed.addresses(event):
            return None
        user = event.from_user
        assert user is not None  # addressed: a person's message
        return update if allowed.allows(user) else Refusal(event.chat.id, user.id, topic_of(event))
    sender = getattr(event, "from_user", None) or getattr(event, "user", None)
    return update if isinstance(sender, User) and allowed.allows(sender) else None


def without_mention(text: str, me: User | None) -> str:
    """`text` without its first @mention of the bot, stripped: what the person asked."""
    if me is None or not me.username:
        return text.strip()
    mention = f"@{me.username}"
    start = text.lower().find(mention.lower())
    return (text[:start] + text[start + len(mention):]).strip() if start >= 0 else text.strip()
