"""`picoclaw policy`: show the memory policy in force and tune it through the overrides layer.

Handlers import what they use: building this group's parser (for `--help`) loads no config.
"""

from __future__ import annotations

import argparse

from picoclaw.cli.command import Parser, UsageError, opened_app
from picoclaw.cli.output import echo, history_lines, one_line_json

TYPE_CHECKING = False  # read as true by type checkers; `typing` is not loaded for it (see cli/command.py)
if TYPE_CHECKING:
    from typing import Any

    from picoclaw.memory import PolicyCheck, Workspace


def register(parser: argparse.ArgumentParser) -> None:
    """Fill in the `policy` group's parser: one action a subcommand."""
    actions = parser.add_subparsers(dest="policy_command", metavar="ACTION", parser_class=Parser)
    actions.add_parser("show", help="each key's value and where it comes from").set_defaults(
        handler=cmd_policy_show)
    set_ = actions.add_parser("set", help="override keys: KEY=VALUE …")
    set_.add_argument("assignments", nargs="+", metavar="KEY=VALUE")
    set_.add_argument("--check", action="store_true",
                      help="try the change against the memory eval first (as reflection does): set it only when it "
                           "does not lower recall@K")
    set_.set_defaults(handler=cmd_policy_set)
    actions.add_parser("snapshots", help="list override snapshots, newest first").set_defaults(
        handler=cmd_policy_snapshots)
    rollback = actions.add_parser("rollback", help="restore a snapshot (default: the newest)")
    rollback.add_argument("snapshot", nargs="?")
    rollback.set_defaults(handler=cmd_policy_rollback)
    actions.add_parser("reset", help="drop every override").set_defaults(handler=cmd_policy_reset)
    actions.add_parser("history", help="every policy change, oldest first: who, old → new, why"
                       ).set_defaults(handler=cmd_policy_history)


def parse_cli_value(text: str) -> Any:
    """`policy set` values are JSON scalars (15, true); anything else stays a string and fails validation."""
    import orjson  # here, not at the top: loading orjson alone costs `policy --help` twice a bare interpreter

    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def cmd_policy_show(args: argparse.Namespace) -> int:
    from picoclaw.policy_schema import POLICY_KEYS

    with opened_app() as app:
        effective = app.workspace.policy.effective()
    width = max(len(key) for key in POLICY_KEYS)
    for key in POLICY_KEYS:
        value = getattr(effective.policy, key)
        shown = str(value).lower() if isinstance(value, bool) else str(value)
        echo(f"{key:{width}}  {shown:>8}  ({effective.sources[key]})")
    return 0


def cmd_policy_set(args: argparse.Namespace) -> int:
    import orjson

    with opened_app() as app:
        policy = app.workspace.policy
        changes = {}
        for item in args.assignments:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise UsageError(f"expected KEY=VALUE, got {item!r}")
            changes[key.strip()] = parse_cli_value(value.strip())
        check = _check(app.workspace, changes) if args.check else None
        snapshot = policy.set(changes, source="cli", reason="picoclaw policy set",
                              check=None if check is None else check.record())
    if check is not None:
        echo(f"checked by the eval: {check.describe()}")
    for key, value in changes.items():
        # JSON spelling (true, not True), the way the value is typed and the way `policy show` prints it.
        echo(f"{key} = {orjson.dumps(value).decode('utf-8')}")
    echo(f"previous overrides saved as {snapshot.name}")
    return 0


def _check(workspace: Workspace, changes: dict[str, Any]) -> PolicyCheck:
    """The eval's verdict on `changes`; a PicoclawError (nothing written) when there is no eval set, or when the
    change lowers recall@K."""
    from picoclaw.cli.memory_eval import NO_CASES
    from picoclaw.errors import PicoclawError
    from picoclaw.memory import check_change

    workspace.policy.validate_changes(changes)  # a bad value is said as `policy set` says it, before any search
    check = check_change(workspace, changes)
    if check is None:
        raise PicoclawError(f"--check needs eval cases; {NO_CASES}")
    if check.lowers:
        raise PicoclawError(f"not set: the change would lower {check.describe()}; nothing was written (without "
                            "--check it is set anyway)")
    return check


def cmd_policy_snapshots(args: argparse.Namespace) -> int:
    with opened_app() as app:
        policy = app.workspace.policy
        snapshots = policy.snapshots()
        if not snapshots:
            echo(f"no snapshots yet in {policy.snapshots_dir}")
        for path in reversed(snapshots):
            echo(f"{path.name}  {one_line_json(path.read_bytes())}")
    return 0


def cmd_policy_rollback(args: argparse.Namespace) -> int:
    with opened_app() as app:
        restored = app.workspace.policy.rollback(args.snapshot)
    echo(f"restored policy overrides from {restored.name} (the overrides before it were snapshotted too)")
    return 0


def cmd_policy_reset(args: argparse.Namespace) -> int:
    with opened_app() as app:
        snapshot = app.workspace.policy.reset()
    echo(f"policy overrides cleared; the previous ones are in {snapshot.name}")
    return 0


def cmd_policy_history(args: argparse.Namespace) -> int:
    with opened_app() as app:
        policy = app.workspace.policy
        changes = policy.history()
        if not changes:
            echo(f"no policy changes yet ({policy.history_path})")
        for change in changes:
            echo("\n".join(history_lines(change)))
    return 0
