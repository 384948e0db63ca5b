#!/usr/bin/env python3
"""Start-up cost of the `picoclaw` command line: CPU time and imported modules of short commands.

What is measured
    A temporary home is onboarded (``picoclaw onboard`` under ``PICOCLAW_HOME``, no network) and
    given two memory entries (English and Chinese). Then each command below runs ``--runs`` times (default 7),
    each in a fresh process, its output discarded. A ``picoclaw`` command runs as the installed ``picoclaw``
    script runs it: ``python -c "import sys; from picoclaw.cli import main; sys.exit(main())" ARGS`` (``python
    -m picoclaw`` would add runpy's imports, which the script does not pay):

    * ``python -c pass``: the interpreter alone, the unit of the ratio column;
    * ``picoclaw --help`` and ``picoclaw memory --help``: help only, which should import no config;
    * ``picoclaw memory search <query>``, ``picoclaw policy show``, ``picoclaw cron list``: short commands
      that read the workspace and print.

    CPU time is the child's user + system time, from ``resource.getrusage(RUSAGE_CHILDREN)`` read before and
    after each run (one child at a time, so the difference is that child's). It counts what the process
    computed, not how long it waited for a busy machine, so it is steadier than wall-clock time on a shared
    one. The table shows each command's median, its ratio to the median of ``python -c pass``, and the number
    of modules imported.

    Modules load from bytecode, as in an installed picoclaw: the processes keep their ``.pyc`` files under a
    temporary ``PYTHONPYCACHEPREFIX`` (the checkout is not written to; ``PYTHONDONTWRITEBYTECODE`` is
    dropped), filled by one untimed run of each command first. Compiling picoclaw from source on every run
    would otherwise cost more than the rest of a short command.

    The module count is ``len(sys.modules)`` at the exit of one more, untimed run: the command runs inside a
    small ``python -c`` wrapper that registers an ``atexit`` hook writing the count to a file, then calls
    ``main`` as the script does. Every module counts, the interpreter's own start-up modules included, so
    ``python -c pass`` has a count too and a command's extra modules are the difference.

    ``--repo`` runs another checkout of picoclaw (say, a worktree of the code before issue 25) with this
    interpreter: its folder goes first on ``PYTHONPATH`` and is the processes' working folder.

Run (from the repository root):
    python bench/startup.py
    python bench/startup.py --runs 15
    python bench/startup.py --repo /tmp/base     # the same bench against the old code
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QUERY = "tea"
MEMORIES = ("I drink green tea every morning", "我每天早上喝绿茶 (tea)")

# What the installed `picoclaw` script runs (its `sys.argv[0]` fix-up aside).
SCRIPT = "import sys; from picoclaw.cli import main; sys.exit(main())"
# The wrapper of the counting run: argv is [file for the count, picoclaw's arguments …]; no arguments at all
# stands for `python -c pass`.
COUNT_MODULES = """\
import atexit, sys
out, args = sys.argv[1], sys.argv[2:]
atexit.register(lambda: open(out, "w", encoding="utf-8").write(str(len(sys.modules))))
if args:
    from picoclaw.cli import main
    sys.argv = ["picoclaw", *args]
    sys.exit(main())
"""


@dataclass(frozen=True)
class Command:
    """One row of the table: its label and picoclaw's arguments (None: the bare interpreter)."""

    label: str
    args: tuple[str, ...] | None


COMMANDS = (
    Command("python -c pass", None),
    Command("picoclaw --help", ("--help",)),
    Command("picoclaw memory --help", ("memory", "--help")),
    Command(f"picoclaw memory search {QUERY}", ("memory", "search", QUERY)),
    Command("picoclaw policy show", ("policy", "show")),
    Command("picoclaw cron list", ("cron", "list")),
)


@dataclass(frozen=True)
class Row:
    """A command's median CPU seconds and its module count."""

    command: Command
    cpu: float
    modules: int


class Runner:
    """Runs commands of one checkout under one home, with its own bytecode cache."""

    def __init__(self, repo: Path, home: Path, pycache: Path):
        self.repo = repo
        self.env = {**os.environ, "PICOCLAW_HOME": str(home), "PYTHONPATH": str(repo), "PYTHONIOENCODING": "utf-8",
                    "PYTHONPYCACHEPREFIX": str(pycache)}
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)

    def argv(self, command: Command) -> list[str]:
        if command.args is None:
            return [sys.executable, "-c", "pass"]
        return [sys.executable, "-c", SCRIPT, *command.args]

    def run(self, argv: list[str], *, check: bool = True) -> None:
        done = subprocess.run(argv, cwd=self.repo, env=self.env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if check and done.returncode != 0:
            raise SystemExit(f"{' '.join(argv[1:])[:80]} failed ({done.returncode}):\n"
                             f"{done.stderr.decode('utf-8', 'replace')}")

    def cpu_seconds(self, command: Command) -> float:
        """User + system CPU time of one run of the command."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.run(self.argv(command))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    def modules(self, command: Command) -> int:
        """How many modules `sys.modules` holds when the command exits."""
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "count"
            self.run([sys.executable, "-c", COUNT_MODULES, str(out), *(command.args or ())])
            return int(out.read_text(encoding="utf-8"))


def measure(repo: Path, runs: int) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="picoclaw-startup-bench-") as tmp:
        runner = Runner(repo, Path(tmp) / "home", Path(tmp) / "pycache")
        runner.run(runner.argv(Command("onboard", ("onboard",))))
        for text in MEMORIES:
            runner.run(runner.argv(Command("append", ("memory", "append", text))))
        for command in COMMANDS:  # untimed: fills the bytecode cache
            runner.run(runner.argv(command))
        times: dict[Command, list[float]] = {command: [] for command in COMMANDS}
        for _ in range(runs):  # round-robin: a burst of load elsewhere spreads over every command alike
            for command in COMMANDS:
                times[command].append(runner.cpu_seconds(command))
        return [Row(command, statistics.median(times[command]), runner.modules(command)) for command in COMMANDS]


def print_table(rows: list[Row], repo: Path, runs: int) -> None:
    unit = rows[0].cpu
    print(f"\npicoclaw at {repo}, {runs} runs per command, median CPU time (user + sys)\n")
    print("| command | CPU s | × python -c pass | modules |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| `{row.command.label}` | {row.cpu:.3f} | {row.cpu / unit:.1f} | {row.modules} |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per command (default 7)")
    parser.add_argument("--repo", type=Path, default=REPO, help="the picoclaw checkout to run (default: this one)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    repo = args.repo.resolve()
    print_table(measure(repo, args.runs), repo, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
