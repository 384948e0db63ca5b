"""A file a person attaches to a message, whichever face it came through (`picoclaw chat --attach`, the web
console's Attach): what it is, told by its bytes, and the turn it makes.

- audio (OGG, MP3, WAV, FLAC, M4A/MP4, WebM) is transcribed by the configured `Transcriber` (none configured:
  `NOT_LISTENING`); the turn is the transcript marked as spoken (`spoken`), and the person sees it first;
- an image (JPEG, PNG, GIF, WebP: `image_type`) is kept in the scope's media/ folder and sent to a model that
  sees; a model that does not gets the text and a note (`image_turn`), and the person hears `NO_VISION`;
- anything else is a document: read (`read_document`: text in any common encoding, or a PDF's text), kept
  (`save_document`) and given to the model as its text (`document_turn`).

The person's typed message goes where Telegram puts a caption. Every failure is `MediaRefused`, one line for the
person, raised before anything reaches the model; the limits are config.json's `media` (images, documents) and
`transcription` (audio). The pieces are the ones the Telegram channel composes (voice_notes.py, documents.py); Telegram
keeps its own flow only for what it fetches from the Bot API.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from picoclaw.channels.documents import KILOBYTE, check_document_size, document_turn, read_document, save_document
from picoclaw.channels.voice_notes import IMAGE_NOT_KEPT, NO_VISION, NOT_LISTENING, MediaRefused, image_turn, spoken
from picoclaw.memory import image_type

if TYPE_CHECKING:
    from picoclaw.agent import AgentLoop
    from picoclaw.channels.voice_notes import Transcriber
    from picoclaw.config import MediaConfig

__all__ = ["HEARD_MARK", "Attached", "Kind", "attach", "audio_format", "kind_of", "largest_attachment",
           "read_attachment"]

log = logging.getLogger(__name__)

Kind = Literal["audio", "image", "document"]
HEARD_MARK = "🎤 "  # before the transcript shown back, as on Telegram
AUDIO_KIND = "audio file"  # what the transcriber's refusals call it: "That audio file is …"
_IMAGE_BRANDS = (b"heic", b"heix", b"hevc", b"mif1", b"msf1", b"avif")  # ISO files that are images, not audio


@dataclass(frozen=True)
class Attached:
    """The turn a file makes: its text (the caption inside it), the images for a model that sees, and the lines
    the person sees before the answer (the transcript heard, `NO_VISION`)."""

    kind: Kind
    text: str
    images: tuple[bytes, ...] = ()
    notices: tuple[str, ...] = ()
    saved_as: str | None = None  # where the file is kept (media/…); None for audio, which is not kept


def audio_format(data: bytes) -> str | None:
    """The extension of the audio `data` holds, by its bytes (the transcriber reads the format from the file
    name); None when it is not audio."""
    if data.startswith(b"OggS"):
        return "ogg"
    if data.startswith(b"fLaC"):
        return "flac"
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data.startswith(b"\x1aE\xdf\xa3"):
        return "webm"
    if data[4:8] == b"ftyp" and data[8:12] not in _IMAGE_BRANDS:
        return "m4a" if data[8:11] == b"M4A" else "mp4"
    if data.startswith(b"ID3") or _mp3_frame(data):
        return "mp3"
    return None


def _mp3_frame(data: bytes) -> bool:
    """Whether `data` starts with an MPEG audio layer III frame header (an MP3 without an ID3 tag). Layer III
    only: a UTF-16 text's byte order mark (FF FE) reads as a layer I header."""
    if len(data) < 4 or data[0] != 0xFF or data[1] & 0xE6 != 0xE2:  # 11 sync bits, layer III
        return False
    version, bitrate, rate = (data[1] >> 3) & 3, data[2] >> 4, (data[2] >> 2) & 3
    return version != 1 and bitrate not in (0, 15) and rate != 3


def kind_of(data: bytes) -> Kind:
    """What a file is, by its bytes: audio, an image a vision model takes, or (anything else) a document."""
    if audio_format(data) is not None:
        return "audio"
    if image_type(data) is not None:
        return "image"
    return "document"


def largest_attachment(media: MediaConfig, transcriber: Transcriber | None) -> int:
    """The largest file any kind takes: a file over it is refused before it is read."""
    return max(media.image_megabytes * 1_000_000, media.document_kilobytes * KILOBYTE,
               transcriber.max_bytes if transcriber is not None else 0)


def _too_large(size: int, media: MediaConfig, transcriber: Transcriber | None) -> MediaRefused:
    audio = (f", audio up to {transcriber.max_bytes // 1_000_000} MB (transcription.max_megabytes)"
             if transcriber is not None else "")
    return MediaRefused(f"That file is {size / 1_000_000:.1f} MB; I take images of up to {media.image_megabytes} MB "
                        f"(media.image_megabytes), documents up to {media.document_kilobytes:,} KB "
                        f"(media.document_kilobytes){audio}.")


def read_attachment(path: Path, media: MediaConfig, transcriber: Transcriber | None) -> tuple[str, bytes]:
    """The name and bytes of the file at `path`; MediaRefused (one line) when it is missing, a folder, over every
    kind's limit (told before it is read) or unreadable."""
    shown = str(path)
    try:
        if not path.exists():
            raise MediaRefused(f"There is no file {shown}.")
        if not path.is_file():
            raise MediaRefused(f"{shown} is not a file (a folder?); attach one file.")
        size = path.stat().st_size
        if size > largest_attachment(media, transcriber):
            raise _too_large(size, media, transcriber)
        with path.open("rb") as file:  # read to the limit only: a file that grows meanwhile is not read whole
            data = file.read(largest_attachment(media, transcriber) + 1)
    except OSError as exc:
        raise MediaRefused(f"I could not read {shown}: {exc.strerror or exc}.") from None
    if len(data) > largest_attachment(media, transcriber):
        raise _too_large(len(data), media, transcriber)
    return path.name or "file", data


async def attach(name: str, data: bytes, caption: str | None, *, agent: AgentLoop,
                 transcriber: Transcriber | None) -> Attached:
    """The turn the file `name` holding `data` makes, with the person's `caption` (their typed message, if any);
    MediaRefused (one line) when it cannot make one, before anything reaches the model."""
    kind = kind_of(data)
    if kind == "audio":
        return await _listen(name, data, caption, transcriber)
    if kind == "image":
        return await _look(name, data, caption, agent)
    return await _read(name, data, caption, agent)


async def _listen(name: str, data: bytes, caption: str | None, transcriber: Transcriber | None) -> Attached:
    if transcriber is None:
        log.info("attachments: %s is audio, and no transcription is configured", name)
        raise MediaRefused(NOT_LISTENING)
    transcriber.check(AUDIO_KIND, None, len(data))
    extension = audio_format(data)
    stem, dot, given = name.rpartition(".")
    # The transcriber tells the format by the extension: the one the bytes say, whatever the name says.
    filename = name if dot and given.lower() == extension else f"{stem if dot else name}.{extension}"
    heard = await transcriber.words(AUDIO_KIND, data, filename)
    log.info("attachments: %s (%d bytes) transcribed, %d chars", name, len(data), len(heard))
    return Attached("audio", spoken(heard, caption), notices=(HEARD_MARK + heard,))


async def _look(name: str, data: bytes, caption: str | None, agent: AgentLoop) -> Attached:
    limit = agent.workspace.config.media.image_megabytes
    if len(data) > limit * 1_000_000:
        raise MediaRefused(f"That image is {len(data) / 1_000_000:.1f} MB; I take up to {limit} MB "
                           "(media.image_megabytes).")
    try:
        saved_as = await asyncio.to_thread(agent.workspace.media().save, data, name)
    except OSError as exc:
        log.warning("attachments: image %s could not be kept: %s", name, exc)
        raise MediaRefused(IMAGE_NOT_KEPT) from None
    log.info("attachments: an image (%d bytes) saved as %s", len(data), saved_as)
    if await agent.sees_images():
        return Attached("image", image_turn(saved_as, caption, seen=True), (data,), saved_as=saved_as)
    return Attached("image", image_turn(saved_as, caption, seen=False), notices=(NO_VISION,), saved_as=saved_as)


async def _read(name: str, data: bytes, caption: str | None, agent: AgentLoop) -> Attached:
    settings = agent.workspace.config.media
    limit = settings.document_kilobytes * KILOBYTE
    check_document_size(len(data), limit)
    doc = await asyncio.to_thread(read_document, name, data, max_bytes=limit)
    saved_as, text_saved_as = await asyncio.to_thread(save_document, agent.workspace.media(), doc, data,
                                                      max_chars=settings.document_chars)
    log.info("attachments: document %s (%s, %d bytes) saved as %s", name, doc.kind, len(data), saved_as)
    text = document_turn(doc, saved_as, caption, settings.document_chars, text_saved_as=text_saved_as)
    return Attached("document", text, saved_as=saved_as)
