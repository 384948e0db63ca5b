"""`picoclaw mcp`: the MCP servers of tools.mcp in config.json and their tools.

Handlers import what they use: building this group's parser (for `--help`) loads no config and no MCP SDK.
"""

from __future__ import annotations

import argparse

from picoclaw.cli.command import Parser, opened_app
from picoclaw.cli.output import echo


def register(parser: argparse.ArgumentParser) -> None:
    """Fill in the `mcp` group's parser: one action a subcommand."""
    actions = parser.add_subparsers(dest="mcp_command", metavar="ACTION", parser_class=Parser)
    actions.add_parser("list", help="start each server, show its state (ready / failed: why / disabled) "
                       "and its tools, stop it").set_defaults(handler=cmd_mcp_list)


def cmd_mcp_list(args: argparse.Namespace) -> int:
    import asyncio

    with opened_app() as app:
        if not app.config.tools.mcp.servers:
            echo(f"no MCP servers configured (add them under tools.mcp.servers in {app.home / 'config.json'})")
            return 0

        async def run() -> tuple[list[str], bool]:
            async with app:  # the servers start as they do for chat and the bot, and stop when this ends
                servers = await app.start_mcp()
                lines = []
                for server in servers.servers:
                    lines.append(f"{server.name}: {server.status()}  [{server.describe()}]")
                    lines += [f"  {tool.name}  {tool.description.strip().split(chr(10), 1)[0]}".rstrip()
                              for tool in server.tools]
                return lines, any(server.state == "failed" for server in servers.servers)

        lines, failed = asyncio.run(run())
    echo("\n".join(lines))
    return 1 if failed else 0
