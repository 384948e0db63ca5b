"""Channels: the ways of talking to the assistant, each turning its world's messages into agent turns.

The contract all of them keep is in `base` (`Channel`, `Inbound`, `TurnHooks`, and `run_turn`, where a message
becomes a model call); `ReplChannel` is the terminal and `TelegramChannel` the Telegram bot (the package
`telegram`). Each name is imported on first use (picoclaw/lazy_exports.py): the terminal never loads aiogram.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from picoclaw.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from picoclaw.channels.attachments import HEARD_MARK, Attached, attach, largest_attachment, read_attachment
    from picoclaw.channels.base import Channel
    from picoclaw.channels.documents import (
        ACCEPTED,
        DocumentText,
        ImageDocument,
        document_turn,
        read_document,
        save_document,
    )
    from picoclaw.channels.message_turn import Inbound, TurnHooks, run_turn
    from picoclaw.channels.repl import ReplChannel
    from picoclaw.channels.telegram import TelegramChannel, Webhook, make_bot, polling_lock, webhook_secret
    from picoclaw.channels.voice_notes import (
        IMAGE_NOT_KEPT,
        NO_VISION,
        NOT_LISTENING,
        SPOKEN_MARK,
        MediaRefused,
        Transcriber,
        image_turn,
        spoken,
    )
    from picoclaw.channels.web import ChatEvent, NotOpen, WebChannel

__getattr__, __dir__ = lazy_exports(__name__)
