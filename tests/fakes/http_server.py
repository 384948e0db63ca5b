"""A local aiohttp server on its own thread and event loop: the base of every fake service in the tests.

Sync tests and tests that run their own `asyncio.run` can both talk to it. Subclasses add their routes
in `add_routes`; handlers may `await self.pause(seconds)` for a scripted delay, which stopping cuts short.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Self

from aiohttp import web

START_LIMIT = 60.0  # seconds for the server thread to listen: bounds a hang only (a busy machine is slow)


class BackgroundHTTPServer:
    """HTTP server on 127.0.0.1 (a free port); use as a context manager."""

    name = "fake-http"

    def __init__(self) -> None:
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None
        self._startup_error: BaseException | None = None

    def add_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    @property
    def origin(self) -> str:
        """`http://127.0.0.1:PORT` of the running server."""
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} is not running")
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> Self:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name=self.name, daemon=True)
        self._thread.start()
        if not ready.wait(START_LIMIT):
            raise RuntimeError(f"{type(self).__name__} did not start within {START_LIMIT:g} s")
        if self._startup_error is not None:
            raise RuntimeError(f"{type(self).__name__} failed to start") from self._startup_error
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        # Wake handlers that are sleeping out a scripted delay, so stopping never waits for them.
        loop.call_soon_threadsafe(self._wake_and_stop)
        thread.join(10)
        self._loop = self._thread = None
        self._port = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def call_in_loop(self, callback: object, *args: object) -> None:
        """Run `callback(*args)` on the server's loop (to wake waiters from another thread)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(callback, *args)  # type: ignore[arg-type]

    def stopping(self) -> bool:
        """Whether the server has begun to stop (held requests should give up)."""
        return self._closing is not None and self._closing.is_set()

    async def pause(self, delay: float) -> None:
        """Sleep `delay` seconds, or less when the server is stopping."""
        if delay > 0:
            assert self._closing is not None
            try:
                await asyncio.wait_for(self._closing.wait(), timeout=delay)
            except TimeoutError:
                pass

    def _wake_and_stop(self) -> None:
        assert self._closing is not None and self._loop is not None
        self._closing.set()
        self._loop.stop()

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            loop.run_until_complete(self._listen())
        except BaseException as exc:  # reported to the starting thread, which raises it
            self._startup_error = exc
            ready.set()
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            assert self._runner is not None
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

    async def _listen(self) -> None:
        self._closing = asyncio.Event()
        app = web.Application()
        self.add_routes(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = int(self._runner.addresses[0][1])
