"""A reply that begins by echoing the <context> data block picoclaw put in front of the user's message.

A small model sometimes copies the block (memory, notes, the time: agent/context.py) before its answer, or as all
of it. The echo is removed before the reply is shown or stored: the text after `</context>` is the answer, and a
reply that opens the block and never closes it is echo up to its `</time>` (all of it without one: an empty
reply, then; agent/empty_reply.py). While the reply streams, text that may still be the start of an echo is held
back until that is decided (`may_be_echo`, used by agent/streaming.py).

Only what looks like the block is an echo: `<context>` followed by a tag (the block's first line is always one)
and, before `</context>`, the `<time>` line a turn's block always holds (or the session summary, which alone makes
the block of an older message that had none). An answer about the tag itself ("<context> is
the tag picoclaw puts before your message; it ends with </context>") is text.
"""

from __future__ import annotations

# The data block's tags, as agent/context.py writes them: `<time>…</time>` is always its last line.
OPEN = "<context>"
CLOSE = "</context>"
TIME = "<time>"
TIME_CLOSE = "</time>"
# the session summary's section, at the start of the request's first block (transcripts/session_store.py)
SUMMARY = "<summary>"


def without_context_echo(text: str) -> str:
    """`text` without an echo of the data block at its start; unchanged when it does not begin with one."""
    start = text.lstrip()
    if not _opens_the_block(start):
        return text
    end = start.find(CLOSE)
    block = start if end < 0 else start[:end]
    if TIME not in block and SUMMARY not in block:  # a block always holds one (an older message's, the summary)
        return text
    if end >= 0:
        return start[end + len(CLOSE):].lstrip()
    # Never closed: the block's time line was its end.
    time_end = block.find(TIME_CLOSE, block.find(TIME))
    return "" if time_end < 0 else block[time_end + len(TIME_CLOSE):].lstrip()


def may_be_echo(text: str) -> bool:
    """Whether streamed text so far may still be (or be the start of) an echo, so it must be held back."""
    start = text.lstrip()
    if not start:
        return False
    if OPEN.startswith(start):  # "<", "<cont": the opening tag not yet complete
        return True
    return _opens_the_block(start) and CLOSE not in start


def _opens_the_block(start: str) -> bool:
    """`<context>` followed by nothing yet or by a tag, as the block's first line is; not prose about the tag."""
    if not start.startswith(OPEN):
        return False
    inner = start[len(OPEN):].lstrip()
    return not inner or inner.startswith("<")
