"""What the terminal sees of an answer while it is written: text as it arrives, unless it must not be shown yet.

A small local model may write its tool call as text (```json {"name": …}```, `<tool_call>`, …), which the
loop then runs as a call (agent/text_tool_calls.py). Shown as it streamed, that JSON would reach the screen
before anyone knew it was a call. So while the start of a reply could still be such a call, it is held back;
once it clearly is not, what was held and everything after it flows through. The same holds for a start that
may be an echo of the <context> data block (agent/context_echo.py: the echo is dropped, what follows it shown),
and for white space alone: an empty reply shows nothing (the loop asks again, agent/empty_reply.py).
"""

from __future__ import annotations

from picoclaw.agent.context_echo import may_be_echo, without_context_echo
from picoclaw.providers.base import TextSink

# How a tool call written as text begins; a reply that begins otherwise is plain text.
CALL_OPENINGS = ("```", "<tool_call>", "<tools>", "<response>", "{", "functions.")


class StreamGate:
    """Passes streamed text to `sink`, holding back a start that is white space, may echo the <context> block, or
    (with `hold_calls`) may be a tool call written as text."""

    def __init__(self, sink: TextSink, *, hold_calls: bool = True):
        self.sink = sink
        self.hold_calls = hold_calls
        self.holding = True
        self.held: list[str] = []
        self.echoed = False  # an echo of the <context> block was dropped from the start

    async def feed(self, delta: str) -> None:
        """One piece of the reply, as the provider streams it."""
        if not self.holding:
            await self.sink(delta)
            return
        self.held.append(delta)
        text = "".join(self.held)
        if may_be_echo(text):
            return
        shown = without_context_echo(text)
        if shown != text:  # the echo is dropped; what follows it is judged afresh, its leading blank lines too
            self.echoed = True
        if self.echoed:
            shown = shown.lstrip()
        self.held = [shown] if shown else []
        start = shown.lstrip()
        if not start or (self.hold_calls and _may_open_a_call(start)):
            return
        self.holding = False
        await self._release()

    async def finish(self, *, was_call: bool) -> None:
        """The reply is complete: show what was held (without an echo), unless it turned out to be a tool call or
        there is nothing in it but white space."""
        if self.holding and not was_call:
            text = without_context_echo("".join(self.held))
            if text.strip():
                await self.sink(text)
        self.held.clear()

    async def _release(self) -> None:
        if self.held:
            text, self.held = "".join(self.held), []
            await self.sink(text)


def _may_open_a_call(start: str) -> bool:
    return any(start.startswith(opening) or opening.startswith(start) for opening in CALL_OPENINGS)
