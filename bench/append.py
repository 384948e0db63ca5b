#!/usr/bin/env python3
"""Cost of `picoclaw memory append` and `picoclaw memory search` as MEMORY.md grows: 1 MB, 10 MB, 50 MB.

What is measured
    For each size (default 1, 10 and 50 MB), a temporary home is onboarded (``python -m picoclaw onboard``)
    and its MEMORY.md replaced by synthetic ``## YYYY-MM-DD`` entries of that size (the seeded generator of
    ``bench/retrieval.py``: half Chinese, half English). Then, each in a fresh process of the real command
    line (``python -m picoclaw …`` under ``PICOCLAW_HOME``, the page cache warm):

    * first append: ``memory append`` of one new entry; with the entry table of issue 23 this one builds
      ``.MEMORY.md.entries`` (once per file, or after the file was rewritten or edited by hand);
    * append: ``--runs`` more appends (default 5), each a new entry in English or Chinese made of random
      words, so that none repeats or updates an older one;
    * search: ``memory search`` of ``--runs`` queries of ``bench/retrieval.py`` (English, Chinese, mixed),
      with the default limit (retrieve_limit, 10) and no index.

    Time is wall-clock around the process; peak memory is its maximum resident set size, as GNU time
    (``/usr/bin/time -f %M``) reports it.
    The table shows the medians, the ratio to the first size's, and the bytes added to ``memory/backups``
    per append (the old code copied the whole file there on every append).

    ``--repo`` runs another checkout of picoclaw (say, a worktree of the code before issue 23) with this
    interpreter: its folder goes first on ``PYTHONPATH`` and is the processes' working folder.

Run (from the repository root):
    python bench/append.py
    python bench/append.py --sizes 1 10 --runs 3
    python bench/append.py --repo /tmp/base --runs 3     # the same bench against the old code
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for folder in (REPO, REPO / "bench"):  # run as `python bench/append.py` without installing picoclaw
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from retrieval import (  # noqa: E402
    ADJ,
    ANIMALS,
    EN_PLACES,
    QUERIES,
    TOOLS,
    ZH_FOODS,
    ZH_PLACES,
    ZH_PROJECTS,
    synthetic_memory,
)

MB = 1_000_000
TIME = "/usr/bin/time"  # GNU time (Debian: apt-get install time)
WORDS = [w.lower() for w in (*ADJ, *ANIMALS, *EN_PLACES, *TOOLS)]
ZH_WORDS = [*ZH_FOODS, *ZH_PLACES, *ZH_PROJECTS]


@dataclass
class Run:
    """One process: its wall-clock seconds and peak resident memory in MB."""

    seconds: float
    peak_mb: float


@dataclass
class Row:
    """The measurements at one size of MEMORY.md."""

    size_mb: int
    first: Run | None = None
    appends: list[Run] = field(default_factory=list)
    searches: list[Run] = field(default_factory=list)
    backup_bytes: list[int] = field(default_factory=list)


def run_cli(repo: Path, home: Path, *argv: str) -> Run:
    """Run `python -m picoclaw ARGV` of `repo` under `home`; its time and peak memory (it must succeed).

    The process is started by /usr/bin/time, whose report is its peak: a process started from this one
    directly would report this one's peak when it is the larger (Linux counts the memory it was forked
    with), and this one holds the generated MEMORY.md.
    """
    env = {**os.environ, "PICOCLAW_HOME": str(home), "PYTHONPATH": str(repo), "PYTHONIOENCODING": "utf-8"}
    with tempfile.TemporaryDirectory() as tmp:
        report, out = Path(tmp) / "time", Path(tmp) / "out"
        with out.open("wb") as sink:
            started = time.perf_counter()
            done = subprocess.run([TIME, "-f", "%M", "-o", str(report), sys.executable, "-m", "picoclaw", *argv],
                                  cwd=repo, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
            seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"picoclaw {' '.join(argv)[:60]} failed ({done.returncode}):\n"
                             f"{out.read_text(encoding='utf-8', errors='replace')}")
        peak_kib = int(report.read_text().split()[-1])
    return Run(seconds, peak_kib / 1024)


def memory_of_size(size: int, seed: int = 7) -> str:
    """Synthetic MEMORY.md entries, about `size` bytes of UTF-8 (a whole number of entries)."""
    sample = synthetic_memory(2_000, seed)
    per_entry = len(sample.encode("utf-8")) / 2_000
    return synthetic_memory(max(int(size / per_entry), 1), seed)


def new_entry(rng: random.Random, number: int) -> str:
    """A fact no other appended entry repeats or updates: random words, English or Chinese."""
    if number % 2:
        return f"{''.join(rng.sample(ZH_WORDS, 3))}的备注：{rng.choice(ZH_WORDS)}和{rng.choice(ZH_WORDS)}"
    return f"Note on {' '.join(rng.sample(WORDS, 5))}: see {rng.choice(WORDS)} {rng.choice(WORDS)}"


def backup_bytes(home: Path) -> int:
    folder = home / "workspace" / "memory" / "backups"
    return sum(path.stat().st_size for path in folder.iterdir()) if folder.is_dir() else 0


def measure(repo: Path, size_mb: int, runs: int, rng: random.Random) -> Row:
    row = Row(size_mb)
    with tempfile.TemporaryDirectory(prefix="picoclaw-append-bench-") as tmp:
        home = Path(tmp) / "home"
        run_cli(repo, home, "onboard")
        memory = home / "workspace" / "memory" / "MEMORY.md"
        memory.write_text(memory_of_size(size_mb * MB), encoding="utf-8")
        memory.read_bytes()  # in the page cache, as a file in use is
        row.first = run_cli(repo, home, "memory", "append", new_entry(rng, 0))
        for number in range(1, runs + 1):
            before = backup_bytes(home)
            row.appends.append(run_cli(repo, home, "memory", "append", new_entry(rng, number)))
            row.backup_bytes.append(backup_bytes(home) - before)
        for number in range(runs):
            row.searches.append(run_cli(repo, home, "memory", "search", QUERIES[(number * 7) % len(QUERIES)]))
    return row


def print_table(rows: list[Row], repo: Path) -> None:
    base = rows[0]

    def median(runs: list[Run], attr: str) -> float:
        return statistics.median(getattr(run, attr) for run in runs)

    print(f"\npicoclaw at {repo}, {len(base.appends)} runs per cell, medians (ratio to the {base.size_mb} MB row)\n")
    print("| MEMORY.md | append s | append peak MB | first append s | backup bytes per append "
          "| search s | search peak MB |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        assert row.first is not None
        cells = []
        for runs, attr in ((row.appends, "seconds"), (row.appends, "peak_mb")):
            value = median(runs, attr)
            cells.append(f"{value:.2f} ({value / median(base.appends, attr):.2f}x)")
        cells.append(f"{row.first.seconds:.2f}")
        cells.append(f"{statistics.median(row.backup_bytes):,.0f}")
        for attr in ("seconds", "peak_mb"):
            value = median(row.searches, attr)
            cells.append(f"{value:.2f} ({value / median(base.searches, attr):.2f}x)")
        print(f"| {row.size_mb} MB | " + " | ".join(cells) + " |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 50], help="MEMORY.md sizes in MB")
    parser.add_argument("--runs", type=int, default=5, help="appends and searches timed per size (default 5)")
    parser.add_argument("--repo", type=Path, default=REPO, help="the picoclaw checkout to run (default: this one)")
    parser.add_argument("--seed", type=int, default=23)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    rows = []
    for size in args.sizes:
        rows.append(measure(args.repo.resolve(), size, args.runs, rng))
        print(f"{size} MB done", file=sys.stderr)
    print_table(rows, args.repo.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
