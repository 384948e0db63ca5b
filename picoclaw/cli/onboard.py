"""`picoclaw onboard`: create the home folder, config.json and the workspace, saying what was done.

On a terminal (stdin and stdout both) it first asks which model to use (picoclaw/cli/model_choice.py): always for
a new config.json, and for an existing one only when its provider has no key, so a choice made is not asked
again. Without a terminal (scripts, CI) it asks nothing and looks for nothing.
"""

from __future__ import annotations

import argparse
import sys

TYPE_CHECKING = False  # see picoclaw/cli/command.py: `--help` should not import `typing`
if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path
    from typing import Any

    from picoclaw.cli.model_choice import ModelChoice, Prompter
    from picoclaw.cli.model_probe import LocalServer
    from picoclaw.config import Config
    from picoclaw.onboard import Configure, OnboardStep

NOTES = {"created": "created", "unchanged": "already there, unchanged", "kept": "already there, left as you have it",
         "updated": "updated with your choice"}


def register(parser: argparse.ArgumentParser) -> None:
    """Fill in the `onboard` command's parser."""
    parser.set_defaults(handler=cmd_onboard)


def cmd_onboard(args: argparse.Namespace) -> int:
    from picoclaw.config import home_dir

    prompter = None
    if sys.stdin.isatty() and sys.stdout.isatty():
        from picoclaw.cli.model_choice import TerminalPrompter

        prompter = TerminalPrompter()
    return run_onboard(home_dir(), prompter)


def run_onboard(home: Path, prompter: Prompter | None, *, servers: Sequence[LocalServer] | None = None) -> int:
    """Onboard `home`, asking `prompter` (None: no terminal) for the model first; the exit code.

    Nothing is written before the last answer: stopped at a question (Ctrl-C, Ctrl-D), config.json is as it was."""
    from picoclaw.cli.output import echo
    from picoclaw.config import CONFIG_FILE, parse_config
    from picoclaw.onboard import onboard

    choice: ModelChoice | None = None
    data = _offered(home) if prompter is not None else None
    if prompter is not None and data is not None:
        from picoclaw.cli.model_choice import choose_model

        if (home / CONFIG_FILE).exists():  # say why a home already set up is asked again
            agent = parse_config(data, home / CONFIG_FILE).agents.defaults
            prompter.say(f"{home / CONFIG_FILE} names {agent.model} on {agent.provider}, which has no API key.")
        try:
            choice = choose_model(data, prompter, servers=servers)
        except (KeyboardInterrupt, EOFError) as exc:
            prompter.say()
            kept = "config.json was not changed" if (home / CONFIG_FILE).exists() else "nothing was written"
            echo(f"picoclaw: onboarding stopped at a question; {kept}", file=sys.stderr)
            return 130 if isinstance(exc, KeyboardInterrupt) else 1
    steps = onboard(home, configure=_configure(choice) if choice is not None else None)
    for line in describe_steps(steps):
        echo(line)
    config_path = home / CONFIG_FILE
    if all(step.outcome in ("unchanged", "kept") for step in steps):
        echo("Nothing to do: picoclaw is already set up here; no file was changed.")
    else:
        from picoclaw.jsonio import read_json_object

        echo(closing_line(parse_config(read_json_object(config_path), config_path), config_path, choice))
    return 0


def _configure(choice: ModelChoice) -> Configure:
    from picoclaw.cli.model_choice import apply_choice

    def configure(data: dict[str, Any]) -> dict[str, Any]:
        return apply_choice(data, choice)

    return configure


def _offered(home: Path) -> dict[str, Any] | None:
    """The config data to ask about: the example's for a new home, an existing config.json's when its provider
    has no key; None when there is nothing to ask (or the file is broken: onboarding then says so as ever)."""
    from picoclaw.cli.model_choice import needs_a_choice
    from picoclaw.config import CONFIG_FILE, parse_config
    from picoclaw.errors import ConfigError
    from picoclaw.jsonio import read_json_object
    from picoclaw.onboard import template_paths

    path = home / CONFIG_FILE
    if not path.exists():
        return read_json_object(template_paths()[1])
    try:
        data = read_json_object(path)
        parse_config(data, path)
    except ConfigError:
        return None
    return data if needs_a_choice(data) else None


def closing_line(config: Config, config_path: Path, choice: ModelChoice | None) -> str:
    """The last line: what picoclaw will talk to, or what it still needs, for the provider config.json names."""
    from picoclaw.config import provider_env_name

    agent = config.agents.defaults
    where = config.api_base_for(agent.provider)
    if choice is not None and choice.problem:
        return (f"Done. picoclaw will use {agent.model} on {agent.provider} ({where}), which failed the check "
                f"({choice.problem}): fix it in {config_path}, then run `picoclaw chat`.")
    if config.api_key_for(agent.provider):
        return f"Done. picoclaw will use {agent.model} on {agent.provider} ({where}); run `picoclaw chat`."
    return (f"Done. Add an API key to {config_path} (or set {provider_env_name(agent.provider, 'API_KEY')}), "
            f"or run `picoclaw onboard` in a terminal to choose a local server (Ollama, llama.cpp, LM Studio); "
            f"then run `picoclaw chat`.")


def describe_steps(steps: list[OnboardStep]) -> list[str]:
    """One line a step, as `picoclaw onboard` prints them."""
    return [f"{NOTES[step.outcome]:34} {step.path}" for step in steps]
