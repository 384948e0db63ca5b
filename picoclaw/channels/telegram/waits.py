"""Waiting for the first of several things (a wake-up, a press, a timer), as the inbox worker and the buttons do."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable


async def first_of(*waits: Awaitable[object]) -> None:
    """Until the first of `waits` is done; the others are cancelled (a shielded one goes on)."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
