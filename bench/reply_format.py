#!/usr/bin/env python3
"""What turning one reply into Telegram messages costs: Markdown rendered to Telegram's HTML, then split.

What is measured
    ``telegram_parts`` (picoclaw/channels/telegram/format.py) on replies of the kind a model writes: a heading,
    bold, a numbered list, inline code, a link and a quote, in English and in Chinese, at about 1 KB (one
    message) and about 20 KB (several, so the split cuts). Each is rendered and split ``--runs`` times (default
    200) in one process; the table shows the median milliseconds of the whole call and of the split alone
    (``split_html`` on the rendered HTML), which is picoclaw's own code (rendering is markdown-it-py's).

    With ``--repo`` the same measurement runs a second time, on another checkout (say, a worktree of the code
    before a change), in a child process started right after this one's, alternating: the last column is this
    checkout's split time over the other's.

Run (from the repository root):
    python bench/reply_format.py
    python bench/reply_format.py --repo /tmp/base --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

ENGLISH = ("## Deploy plan\n\nWe deploy on **Thursdays** after the review. Steps:\n\n1. Freeze the branch at noon.\n"
           "2. Run the `migrate` job and watch [the dashboard](https://grafana.example.com/d/abc?orgId=1).\n"
           "3. Roll out to 10% of the pods, then the rest.\n\n> If latency rises above 300 ms, roll back.\n\n")
CHINESE = ("## 部署计划\n\n我们在**周四**评审之后部署。步骤：\n\n1. 中午冻结分支。\n"
           "2. 运行 `migrate` 任务并查看[仪表盘](https://grafana.example.com/d/abc)。\n"
           "3. 先发布到百分之十的实例，再发布到其余实例。\n\n> 如果延迟超过 300 毫秒，就回滚。\n\n")
REPLIES = {"English, 1 KB": ENGLISH * 4, "Chinese, 1 KB": CHINESE * 4,
           "English, 20 KB": ENGLISH * 70, "Chinese, 20 KB": CHINESE * 80}


def measure(runs: int) -> dict[str, tuple[float, float, int]]:
    """Reply name → (median ms of telegram_parts, median ms of split_html alone, messages), in this process."""
    from picoclaw.channels.telegram import render_html, telegram_parts
    from picoclaw.channels.telegram.split import split_html

    results: dict[str, tuple[float, float, int]] = {}
    for name, markdown in REPLIES.items():
        rendered = render_html(markdown)
        whole: list[float] = []
        alone: list[float] = []
        for _ in range(runs):
            t0 = time.perf_counter()
            parts = telegram_parts(markdown)
            t1 = time.perf_counter()
            split_html(rendered)
            t2 = time.perf_counter()
            whole.append(t1 - t0)
            alone.append(t2 - t1)
        results[name] = (statistics.median(whole) * 1000, statistics.median(alone) * 1000, len(parts))
    return results


def measured_in(repo: Path, runs: int) -> dict[str, tuple[float, float, int]]:
    """`measure` run on the checkout at `repo`, in a child process."""
    code = (f"import json, sys; sys.path[:0] = [{str(repo)!r}, {str(REPO / 'bench')!r}]; "
            f"from reply_format import measure; print(json.dumps(measure({runs})))")
    env = {**os.environ, "PYTHONPATH": str(repo)}
    done = subprocess.run([sys.executable, "-c", code], cwd=repo, env=env, capture_output=True, text=True, check=True)
    return {name: (whole, alone, parts) for name, (whole, alone, parts) in json.loads(done.stdout).items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="calls per reply and round (default 200)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds, each measuring both checkouts (default 1)")
    parser.add_argument("--repo", type=Path, help="another picoclaw checkout to measure beside this one")
    args = parser.parse_args(argv)
    if args.runs < 5 or args.rounds < 1:
        parser.error("--runs must be at least 5 and --rounds at least 1")
    ours: list[dict[str, tuple[float, float, int]]] = []
    theirs: list[dict[str, tuple[float, float, int]]] = []
    for _ in range(args.rounds):
        ours.append(measured_in(REPO, args.runs))
        if args.repo is not None:
            theirs.append(measured_in(args.repo.resolve(), args.runs))

    def median_of(rounds: list[dict[str, tuple[float, float, int]]], name: str, field: int) -> float:
        return statistics.median(result[name][field] for result in rounds)

    other = f" | {args.repo} split ms | split, this / that |" if args.repo is not None else " |"
    print(f"median of {args.rounds} round(s) of {args.runs} calls each\n")
    print(f"| reply | messages | render + split ms | split ms{other}")
    print("|---|---|---|---|" + ("---|---|" if args.repo is not None else ""))
    for name in REPLIES:
        whole, alone = median_of(ours, name, 0), median_of(ours, name, 1)
        row = f"| {name} | {ours[0][name][2]} | {whole:.3f} | {alone:.3f} |"
        if args.repo is not None:
            that = median_of(theirs, name, 1)
            row += f" {that:.3f} | {alone / that:.2f} |"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
