"""What every command group builds on: the parser that fails in one line, UsageError, number arguments with
bounds, and the App a command opens.

Light on purpose: every group imports it to build its parser, and `--help` must not load the config (see
`picoclaw.cli`), so the App comes in only when a command opens one.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from picoclaw.errors import PicoclawError

# Type checkers take any constant named TYPE_CHECKING as true; the one from `typing` would cost `picoclaw --help`
# a third of a bare interpreter's start-up, for importing `typing` alone.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

    from picoclaw.app import App

Handler = Callable[[argparse.Namespace], int]


class UsageError(PicoclawError):
    """Bad command-line usage."""


class Parser(argparse.ArgumentParser):
    """A parser whose errors are UsageError: argparse prints usage plus the error over several lines, and we
    want one clear line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to `high`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value

    parse.__name__ = "number"
    return parse


@contextmanager
def opened_app() -> Iterator[App]:
    """The App of this command, closed when the command ends (also when `async with app` closed it first)."""
    from picoclaw.app import App  # the config, its models and the workspace load only for a command that runs

    app = App.open()
    try:
        yield app
    finally:
        app.close()


def refuse_invalid_utf8(arguments: list[str]) -> None:
    """UsageError for an argument that is not valid UTF-8.

    Such an argument reaches Python as lone surrogates (surrogateescape): stored, sent or printed it would
    crash a command half-way, so it is refused before any command runs.
    """
    for argument in arguments:
        try:
            argument.encode("utf-8")
        except UnicodeEncodeError as exc:
            code = ord(argument[exc.start])
            what = f"the byte 0x{code - 0xDC00:02X}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
            try:  # the bytes as given, shown as \xNN
                raw = argument.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                raw = argument.encode("utf-8", "surrogatepass")
            shown = raw.decode("utf-8", "backslashreplace")
            raise UsageError(f"the argument '{shown}' is not valid UTF-8 ({what}): set the terminal to "
                             "UTF-8 and try again; nothing was done") from None
