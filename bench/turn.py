#!/usr/bin/env python3
"""Whole-turn time of picoclaw's AgentLoop against a model that answers at once: our overhead per turn.

What is measured
    A temporary home is onboarded; MEMORY.md gets 10,000 synthetic ``## YYYY-MM-DD`` entries (the
    generator of ``bench/retrieval.py``: half Chinese, half English, seeded) and the session a history of
    200 messages (100 user/assistant pairs, English and Chinese). The fake OpenAI-compatible server of the
    tests (``tests/fakes``, a real aiohttp server on 127.0.0.1, in a child process as a model server is)
    answers every request at once with "ok".
    Summaries, compression and reflection are kept from firing (thresholds at their maximum, evolution
    off) so that every turn does the same work.

    Each of ``--turns`` turns (default 200) sends one question (the 20 queries of ``bench/retrieval.py``
    in turn) through ``AgentLoop.handle``: build the context (bootstrap files, retrieval over the
    10,000 blocks, notes, history), one HTTP round trip through the real ``openai`` client, save the turn
    to the session file (fsynced). Interleaved with the turns, in the same event loop and client:

    * bare round trip: ``provider.chat`` with one short user message (the HTTP floor of any turn);
    * same-payload round trip: ``provider.chat`` with exactly the messages and tool schemas that turn
      sent (what the JSON and HTTP of a request that size cost by themselves).

    overhead = turn − bare round trip (the issue's measure); compute = turn − same-payload round trip
    (what picoclaw itself spends: context, retrieval, session write). The background work after each
    turn is awaited outside the timed region. The CPU rows are this process's CPU time (all its threads:
    the search runs in a worker thread) over the same spans: steadier than wall time on a busy machine.
    ``--runs`` runs (default 3) each use a fresh home; the table shows each run's median and p95 and,
    last, the median over the runs.

Run (from the repository root):
    python bench/turn.py
    python bench/turn.py --turns 100 --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
for folder in (REPO, REPO / "bench"):  # run as `python bench/turn.py` without installing picoclaw
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from retrieval import QUERIES, synthetic_memory  # noqa: E402

from picoclaw.agent.loop import AgentLoop  # noqa: E402
from picoclaw.app import App  # noqa: E402
from picoclaw.memory.workspace import Workspace  # noqa: E402
from picoclaw.onboard import onboard  # noqa: E402
from picoclaw.providers.base import Message  # noqa: E402
from picoclaw.providers.openai_compat import OpenAICompatProvider  # noqa: E402
from picoclaw.tools.registry import build_tools  # noqa: E402
from picoclaw.transcripts.session_store import StoredMessage  # noqa: E402

SESSION = "cli:bench"
MEMORY_BLOCKS = 10_000
HISTORY_MESSAGES = 200
TARGET_MS = 5.0  # the line per-turn overhead (turn − bare round trip) is held to
QUIET_POLICY = {"session_summary_message_threshold": 1000, "session_summary_token_percent": 95,
                "long_term_compress_char_threshold": 0, "evolution_enabled": False, "learning_enabled": False}


@dataclass
class RunTimes:
    """Per-turn milliseconds of one run."""

    turn: list[float]
    bare: list[float]
    payload: list[float]
    turn_cpu: list[float] = field(default_factory=list)  # CPU time of this process (every thread) in the turn
    bare_cpu: list[float] = field(default_factory=list)

    def overhead(self) -> list[float]:
        return [t - b for t, b in zip(self.turn, self.bare)]

    def compute(self) -> list[float]:
        return [t - p for t, p in zip(self.turn, self.payload)]


def p95(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def prepare_home(home: Path, base_url: str, storage: dict[str, Any] | None = None) -> Workspace:
    """An onboarded home pointed at the fake server, with the big MEMORY.md and the long session.

    `storage`: the config's storage block (bench/storage.py runs the same turns on PostgreSQL).
    """
    onboard(home)
    config_path = home / "config.json"
    config = orjson.loads(config_path.read_bytes())
    if storage is not None:
        config["storage"] = storage
    config["agents"]["defaults"]["provider"] = "openai"
    config["providers"]["openai"] = {"api_key": "sk-bench", "api_base": base_url}
    config["memory"].update(QUIET_POLICY)
    config_path.write_bytes(orjson.dumps(config, option=orjson.OPT_INDENT_2))
    workspace = App.open(home).workspace
    workspace.store.rewrite_long_term(synthetic_memory(MEMORY_BLOCKS, seed=7))
    return workspace


def history() -> list[Message]:
    """200 messages: alternating user and assistant, every other pair in Chinese."""
    messages: list[Message] = []
    for i in range(HISTORY_MESSAGES // 2):
        if i % 2:
            messages += [{"role": "user", "content": f"第 {i} 个问题：明天杭州的天气怎么样？要带伞吗？"},
                         {"role": "assistant", "content": f"第 {i} 个回答：可能有小雨，建议带伞。"}]
        else:
            messages += [
                {"role": "user", "content": f"Question {i}: can you remind me what we decided about the deploy?"},
                {"role": "assistant", "content": f"Answer {i}: we deploy on Thursdays after the review."}]
    return messages


@contextmanager
def model_server() -> Iterator[str]:
    """The fake OpenAI-compatible server in a child process, as a model server is; yields its base URL.

    Not a thread of this process: its reading of each request (a 200-message one is ~30 KB of JSON) would take
    the GIL the turn is timed on, which no real model server does."""
    code = ("import sys; from tests.fakes import FakeOpenAIServer; server = FakeOpenAIServer().start(); "
            "print(server.base_url, flush=True); sys.stdin.read()")  # serves until the bench closes stdin
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             cwd=REPO, env=env, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        base_url = child.stdout.readline().strip()
        if not base_url:
            raise RuntimeError("the fake model server did not start")
        yield base_url
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()


async def one_run(base_url: str, turns: int, storage: dict[str, Any] | None = None) -> RunTimes:
    """`turns` timed turns against the model server at `base_url`, in a fresh home."""
    times = RunTimes([], [], [])
    with tempfile.TemporaryDirectory(prefix="picoclaw-bench-turn-") as tmp:
        workspace = prepare_home(Path(tmp) / "home", base_url, storage)
        defaults = workspace.config.agents.defaults
        async with OpenAICompatProvider(name="openai", api_base=base_url, api_key="sk-bench",
                                        defaults=defaults, timeout=10.0, max_retries=0) as provider:
            loop = AgentLoop(workspace, provider, build_tools(workspace))
            loop.sessions.append_messages(await loop.session(SESSION), [StoredMessage(0, m) for m in history()])
            ping: list[Message] = [{"role": "user", "content": "ping"}]
            await loop.handle(SESSION, "warm up")  # builds the retrieval index and opens the connection
            await loop.wait_background()
            for i in range(turns):
                t0, c0 = time.perf_counter(), time.process_time()
                await provider.chat(ping)
                times.bare.append(1000 * (time.perf_counter() - t0))
                times.bare_cpu.append(1000 * (time.process_time() - c0))

                t0, c0 = time.perf_counter(), time.process_time()
                await loop.handle(SESSION, QUERIES[i % len(QUERIES)])
                times.turn.append(1000 * (time.perf_counter() - t0))
                times.turn_cpu.append(1000 * (time.process_time() - c0))
                await loop.wait_background()

                shown = loop.shown_requests.get(SESSION)  # the turn's request as it was sent
                assert shown is not None
                t0 = time.perf_counter()
                await provider.chat(list(shown.prefix.messages), list(shown.prefix.tools) or None)
                times.payload.append(1000 * (time.perf_counter() - t0))
            assert len((await loop.session(SESSION)).active()) == HISTORY_MESSAGES + 2 * (turns + 1), "a summary fired"
    return times


def print_table(runs: list[RunTimes]) -> None:
    rows = [("bare round trip", [r.bare for r in runs]), ("same-payload round trip", [r.payload for r in runs]),
            ("whole turn", [r.turn for r in runs]), ("overhead = turn − bare", [r.overhead() for r in runs]),
            ("compute = turn − same payload", [r.compute() for r in runs]),
            ("CPU: bare round trip", [r.bare_cpu for r in runs]), ("CPU: whole turn", [r.turn_cpu for r in runs])]
    runs_header = " | ".join(f"run {i + 1} median / p95" for i in range(len(runs)))
    print(f"| {'ms per turn':<29} | {runs_header} | median of runs (median / p95) |")
    print("|" + "|".join("-" * (len(c) + 2) for c in ["x" * 29, *runs_header.split(" | "), "x" * 29]) + "|")
    for name, per_run in rows:
        cells = " | ".join(f"{statistics.median(v):>9.2f} / {p95(v):>7.2f}".ljust(len("run 1 median / p95"))
                           for v in per_run)
        med = statistics.median(statistics.median(v) for v in per_run)
        tail = statistics.median(p95(v) for v in per_run)
        print(f"| {name:<29} | {cells} | {med:>13.2f} / {tail:>7.2f} |")
    overhead = statistics.median(statistics.median(r.overhead()) for r in runs)
    verdict = "under" if overhead < TARGET_MS else "NOT under"
    print(f"\noverhead median {overhead:.2f} ms: {verdict} the {TARGET_MS:g} ms line "
          f"({MEMORY_BLOCKS:,}-block MEMORY.md, {HISTORY_MESSAGES}-message session)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200, help="timed turns per run (default 200)")
    parser.add_argument("--runs", type=int, default=3, help="runs, each with a fresh home (default 3)")
    args = parser.parse_args(argv)
    if args.turns < 2 or args.runs < 1:
        parser.error("--turns must be at least 2 and --runs at least 1")
    logging.basicConfig(level=logging.WARNING)
    runs = []
    for i in range(args.runs):
        with model_server() as base_url:
            runs.append(asyncio.run(one_run(base_url, args.turns)))
        print(f"run {i + 1}/{args.runs} done", file=sys.stderr)
    print_table(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
