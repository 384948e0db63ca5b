"""`picoclaw web`: the console in a browser, on this machine unless --listen says otherwise; `--new-link` asks
the running console for a new one-time login link."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import re
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from picoclaw.cli.command import UsageError, opened_app
from picoclaw.cli.output import echo

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 18790
LOOPBACK = ("127.0.0.1", "localhost", "::1")
LISTEN_FORMS = "HOST, HOST:PORT or [IPv6]:PORT (such as 127.0.0.1, 127.0.0.1:18790, 0.0.0.0 or [::1]:18790)"


def register(parser: argparse.ArgumentParser) -> None:
    """Fill in the `web` command's parser."""
    parser.add_argument("--listen", metavar="HOST[:PORT]", default=DEFAULT_HOST,
                        help=f"the address to listen on: {LISTEN_FORMS} (default {DEFAULT_HOST}: this machine only)")
    parser.add_argument("--port", type=int, help=f"the port (default {DEFAULT_PORT}, or the one --listen names)")
    parser.add_argument("--token-file", metavar="PATH", type=Path,
                        help="where the script token is kept while the console runs (default "
                             "<home>/console-<host>-<port>.token, readable by you only)")
    parser.add_argument("--new-link", action="store_true",
                        help="ask the console running at --listen/--port for a new one-time login link, print it "
                             "and exit")
    parser.set_defaults(handler=cmd_web)


def console_address(listen: str, port: int | None) -> tuple[str, int]:
    """(host, port) from --listen (HOST, HOST:PORT, [IPv6]:PORT, or an IPv6 address alone) and --port;
    UsageError, one line naming the forms expected, for anything else."""
    from picoclaw.config import listen_address

    bad = UsageError(f"--listen {listen!r} is not {LISTEN_FORMS}")
    named: int | None = None
    if listen.count(":") >= 2 and not listen.startswith("["):  # ::1, fd00::5: an IPv6 address has no port
        host = listen
    elif bracketed := re.fullmatch(r"\[([^\]]*)\]", listen):
        host = bracketed.group(1)
    elif ":" in listen:
        try:
            host, named = listen_address(listen)  # as `picoclaw telegram --listen` reads it
        except ValueError:
            raise bad from None
    elif re.fullmatch(r"[A-Za-z0-9.-]+", listen):
        host = listen
    else:
        raise bad
    if ":" in host and not _is_ipv6(host):
        raise bad
    if named is not None and port is not None and port != named:
        raise UsageError(f"--listen {listen!r} says port {named} and --port {port}: give the port once")
    chosen = named if named is not None else port if port is not None else DEFAULT_PORT
    if not 0 < chosen < 65536:
        raise UsageError(f"--port {chosen} is not a TCP port (1-65535)")
    return host, chosen


def _is_ipv6(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


def cmd_web(args: argparse.Namespace) -> int:
    host, port = console_address(args.listen, args.port)
    if args.new_link:
        return _new_link(host, port, args.token_file)
    from picoclaw.web import serve

    if host not in LOOPBACK:
        log.warning("the console listens on %s: anyone who can reach that address and has a login link can "
                    "read and change this assistant's memory", host)

    def announce(url: str, token_file: Path) -> None:
        echo(f"picoclaw console: open this link once to log in (Ctrl-C stops):\n    {url}\n"
             f"A new link: picoclaw web --new-link{_same_console(args)}. Scripts send the token in {token_file} as "
             "Authorization: Bearer.")
        sys.stdout.flush()  # now, also into a pipe or a log file: the link is what the user waits for

    with opened_app() as app, contextlib.suppress(KeyboardInterrupt):
        from picoclaw.web.token_file import default_path

        token_file = args.token_file or default_path(app.home, host, port)
        try:
            asyncio.run(until_sigterm(serve(app, host, port, token_file, announce=announce)))
        except OSError as exc:
            shown = f"[{host}]" if ":" in host else host
            raise UsageError(f"cannot listen on {shown}:{port}: {exc.strerror or exc}") from None
    return 0


async def until_sigterm(serving: Coroutine[Any, Any, None]) -> None:
    """Run `serving` until it returns, Ctrl-C, or SIGTERM (what a service manager sends to stop it): SIGTERM
    cancels it as Ctrl-C does, so it stops the same way, its `finally` run (token file removed, app closed)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(serving)

    def stop() -> None:
        loop.add_signal_handler(signal.SIGTERM, lambda: None)  # a second SIGTERM must not cut the stopping short
        task.cancel()

    try:
        loop.add_signal_handler(signal.SIGTERM, stop)
    except (NotImplementedError, RuntimeError):  # a loop that takes no signals (Windows, not the main thread)
        await task
        return
    try:
        await task
    except asyncio.CancelledError:
        # Ctrl-C (asyncio.run cancels this task, and makes it KeyboardInterrupt) goes on as before, also after a
        # SIGTERM; SIGTERM alone cancelled only `task`, and is a normal end.
        current = asyncio.current_task()
        if not task.cancelled() or (current is not None and current.cancelling()):
            raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _same_console(args: argparse.Namespace) -> str:
    """The options `--new-link` needs to find this console again (none for the defaults)."""
    named = [f"--listen {args.listen}"] if args.listen != DEFAULT_HOST else []
    named += [f"--port {args.port}"] if args.port is not None else []
    named += [f"--token-file {args.token_file}"] if args.token_file is not None else []
    return "".join(f" {option}" for option in named)


def _new_link(host: str, port: int, token_file: Path | None) -> int:
    """Print a new login link from the console running at `host:port`."""
    from picoclaw.config import home_dir
    from picoclaw.web.login_link import ask_for_link
    from picoclaw.web.token_file import default_path, read_token

    token = read_token(token_file or default_path(home_dir(), host, port))
    echo(ask_for_link(host, port, token))
    return 0
