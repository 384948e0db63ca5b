"""The web console run for real on 127.0.0.1 (a free port) on its own thread and event loop, over an App the
caller opened: what the console tests and bench/web.py talk to over HTTP, as to `picoclaw web`; and `picoclaw
web` itself in a process of its own, for what only the command does (its token file, its terminal)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2
from aiohttp import web

from picoclaw.app import App
from picoclaw.web import Gate, make_console, make_runner

REPO = Path(__file__).resolve().parents[2]


class Console:
    """`make_console` on 127.0.0.1 in a thread: `base` is its origin, `gate` its gate (`gate.login_url()` makes
    a login link, `gate.script_token` is a script's token; the Host names, the cookie), `app_web` the aiohttp
    application and `loop` the loop it runs on."""

    def __init__(self, app: App):
        self.app = app
        self.gate = Gate(frozenset())
        self.base = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console", daemon=True)
        self._stopping = False

    def __enter__(self) -> Console:
        self._thread.start()
        assert self._ready.wait(60), "the console did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Shut the console down as `picoclaw web` does at Ctrl-C (its runner's cleanup); once only."""
        if self._stopping or not self._thread.is_alive():
            return
        self._stopping = True  # a second stop must not stop the loop in the middle of the first one's cleanup
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self.app_web = make_console(self.app, self.gate)
        runner = make_runner(self.app_web)  # as `serve` runs it: the same server log
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
        port = int(runner.addresses[0][1])
        address = Gate.for_address("127.0.0.1", port)
        self.gate.hosts, self.gate.cookie, self.gate.base = address.hosts, address.cookie, address.base
        self.base = f"http://127.0.0.1:{port}"
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(runner.cleanup())
            self._loop.close()


def logged_in(console: Console) -> httpx2.Client:
    """A client that opened a new login link of `console`: its session cookie set."""
    client = httpx2.Client(base_url=console.base, follow_redirects=False, timeout=60)
    response = client.get(console.gate.login_url())
    assert response.status_code == 303 and response.headers["location"] == "/"
    return client


def csrf_of(page: str) -> str:
    """The CSRF token of a page's forms."""
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found is not None, "no CSRF field on the page"
    return found.group(1)


def free_port(family: socket.AddressFamily = socket.AF_INET, host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now, for a console that takes a fixed one as `picoclaw web` does."""
    with socket.socket(family) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def picoclaw_web(home: Path, *args: str) -> subprocess.Popen[str]:
    """`picoclaw web ARGS` in a process of its own over `home` (no model configured), output piped."""
    environment = {**os.environ, "PICOCLAW_HOME": str(home), "PYTHONPATH": str(REPO)}
    for name in ("OPENAI_API_KEY", "TELEGRAM_BOT_TOKEN"):
        environment.pop(name, None)
    return subprocess.Popen([sys.executable, "-m", "picoclaw", "web", *args], env=environment, text=True,
                            encoding="utf-8", stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def login_link_of(process: subprocess.Popen[str]) -> str:
    """The login link `process` prints once it listens, read as it prints it (a process that ends first fails
    the test with its stderr; one that says nothing for 120 s too)."""
    found: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if "/login?token=" in line:
                found.append(line.strip())
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(120)
    if not found:
        process.kill()
        _, err = process.communicate()
        raise AssertionError(f"`picoclaw web` printed no login link; its stderr:\n{err}")
    return found[0]


def stopped(process: subprocess.Popen[str]) -> tuple[str, str]:
    """Stop `process` as Ctrl-C does; the rest of its stdout, and its stderr."""
    process.send_signal(signal.SIGINT)
    try:
        out, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()  # no process outlives the test that failed
        process.communicate()
        raise
    return out, err


@contextmanager
def console_of(home: Path) -> Iterator[Console]:
    """The web console of `home` serving on 127.0.0.1."""
    app = App.open(home)
    try:
        with Console(app) as running:
            yield running
    finally:
        app.close()
