"""`picoclaw skills`: the skills in workspace/skills/ that the model can load, and the drafts picoclaw wrote
from its lessons (workspace/skills/_drafts/), which the user accepts or rejects here and nowhere else.

Handlers import what they use: building this group's parser (for `--help`) loads no config and no tools.
"""

from __future__ import annotations

import argparse

from picoclaw.cli.command import Parser, opened_app
from picoclaw.cli.output import echo

TYPE_CHECKING = False  # read as true by type checkers; `typing` is not loaded for it (see cli/command.py)
if TYPE_CHECKING:
    from picoclaw.tools import SkillDrafts


def register(parser: argparse.ArgumentParser) -> None:
    """Fill in the `skills` group's parser: one action a subcommand."""
    actions = parser.add_subparsers(dest="skills_command", metavar="ACTION", parser_class=Parser)
    actions.add_parser("list", help="installed skills (name: description) and any that failed to load"
                       ).set_defaults(handler=cmd_skills_list)
    actions.add_parser("drafts", help="skills drafted from lessons, waiting to be accepted or rejected"
                       ).set_defaults(handler=cmd_skills_drafts)
    accept = actions.add_parser("accept", help="install a draft: move skills/_drafts/NAME to skills/NAME")
    accept.add_argument("name", metavar="NAME")
    accept.set_defaults(handler=cmd_skills_accept)
    reject = actions.add_parser("reject", help="delete a draft")
    reject.add_argument("name", metavar="NAME")
    reject.set_defaults(handler=cmd_skills_reject)


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


def _drafts() -> SkillDrafts:
    from picoclaw.tools import SkillDrafts

    with opened_app() as app:
        return SkillDrafts(app.workspace.layout.skills_dir)


def cmd_skills_drafts(args: argparse.Namespace) -> int:
    drafts = _drafts()
    found = drafts.list()
    if not found:
        echo(f"no skill drafts ({drafts.folder})")
    for draft in found:
        if draft.skill is not None:
            echo(f"{draft.name}: {draft.skill.description}")
        else:
            echo(f"{draft.name}: broken: {draft.problem}")
    return 1 if any(draft.skill is None for draft in found) else 0


def cmd_skills_accept(args: argparse.Namespace) -> int:
    skill = _drafts().accept(args.name)
    echo(f"accepted {skill.name}: installed in {skill.folder} (a running assistant that had no skill when it "
         "started offers skills after a restart)")
    return 0


def cmd_skills_reject(args: argparse.Namespace) -> int:
    folder = _drafts().reject(args.name)
    echo(f"rejected {args.name}: deleted {folder}")
    return 0
