#!/usr/bin/env python3
"""Several webhook workers, one bot: 1 worker against 3, and how soon a killed worker's chats are answered again.

Real `picoclaw telegram --webhook` processes on one PostgreSQL (the test extra's embedded server, or
PICOCLAW_TEST_POSTGRES_DSN), behind the tests' fake Bot API, which POSTs each update to the workers' ports
round-robin as a load balancer would, and the fake model, which answers after ``--model-delay`` (200 ms).

load
    ``--chats`` chats (50) each send ``--messages`` messages (10, English and Chinese in turn), each as soon as
    the answer to the previous one arrived (closed loop), after one warm-up message per chat that is not
    counted. Throughput = messages answered / wall time; latency = from the update being queued at the fake
    Bot API to the answer's sendMessage arriving there; CPU per answer = the CPU time (user + system, every
    thread, from /proc) used over the timed part / messages answered, by the worker processes, by the
    PostgreSQL server (when it runs here), by this process (the fakes and the pacer) and by the whole machine:
    steadier than throughput on a busy machine (N answers/s at C ms each keep N·C/1000 cores busy, so the
    machine's figure bounds what its cores can answer a second). Once with 1 worker, once with 3
    (``--workers``), ``--runs`` times (3) each; the rows are medians, and the last column is 3 workers / 1.
kill
    3 workers with a lease of ``--lease`` seconds (10; the default of channels.telegram.webhook is 30) under
    the same closed loop; once every chat has had an answer, one worker is SIGKILLed. Reported: how long
    after the kill each update it held was answered (by the others, once its lease ran out), the slowest
    and the median, per run and their median over ``--runs``.
faults
    3 workers (lease ``--lease``) on a PostgreSQL server of the run's own, under the same closed loop, which
    never stops sending: w0 is SIGKILLed; later w1 is SIGSTOPped for 1.5 leases and SIGCONTed; later
    PostgreSQL is stopped for ``--outage`` seconds (20) and started again, while /healthz of the live workers
    is asked every quarter second. Then the load stops and every message still waiting must be answered.
    Reported per run: messages lost (never answered), apologies (and those followed by the real answer),
    messages answered twice (and when: after the kill, the SIGCONT or the outage's start), the /healthz
    questions asked from the stop to the return that were answered 503 and the slowest answer, the time from
    PostgreSQL's return to the first answer (the median of it over ``--runs``), and the warnings, errors and
    tracebacks in the logs of w1 and w2 over the whole run.

The fakes run in threads of this process, sharing the machine's 2 cores with the workers: the figures are
what one small machine does, not what a bot's workers on separate machines would.

    python bench/workers.py                 # load and kill, ~4 minutes
    python bench/workers.py --part load --runs 1
    python bench/workers.py --part load --workers 1 --runs 5   # one worker's throughput and CPU, ~3 minutes
    python bench/workers.py --part faults   # ~4 minutes
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python bench/workers.py` without installing picoclaw
    sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402

from picoclaw.channels.telegram import APOLOGY  # noqa: E402
from picoclaw.onboard import onboard  # noqa: E402
from tests.fakes import FakeOpenAIServer, Text  # noqa: E402
from tests.fakes.postgres import TEST_DSN_ENV, embedded_server, fresh_database, stoppable_server  # noqa: E402
from tests.fakes.telegram_server import TOKEN, FakeTelegramServer, free_port, worker_healthy  # noqa: E402

URL = "https://bot.example.com/tg"
FIRST_CHAT = 20_000
TEXTS = ("What is on my calendar tomorrow? #{n}", "明天杭州的天气怎么样？#{n}")
QUIET_POLICY = {"session_summary_message_threshold": 1000, "session_summary_token_percent": 95,
                "long_term_compress_char_threshold": 0, "evolution_enabled": False}
START_LIMIT = 240.0  # seconds for a worker to answer /healthz: bounds a hang only


def p95(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[18] if len(values) > 1 else values[0]


@contextmanager
def database() -> Iterator[str]:
    """A fresh database on the given server or an embedded one."""
    given = os.environ.get(TEST_DSN_ENV)
    with ExitStack() as stack:
        admin = given or stack.enter_context(embedded_server())
        yield admin


def prepare_home(home: Path, dsn: str, telegram: FakeTelegramServer, model: FakeOpenAIServer,
                 chats: Sequence[int], lease: float) -> None:
    onboard(home)
    path = home / "config.json"
    config = orjson.loads(path.read_bytes())
    config["providers"]["openai"] = {"api_key": "sk-bench", "api_base": model.base_url}
    config["channels"]["telegram"].update({"enabled": True, "token": TOKEN, "api_base": telegram.origin,
                                          "allow_from": list(chats),
                                          "webhook": {"url": URL, "lease_seconds": lease, "max_parallel": 16}})
    config["storage"] = {"backend": "postgres", "postgres": {"dsn": dsn, "pool_size": 8}}
    config["memory"].update(QUIET_POLICY)
    path.write_bytes(orjson.dumps(config))


@contextmanager
def workers(home: Path, count: int) -> Iterator[dict[str, tuple[int, subprocess.Popen[bytes]]]]:
    """`count` workers, ready (each answering /healthz), killed at the end; their logs go to files in `home`."""
    # The caller's PYTHONPATH after the repository: a profiler's sitecustomize reaches the workers too.
    paths = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PICOCLAW_HOME": str(home), "PYTHONPATH": paths}
    started: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
    try:
        for i in range(count):
            port, name = free_port(), f"w{i}"
            with open(home / f"{name}.log", "wb") as log:
                started[name] = (port, subprocess.Popen(
                    [sys.executable, "-m", "picoclaw", "telegram", "--webhook", URL, "--listen",
                     f"127.0.0.1:{port}", "--worker", name], env=env, stdout=log, stderr=log))
        deadline = time.monotonic() + START_LIMIT
        for name, (port, process) in started.items():
            while not worker_healthy(port):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"worker {name} did not start; its log:\n"
                                     + (home / f"{name}.log").read_text(encoding="utf-8")[-3000:])
                time.sleep(0.1)
        yield started
    finally:
        for _, process in started.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for _, process in started.values():
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()


class ClosedLoop:
    """Each chat sends its next message when the answer to its last one arrives; records every latency."""

    def __init__(self, telegram: FakeTelegramServer, chats: Sequence[int], messages: int | None):
        self.telegram = telegram
        self.chats = chats
        self.messages = messages  # None: until stopped
        self.queued: dict[tuple[int, int], float] = {}
        self.answered: dict[tuple[int, int], float] = {}
        self.sent: list[tuple[float, int, str]] = []  # every message the bot sent: (time, chat, text)
        self.stopped = False
        self.done = threading.Event()
        self.lock = threading.Lock()
        self._finished: set[int] = set()
        telegram.on_sent = self._on_sent

    def send(self, chat: int, n: int) -> None:
        with self.lock:
            self.queued[(chat, n)] = time.monotonic()
        self.telegram.send_text(chat, chat, TEXTS[n % 2].format(n=n))

    def start(self, first: int) -> None:
        for chat in self.chats:
            self.send(chat, first)

    def _on_sent(self, params: dict[str, Any]) -> None:
        text = str(params.get("text", ""))
        with self.lock:
            self.sent.append((time.monotonic(), int(params["chat_id"]), text))
        if "#" not in text:
            return
        chat, n = int(params["chat_id"]), int(text.rsplit("#", 1)[1])
        with self.lock:
            if (chat, n) in self.answered:
                return  # a second answer (the window after a kill) is not a new one
            self.answered[(chat, n)] = time.monotonic()
            last = self.messages is not None and n + 1 >= self.messages
            if last:
                self._finished.add(chat)
                if len(self._finished) == len(self.chats):
                    self.done.set()
        if not self.stopped and not last:
            self.send(chat, n + 1)  # on the fake server's loop: queued there at once

    def wait(self, timeout: float = 600.0) -> None:
        if not self.done.wait(timeout):
            raise SystemExit(f"the closed loop did not finish within {timeout} s")

    def latencies(self, since: int) -> list[float]:
        with self.lock:
            return [self.answered[key] - self.queued[key] for key in self.answered if key[1] >= since]


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) the process `pid` has used so far, from /proc; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU time the machine's cores have spent working so far (every process and the kernel), from /proc/stat."""
    ticks = [int(field) for field in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # user, nice, system, idle, iowait, irq, softirq: steal (a virtual machine's neighbours) is not this machine's
    return (sum(ticks[:7]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def server_pids(admin: str) -> list[int]:
    """The PostgreSQL server's processes (postmaster and its children) when it runs on this machine, else []."""
    try:
        with psycopg.connect(admin) as conn:
            row = conn.execute("SELECT setting FROM pg_settings WHERE name = 'data_directory'").fetchone()
        postmaster = int((Path(row[0]) / "postmaster.pid").read_text().split()[0]) if row else 0
    except (psycopg.Error, OSError, ValueError):
        return []
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == postmaster:
            children.append(int(stat.parent.name))
    return [postmaster, *children]


@dataclass(frozen=True)
class CpuShares:
    """CPU milliseconds per answer: the workers, PostgreSQL, this process (the fakes and the pacer), the machine."""

    workers: float
    postgres: float
    bench: float
    machine: float

    @classmethod
    def sample(cls, workers: Sequence[int], postgres: Sequence[int]) -> CpuShares:
        """Seconds used so far by each (subtract two samples for a span)."""
        return cls(sum(map(cpu_seconds, workers)), sum(map(cpu_seconds, postgres)), time.process_time(),
                   machine_busy_seconds())

    def per_answer(self, before: CpuShares, answers: int) -> CpuShares:
        return CpuShares(*(1000 * (now - then) / answers for now, then in zip(astuple(self), astuple(before))))


def load_run(admin: str, count: int, chats: Sequence[int], messages: int,
             delay: float) -> tuple[float, float, float, CpuShares]:
    """(answers/s, p50 ms, p95 ms, CPU ms per answer) of one closed-loop run on `count` workers."""
    with tempfile.TemporaryDirectory(prefix="picoclaw-bench-workers-") as tmp, fresh_database(admin) as dsn, \
            FakeTelegramServer() as telegram, FakeOpenAIServer() as model:
        model.responder = lambda body: Text(_echo(body), delay=delay)
        home = Path(tmp) / "home"
        prepare_home(home, dsn, telegram, model, chats, lease=30)
        with workers(home, count) as running:
            telegram.deliver_to([port for port, _ in running.values()])
            loop = ClosedLoop(telegram, chats, messages + 1)
            loop.start(0)  # message 0 of each chat warms up (first session, first connections); not counted
            while len([k for k in loop.answered if k[1] == 0]) < len(chats):
                time.sleep(0.05)
            pids, postgres = [process.pid for _, process in running.values()], server_pids(admin)
            before = CpuShares.sample(pids, postgres)
            started = time.monotonic()
            loop.wait()
            wall = time.monotonic() - started
            cpu = CpuShares.sample(pids, postgres)
            latencies = loop.latencies(since=1)
    return (len(latencies) / wall, statistics.median(latencies) * 1000, p95(latencies) * 1000,
            cpu.per_answer(before, len(latencies)))


def kill_run(admin: str, chats: Sequence[int], lease: float, delay: float) -> list[float]:
    """Seconds from a worker's SIGKILL to the answer of each update it held."""
    with tempfile.TemporaryDirectory(prefix="picoclaw-bench-workers-") as tmp, fresh_database(admin) as dsn, \
            FakeTelegramServer() as telegram, FakeOpenAIServer() as model:
        model.responder = lambda body: Text(_echo(body), delay=delay)
        home = Path(tmp) / "home"
        prepare_home(home, dsn, telegram, model, chats, lease=lease)
        with workers(home, 3) as running:
            telegram.deliver_to([port for port, _ in running.values()])
            loop = ClosedLoop(telegram, chats, None)
            loop.start(0)
            while len({k[0] for k in loop.answered}) < len(chats) or len(loop.answered) < 3 * len(chats):
                time.sleep(0.05)
            held: list[tuple[int, int]] = []
            while not held:  # a moment at which the victim holds an update not answered yet
                held = unanswered(loop, claimed_by(dsn, "w1"))
            running["w1"][1].kill()
            killed = time.monotonic()
            held = unanswered(loop, sorted(set(held) | set(claimed_by(dsn, "w1"))))
            waits = []
            for chat, n in held:
                while (chat, n) not in loop.answered:
                    if time.monotonic() - killed > lease * 4 + 60:
                        raise SystemExit(f"chat {chat} message {n} was not answered after the kill")
                    time.sleep(0.01)
                waits.append(loop.answered[(chat, n)] - killed)
            loop.stopped = True
    return waits


def fault_run(chats: Sequence[int], lease: float, delay: float, outage: float,
              keep: Path | None = None) -> dict[str, Any]:
    """One run of the fault sequence (module docstring, "faults"); what it counted. `keep`: a folder to copy the
    workers' logs, the inbox and the timeline into, to look at afterwards."""
    with tempfile.TemporaryDirectory(prefix="picoclaw-bench-workers-") as tmp, stoppable_server() as server, \
            fresh_database(server.dsn) as dsn, FakeTelegramServer() as telegram, FakeOpenAIServer() as model:
        model.responder = lambda body: Text(_echo(body), delay=delay)
        home = Path(tmp) / "home"
        prepare_home(home, dsn, telegram, model, chats, lease=lease)
        with workers(home, 3) as running:
            telegram.deliver_to([port for port, _ in running.values()])
            loop = ClosedLoop(telegram, chats, None)
            loop.start(0)
            until(lambda: len({key[0] for key in loop.answered}) == len(chats), 240, "every chat answered once")
            running["w0"][1].kill()  # its chats wait for its leases to run out
            time.sleep(lease + 5)
            stopped = running["w1"][1]
            paused_at = time.monotonic()
            stopped.send_signal(signal.SIGSTOP)  # alive, but renewing nothing: its leases run out too
            time.sleep(lease * 1.5)
            stopped.send_signal(signal.SIGCONT)
            continued_at = time.monotonic()
            time.sleep(lease)
            probe = HealthProbe([running[name][0] for name in ("w1", "w2")])
            probe.start()
            stopping_at = time.monotonic()
            server.stop()
            down_at = time.monotonic()
            time.sleep(outage)
            server.start()
            back_at = time.monotonic()
            until(lambda: any(at > back_at for at in loop.answered.values()), 240, "an answer after the return")
            probe.stop()
            time.sleep(10)  # the load goes on a while after the return
            loop.stopped = True
            # Those still unanswered after this are lost.
            until(lambda: set(loop.queued) <= set(loop.answered), 180, "every message answered", fatal=False)
            time.sleep(2)  # a second answer to any of them would arrive now
            logs = "".join(f"{name} " + line for name in ("w1", "w2")
                           for line in (home / f"{name}.log").read_text(encoding="utf-8").splitlines(keepends=True))
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                for name in ("w0", "w1", "w2"):
                    (keep / f"{name}.log").write_bytes((home / f"{name}.log").read_bytes())
                with psycopg.connect(dsn) as conn:
                    rows = conn.execute("select update_id, chat, body, attempts, worker, received_at::text, "
                                        "replied_at::text, done_at::text from telegram_inbox order by update_id")
                    (keep / "inbox.json").write_bytes(orjson.dumps(rows.fetchall()))
                (keep / "timeline.json").write_bytes(orjson.dumps({
                    "paused": paused_at, "continued": continued_at, "down": down_at, "back": back_at,
                    "sent": loop.sent, "queued": [[*key, at] for key, at in loop.queued.items()]}))
        with loop.lock:
            queued, answered, sent = dict(loop.queued), dict(loop.answered), list(loop.sent)
    answers = Counter((chat, int(text.rsplit("#", 1)[1])) for _, chat, text in sent if "#" in text)
    times: dict[tuple[int, int], list[float]] = {}
    for at, chat, text in sent:
        if "#" in text:
            times.setdefault((chat, int(text.rsplit("#", 1)[1])), []).append(at)
    # When each message answered twice got its second answer: after w1's SIGCONT, or once the outage began.
    twice_when = Counter("outage" if at[1] >= down_at else "SIGCONT" if at[1] >= continued_at else "kill"
                         for at in times.values() if len(at) > 1)
    apologies = [(at, chat) for at, chat, text in sent if text == APOLOGY or text.startswith("Sorry")]
    followed = 0
    for at, chat in apologies:
        waiting = max((key for key, when in queued.items() if key[0] == chat and when < at), default=None)
        if waiting is not None and answered.get(waiting, 0) > at:
            followed += 1
    during = [(status, seconds) for at, status, seconds in probe.answers if stopping_at <= at <= back_at]
    return {"lost": len(set(queued) - set(answered)), "apologies": len(apologies), "followed": followed,
            "twice": sum(count - 1 for count in answers.values() if count > 1),
            "health_503": sum(1 for status, _ in during if status == 503), "health_asked": len(during),
            "health_slowest": max((seconds for _, seconds in during), default=0.0),
            "first_answer": min(at for at in answered.values() if at > back_at) - back_at,
            "messages": len(queued), "log_warnings": len(re.findall(r"^w\d picoclaw: (WARNING|ERROR): ", logs, re.M)),
            "log_tracebacks": logs.count("Traceback (most recent call last)"), "twice_when": dict(twice_when),
            "log_lines": dict(Counter(line[:110] for line in logs.splitlines()
                                      if re.match(r"w\d picoclaw: (WARNING|ERROR): ", line)))}


class HealthProbe(threading.Thread):
    """Asks /healthz of each port every quarter second: (time asked, status or 0, seconds to the answer)."""

    def __init__(self, ports: Sequence[int]):
        super().__init__(daemon=True)
        self.ports = ports
        self.answers: list[tuple[float, int, float]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.25):
            for port in self.ports:
                asked = time.monotonic()
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=30) as response:
                        status = response.status
                except urllib.error.HTTPError as exc:
                    status = exc.code
                except OSError:
                    status = 0
                self.answers.append((asked, status, time.monotonic() - asked))

    def stop(self) -> None:
        self._halt.set()
        self.join()


def until(condition: Any, limit: float, what: str, *, fatal: bool = True) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            if not fatal:
                return
            raise SystemExit(f"no {what} within {limit:g} s")
        time.sleep(0.05)


def unanswered(loop: ClosedLoop, updates: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The updates whose answer has not arrived (one sent just before a kill is not waiting for anyone)."""
    with loop.lock:
        return [key for key in updates if key not in loop.answered]


def claimed_by(dsn: str, worker: str) -> list[tuple[int, int]]:
    """(chat, message number) of each update `worker` holds, not done."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("select chat, body from telegram_inbox where worker = %s and done_at is null",
                            (worker,)).fetchall()
    return [(int(chat), int(orjson.loads(body)["message"]["text"].rsplit("#", 1)[1])) for chat, body in rows]


def _echo(body: dict[str, Any]) -> str:
    """The last user message, whose "#n" tells the bench which message an answer is for."""
    last = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    text = last if isinstance(last, str) else " ".join(part.get("text", "") for part in last)
    return "answer to " + text.rsplit("</context>", 1)[-1].strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("all", "load", "kill", "faults"), default="all")
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--model-delay", type=float, default=0.2)
    parser.add_argument("--lease", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 3], help="load: the worker counts (1 3)")
    parser.add_argument("--outage", type=float, default=20.0)
    parser.add_argument("--keep", type=Path, help="faults: copy each run's logs, inbox and timeline here")
    args = parser.parse_args()
    chats = [FIRST_CHAT + i for i in range(args.chats)]
    if args.part == "faults":  # a server of its own, which it stops and starts
        faults(chats, args)
        return
    with database() as admin:
        if args.part in ("all", "load"):
            rows: dict[int, list[float]] = {}
            for count in args.workers:
                runs = [load_run(admin, count, chats, args.messages, args.model_delay) for _ in range(args.runs)]
                columns = [[*run[:3], *astuple(run[3])] for run in runs]
                rows[count] = [statistics.median(column[i] for column in columns) for i in range(len(columns[0]))]
                for run in runs:
                    print(f"  {count} worker(s): {run[0]:.1f} answers/s, p50 {run[1]:.0f} ms, p95 {run[2]:.0f} ms, "
                          f"CPU ms/answer: workers {run[3].workers:.1f}, PostgreSQL {run[3].postgres:.1f}, "
                          f"fakes {run[3].bench:.1f}, machine {run[3].machine:.1f}", flush=True)
            print(f"\n{args.chats} chats × {args.messages} messages, closed loop, model {args.model_delay * 1000:.0f} "
                  f"ms, median of {args.runs} runs; {os.cpu_count()} cores = {1000 * (os.cpu_count() or 1):.0f} ms "
                  f"of CPU a second\n")
            first, last = args.workers[0], args.workers[-1]
            ratio = f" {last} / {first} |" if len(rows) > 1 else ""
            print("| measure |" + "".join(f" {count} worker(s) |" for count in rows) + ratio)
            print("|---|" + "---|" * (len(rows) + (len(rows) > 1)))
            for i, name in enumerate(("answers/s", "latency p50 (ms)", "latency p95 (ms)",
                                      "workers' CPU per answer (ms)", "PostgreSQL's CPU per answer (ms)",
                                      "the fakes' CPU per answer (ms)", "the machine's CPU per answer (ms)")):
                cells = "".join(f" {row[i]:.1f} |" for row in rows.values())
                if len(rows) > 1:
                    cells += f" {rows[last][i] / rows[first][i] if rows[first][i] else float('nan'):.2f} |"
                print(f"| {name} |{cells}")
        if args.part in ("all", "kill"):
            results = [kill_run(admin, chats, args.lease, args.model_delay) for _ in range(args.runs)]
            print(f"\n3 workers, one SIGKILLed under load, lease {args.lease:g} s: seconds from the kill to the "
                  f"answer of each update it held\n")
            print("| run | updates held | slowest (s) | median (s) |\n|---|---|---|---|")
            for i, waits in enumerate(results, 1):
                print(f"| {i} | {len(waits)} | {max(waits):.2f} | {statistics.median(waits):.2f} |")
            print(f"| median | | {statistics.median(max(w) for w in results):.2f} | "
                  f"{statistics.median(statistics.median(w) for w in results):.2f} |")


def faults(chats: Sequence[int], args: argparse.Namespace) -> None:
    runs: list[dict[str, Any]] = []
    for _ in range(args.runs):
        keep = args.keep / f"run{len(runs) + 1}" if args.keep is not None else None
        runs.append(fault_run(chats, args.lease, args.model_delay, args.outage, keep))
        print(f"  run {len(runs)}: {runs[-1]}", flush=True)
    print(f"\n3 workers, {args.chats} chats in a closed loop, model {args.model_delay * 1000:.0f} ms, lease "
          f"{args.lease:g} s: w0 SIGKILLed, w1 SIGSTOPped for {args.lease * 1.5:g} s, PostgreSQL stopped for "
          f"{args.outage:g} s\n")
    print("| run | messages | lost | apologies (followed by an answer) | answered twice (after) | /healthz 503 "
          "during the outage (slowest) | first answer after PostgreSQL's return | w1+w2 log: warnings, tracebacks |\n"
          "|---|---|---|---|---|---|---|---|")
    for i, run in enumerate(runs, 1):
        when = ", ".join(f"{phase} {count}" for phase, count in run["twice_when"].items())
        print(f"| {i} | {run['messages']} | {run['lost']} | {run['apologies']} ({run['followed']}) | {run['twice']}"
              f"{f' ({when})' if when else ''} | "
              f"{run['health_503']}/{run['health_asked']} ({run['health_slowest']:.2f} s) | "
              f"{run['first_answer']:.2f} s | {run['log_warnings']}, {run['log_tracebacks']} |")
    print(f"| median | | | | | | {statistics.median(run['first_answer'] for run in runs):.2f} s | |")


if __name__ == "__main__":
    main()
