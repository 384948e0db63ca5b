"""Media a person sends besides text, as every channel turns it into a turn: a voice note's words.

A channel hands the audio to the `Transcriber` app.py built from config.json's `transcription` (any
OpenAI-compatible `/audio/transcriptions` endpoint) and gets the words back, or `MediaRefused`: one line for
the person, saying why nothing was sent to the model. The turn's text is the transcript marked as spoken
(`spoken`), so the model knows it heard a voice, and the session and memory keep what was said. An image's turn
(`image_turn`) is its caption and where the image is kept; the image itself goes only to a model that sees.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["IMAGE_NOT_KEPT", "NOT_LISTENING", "NO_VISION", "SPOKEN_MARK", "MediaRefused", "Transcriber", "image_turn",
           "spoken"]

SPOKEN_MARK = "[voice note, transcribed]"
NOT_LISTENING = ("I cannot listen to voice notes or audio yet: the owner can turn it on with a \"transcription\" "
                 "entry in config.json (docs/telegram.md: Voice, photos and files).")


NO_VISION = "This model cannot see images, so I read only what you wrote with it."
IMAGE_NOT_KEPT = "I could not keep that image on my side, so I did not answer it. Please try again later."
IMAGE_MARK = "[image: {saved_as}]"
NOT_SEEN = "(this model cannot see images: only the text above was read)"


class MediaRefused(Exception):
    """Why a piece of media did not become a turn, as one line for the person who sent it."""


@dataclass(frozen=True)
class Transcriber:
    """The configured transcriber: `transcribe(audio, file name)` gives the words ("" when it heard none) or
    raises MediaRefused; audio over `max_seconds` or `max_bytes` is refused before it is fetched."""

    transcribe: Callable[[bytes, str], Awaitable[str]]
    max_seconds: int
    max_bytes: int

    def check(self, kind: str, seconds: int | None, size: int | None) -> None:
        """Refuse audio over the limits, before anything is downloaded."""
        if seconds is not None and seconds > self.max_seconds:
            raise MediaRefused(f"That {kind} is {seconds} s long; I transcribe up to {self.max_seconds} s "
                               "(transcription.max_seconds).")
        if size is not None and size > self.max_bytes:
            raise MediaRefused(f"That {kind} is {size / 1_000_000:.1f} MB; I take up to "
                               f"{self.max_bytes // 1_000_000} MB (transcription.max_megabytes).")

    async def words(self, kind: str, audio: bytes, filename: str) -> str:
        """The words spoken in `audio`; MediaRefused when there are none."""
        if len(audio) > self.max_bytes:
            raise MediaRefused(f"That {kind} is {len(audio) / 1_000_000:.1f} MB; I take up to "
                               f"{self.max_bytes // 1_000_000} MB (transcription.max_megabytes).")
        text = (await self.transcribe(audio, filename)).strip()
        if not text:
            raise MediaRefused(f"I heard no words in that {kind}, so I did not answer it.")
        return text


def spoken(transcript: str, caption: str | None = None) -> str:
    """A turn's text for audio the person sent: its transcript marked as spoken, and its caption, if any."""
    text = f"{SPOKEN_MARK} {transcript}"
    return f"{text}\n{caption.strip()}" if caption and caption.strip() else text


def image_turn(saved_as: str, caption: str | None, *, seen: bool) -> str:
    """A turn's text for an image the person sent: their caption, and where the image is kept (the session
    keeps this, never the image); with `seen` False, a note that the model got only the text."""
    lines = [caption.strip()] if caption and caption.strip() else []
    lines.append(IMAGE_MARK.format(saved_as=saved_as) + ("" if seen else f" {NOT_SEEN}"))
    return "\n".join(lines)
