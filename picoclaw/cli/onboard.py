"""`picoclaw onboard`: create the home folder, config.json and the workspace, saying what was done."""

from __future__ import annotations

import argparse


def register(parser: argparse.ArgumentParser) -> None:
    """Fill in the `onboard` command's parser."""
    parser.set_defaults(handler=cmd_onboard)


def cmd_onboard(args: argparse.Namespace) -> int:
    from picoclaw.config import home_dir
    from picoclaw.onboard import onboard

    home = home_dir()
    steps = onboard(home)
    for step in steps:
        note = {"created": "created", "unchanged": "already there, unchanged",
                "kept": "already there, left as you have it"}[step.outcome]
        print(f"{note:34} {step.path}")
    if all(step.outcome != "created" for step in steps):
        print("Nothing to do: picoclaw is already set up here; no file was changed.")
    else:
        print(f"Done. Add an API key to {home / 'config.json'} (or set OPENAI_API_KEY), then run `picoclaw chat`.")
    return 0
