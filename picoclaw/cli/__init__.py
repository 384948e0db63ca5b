"""The `picoclaw` command line. Every failure is one line on stderr and a non-zero exit.

One module per command group (`picoclaw.cli.memory` …), each with `register(parser)` and its handlers. GROUPS
below names them the way pip's command table does: `picoclaw --help` imports none, and a command imports
only its own group, so help and short commands start quickly (bench/startup.py measures it).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib import import_module

from picoclaw import __version__
from picoclaw.cli.command import Handler, Parser, UsageError, refuse_invalid_utf8
from picoclaw.errors import PicoclawError

# Each command group: its name, the module that registers its parser, and its line in `picoclaw --help`.
# Plain tuples, not a NamedTuple: `--help` loads little more than argparse (see TYPE_CHECKING in command.py).
GROUPS: tuple[tuple[str, str, str], ...] = (
    ("onboard", "picoclaw.cli.onboard", "create ~/.picoclaw, config.json and the workspace"),
    ("chat", "picoclaw.cli.chat", "talk to the assistant in this terminal"),
    ("telegram", "picoclaw.cli.telegram", "run the assistant as a Telegram bot (polling or webhook; Ctrl-C stops)"),
    ("memory", "picoclaw.cli.memory", "read, search and write long-term memory and notes"),
    ("cron", "picoclaw.cli.cron", "reminders and recurring tasks that `picoclaw telegram` delivers"),
    ("skills", "picoclaw.cli.skills", "the skills in workspace/skills/ that the model can load"),
    ("mcp", "picoclaw.cli.mcp", "the MCP servers of tools.mcp in config.json and their tools"),
    ("usage", "picoclaw.cli.usage", "what the model cost today and in the last 30 days, by purpose, and the caps"),
    ("policy", "picoclaw.cli.policy", "show and tune the memory policy"),
    ("storage", "picoclaw.cli.storage", "the storage backend (files or PostgreSQL): status"),
    ("web", "picoclaw.cli.web", "the console in a browser: memory, search (a one-time login link)"),
)
# Groups whose missing action is named as such; any other (skills too, as ever) is "missing a command".
_ACTION_HINTS = ("memory", "policy", "cron", "mcp", "storage")


def named_group(arguments: Sequence[str]) -> str | None:
    """The group an argument list names: its first argument that is not an option (the top-level options
    take no value), or None."""
    return next((argument for argument in arguments if not argument.startswith("-")), None)


def build_parser(group: str | None = None) -> argparse.ArgumentParser:
    """The command tree: every group with its summary, and the arguments of `group` only."""
    parser = Parser(prog="picoclaw", description="A personal assistant with Markdown memory.")
    parser.add_argument("--version", action="version", version=f"picoclaw {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more detail to stderr")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, module, summary in GROUPS:
        group_parser = commands.add_parser(name, help=summary)
        if name == group:
            register: Callable[[argparse.ArgumentParser], None] = import_module(module).register
            register(group_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `picoclaw` script; returns the exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        refuse_invalid_utf8(arguments)
        code = _run(build_parser(named_group(arguments)).parse_args(arguments))
        sys.stdout.flush()  # here, not at exit: a reader that left shows now, while it can still end quietly
        return code
    except BrokenPipeError as exc:
        return _quiet_exit() if _stdout_closed() else _report(exc)
    except (PicoclawError, KeyboardInterrupt, OSError, UnicodeError) as exc:
        return _report(exc)


SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for a tool that a closed pipe ended


def _stdout_closed() -> bool:
    """Whether stdout's reader has gone (`picoclaw memory show | head`), so the broken pipe was ours to end on."""
    import select

    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # stdout is no file (captured): the pipe was something else
        return False
    if not hasattr(select, "poll"):  # Windows: no way to ask, and stdout is the pipe a command most often breaks
        return True
    poller = select.poll()
    poller.register(descriptor, select.POLLOUT)
    # A pipe (or socket) whose reader has gone polls as an error or a hang-up; a working one as writable.
    return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in poller.poll(0))


def _quiet_exit() -> int:
    """End without a word, as other Unix tools do when the reader leaves early.

    What is still buffered for stdout goes to /dev/null (as the Python docs advise for SIGPIPE): flushed into
    the closed pipe at exit, it would print "Exception ignored … BrokenPipeError".
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):
        pass
    finally:
        os.close(devnull)
    return SIGPIPE_EXIT


def _run(args: argparse.Namespace) -> int:
    from picoclaw.cli.logs import log_to_stderr  # logging loads after parsing: `--help` has exited by then

    log_to_stderr(args.verbose)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        sub = args.command if args.command in _ACTION_HINTS else None
        what = "an action" if sub else "a command"
        raise UsageError(f"missing {what} (see `{' '.join(['picoclaw', *([sub] if sub else [])])} --help`)")
    return handler(args)


def _report(exc: BaseException) -> int:
    """Say what failed in one line on stderr; the exit code."""
    from picoclaw.cli.output import echo  # loaded only when something failed: `--help` prints no error

    if isinstance(exc, PicoclawError):  # errors quote what they refused: printable, like all the CLI shows
        echo(f"picoclaw: error: {exc}", file=sys.stderr)
        return 1 if not isinstance(exc, UsageError) else 2
    if isinstance(exc, KeyboardInterrupt):
        print("picoclaw: interrupted", file=sys.stderr)
        return 130
    if isinstance(exc, OSError):
        echo(f"picoclaw: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 1
    # UnicodeError, a last line of defence: bad input is one line, never a traceback
    echo(f"picoclaw: error: text that is not valid UTF-8: {exc}", file=sys.stderr)
    return 1
