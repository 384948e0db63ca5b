"""The images a user's message carries: sent in the turn's own requests as `image_url` parts with data
URLs, beside the text. The session keeps the message's text, which names each image by its place in media/, never
the bytes; a later turn sends that text only, so an image goes to the model once."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from contextvars import ContextVar

from picoclaw.memory import image_type
from picoclaw.providers.base import Message

IMAGE_TOKENS = 1_000  # what one image costs in a request, as counted here (vision models take ~85 to ~1,500)
# How many images the turn under way sends with its message: its requests are fitted with room for them.
turn_images: ContextVar[int] = ContextVar("turn_images", default=0)


def with_images(message: Message, images: Sequence[bytes]) -> Message:
    """`message` (a user message) with `images` after its text, as `image_url` parts."""
    if not images:
        return message
    text = message.get("content")
    parts: list[dict[str, object]] = [{"type": "text", "text": text if isinstance(text, str) else ""}]
    for data in images:
        mime = image_type(data) or "application/octet-stream"
        url = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return {**message, "content": parts}


def image_count(message: Message) -> int:
    """How many image parts `message` holds."""
    content = message.get("content")
    if not isinstance(content, list):
        return 0
    return sum(1 for part in content if isinstance(part, dict) and part.get("type") == "image_url")


def without_images(message: Message) -> Message:
    """`message` with its image parts left out (what its tokens are counted on)."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    return {**message, "content": [part for part in content
                                   if not (isinstance(part, dict) and part.get("type") == "image_url")]}
