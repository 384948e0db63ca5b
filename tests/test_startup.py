"""Start-up costs only what the command uses: held by what a command imports, never by timing.

Each case runs the real command line in a fresh process and lists `sys.modules` as the command ends. Help
(`picoclaw --help`, a group's `--help`) must load no config (no pydantic) and no layer of the runtime; a
command that reads memory must load neither the model client, Telegram, MCP, numpy, the console, nor the agent,
channel and tool layers; and, as it only reads, no event loop (asyncio) and no lock library (filelock).
bench/startup.py measures what this costs; this file only keeps the imports from creeping back.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import picoclaw
from picoclaw.cli import GROUPS, main

REPO = Path(picoclaw.__file__).resolve().parent.parent
# Runs `main` as the `picoclaw` script does, then writes the names of the loaded modules to argv[1].
SCRIPT = """\
import sys
from picoclaw.cli import main
try:
    code = main(sys.argv[2:])
except SystemExit as exc:  # --help prints and exits
    code = exc.code
loaded = sorted(sys.modules)
with open(sys.argv[1], "w", encoding="utf-8") as out:
    out.write("\\n".join(loaded))
sys.exit(code)
"""
LIBRARIES_NOT_FOR_MEMORY = ("aiogram", "openai", "mcp", "httpx", "numpy", "aiohttp", "jinja2")
LAYERS_ABOVE_MEMORY = ("picoclaw.agent", "picoclaw.channels", "picoclaw.tools", "picoclaw.web")
NOT_FOR_READING = ("asyncio", "filelock")  # a command that only reads runs no event loop and takes no lock
NOT_FOR_HELP = ("pydantic", "picoclaw.config", "picoclaw.app", "picoclaw.memory", "picoclaw.jobs",
                "picoclaw.providers", *LIBRARIES_NOT_FOR_MEMORY, *LAYERS_ABOVE_MEMORY)


def run_picoclaw(tmp_path: Path, *argv: str) -> tuple[int, str, set[str]]:
    """Run `picoclaw ARGV` in a new process; (exit code, stdout, the modules loaded when it ended)."""
    listing = tmp_path / "modules.txt"
    env = {**os.environ, "PYTHONIOENCODING": "utf-8",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    # The timeout only stops a hung process; nothing here depends on how fast the machine is.
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(listing), *argv], cwd=tmp_path, env=env,
                          capture_output=True, timeout=300)
    assert done.stderr.decode("utf-8", "replace") == ""
    return done.returncode, done.stdout.decode("utf-8"), set(listing.read_text(encoding="utf-8").split("\n"))


def loaded_from(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    """The modules that are one of `packages` or inside one."""
    return sorted(name for name in modules if any(name == p or name.startswith(f"{p}.") for p in packages))


@pytest.mark.slow
@pytest.mark.parametrize("argv", [("--help",), *((name, "--help") for name, _, _ in GROUPS),
                                  ("memory", "search", "--help"), ("cron", "add", "--help")],
                         ids=lambda argv: " ".join(argv))
def test_help_loads_no_config_and_no_runtime(tmp_path: Path, argv: tuple[str, ...]) -> None:
    code, out, modules = run_picoclaw(tmp_path, *argv)
    assert code == 0
    assert out.startswith("usage: picoclaw")
    assert "picoclaw.cli" in modules  # the listing is of the process that ran the command
    assert loaded_from(modules, NOT_FOR_HELP) == []


@pytest.mark.slow
def test_top_level_help_loads_no_group(tmp_path: Path) -> None:
    code, out, modules = run_picoclaw(tmp_path, "--help")
    assert code == 0
    words = " ".join(out.split())  # argparse wraps long summaries
    for name, module, summary in GROUPS:  # every group is listed with its summary, none is imported
        assert f"{name} {summary}" in words
        assert module not in modules


@pytest.mark.slow
def test_a_group_loads_only_its_own_module(tmp_path: Path) -> None:
    code, _, modules = run_picoclaw(tmp_path, "policy", "--help")
    assert code == 0
    assert "picoclaw.cli.policy" in modules
    assert [module for _, module, _ in GROUPS if module in modules] == ["picoclaw.cli.policy"]


@pytest.mark.slow
@pytest.mark.parametrize(("query", "found"), [("tea", "I drink green tea every morning"),
                                              ("绿茶", "我每天早上喝绿茶")], ids=["english", "chinese"])
def test_memory_search_loads_no_model_client_and_no_agent(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], query: str, found: str
) -> None:
    for text in ("I drink green tea every morning", "我每天早上喝绿茶"):
        assert main(["memory", "append", text]) == 0
    capsys.readouterr()
    code, out, modules = run_picoclaw(tmp_path, "memory", "search", query)
    assert code == 0
    assert out.startswith("1. score ") and found in out  # the search really ran
    assert loaded_from(modules, LIBRARIES_NOT_FOR_MEMORY + LAYERS_ABOVE_MEMORY + NOT_FOR_READING) == []
    assert "picoclaw.providers.openai_compat" not in modules


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "shown"), [(("policy", "show"), "retrieve_limit"),
                                             (("cron", "list"), "no scheduled jobs"),
                                             (("memory", "show"), "# Long-term memory")],
                         ids=["policy show", "cron list", "memory show"])
def test_reading_commands_load_no_model_client_and_no_agent(
    home: Path, tmp_path: Path, argv: tuple[str, ...], shown: str
) -> None:
    code, out, modules = run_picoclaw(tmp_path, *argv)
    assert code == 0
    assert shown in out
    assert loaded_from(modules, LIBRARIES_NOT_FOR_MEMORY + LAYERS_ABOVE_MEMORY + NOT_FOR_READING) == []
    if argv[0] == "policy":  # the policy needs no search: the workspace opens its search at first use
        assert loaded_from(modules, ("picoclaw.memory.search",)) == []


def test_loaded_from_matches_packages_and_their_modules_only() -> None:
    modules = {"picoclaw.agent", "picoclaw.agent.loop", "picoclaw.agentic", "openai", "openai_like"}
    assert loaded_from(modules, ("picoclaw.agent", "openai")) == ["openai", "picoclaw.agent", "picoclaw.agent.loop"]
