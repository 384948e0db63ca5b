"""A reply that begins by echoing the <context> data block picoclaw put in front of the user's message.

A small model sometimes copies the block (memory, notes, the time: agent/context.py) before its answer, or as all
of it. The echo is removed before the reply is shown or stored: the text after `</context>` is the answer, and a
reply that opens the block and never closes it is all echo (an empty reply, then: agent/empty_reply.py). While
the reply streams, text that may still be the start of an echo is held back until that is decided
(`may_be_echo`, used by agent/streaming.py).
"""

from __future__ import annotations

# The data block's tags, as agent/context.py writes them.
OPEN = "<context>"
CLOSE = "</context>"


def without_context_echo(text: str) -> str:
    """`text` without an echo of the data block at its start; unchanged when it does not begin with one."""
    start = text.lstrip()
    if not start.startswith(OPEN):
        return text
    end = start.find(CLOSE)
    return "" if end < 0 else start[end + len(CLOSE):].lstrip()


def may_be_echo(text: str) -> bool:
    """Whether streamed text so far may still be (or be the start of) an echo, so it must be held back."""
    start = text.lstrip()
    if not start:
        return False
    if OPEN.startswith(start):  # "<", "<cont": the opening tag not yet complete
        return True
    return start.startswith(OPEN) and CLOSE not in start
