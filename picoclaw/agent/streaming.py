"""What the terminal sees of an answer while it is written: text as it arrives, unless it may be a tool call.

A small local model may write its tool call as text (```json {"name": …}```, `<tool_call>`, …), which the
loop then runs as a call (agent/text_tool_calls.py). Shown as it streamed, that JSON would reach the screen
before anyone knew it was a call. So while the start of a reply could still be such a call, it is held back;
once it clearly is not, what was held and everything after it flows through.
"""

from __future__ import annotations

from picoclaw.providers.base import TextSink

# How a tool call written as text begins; a reply that begins otherwise is plain text.
CALL_OPENINGS = ("```", "<tool_call>", "<tools>", "{", "functions.")


class StreamGate:
    """Passes streamed text to `sink`, holding back a reply whose start may be a tool call written as text."""

    def __init__(self, sink: TextSink, *, hold_calls: bool = True):
        self.sink = sink
        self.holding = hold_calls
        self.held: list[str] = []

    async def feed(self, delta: str) -> None:
        """One piece of the reply, as the provider streams it."""
        if not self.holding:
            await self.sink(delta)
            return
        self.held.append(delta)
        start = "".join(self.held).lstrip()
        if not start or _may_open_a_call(start):
            return
        self.holding = False
        await self._release()

    async def finish(self, *, was_call: bool) -> None:
        """The reply is complete: show what was held, unless the reply turned out to be a tool call."""
        if not was_call:
            await self._release()
        self.held.clear()

    async def _release(self) -> None:
        if self.held:
            text, self.held = "".join(self.held), []
            await self.sink(text)


def _may_open_a_call(start: str) -> bool:
    return any(start.startswith(opening) or opening.startswith(start) for opening in CALL_OPENINGS)
