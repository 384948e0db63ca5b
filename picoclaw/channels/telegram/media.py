"""Voice notes, audio files and round video notes from Telegram as turns: the message's audio checked
against the transcriber's limits, fetched through the Bot API (`getFile`, then the file), and transcribed. A
document is checked against media.document_kilobytes (the message's size, then getFile's) and fetched the same
way; picoclaw/channels/documents.py reads it.

Only an allowed user's message gets here (strangers are refused before any handler), so a stranger's file is
never fetched. Every failure is `MediaRefused`: one line for the user, and the session untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from aiogram import Bot
from aiogram.exceptions import TelegramAPIError
from aiogram.types import Message
from aiogram.utils.text_decorations import html_decoration
from aiohttp import ClientError

from picoclaw.channels.documents import check_document_size
from picoclaw.channels.voice_notes import MediaRefused, Transcriber
from picoclaw.memory import image_type

log = logging.getLogger(__name__)

ECHO_CHARS = 3_500  # the transcript shown back is cut here (a Telegram message holds 4,096); the model gets it all


@dataclass(frozen=True)
class Audio:
    """The audio of one message: which file, what it is called for the user and the transcriber, its length."""

    kind: str  # "voice note", "audio file", "video note"
    file_id: str
    filename: str  # the transcriber reads the format from the extension
    seconds: int | None
    size: int | None


def audio_of(message: Message) -> Audio | None:
    """The voice note, audio file or video note `message` carries, if it carries one."""
    if message.voice is not None:
        voice = message.voice
        return Audio("voice note", voice.file_id, "voice.ogg", voice.duration, voice.file_size)
    if message.audio is not None:
        audio = message.audio
        return Audio("audio file", audio.file_id, audio.file_name or "audio.mp3", audio.duration, audio.file_size)
    if message.video_note is not None:
        note = message.video_note
        return Audio("video note", note.file_id, "video_note.mp4", note.duration, note.file_size)
    return None


async def fetch(bot: Bot, file_id: str, what: str, check: Callable[[int | None], None] = lambda size: None) -> bytes:
    """The bytes of a file through the Bot API: `getFile` (whose size `check` may refuse), then the download;
    MediaRefused naming `what` when Telegram cannot give it."""
    try:
        file = await bot.get_file(file_id)
        check(file.file_size)
        if file.file_path is None:
            raise MediaRefused(f"Telegram could not give me that {what} (it gave no path to it).")
        data = await bot.download_file(file.file_path)
    except TelegramAPIError as exc:
        raise MediaRefused(f"Telegram could not give me that {what} ({exc.message}).") from None
    except (ClientError, TimeoutError) as exc:
        raise MediaRefused(f"Telegram could not give me that {what} ({type(exc).__name__}).") from None
    if data is None:
        raise MediaRefused(f"Telegram could not give me that {what}.")
    return data.read()


async def transcript_of(bot: Bot, audio: Audio, transcriber: Transcriber) -> str:
    """The words of `audio`: checked against the limits, downloaded, transcribed; else MediaRefused."""
    transcriber.check(audio.kind, audio.seconds, audio.size)
    data = await fetch(bot, audio.file_id, audio.kind, lambda size: transcriber.check(audio.kind, None, size))
    return await transcriber.words(audio.kind, data, audio.filename)


def echo_html(transcript: str) -> str:
    """The transcript as the user sees it first, in a quote that folds away when long, so a mishearing shows."""
    shown = transcript if len(transcript) <= ECHO_CHARS else transcript[:ECHO_CHARS] + " …"
    quote = html_decoration.quote(f"🎤 {shown}")
    return html_decoration.expandable_blockquote(quote) if len(shown) > 200 else html_decoration.blockquote(quote)


# -- documents ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Document:
    """The file of one message sent as a document: which file, its name, what Telegram says it is and weighs."""

    file_id: str
    name: str
    mime_type: str | None
    size: int | None

    @property
    def image(self) -> bool:
        """An image sent as a file, by what Telegram says (SVG is text, and read as such)."""
        mime = self.mime_type or ""
        return mime.startswith("image/") and mime != "image/svg+xml"


def document_of(message: Message) -> Document | None:
    """The document `message` carries, if it carries one."""
    document = message.document
    if document is None or message.animation is not None:  # a GIF comes as an animation that is a document too
        return None
    return Document(document.file_id, document.file_name or "document", document.mime_type, document.file_size)


async def document_bytes(bot: Bot, document: Document, max_bytes: int) -> bytes:
    """The bytes of `document`, fetched only when neither the message nor getFile says it is over `max_bytes`;
    else MediaRefused."""
    check_document_size(document.size, max_bytes)
    return await fetch(bot, document.file_id, "file", lambda size: check_document_size(size, max_bytes))


# -- photos -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Picture:
    """The image of one message: a photo (the largest size within the limit) or an image sent as a file."""

    file_id: str
    name: str
    size: int | None


def picture_of(message: Message, max_bytes: int) -> Picture | None:
    """The image `message` carries, if it carries one; MediaRefused when every size of it is over `max_bytes`."""
    if message.photo:
        fitting = [size for size in message.photo if size.file_size is None or size.file_size <= max_bytes]
        if not fitting:
            refuse_image(min(size.file_size or 0 for size in message.photo), max_bytes)
        best = max(fitting, key=lambda size: size.width * size.height)
        return Picture(best.file_id, "photo.jpg", best.file_size)
    document = document_of(message)
    if document is not None and document.image:
        if document.size is not None and document.size > max_bytes:
            refuse_image(document.size, max_bytes)
        return Picture(document.file_id, document.name, document.size)
    return None


def refuse_image(size: int, max_bytes: int) -> NoReturn:
    raise MediaRefused(f"That image is {size / 1_000_000:.1f} MB; I take up to {max_bytes // 1_000_000} MB "
                       "(media.image_megabytes).")


async def picture_bytes(bot: Bot, picture: Picture, max_bytes: int) -> bytes:
    """The bytes of `picture`, checked to be an image a vision model takes; else MediaRefused."""

    def check(size: int | None) -> None:
        if size is not None and size > max_bytes:
            refuse_image(size, max_bytes)

    data = await fetch(bot, picture.file_id, "image", check)
    check(len(data))
    if image_type(data) is None:
        raise MediaRefused("That image could not be read: it is damaged, or not a JPEG, PNG, GIF or WebP.")
    return data
