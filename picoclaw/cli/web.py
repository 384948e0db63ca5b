"""`picoclaw web`: the console in a browser, on this machine unless --listen says otherwise."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging

from picoclaw.cli.command import UsageError, opened_app
from picoclaw.cli.output import echo

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 18790


def register(parser: argparse.ArgumentParser) -> None:
    """Fill in the `web` command's parser."""
    parser.add_argument("--listen", metavar="HOST", default=DEFAULT_HOST,
                        help=f"the address to listen on (default {DEFAULT_HOST}: this machine only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the port (default {DEFAULT_PORT})")
    parser.set_defaults(handler=cmd_web)


def cmd_web(args: argparse.Namespace) -> int:
    from picoclaw.web import serve

    if not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port} is not a TCP port (1-65535)")
    if args.listen not in ("127.0.0.1", "localhost", "::1"):
        log.warning("the console listens on %s: anyone who can reach that address and has the login link can "
                    "read and change this assistant's memory", args.listen)

    def announce(url: str) -> None:
        echo(f"picoclaw console: open this link once to log in (Ctrl-C stops):\n    {url}")

    with opened_app() as app, contextlib.suppress(KeyboardInterrupt):
        try:
            asyncio.run(serve(app, args.listen, args.port, announce=announce))
        except OSError as exc:
            raise UsageError(f"cannot listen on {args.listen}:{args.port}: {exc.strerror or exc}") from None
    return 0
