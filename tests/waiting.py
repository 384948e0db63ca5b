"""Deadlines for tests that wait for something to happen: a wait that never ends fails, naming what it
waited for, instead of hanging the suite.

    await wait_until(lambda: server.calls("getUpdates"), what="the first long poll")   # in a coroutine
    wait_until_sync(lambda: path.exists(), what="the lock file")                        # in plain code
    deadline = Deadline(60, "the parent to kill this writer")                           # a loop with a body
    while True:
        deadline.check()
        ...

The clocks are real even while freezegun freezes time: the async helper reads the event loop's clock
(`freeze_time(..., real_asyncio=True)`, which the agent tests use, keeps it real, as asyncio.sleep needs),
and the sync ones read `time.monotonic` as it was when this module was imported (freezegun swaps
`time.monotonic`, and every module-level alias of it, while time is frozen).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["Deadline", "real_monotonic", "wait_until", "wait_until_sync"]

# Generous: it only bounds a hang. What is waited for happens in milliseconds on an idle machine and may take
# seconds on a busy one; a wait that times out fails the test, so the bound must not be what a pass depends on.
DEFAULT_TIMEOUT = 60.0
DEFAULT_INTERVAL = 0.01

# Kept inside a tuple, not as a module attribute, so freezegun's patching of module globals misses it.
_CLOCK: tuple[Callable[[], float]] = (time.monotonic,)


def real_monotonic() -> float:
    """`time.monotonic()`, unaffected by freezegun."""
    return _CLOCK[0]()


def _timed_out(timeout: float, what: str) -> AssertionError:
    return AssertionError(f"timed out after {timeout:g} s waiting for {what}")


class Deadline:
    """A point `timeout` seconds from now (real time); `check()` fails once it has passed."""

    def __init__(self, timeout: float, what: str, clock: Callable[[], float] = real_monotonic) -> None:
        self.timeout = timeout
        self.what = what
        self._clock = clock
        self._end = clock() + timeout

    def left(self) -> float:
        """Seconds until the deadline (0 once it has passed)."""
        return max(0.0, self._end - self._clock())

    def expired(self) -> bool:
        return self._clock() >= self._end

    def check(self) -> None:
        """Raise AssertionError naming what was waited for, once the deadline has passed."""
        if self.expired():
            raise _timed_out(self.timeout, self.what)


async def wait_until(predicate: Callable[[], object], timeout: float = DEFAULT_TIMEOUT, what: str = "the condition",
                     interval: float = DEFAULT_INTERVAL) -> None:
    """Poll `predicate` every `interval` seconds (asyncio.sleep, so the loop keeps running) until it is
    true; raise AssertionError naming `what` after `timeout` seconds of the event loop's clock."""
    loop = asyncio.get_running_loop()
    deadline = Deadline(timeout, what, clock=loop.time)
    while not predicate():
        deadline.check()
        await asyncio.sleep(min(interval, deadline.left()))


def wait_until_sync(predicate: Callable[[], object], timeout: float = DEFAULT_TIMEOUT, what: str = "the condition",
                    interval: float = DEFAULT_INTERVAL) -> None:
    """Like `wait_until`, blocking: poll `predicate` every `interval` seconds (time.sleep) until it is true;
    raise AssertionError naming `what` after `timeout` seconds of real time."""
    deadline = Deadline(timeout, what)
    while not predicate():
        deadline.check()
        time.sleep(min(interval, deadline.left()))
