"""`picoclaw storage`: which backend keeps the workspace, and whether it is healthy."""

from __future__ import annotations

import argparse

from picoclaw.cli.command import Parser
from picoclaw.cli.output import echo


def register(parser: argparse.ArgumentParser) -> None:
    """Fill in the `storage` group's parser."""
    actions = parser.add_subparsers(dest="storage_command", metavar="ACTION", parser_class=Parser)
    actions.add_parser("status", help="backend, server and schema versions, pgvector, rows per table"
                       ).set_defaults(handler=cmd_storage_status)


def cmd_storage_status(args: argparse.Namespace) -> int:
    # Only the storage is opened: a health check must not wait for the index or the model.
    from picoclaw.config import home_dir, load_config
    from picoclaw.layout import WorkspaceLayout
    from picoclaw.storage import open_storage

    home = home_dir()
    config = load_config(home)
    storage = open_storage(config, WorkspaceLayout.of(config, home).root)
    try:
        status = storage.status()
    finally:
        storage.close()
    for key, value in status.items():
        if isinstance(value, dict):
            echo(f"{key}:")
            for name, count in value.items():
                echo(f"  {name}: {count}")
        else:
            echo(f"{key}: {value}")
    return 0
