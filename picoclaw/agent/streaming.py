"""What the terminal sees of an answer while it is written: text as it arrives, unless it must not be shown yet.

A small local model may write its tool call as text (```json {"name": …}```, `<tool_call>`, …), which the
loop then runs as a call (tools/text_tool_calls.py). Shown as it streamed, that JSON would reach the screen
before anyone knew it was a call. So while the start of a reply could still be such a call, it is held back;
once it clearly is not, what was held and everything after it flows through. The same holds for a start that
may be an echo of the <context> data block (agent/context_echo.py: the echo is dropped, what follows it shown),
and for white space alone: an empty reply shows nothing (the loop asks again, agent/empty_reply.py). With
`previous`, the answer that ended the turn before, a start that is that answer's start is held too: the whole of
it again is an echo the loop asks again for, never shown.
A model that wraps its replies in `<response>…</response>` streams too: after the opening tag, what follows is
judged as a reply's start is, and the tags are not shown (a closing tag that ends the reply is held until it is
clear that it does; `without_response_wrapper` drops the same from what is stored).
"""

from __future__ import annotations

from picoclaw.agent.context_echo import may_be_echo, without_context_echo
from picoclaw.agent.empty_reply import MIN_REPEAT_CHARS, same_words
from picoclaw.providers.base import TextSink
from picoclaw.tools import RESPONSE_CLOSE, RESPONSE_OPEN, without_response_wrapper

# How a tool call written as text begins (inside a `<response>` wrapper too); a reply that begins otherwise is
# plain text.
CALL_OPENINGS = ("```", "<tool_call>", "<tools>", "{", "functions.")


class StreamGate:
    """Passes streamed text to `sink`, holding back a start that is white space, may echo the <context> block, or
    (with `hold_calls`) may be a tool call written as text; without a `<response>` wrapper's tags."""

    def __init__(self, sink: TextSink, *, hold_calls: bool = True, previous: str | None = None):
        self.sink = sink
        self.hold_calls = hold_calls
        # The previous turn's answer (agent/empty_reply.py `repeats_last_answer`), compared as same_words.
        self.previous = same_words(previous) if previous and len(same_words(previous)) >= MIN_REPEAT_CHARS else ""
        self.holding = True
        self.held: list[str] = []
        self.echoed = False  # an echo of the <context> block was dropped from the start
        self.wrapped = False  # the reply opened with <response>: a closing tag at its end is not shown
        self.tail = ""  # of a wrapped reply: what may still be its closing tag (and white space around it)

    async def feed(self, delta: str) -> None:
        """One piece of the reply, as the provider streams it."""
        if not self.holding:
            await self._show(delta)
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
        if start.startswith(RESPONSE_OPEN):  # judged by what follows the tag
            start = start[len(RESPONSE_OPEN):].lstrip()
            if start and not (self.hold_calls and _may_open_a_call(start)):
                self.wrapped = True
                self.held = [start]
        elif RESPONSE_OPEN.startswith(start):  # "<resp": may be the wrapper's tag
            return
        if not start or (self.hold_calls and _may_open_a_call(start)):
            return
        judged = start[:_closing_at(start)] if self.wrapped else start  # a wrapper's closing tag is no word of it
        if self.previous and self.previous.startswith(same_words(judged)):  # may be the previous answer again
            return
        self.holding = False
        await self._release()

    async def finish(self, *, was_call: bool) -> None:
        """The reply is complete: show what was held (without an echo or a wrapper's tags), unless it turned out
        to be a tool call or there is nothing in it but white space."""
        if self.holding and not was_call:
            text = without_response_wrapper(without_context_echo("".join(self.held)))
            if text.strip():
                await self.sink(text)
        elif self.tail.strip() not in ("", RESPONSE_CLOSE):  # not the wrapper's closing tag after all
            await self.sink(self.tail)
        self.held.clear()
        self.tail = ""

    async def _release(self) -> None:
        if self.held:
            text, self.held = "".join(self.held), []
            await self._show(text)

    async def _show(self, text: str) -> None:
        """`text` to the sink; of a wrapped reply, all but an end that may still be its closing tag."""
        if not self.wrapped:
            await self.sink(text)
            return
        tail = self.tail + text
        cut = _closing_at(tail)
        self.tail = tail[cut:]
        if cut:
            await self.sink(tail[:cut])


def _may_open_a_call(start: str) -> bool:
    return any(start.startswith(opening) or opening.startswith(start) for opening in CALL_OPENINGS)


def _closing_at(text: str) -> int:
    """Where the end of `text` that may still be a closing `</response>` (with the white space around it) begins;
    len(text) when none may (trailing white space alone is held too: the tag may follow it)."""
    at = text.rfind("<")
    after = text[at:] if at >= 0 else ""
    if at < 0 or not (RESPONSE_CLOSE.startswith(after) or (after.startswith(RESPONSE_CLOSE)
                                                            and not after[len(RESPONSE_CLOSE):].strip())):
        at = len(text.rstrip())
    while at > 0 and text[at - 1].isspace():
        at -= 1
    return at
