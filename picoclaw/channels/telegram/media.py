"""Voice notes, audio files and round video notes from Telegram as turns (issue 43): the message's audio checked
against the transcriber's limits, fetched through the Bot API (`getFile`, then the file), and transcribed.

Only an allowed user's message gets here (strangers are refused before any handler), so a stranger's file is
never fetched. Every failure is `MediaRefused`: one line for the user, and the session untouched.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiogram import Bot
from aiogram.exceptions import TelegramAPIError
from aiogram.types import Message
from aiogram.utils.text_decorations import html_decoration
from aiohttp import ClientError

from picoclaw.channels.media import MediaRefused, Transcriber

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


async def transcript_of(bot: Bot, audio: Audio, transcriber: Transcriber) -> str:
    """The words of `audio`: checked against the limits, downloaded, transcribed; else MediaRefused."""
    transcriber.check(audio.kind, audio.seconds, audio.size)
    try:
        data = await bot.download(audio.file_id)
    except TelegramAPIError as exc:
        raise MediaRefused(f"Telegram could not give me that {audio.kind} ({exc.message}).") from None
    except (ClientError, TimeoutError) as exc:
        raise MediaRefused(f"Telegram could not give me that {audio.kind} ({type(exc).__name__}).") from None
    if data is None:
        raise MediaRefused(f"Telegram could not give me that {audio.kind}.")
    return await transcriber.words(audio.kind, data.read(), audio.filename)


def echo_html(transcript: str) -> str:
    """The transcript as the user sees it first, in a quote that folds away when long, so a mishearing shows."""
    shown = transcript if len(transcript) <= ECHO_CHARS else transcript[:ECHO_CHARS] + " …"
    quote = html_decoration.quote(f"🎤 {shown}")
    return html_decoration.expandable_blockquote(quote) if len(shown) > 200 else html_decoration.blockquote(quote)
