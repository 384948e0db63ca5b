"""Real processes: concurrent appends lose nothing, and SIGKILL mid-write leaves a whole MEMORY.md."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import sys
import threading
import time
from collections import Counter
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from tests.stores import memory_store
from tests.waiting import Deadline

pytestmark = pytest.mark.slow  # every test here starts processes

# "spawn": each child is a fresh interpreter with its own imports and its own FileLock, as when the
# bot, the REPL and the CLI run side by side.
CTX = multiprocessing.get_context("spawn")
TZ_NAME = "Asia/Shanghai"

WORKERS = 4
ENTRIES_EACH = 250
ROUNDS = 30
# Round n kills the writer n / (ROUNDS - 1) of the way through the KILL_SPAN rewrites after its third one, timed
# by the writer's own pace (its second and third rewrites): the kills land at different points of the work and
# of several rewrites, however fast or busy the machine (a fixed window in seconds can fall within one rewrite
# there), and a failing round's delay is printed to rerun it.
KILL_SPAN = 4
WRITER_TIMEOUT = 120.0  # a writer nobody killed stops by itself (and fails its round) instead of running on
# The appenders' lock wait: four processes taking one lock back to back can leave one of them polling for it
# longer than the default 30 s on a busy machine (filelock polls; it is not fair). This test checks that nothing
# is lost, not how long a wait takes, so the bound is only one on a hang, like the join below.
STRESS_LOCK_WAIT = 600.0


def _entry(worker: int, number: int) -> str:
    # Two lines and some Chinese, so a torn or interleaved write would show.
    return f"worker {worker} entry {number:03d}：用户偏好第{number}条\nline two of w{worker}e{number:03d}"


def _append_many(memory_dir: str, worker: int, count: int, go: Event) -> None:
    store = memory_store(Path(memory_dir), ZoneInfo(TZ_NAME), lock_wait=STRESS_LOCK_WAIT)
    go.wait()  # start together, so the appends really overlap
    for number in range(count):
        store.append_long_term(_entry(worker, number))


def test_four_processes_append_without_losing_an_entry(tmp_path: Path) -> None:
    memory_dir = tmp_path / "memory"
    store = memory_store(memory_dir, ZoneInfo(TZ_NAME))
    store.rewrite_long_term("# Long-term memory\n")  # a preamble, as a person might write
    go = CTX.Event()
    workers = [
        CTX.Process(target=_append_many, args=(str(memory_dir), worker, ENTRIES_EACH, go))
        for worker in range(WORKERS)
    ]
    for process in workers:
        process.start()
    started = time.perf_counter()
    go.set()
    for process in workers:
        process.join(timeout=600)  # bounds a hang only: 1000 locked, fsynced appends took 90 s on a busy machine
    elapsed = time.perf_counter() - started
    for process in workers:
        if process.is_alive():
            process.kill()
    print(f"\n{WORKERS}x{ENTRIES_EACH} appends from {WORKERS} processes: {elapsed:.2f} s", file=sys.stderr)
    assert [process.exitcode for process in workers] == [0] * WORKERS

    text = store.read_long_term()
    parts = re.split(r"^(?=## )", text, flags=re.MULTILINE)
    preamble, blocks = parts[0], parts[1:]
    assert preamble == "# Long-term memory\n\n"
    assert len(blocks) == WORKERS * ENTRIES_EACH

    seen: Counter[str] = Counter()
    order: dict[int, list[int]] = {worker: [] for worker in range(WORKERS)}
    for index, block in enumerate(blocks):
        match = re.fullmatch(r"## (\d{4}-\d{2}-\d{2})\n(worker (\d) entry (\d{3})：.*\n.*)\n\n?", block)
        assert match, f"block {index} is not one intact entry: {block!r}"
        seen[match.group(2)] += 1
        order[int(match.group(3))].append(int(match.group(4)))
    expected = {_entry(w, n) for w in range(WORKERS) for n in range(ENTRIES_EACH)}
    assert set(seen) == expected
    assert max(seen.values()) == 1
    # Each process appended in order, and nobody's entry overwrote an earlier one.
    assert all(numbers == list(range(ENTRIES_EACH)) for numbers in order.values())

    # An append copies nothing: backups are for rewrites.
    assert store.backups() == []


def _rewrite_forever(memory_dir: str, a: str, b: str, started: Event, pace: Synchronized[float]) -> None:
    store = memory_store(Path(memory_dir), ZoneInfo(TZ_NAME), backup_keep=3)
    written = 0
    deadline = Deadline(WRITER_TIMEOUT, "the test to SIGKILL this writer")
    first_done = 0.0
    while True:
        deadline.check()
        store.rewrite_long_term(a if written % 2 else b)
        written += 1
        if written == 1:
            first_done = time.perf_counter()
        if written == 3:
            pace.value = (time.perf_counter() - first_done) / 2  # seconds per rewrite, as this machine runs now
            started.set()  # the parent's delay starts from here, mid-loop


def _big(unit: str, size: int = 200_000) -> str:
    return unit * (size // len(unit.encode("utf-8")))


def test_sigkill_during_rewrites_leaves_one_whole_version(tmp_path: Path) -> None:
    a = _big("长期记忆版本甲：用户喜欢无糖拿铁。Version A of the memory file.\n")
    b = _big("另一个版本乙：用户住在杭州，周末去西湖。Version B, a different text!\n")
    assert a != b and len(a.encode("utf-8")) > 190_000 and len(b.encode("utf-8")) > 190_000
    outcomes: Counter[str] = Counter()
    started_at = time.perf_counter()

    for round_number in range(ROUNDS):
        memory_dir = tmp_path / f"round{round_number}"
        store = memory_store(memory_dir, ZoneInfo(TZ_NAME), backup_keep=3)
        store.rewrite_long_term(a)
        original = store.read_long_term()
        assert original in (a, b)

        started, pace = CTX.Event(), CTX.Value("d", 0.0)
        child = CTX.Process(target=_rewrite_forever, args=(str(memory_dir), a, b, started, pace))
        child.start()
        assert started.wait(timeout=60), f"round {round_number}: the writer never started"
        delay = KILL_SPAN * pace.value * round_number / (ROUNDS - 1)
        where = f"round {round_number}, killed {delay * 1000:.1f} ms after the third write"
        time.sleep(delay)
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(timeout=10)
        assert child.exitcode == -signal.SIGKILL, where

        current = store.read_long_term()
        assert current in (a, b), f"{where}: MEMORY.md is torn ({len(current)} characters)"
        outcomes["A" if current == a else "B"] += 1
        # Every backup left behind is a whole earlier version too, never an empty or partial file.
        for backup in store.backups():
            assert backup.read_text(encoding="utf-8") in (a, b), f"{where}: bad backup {backup.name}"

        # The killed writer's lock died with it: a new store gets it at once. (A thread with a
        # deadline, because FileLock would otherwise wait forever.)
        appended: list[str] = []
        appender = threading.Thread(
            target=lambda: appended.append(memory_store(memory_dir, ZoneInfo(TZ_NAME)).append_long_term("after").text),
            daemon=True,
        )
        appender.start()
        appender.join(timeout=60)  # bounds a hang only: a lock still held would make it wait forever
        assert not appender.is_alive(), f"{where}: the memory lock is still held after the kill"
        assert store.read_long_term() == current + "\n" + appended[0]

    elapsed = time.perf_counter() - started_at
    print(f"\n{ROUNDS} SIGKILL rounds: {elapsed:.2f} s, outcomes {dict(outcomes)}", file=sys.stderr)
    # The kills landed at different points of the loop, not always after the same write.
    assert set(outcomes) == {"A", "B"}, dict(outcomes)
