"""`picoclaw chat`: talk to the assistant in this terminal, one message (-m) or a conversation; `--attach FILE`
sends a file (an image, a document, audio to transcribe) as one message, with -m's text as its caption.

The handler imports what it uses: building this command's parser (for `--help`) loads no config and no agent.
"""

from __future__ import annotations

import argparse

from picoclaw.cli.command import UsageError, opened_app

TYPE_CHECKING = False  # as in command.py: `typing` is not loaded for `--help`
if TYPE_CHECKING:
    from picoclaw.app import App
    from picoclaw.channels import Transcriber


def register(parser: argparse.ArgumentParser) -> None:
    """Fill in the `chat` command's parser."""
    parser.add_argument("-m", "--message", help="send one message, print the answer and exit")
    parser.add_argument("--attach", metavar="FILE",
                        help="send this file (an image, a document, or audio, transcribed) as one message, with -m's "
                             "text if given, print the answer and exit")
    parser.add_argument("--session", metavar="KEY", help="conversation to continue (default: cli:default)")
    parser.add_argument("--show-context", action="store_true",
                        help="after each answer, print on stderr where its request's tokens went (as /context does)")
    parser.set_defaults(handler=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from picoclaw.channels import ReplChannel  # the agent stack loads only for commands that talk

    if args.message is not None and not args.message.strip():
        raise UsageError("the message given with -m is empty")
    if args.attach is not None and not args.attach.strip():
        raise UsageError("--attach needs a file")
    if args.session is not None:
        from picoclaw.session_key import SessionKey, terminal_key

        # Checked before any model call: a key that cannot name a file would fail after the answer was shown.
        try:
            SessionKey.parse(terminal_key(args.session))
        except ValueError as exc:
            raise UsageError(f"--session: {exc}") from None
    with opened_app() as app:

        async def run() -> int:
            async with app:
                app.provider()  # a missing key or URL is reported before any MCP server starts
                await app.start_mcp()
                channel = ReplChannel(app.agent(), args.session, show_context=args.show_context,
                                      transcriber=transcriber(app, needed=args.attach is not None))
                if args.attach is not None:
                    return await channel.answer_once(args.message, Path(args.attach).expanduser())
                if args.message is not None:
                    return await channel.answer_once(args.message)
                # The terminal is this session's channel while it is open: its reminders and heartbeat come here,
                # and the day's notice that the background budget is spent.
                app.tell_owner(channel.deliver, channel.session_key)
                return await channel.run(scheduler=app.scheduler(channel, channels=(channel.session_key,)))

        return asyncio.run(run())


def transcriber(app: App, *, needed: bool) -> Transcriber | None:
    """The configured transcriber. A conversation that may never attach audio starts without it when its client
    cannot be made (a missing key: logged); `--attach` fails on that in one line."""
    if needed:
        return app.transcriber()
    from picoclaw.errors import PicoclawError

    try:
        return app.transcriber()
    except PicoclawError as exc:
        import logging

        logging.getLogger(__name__).warning("chat: audio cannot be transcribed: %s", exc)
        return None
