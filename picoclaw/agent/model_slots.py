"""A channel's bound on the model calls it makes at once (a webhook worker's max_parallel): the slot a turn's model
calls wait for. `AgentLoop.handle` sets it for the turn (`turn_model_slot`); `SlottedProvider`, under every
provider of the agent, holds it around each call the turn makes (its answer, a query rewrite, a summary or flush
it must wait for), and not around the budget's claim, a tool, or work after the reply (`AgentLoop._spawn` clears
it there).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from contextvars import ContextVar
from typing import Any

from picoclaw.providers.base import ChatReply, Message, TextSink, ToolChoice, WrappedProvider

ModelSlot = Callable[[], AbstractAsyncContextManager[object]]

# The slot of the turn under way; None: no bound (outside a turn, or a channel that sets none).
turn_model_slot: ContextVar[ModelSlot | None] = ContextVar("turn_model_slot", default=None)


class SlottedProvider(WrappedProvider):
    """`inner`, each call made holding the slot of the turn under way, if any."""

    async def chat(self, messages: list[Message], tools: list[dict[str, Any]] | None = None,
                   *, max_tokens: int | None = None, on_text: TextSink | None = None,
                   tool_choice: ToolChoice = "auto") -> ChatReply:
        slot = turn_model_slot.get()
        async with slot() if slot is not None else nullcontext():
            return await self.inner.chat(messages, tools, max_tokens=max_tokens, on_text=on_text,
                                         tool_choice=tool_choice)
