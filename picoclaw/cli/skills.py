"""`picoclaw skills`: the skills in workspace/skills/ that the model can load.

Handlers import what they use: building this group's parser (for `--help`) loads no config and no tools.
"""

from __future__ import annotations

import argparse

from picoclaw.cli.command import Parser, opened_app
from picoclaw.cli.output import echo


def register(parser: argparse.ArgumentParser) -> None:
    """Fill in the `skills` group's parser: one action a subcommand."""
    actions = parser.add_subparsers(dest="skills_command", metavar="ACTION", parser_class=Parser)
    actions.add_parser("list", help="installed skills (name: description) and any that failed to load"
                       ).set_defaults(handler=cmd_skills_list)


def cmd_skills_list(args: argparse.Namespace) -> int:
    from picoclaw.tools import SkillCatalog

    with opened_app() as app:
        folder = app.workspace.layout.skills_dir
    scan = SkillCatalog(folder).scan()
    if not scan.skills and not scan.problems:
        echo(f"no skills installed ({folder})")
    for skill in scan.skills:
        echo(f"{skill.name}: {skill.description}")
    for problem in scan.problems:
        echo(f"failed: {problem.path}: {problem.reason}")
    return 1 if scan.problems else 0
