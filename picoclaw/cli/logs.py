"""The CLI's log lines: `picoclaw: LEVEL: message` on stderr, as printable text."""

from __future__ import annotations

import logging

from picoclaw.printable import printable


class PrintableFormatter(logging.Formatter):
    """Log records as `printable` lines: a log message may quote a model's answer or a server's reply."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


def log_to_stderr(verbose: bool) -> None:
    """Send picoclaw's log to stderr: warnings and errors, and with `verbose` (-v) what it does too."""
    log_lines = logging.StreamHandler()
    log_lines.setFormatter(PrintableFormatter("picoclaw: %(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[log_lines])
