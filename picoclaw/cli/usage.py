"""`picoclaw usage`: today's and the last 30 days' model use by purpose (chat, each kind of background work), cached
and uncached input apart, the cost by `budget.prices`, and how close each cap of `budget` is."""

from __future__ import annotations

import argparse
import os

from picoclaw.cli.command import opened_app
from picoclaw.cli.output import echo
from picoclaw.errors import PicoclawError


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lang", choices=("en", "zh"), help="English or Chinese (default: from LANG)")
    parser.set_defaults(handler=cmd_usage)


def cmd_usage(args: argparse.Namespace) -> int:
    from picoclaw import clock
    from picoclaw.agent import report_lines, spend_report
    from picoclaw.memory import SpendLedger

    lang = args.lang or ("zh" if os.environ.get("LANG", "").lower().startswith("zh") else "en")
    with opened_app() as app:
        ledger = SpendLedger(app.workspace.layout.shared_memory_dir, storage=app.storage)
        try:
            days = ledger.read()
        except PicoclawError as exc:  # a damaged ledger: said in one line; the next call starts a fresh one
            raise PicoclawError(f"{exc}; today counts as spent (the next model call starts a fresh ledger)") from None
        report = spend_report(days, app.config.budget, clock.now(app.workspace.tz).date())
    echo("\n".join(report_lines(report, lang)))
    return 0
