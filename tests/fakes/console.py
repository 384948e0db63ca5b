"""The web console run for real on 127.0.0.1 (a free port) on its own thread and event loop, over an App the
caller opened: what the console tests and bench/web.py talk to over HTTP, as to `picoclaw web`."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web

from picoclaw.app import App
from picoclaw.web import Gate, make_console


class Console:
    """`make_console` on 127.0.0.1 in a thread: `base` is its origin, `gate` its gate (the login link, the
    Host names, the cookie), `app_web` the aiohttp application and `loop` the loop it runs on."""

    def __init__(self, app: App):
        self.app = app
        self.gate = Gate(frozenset())
        self.base = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console", daemon=True)

    def __enter__(self) -> Console:
        self._thread.start()
        assert self._ready.wait(60), "the console did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self.app_web = make_console(self.app, self.gate)
        runner = web.AppRunner(self.app_web, access_log=None, shutdown_timeout=1.0)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
        port = int(runner.addresses[0][1])
        address = Gate.for_address("127.0.0.1", port)
        self.gate.hosts, self.gate.cookie = address.hosts, address.cookie
        self.base = f"http://127.0.0.1:{port}"
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(runner.cleanup())
            self._loop.close()
