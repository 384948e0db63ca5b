"""The provider the background calls between turns use (summary, memory flush, lessons, reflection, compression,
the query rewrite): each request's max_tokens is what its prompt leaves of the model's window, at most
BACKGROUND_REPLY_CAP unless the caller asks for its own max_tokens (compression: a rewrite as long as its group), so
no request of the process is over the window with its reply (agent/budget.py).
"""

from __future__ import annotations

from typing import Any

from picoclaw.agent.budget import json_tokens, message_tokens, usable
from picoclaw.providers.base import (
    ChatProvider,
    ChatReply,
    ContextWindows,
    Message,
    ProviderError,
    TextSink,
    ToolChoice,
    WrappedProvider,
)

# A summary, a flush's facts, a lesson: a few hundred tokens; config's max_tokens (4,096) would not fit a 4k window.
BACKGROUND_REPLY_CAP = 1024
# What a flush's own prompt holds besides the transcript (its instructions, ~200 tokens), with a margin.
FLUSH_PROMPT_ALLOWANCE = 400
# Less room than this for the answer: the request is not sent (a background call after the conversation then asks
# in its own, shorter prompt: PromptPrefix.ask).
BACKGROUND_REPLY_FLOOR = 128


class WindowedProvider(WrappedProvider):
    """`provider` with each request's max_tokens fitted to the window `windows` says (see the module doc)."""

    def __init__(self, provider: ChatProvider, windows: ContextWindows, cap: int = BACKGROUND_REPLY_CAP):
        super().__init__(provider)
        self.windows = windows
        self.cap = cap

    async def chat(self, messages: list[Message], tools: list[dict[str, Any]] | None = None,
                   *, max_tokens: int | None = None, on_text: TextSink | None = None,
                   tool_choice: ToolChoice = "auto") -> ChatReply:
        window = await self.windows.current()
        prompt = sum(message_tokens(m) for m in messages) + (json_tokens(tools) if tools else 0)
        wanted = self.cap if max_tokens is None else max_tokens  # asked for: wins, still lowered to the room
        room = min(wanted, usable(window.tokens) - prompt)
        if room < min(BACKGROUND_REPLY_FLOOR, wanted):
            raise ProviderError("context_too_long", f"a background request ({prompt:,} tokens) leaves no room for "
                                f"its answer in the model's window of {window.tokens:,} tokens ({window.source})")
        return await self.inner.chat(messages, tools, max_tokens=room, on_text=on_text, tool_choice=tool_choice)


def flush_pieces(messages: list[Message], window: int) -> list[list[Message]]:
    """`messages` in runs whose flush request fits `window` with its reply, newest run first (what a flush can
    still read when a range is too long for one request); a single message over it is a run of its own."""
    room = usable(window) - BACKGROUND_REPLY_CAP - FLUSH_PROMPT_ALLOWANCE
    pieces: list[list[Message]] = []
    piece: list[Message] = []
    size = 0
    for message in reversed(messages):
        cost = message_tokens(message)
        if piece and size + cost > room:
            pieces.append(piece)
            piece, size = [], 0
        piece.insert(0, message)
        size += cost
    if piece:
        pieces.append(piece)
    return pieces
