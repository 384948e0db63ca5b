"""`StorageWatch`: whether a webhook worker can reach its storage, decided once for all its parts, with one
log line when the storage goes away and one when it is back.

A call that finds the storage unreachable reports it (`failed`); the watch then pings it (`Storage.ping`, a
round trip bounded to about a second). A ping that fails too begins an outage: while it lasts the worker
refuses posts at once (503, Telegram retries them), claims and renews nothing, and the watch pings every
PROBE_INTERVAL seconds; the first ping that succeeds ends it and wakes whoever waits (`wait_up`). A failed call
whose ping succeeds (a busy pool) is no outage. Pings run on a thread of the watch's own, so a health check is
never queued behind turns that wait for the database on the shared threads.

A server that answers pings can still leave turns without their storage: a lock whose holder is stuck (each
wait ends after storage.lock_wait_seconds). Each turn says whether it got its storage (`turn`); from a turn that
did not until one that did, `turn_error` says why, and /healthz answers 503 with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from picoclaw.storage import StorageError

log = logging.getLogger(__name__)

PROBE_INTERVAL = 0.5  # seconds between pings while the storage is down: its return is seen this soon
CHECK_TIMEOUT = 1.0  # seconds a health check waits for a ping before it answers that the storage is down


class StorageWatch:
    """Up or down, as this worker sees its storage (`ping`: a bounded round trip that raises StorageError)."""

    def __init__(self, ping: Callable[[], None], *, on_back: Callable[[], None] = lambda: None,
                 interval: float = PROBE_INTERVAL):
        self._ping = ping
        self._on_back = on_back
        self.interval = interval
        self._up = asyncio.Event()
        self._up.set()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="storage-watch")
        self._pinging: asyncio.Future[None] | None = None
        self._probing: asyncio.Task[None] | None = None
        self.outages = 0  # how many began
        self.error = StorageError("the storage is unreachable")  # why the last outage began
        self.turn_error: StorageError | None = None  # why the latest turn could not get its storage; None: it did

    @property
    def up(self) -> bool:
        return self._up.is_set()

    async def wait_up(self) -> None:
        """Return once the storage is reachable (at once when it is)."""
        await self._up.wait()

    def failed(self, exc: StorageError, *, pinged: bool = False) -> None:
        """A call found the storage unreachable (`exc`): look whether it is, unless a look is under way. A failed
        ping (`pinged`) needs no second look: the outage begins at once."""
        if self._probing is None or self._probing.done():
            self._probing = asyncio.create_task(self._probe(exc, pinged))

    def turn(self, error: StorageError | None) -> None:
        """A turn got its storage (None), or could not (`error`): what /healthz says of turns from now on."""
        if error is not None and self.turn_error is None:
            log.info("telegram: a turn could not get its storage; /healthz answers 503 until one does: %s", error)
        elif error is None and self.turn_error is not None:
            log.info("telegram: a turn got its storage again; /healthz answers 200")
        self.turn_error = error

    async def check(self) -> StorageError | None:
        """A health check: None when a ping succeeds within CHECK_TIMEOUT, else why not (an outage then begins,
        or goes on)."""
        if not self.up:
            return self.error
        try:
            error = await asyncio.wait_for(self._pinged(), CHECK_TIMEOUT)
        except TimeoutError:
            slow = StorageError(f"the storage did not answer within {CHECK_TIMEOUT:g} s")
            self.failed(slow)
            return slow
        if error is not None:
            self.failed(error, pinged=True)
        return error

    def _ping_once(self) -> asyncio.Future[None]:
        """The ping under way, or a new one: checks that come together share one."""
        if self._pinging is None or self._pinging.done():
            self._pinging = asyncio.get_running_loop().run_in_executor(self._thread, self._ping)
        return self._pinging

    async def _pinged(self) -> StorageError | None:
        try:
            await asyncio.shield(self._ping_once())
        except StorageError as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - a ping that fails in any other way did not reach it either
            return StorageError(f"{type(exc).__name__}: {exc}")
        return None

    async def _probe(self, first: StorageError, pinged: bool) -> None:
        error = first if pinged else await self._pinged()
        if error is None:
            log.info("telegram: a storage call failed but the storage answers: %s", first)
            return
        self._up.clear()
        self.outages += 1
        self.error = error
        loop = asyncio.get_running_loop()
        began = loop.time()
        log.warning("telegram: storage unreachable, refusing updates (503) until it is back: %s", error)
        while error is not None:
            await asyncio.sleep(self.interval)
            error = await self._pinged()
        log.info("telegram: storage reachable again after %.1f s; taking updates", loop.time() - began)
        self._up.set()
        self._on_back()

    async def close(self) -> None:
        """Stop looking (a ping under way finishes on its thread by itself)."""
        if self._probing is not None:
            self._probing.cancel()
            await asyncio.gather(self._probing, return_exceptions=True)
        self._thread.shutdown(wait=False, cancel_futures=True)
