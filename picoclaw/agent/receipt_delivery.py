"""Where the receipts of automatic memory writes go: each write to MEMORY.md or LEARNINGS.md made
without a command of the user's (the memory flush, the model's memory_append, a lesson) is logged for
`/memory recent` and shown once in the conversation it came from.

A channel shows them by passing a `MemorySink` (`TurnHooks.on_memory`): it gets the write itself, whose
`notice` is the one line to show ("remembered: …"), and may do more with it (react to the message, say). A
channel that passes none shows no receipt: the write is still logged and listed. A receipt that cannot be
shown is logged, never raised into the work that wrote it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from picoclaw.memory import MemoryWrite, WriteLog

log = logging.getLogger(__name__)

NoticeSink = Callable[[str, str], Awaitable[None]]  # (session key, notice): work done after the reply
MemorySink = Callable[[str, MemoryWrite], Awaitable[None]]  # (session key, write): an automatic memory write


@dataclass(frozen=True)
class Receipts:
    """Where one conversation's work after the reply speaks: `notify` for notices (a summary starting),
    `remembered` for the receipts of memory writes."""

    notify: NoticeSink | None = None
    remembered: MemorySink | None = None

    async def show(self, key: str, writes: Sequence[MemoryWrite], written_log: WriteLog) -> None:
        """Log `writes` for `/memory recent`, then show each once in session `key`."""
        if not writes:
            return
        await asyncio.to_thread(written_log.record, list(writes))
        for write in writes:
            log.info("session %s: %s (%s)", key, write.notice, write.source)
            if self.remembered is None:
                continue
            try:
                await self.remembered(key, write)
            except Exception:  # a channel that cannot show it: the write stands, and /memory recent lists it
                log.warning("session %s: could not show the receipt %r", key, write.notice, exc_info=True)
