#!/usr/bin/env python3
"""The console's pages, timed: a 10,000-entry MEMORY.md and a 2,000-message conversation.

Each page is fetched --runs times over loopback (after one warm-up fetch) with the script token as a bearer
header; the table gives the median and p95 in milliseconds, against the 100 ms the console must stay under.

Run (from the repository root):
    python bench/web.py
    python bench/web.py --runs 50
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx2
import orjson

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from picoclaw.app import App  # noqa: E402
from picoclaw.onboard import onboard  # noqa: E402
from tests.fakes.console import Console  # noqa: E402

ENTRIES = 10_000
MESSAGES = 2_000
LIMIT_MS = 100.0


def fill(home: Path, entries: int = ENTRIES) -> str:
    """MEMORY.md with `entries` entries (English and Chinese) and one MESSAGES-message transcript; its name."""
    memory = home / "workspace" / "memory" / "MEMORY.md"
    lines = [memory.read_text(encoding="utf-8").rstrip("\n"), ""]
    for n in range(entries):
        text = f"Fact {n}: the deploy of service {n % 97} is reviewed on Fridays" if n % 2 else \
            f"事实 {n}：第 {n % 89} 号服务的预算每周五评审"
        lines += [f"## 2024-{1 + n % 12:02d}-{1 + n % 28:02d}", text, ""]
    memory.write_text("\n".join(lines), encoding="utf-8")
    sessions = home / "workspace" / "sessions"
    sessions.mkdir(parents=True, exist_ok=True)
    records = []
    for n in range(1, MESSAGES + 1):
        if n % 2:
            why = {"search": "keywords (BM25 over the memory files), re-ranked by standing",
                   "items": [{"key": f"k{n}{i}", "found_by": "search", "score": 0.5, "path": "memory/MEMORY.md",
                              "lines": [10 * i + 5, 10 * i + 6], "text": f"Fact {i}: a block"} for i in range(5)],
                   "policy": {"retrieve_limit": 10, "memory_token_budget": 2000}}
            records.append({"type": "message", "id": n, "time": "2026-11-26T10:00:00+00:00",
                            "message": {"role": "user", "content": f"question {n} 问题"}, "why": why})
        else:
            records.append({"type": "message", "id": n, "time": "2026-11-26T10:00:01+00:00",
                            "message": {"role": "assistant", "content": f"answer {n}"},
                            "prompt_tokens": 1000 + n, "cached_tokens": 900 + n})
    name = "web%3Abench.jsonl"  # a console conversation: its why page and its chat page both read it
    (sessions / name).write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in records))
    return name


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="fetches per page (default 30)")
    parser.add_argument("--entries", type=int, default=ENTRIES, help=f"entries of MEMORY.md (default {ENTRIES:,}; "
                        "30 for the memory page's cost at a small file)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="picoclaw-bench-web-") as tmp:
        home = Path(tmp) / "home"
        os.environ["PICOCLAW_HOME"] = str(home)
        onboard(home)
        name = fill(home, args.entries)
        app = App.open(home)
        store = app.workspace.store  # one backup to list and diff: the file since then has one entry changed
        store.rewrite_long_term(store.read_long_term().replace(f"Fact {args.entries // 2 | 1}:", "Fact (checked):"))
        backup = store.backups()[-1].name
        console = Console(app).__enter__()
        pages = {
            "memory, page 1": "/memory",
            "memory, page 150": "/memory?page=150",
            "memory, search": "/memory?q=deploy%20service%2042%20预算",
            "backups": "/memory/backups",
            f"backup diff ({args.entries:,} entries)": f"/memory/backups?name={backup}",
            "conversations": "/why",
            f"conversation ({MESSAGES:,} messages)": f"/why/conversation?name={name.replace('%', '%25')}",
            "memory stats": "/memory/stats",
            "daily notes": "/memory/notes",
            "LEARNINGS.md": "/memory/lessons",
            "chat (history of 2,000 messages)": "/chat?name=bench",
            "policy": "/policy",
            "jobs": "/jobs",
            "status": "/status",
        }
        bearer = {"Authorization": f"Bearer {console.gate.script_token}"}
        client = httpx2.Client(base_url=console.base, headers=bearer, timeout=120)
        print(f"| page | median ms | p95 ms | under {LIMIT_MS:g} ms |")
        print("|---|---|---|---|")
        for label, path in pages.items():
            assert client.get(path).status_code == 200, path  # warm-up: caches filled as a user's first visit
            times = []
            for _ in range(args.runs):
                start = time.perf_counter()
                response = client.get(path)
                times.append((time.perf_counter() - start) * 1000)
                assert response.status_code == 200
            median, high = statistics.median(times), p95(times)
            print(f"| {label} | {median:.1f} | {high:.1f} | {'yes' if high < LIMIT_MS else 'NO'} |")
        app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
