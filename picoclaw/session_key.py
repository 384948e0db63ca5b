"""Session keys: the one written form of "which conversation", `telegram:<chat>[:t<topic>][:<user>]`,
`cli:<name>` or `web:<name>` (a conversation in the web console).

A Telegram key names a chat; `:t<topic>` one topic of a forum supergroup (its `message_thread_id`: each topic
is a conversation of its own, and what is sent to the key goes into that topic); `:<user>` one member's own
conversation in a group (memory_scope "per_user"), in a topic too: `telegram:-100123:t7:1001`. The "t" keeps
a topic apart from a member, so every key older versions wrote reads as it did.

A key names the conversation's transcript file and the target of a scheduled job, so it is made, read and
checked here only. `SessionKey.parse` accepts exactly the keys a channel can deliver to; `str(key)` gives the
text back unchanged, so keys travel as plain strings (file names, jobs.json, config) and are parsed where a
part of one is needed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

TELEGRAM: Final = "telegram"
CLI: Final = "cli"
WEB: Final = "web"
ChannelName = Literal["telegram", "cli", "web"]

# A session key names its transcript file, percent-encoded (at most 3 characters a byte) plus ".jsonl", and
# /new archives it under a name 21 characters longer: 64 bytes keep that well under the usual 255 a name.
MAX_SESSION_KEY_BYTES = 64
TELEGRAM_IDS = range(-(2**63), 2**63)  # Telegram's ids are signed 64-bit integers
EXPECTED = ("expected telegram:<chat_id>, telegram:<chat_id>:<user_id>, telegram:<chat_id>:t<topic_id>[:<user_id>], "
            "cli:<name> or web:<name>")

_TELEGRAM = re.compile(r"telegram:(-?[0-9]+)(?::t([0-9]+))?(?::([0-9]+))?")  # chat, topic, user
_CLI = re.compile(r"cli:([\w.-]+)")  # letters of any script (中文 too), digits, _ . -: what `--session` names
_WEB = re.compile(r"web:([\w.-]+)")  # a console conversation's name: the same letters as a terminal one's
# What older versions accepted, and web and forum topics.
_STORED = re.compile(r"^(telegram:-?\d+(:t\d+)?(:\d+)?|(cli|web):[\w.-]+)$")


@dataclass(frozen=True)
class SessionKey:
    """A key a channel can deliver to; made by `telegram`, `cli` or `parse`, written out by `str()`."""

    channel: ChannelName
    chat_id: int | None = None  # Telegram: the chat
    user_id: int | None = None  # Telegram: the member, in a group whose members each keep their own history
    name: str | None = None  # terminal: the name given with `--session`; console: the conversation's name
    topic_id: int | None = None  # Telegram: the forum topic (message_thread_id) that is the conversation

    def __post_init__(self) -> None:
        # Checked as written: a key made here always parses back to itself.
        telegram = self.channel == TELEGRAM
        fields = (self.chat_id is not None,
                  (self.user_id is not None or self.topic_id is not None) and not telegram, self.name is not None)
        if self.channel not in (TELEGRAM, CLI, WEB) or fields != (telegram, False, not telegram):
            raise ValueError(f"{self!r} is not a session key ({EXPECTED})")
        _check(str(self))

    @classmethod
    def telegram(cls, chat_id: int, user_id: int | None = None, *, topic_id: int | None = None) -> SessionKey:
        """A Telegram chat's key; with `topic_id`, one topic of a forum; with `user_id`, one member's own
        conversation in that chat (or topic)."""
        return cls(TELEGRAM, chat_id=chat_id, user_id=user_id, topic_id=topic_id)

    @classmethod
    def cli(cls, name: str) -> SessionKey:
        """A terminal session's key (`picoclaw chat --session NAME`)."""
        return cls(CLI, name=name)

    @classmethod
    def web(cls, name: str) -> SessionKey:
        """A web console conversation's key."""
        return cls(WEB, name=name)

    @classmethod
    def parse(cls, text: str) -> SessionKey:
        """The key `text` writes; ValueError, saying what is wrong with it, unless a channel can deliver to it."""
        match = _check(text)
        if match.re is _TELEGRAM:
            chat, topic, user = match.groups()
            return cls.telegram(int(chat), None if user is None else int(user),
                                topic_id=None if topic is None else int(topic))
        return cls.web(match.group(1)) if match.re is _WEB else cls.cli(match.group(1))

    def __str__(self) -> str:
        if self.channel == TELEGRAM:
            return (f"{TELEGRAM}:{self.chat_id}" + ("" if self.topic_id is None else f":t{self.topic_id}")
                    + ("" if self.user_id is None else f":{self.user_id}"))
        return f"{self.channel}:{self.name}"

    def scope(self, memory_scope: str) -> str | None:
        """The memory scope whose agent serves this session: None (the shared memory), or a user key.

        With Telegram's "per_user" scope a private chat's id is its user's id, and a group member's key ends
        in the user's id, as the Telegram channel makes them (in a forum topic too: the topic picks the
        conversation, never the memory).
        """
        if memory_scope != "per_user" or self.channel != TELEGRAM:
            return None
        return str(self.user_id) if self.user_id is not None else str(self.chat_id).lstrip("-")


def channel_of(text: str) -> str:
    """The channel a key names ("telegram", "cli"), read from its prefix; the key need not be valid."""
    return text.partition(":")[0]


def is_stored_form(text: str) -> bool:
    """Whether `text` has the shape of a key older versions stored (jobs.json, heartbeat.session): a stored
    key that `SessionKey.parse` now refuses is reported as undeliverable rather than making its file unreadable."""
    return _STORED.match(text) is not None


def terminal_key(given: str) -> str:
    """The session `picoclaw chat --session GIVEN` talks in: GIVEN when it names its channel, else `cli:GIVEN`
    (not checked: `SessionKey.parse` says whether it is a key)."""
    return given if ":" in given else f"{CLI}:{given}"


def _check(text: str) -> re.Match[str]:
    """The match of `text` against its channel's form; ValueError unless it is a key a channel delivers to:
    ids as Telegram writes them (in 64 bits), in at most MAX_SESSION_KEY_BYTES bytes."""
    telegram = _TELEGRAM.fullmatch(text)
    match = telegram or _CLI.fullmatch(text) or _WEB.fullmatch(text)
    if match is None:
        raise ValueError(f"{_quote(text)} is not a session key ({EXPECTED}; a name has letters, digits, _ . -)")
    for number in telegram.groups() if telegram else ():
        # "042" would be delivered to chat 42 but run in another session than the chat's own "telegram:42";
        # the length goes first, as int() refuses 4,300 digits and more with an error of its own
        if number is not None and (len(number) > 20 or str(int(number)) != number
                                   or int(number) not in TELEGRAM_IDS):
            raise ValueError(f"{_quote(number)} in {_quote(text)} is not a Telegram id (a whole number without "
                             "leading zeros that fits in 64 bits)")
    size = len(text.encode("utf-8"))
    if size > MAX_SESSION_KEY_BYTES:
        raise ValueError(f"the session key {_quote(text)} is too long: {size} bytes in UTF-8, at most "
                         f"{MAX_SESSION_KEY_BYTES} (a Chinese character takes 3), since it names the chat's file")
    return match


def _quote(value: str) -> str:
    # Imported on use: the pydantic_errors module brings pydantic, which reading a key does not need.
    from picoclaw.pydantic_errors import quote

    return quote(value)
