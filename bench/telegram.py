#!/usr/bin/env python3
"""The Telegram channel under load: closed loop, open loop, a slow embedding endpoint, and memory over time.

The bot (`TelegramChannel`: aiogram long polling, per-chat locks, the whole AgentLoop turn, HTML rendering,
sendMessage) runs against the tests' fake Telegram Bot API server and fake OpenAI-compatible model
(``tests/fakes``, real aiohttp servers on 127.0.0.1); the model answers every request at once. Every chat
is an allowed user. Summaries, compression and reflection are kept from firing so that every turn does the
same work.

    latency  = time from an update being queued at the fake Bot API to the bot's sendMessage for it
               arriving there (long-poll delivery, aiogram, the turn, the model call, the send);
    added    = latency − the bare model round trip (``provider.chat`` with one short message, median of
               50, measured in the same run): what the channel and the agent add to a model call.

Parts (``--part``, default ``all``):

closed
    ``--chats`` chats (default 100) each send ``--messages`` messages (default 10, English and Chinese in
    turn), each as soon as the answer to the previous one arrived. Throughput = messages answered / wall
    time. ``--runs`` runs (default 3), each with a fresh home; the last row is the median over the runs.
open
    Open loop: messages arrive at a fixed ``--rate`` (default 30/s, Telegram's own per-bot send limit) for
    ``--seconds`` (default 60), round-robin over ``--open-chats`` chats (default 200), whether or not answers
    came back. Sends are scheduled at absolute times (no drift; the worst slip is reported). A chat may
    have several messages in flight, so each carries a sequence number that the fake model echoes, and an
    answer is matched to its message by it. One warm-up message (not counted) goes first, so that lazy
    imports and the first index sync are not in the figures. Goal: added p95 < 50 ms.
    The bot runs in a child process of its own (as in rss); the fakes and the pacer stay in this one, as
    Telegram and the model are elsewhere for a real bot. Also reported: the bot process's CPU time
    (``time.process_time``, every thread) from the first message to the last turn's end, per message:
    the cost of a message, steadier than latency on a busy machine. At 30 msg/s a process that spends
    more than 33 ms of CPU on each message cannot keep up.
slow
    The same open loop with the memory index on (MEMORY.md seeded with English and Chinese entries, remote
    embeddings from the fake model server), twice: embeddings answering at once, then with every embedding
    request that contains the marker "慢" waiting 2 s (``--slow-delay``). Only one chat (the first) sends
    that marker, in every variant, so the runs differ by the delay alone. Reported: the *other* chats'
    added latency (goal: p95 unchanged within noise; the ratio to the no-delay run is printed) and, for
    information, the slow chat's own latency.
stream
    Time to the first visible text with streaming (``channels.telegram.stream``) off and on, in runs that
    alternate (the same minutes): the open loop over private chats, with a model that takes
    ``--writing-seconds`` (default 3) to write each answer, streamed piece by piece or, asked without
    streaming, answered whole after that time. First text = the first draft (sendMessageDraft) for the message,
    or its answer, whichever comes first; also the whole answer's latency, answers lost, and chats whose
    answers came in another order than their messages (goal: none lost, none reordered).
rss
    ``--rss-chats`` distinct chats (default 10,000) of 3 messages each (closed loop per chat, ``--rss-width``
    = 200 chats at a time). The bot runs in a child process of its own here, so its resident memory is
    measured alone (the fakes keep a record of every request, and earlier parts leave garbage behind):
    VmRSS from /proc/self/status after a gc.collect(), at start, after the first ``--rss-first`` chats
    (default 1,000) and after all of them, with the ratio of the last two (goal: flat, within 20 %), and
    the size of the per-chat structures (sessions loaded, session locks, chat locks) to show they are
    bounded.

Medians over several runs where time allows: ``--runs`` for closed (default 3); the open-loop parts take a
minute each, so they run once by default (``--open-runs`` for more; the rows are then medians). The rss
part runs once: it is one process's memory over time. ``--quick`` (closed 1 run, open loops 10 s, rss 2,000
chats) for a fast look; explicit options override it.

In the closed and stream parts the two fake servers run in threads of this same process, so they share its
GIL (and the machine's cores) with the bot: the figures are an upper bound on what the channel costs.

Run (from the repository root):
    python bench/telegram.py                        # everything, ~10 minutes
    python bench/telegram.py --quick
    python bench/telegram.py --part open --rate 30 --seconds 20
    python bench/telegram.py --part closed --chats 20 --messages 5 --runs 5
    python bench/telegram.py --part stream --seconds 20 --open-runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import multiprocessing
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python bench/telegram.py` without installing picoclaw
    sys.path.insert(0, str(REPO))

from picoclaw.app import App  # noqa: E402
from picoclaw.channels import TelegramChannel, make_bot  # noqa: E402
from picoclaw.config import Config, load_config  # noqa: E402
from picoclaw.onboard import onboard  # noqa: E402
from picoclaw.providers.openai_compat import OpenAICompatProvider  # noqa: E402
from tests.fakes import FakeOpenAIServer, Text  # noqa: E402
from tests.fakes.telegram_server import TOKEN, FakeTelegramServer  # noqa: E402

QUIET_POLICY = {"session_summary_message_threshold": 1000, "session_summary_token_percent": 95,
                "long_term_compress_char_threshold": 0, "evolution_enabled": False}
TEXTS = ("What is on my calendar tomorrow?", "明天杭州的天气怎么样？")
INDEX = {"enabled": True, "embeddings": {"provider": "openai", "model": "text-embedding-3-small"}}
# What the seeded MEMORY.md holds: something for the searches of TEXTS to find, in both languages.
MEMORY_ENTRIES = (
    "The user's team meets every Tuesday at 10:00 to plan the week; the calendar lives in Google Calendar.",
    "The user prefers answers in short bullet points.",
    "用户住在杭州，每天骑车上班，所以很关心天气。",
    "用户的日历上每周五下午有羽毛球。",
    "The user's dentist appointment is on the first Monday of next month.",
    "用户喜欢喝龙井茶，不喝咖啡。",
)
SLOW_MARKER = "慢"  # only the slow chat's messages contain it, so only its embedding requests wait
SEQUENCE = re.compile(r"#(\d+)")
FIRST_CHAT = 10_000  # chat (= user) ids count up from here
WARM_UP_CHAT = 9_999
SLOW_VARIANT = "index on, slow embeddings"
RSS_MESSAGES = 3  # per chat in the rss part


# -- shared ---------------------------------------------------------------------------------------------


def p95(values: Sequence[float]) -> float:
    if len(values) < 2:  # a slow chat in a short run may have one message
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


STREAM = [False]  # channels.telegram.stream for every home of the run (--stream)


def prepare_home(home: Path, telegram_origin: str, model_url: str, allowed: Sequence[int], *,
                 index: bool = False) -> Config:
    """A fresh home whose bot talks to the fakes; with `index`, memory search with remote embeddings."""
    onboard(home)
    path = home / "config.json"
    config = orjson.loads(path.read_bytes())
    config["providers"]["openai"] = {"api_key": "sk-bench", "api_base": model_url}
    config["channels"]["telegram"].update({"enabled": True, "token": TOKEN, "api_base": telegram_origin,
                                          "allow_from": list(allowed), "stream": STREAM[0]})
    config["memory"].update(QUIET_POLICY)
    if index:
        config["memory"]["index"] = INDEX
    path.write_bytes(orjson.dumps(config))
    app = App.open(home)
    try:
        if index:  # something for each turn's memory search to find
            for entry in MEMORY_ENTRIES:
                app.workspace.store.append_long_term(entry)
        return app.config
    finally:
        app.close()


def provider_for(model_url: str) -> Callable[[Config], OpenAICompatProvider]:
    def connect(config: Config) -> OpenAICompatProvider:
        # No retries: a failed model call should show in the figures, not be hidden by a second try.
        return OpenAICompatProvider(name="openai", api_base=model_url, api_key="sk-bench",
                                    defaults=config.agents.defaults, timeout=30.0, max_retries=0)
    return connect


@asynccontextmanager
async def serving(config: Config, home: Path, model_url: str) -> AsyncIterator[tuple[App, TelegramChannel]]:
    """The app and its Telegram channel, polling (short polls, so stopping is quick) until the block ends."""
    bot = make_bot(config.channels.telegram, TOKEN)
    async with App(config, home, make_provider=provider_for(model_url)) as app:
        channel = TelegramChannel(config.channels.telegram, bot, app.agent,
                                  replies=app.storage.telegram_replies)
        running = asyncio.create_task(channel.run(handle_signals=False, polling_timeout=1))
        try:
            yield app, channel
        finally:
            await channel.stop()
            await running


async def bare_round_trip(provider: OpenAICompatProvider) -> float:
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        await provider.chat([{"role": "user", "content": "ping"}])
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


async def polled(telegram: FakeTelegramServer) -> None:
    """Until the bot's first long poll reached the fake (it is then ready for updates)."""
    await asyncio.to_thread(telegram.wait_until, lambda: bool(telegram.calls("getUpdates")))


def footprint(app: App, channel: TelegramChannel) -> dict[str, int]:
    """This process's resident memory after a full collection, and the per-chat structures' sizes."""
    gc.collect()
    status = Path("/proc/self/status").read_text()
    kib = {name: int(re.search(rf"^{name}:\s+(\d+) kB", status, re.M).group(1))  # type: ignore[union-attr]
           for name in ("VmRSS", "VmHWM")}
    agent = app.agent()
    # Private attributes, read only: the bench shows they stay bounded, no public API needs them.
    return {"rss_kib": kib["VmRSS"], "peak_kib": kib["VmHWM"], "sessions_loaded": len(agent._loaded),
            "session_locks": len(agent._locks), "chat_locks": len(channel._chat_locks),
            "in_flight": len(channel._in_flight)}


async def settled(channel: TelegramChannel, timeout: float = 10.0) -> None:
    """Until the last turns have returned: the fake hears a sendMessage before its handler is done."""
    deadline = time.monotonic() + timeout
    while channel._in_flight and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def bot_process(home: str, model_url: str, conn: Connection) -> None:
    """The child process: serves the bot and answers the parent's commands until "stop" (see BotProcess)."""
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_bot_process(Path(home), model_url, conn))


async def _bot_process(home: Path, model_url: str, conn: Connection) -> None:
    async with serving(load_config(home), home, model_url) as (app, channel):
        conn.send("ready")
        while (command := await asyncio.to_thread(conn.recv)) != "stop":
            if command == "bare":
                conn.send(await bare_round_trip(app.provider()))
            elif command == "cpu":  # this process's CPU seconds (every thread) once the last turns returned
                await settled(channel)
                conn.send(time.process_time())
            else:  # "footprint"
                await settled(channel)
                conn.send(footprint(app, channel))


class BotProcess:
    """The bot in a child process of its own, so that its CPU and memory are its alone: the fakes (and the
    pacer) stay in this process, as Telegram and the model are elsewhere for a real bot."""

    def __init__(self, home: Path, model_url: str):
        # spawn, not fork: this process has threads (the fakes'), and the child should start from a clean slate.
        context = multiprocessing.get_context("spawn")
        self.conn, theirs = context.Pipe()
        self.child = context.Process(target=bot_process, args=(str(home), model_url, theirs), name="bench-bot")

    def __enter__(self) -> BotProcess:
        self.child.start()
        self.receive()  # "ready"
        return self

    def ask(self, command: str) -> Any:
        self.conn.send(command)
        return self.receive()

    def receive(self, timeout: float = 120.0) -> Any:
        if not self.conn.poll(timeout):
            raise RuntimeError(f"the bot process did not answer in {timeout:g} s (exit code {self.child.exitcode})")
        return self.conn.recv()

    def __exit__(self, *exc: object) -> None:
        try:
            if self.child.is_alive():
                self.conn.send("stop")
        finally:
            self.child.join(60)
            if self.child.is_alive():
                self.child.kill()


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(name), *(len(row[i]) for row in rows)) for i, name in enumerate(header)]
    print("| " + " | ".join(name.rjust(w) for name, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(cell.rjust(w) for cell, w in zip(row, widths)) + " |")


# -- closed loop --------------------------------------------------------------------------------------


@dataclass
class RunResult:
    messages: int
    seconds: float
    latencies_ms: list[float]
    bare_ms: float

    @property
    def throughput(self) -> float:
        return self.messages / self.seconds

    @property
    def added_ms(self) -> list[float]:
        return [latency - self.bare_ms for latency in self.latencies_ms]


class Conversation:
    """Sends each chat's next message when its previous answer arrives; records every latency."""

    def __init__(self, telegram: FakeTelegramServer, chats: list[int], per_chat: int):
        self.telegram = telegram
        self.per_chat = per_chat
        self.sent_at: dict[int, float] = {}
        self.count = {chat: 0 for chat in chats}
        self.latencies: list[float] = []
        self.done = threading.Event()
        self.remaining = len(chats) * per_chat

    def send(self, chat: int) -> None:
        n = self.count[chat]
        self.sent_at[chat] = time.perf_counter()
        self.telegram.send_text(chat, chat, f"{TEXTS[n % 2]} ({n})")

    def on_sent(self, params: dict[str, Any]) -> None:
        chat = int(params["chat_id"])
        self.latencies.append(1000 * (time.perf_counter() - self.sent_at[chat]))
        self.count[chat] += 1
        self.remaining -= 1
        if self.count[chat] < self.per_chat:
            self.send(chat)
        if self.remaining == 0:
            self.done.set()


async def closed_run(chats: int, per_chat: int) -> RunResult:
    ids = [FIRST_CHAT + n for n in range(chats)]
    with FakeTelegramServer() as telegram, FakeOpenAIServer() as model, \
            tempfile.TemporaryDirectory(prefix="picoclaw-bench-telegram-") as tmp:
        home = Path(tmp) / "home"
        config = prepare_home(home, telegram.origin, model.base_url, ids)
        async with serving(config, home, model.base_url) as (app, _):
            bare = await bare_round_trip(app.provider())
            await polled(telegram)
            conversation = Conversation(telegram, ids, per_chat)
            telegram.on_sent = conversation.on_sent
            started = time.perf_counter()
            for chat in ids:
                conversation.send(chat)
            finished = await asyncio.to_thread(conversation.done.wait, 300)
            seconds = time.perf_counter() - started
        if not finished:
            raise RuntimeError(f"only {len(conversation.latencies)} of {chats * per_chat} answers arrived")
    return RunResult(len(conversation.latencies), seconds, conversation.latencies, bare)


def print_closed_table(results: list[RunResult]) -> None:
    header = ("run", "messages", "seconds", "msgs/s", "bare model ms", "latency p50 ms", "latency p95 ms",
              "added p50 ms", "added p95 ms")
    rows = [(str(i + 1), r.messages, r.seconds, r.throughput, r.bare_ms, median(r.latencies_ms),
             p95(r.latencies_ms), median(r.added_ms), p95(r.added_ms)) for i, r in enumerate(results)]
    rows.append(("median", results[0].messages, *(statistics.median(row[k] for row in rows) for k in range(2, 9))))
    print_table(header, [(name, str(n), f"{seconds:.2f}", f"{rate:.1f}", f"{bare:.2f}", f"{lat50:.1f}",
                          f"{lat95:.1f}", f"{add50:.1f}", f"{add95:.1f}")
                         for name, n, seconds, rate, bare, lat50, lat95, add50, add95 in rows])


# -- open loop ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpenVariant:
    label: str
    index: bool
    slow_delay: float  # seconds an embedding request carrying SLOW_MARKER waits


@dataclass
class OpenResult:
    variant: OpenVariant
    planned: int
    bare_ms: float
    max_slip_ms: float  # how late the worst send left against its schedule
    latencies_ms: dict[int, float]  # sequence number → latency, for the answered messages
    slow_sequences: set[int]
    bot_cpu_ms: float  # the bot process's CPU per message, from the first message to the last turn's end

    def others(self) -> list[float]:
        return [ms for seq, ms in self.latencies_ms.items() if seq not in self.slow_sequences]

    def slow(self) -> list[float]:
        return [ms for seq, ms in self.latencies_ms.items() if seq in self.slow_sequences]

    def added(self, latencies: list[float]) -> list[float]:
        return [ms - self.bare_ms for ms in latencies]


def echo_sequence(body: dict[str, Any]) -> str:
    """The fake model's answer: the sequence number of the user's text (after the <context> block)."""
    user = next((m for m in reversed(body.get("messages", [])) if m.get("role") == "user"), {})
    content = user.get("content")
    text = content if isinstance(content, str) else str(content)
    found = SEQUENCE.search(text.rpartition("</context>")[2])
    return f"Noted #{found.group(1)}." if found else "ok"


def slow_inputs(delay: float) -> Callable[[list[str]], float]:
    return lambda inputs: delay if any(SLOW_MARKER in text for text in inputs) else 0.0


@dataclass
class OpenLoop:
    """Sends message i of the plan at start + i / rate from a thread of its own; matches answers by number."""

    telegram: FakeTelegramServer
    chats: list[int]
    rate: float
    seconds: float
    slow_chat: int
    sent_at: dict[int, float] = field(default_factory=dict)
    latencies_ms: dict[int, float] = field(default_factory=dict)
    max_slip: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def planned(self) -> int:
        return round(self.rate * self.seconds)

    def message(self, seq: int) -> tuple[int, str]:
        """Chat and text of message `seq` (round-robin over the chats; the number at the end)."""
        chat = self.chats[seq % len(self.chats)]
        body = TEXTS[(seq // len(self.chats)) % 2]
        return chat, f"{SLOW_MARKER}慢说：{body} #{seq}" if chat == self.slow_chat else f"{body} #{seq}"

    def slow_sequences(self) -> set[int]:
        return {seq for seq in range(self.planned) if self.message(seq)[0] == self.slow_chat}

    def pace(self) -> None:
        # Absolute times: a late send does not push the later ones back, so the rate does not drift.
        start = time.perf_counter()
        for seq in range(self.planned):
            due = start + seq / self.rate
            if (wait := due - time.perf_counter()) > 0:
                time.sleep(wait)
            chat, text = self.message(seq)
            now = time.perf_counter()
            self.max_slip = max(self.max_slip, now - due)
            self.sent_at[seq] = now  # before queueing: the answer cannot come before the update exists
            self.queued(seq, self.telegram.send_text(chat, chat, text))

    def queued(self, seq: int, update_id: int) -> None:
        """Message `seq` is update `update_id` (for loops that follow more than the answer)."""

    def on_sent(self, params: dict[str, Any]) -> None:
        found = SEQUENCE.search(str(params.get("text", "")))
        if found is None or int(found.group(1)) not in self.sent_at:
            return
        seq = int(found.group(1))
        self.latencies_ms[seq] = 1000 * (time.perf_counter() - self.sent_at[seq])
        if len(self.latencies_ms) == self.planned:
            self.done.set()


async def warm_up(telegram: FakeTelegramServer) -> None:
    """One message from a chat outside the measurement, answered before the clock starts."""
    telegram.send_text(WARM_UP_CHAT, WARM_UP_CHAT, f"{TEXTS[0]} #0")
    await asyncio.to_thread(telegram.wait_until, lambda: bool(telegram.sent_texts(WARM_UP_CHAT)), 60)


def open_run(variant: OpenVariant, rate: float, seconds: float, chats: int) -> OpenResult:
    ids = [FIRST_CHAT + n for n in range(chats)]
    with FakeTelegramServer() as telegram, FakeOpenAIServer() as model, \
            tempfile.TemporaryDirectory(prefix="picoclaw-bench-telegram-") as tmp:
        model.responder = echo_sequence
        if variant.slow_delay:
            model.delay_embeddings = slow_inputs(variant.slow_delay)
        home = Path(tmp) / "home"
        prepare_home(home, telegram.origin, model.base_url, [WARM_UP_CHAT, *ids], index=variant.index)
        with BotProcess(home, model.base_url) as bot:
            bare = bot.ask("bare")
            telegram.wait_until(lambda: bool(telegram.calls("getUpdates")), 60)
            # One message from a chat outside the measurement, answered before the clock starts.
            telegram.send_text(WARM_UP_CHAT, WARM_UP_CHAT, f"{TEXTS[0]} #0")
            telegram.wait_until(lambda: bool(telegram.sent_texts(WARM_UP_CHAT)), 60)
            loop = OpenLoop(telegram, ids, rate, seconds, slow_chat=ids[0])
            telegram.on_sent = loop.on_sent
            cpu_before = bot.ask("cpu")
            loop.pace()
            # Answers still under way get a grace period; a message still unanswered after it is reported.
            loop.done.wait(30 + 2 * variant.slow_delay)
            cpu = bot.ask("cpu") - cpu_before
            telegram.on_sent = None
    return OpenResult(variant, loop.planned, bare, 1000 * loop.max_slip, dict(loop.latencies_ms),
                      loop.slow_sequences(), 1000 * cpu / loop.planned)


def open_row(results: list[OpenResult]) -> list[float]:
    """One result's figures, or the median of each over several runs of one variant."""
    figures = [[r.planned, len(r.latencies_ms), r.max_slip_ms, r.bare_ms, median(r.others()), p95(r.others()),
                median(r.added(r.others())), p95(r.added(r.others())), median(r.slow()),
                max(r.slow(), default=float("nan")), r.bot_cpu_ms] for r in results]
    return [statistics.median(column) for column in zip(*figures)]


def print_open_table(variants: list[tuple[OpenVariant, list[OpenResult]]], rate: float, seconds: float,
                     chats: int) -> None:
    print(f"open loop: {rate:g} messages/s for {seconds:g} s over {chats} chats; 'others' = every chat but "
          f"the one whose messages carry {SLOW_MARKER!r}; medians over {len(variants[0][1])} run(s)")
    header = ("variant", "sent", "answered", "max slip ms", "bare model ms", "others p50 ms", "others p95 ms",
              "others added p50", "others added p95", "slow chat p50 ms", "slow chat max ms", "bot CPU ms/msg")
    rows = []
    for variant, results in variants:
        sent, answered, slip, bare, *rest = open_row(results)
        rows.append((variant.label, f"{sent:.0f}", f"{answered:.0f}", f"{slip:.1f}", f"{bare:.2f}",
                     *(f"{x:.1f}" for x in rest)))
    print_table(header, rows)
    by_label = {variant.label: open_row(results) for variant, results in variants}
    if SLOW_VARIANT in by_label and "index on" in by_label:
        ratio = by_label[SLOW_VARIANT][7] / by_label["index on"][7]
        print(f"others' added p95 with the slow embedding endpoint / without: {ratio:.2f}")


# -- stream -------------------------------------------------------------------------------------------

# What the writing model says after "Noted #N.": an answer of a few sentences, written in STREAM_PIECE_CHARS pieces.
ANSWER_TAIL = (" I have put it with the rest of your notes, and I will bring it up again when it matters. "
               "我已经把它和你的其他笔记放在一起了，需要的时候会再提起。")
STREAM_PIECE_CHARS = 3  # the fake model's streamed piece (tests/fakes/openai_server.py)


def writing(seconds: float) -> Callable[[dict[str, Any]], Text]:
    """The fake model as one that takes `seconds` to write its answer: streamed piece by piece over that time,
    or, asked without streaming, the whole answer after it."""
    def respond(body: dict[str, Any]) -> Text:
        text = echo_sequence(body) + ANSWER_TAIL
        if body.get("stream"):
            return Text(text, chunk_delay=seconds / -(-len(text) // STREAM_PIECE_CHARS))
        return Text(text, delay=seconds)
    return respond


@dataclass
class StreamLoop(OpenLoop):
    """The open loop, following what a user sees first (a draft, or the answer) and the answers' order."""

    message_seq: dict[int, int] = field(default_factory=dict)  # the user's message_id -> its sequence number
    first_ms: dict[int, float] = field(default_factory=dict)  # sequence number -> time to the first visible text
    answered_in: dict[int, list[int]] = field(default_factory=dict)  # chat -> sequence numbers, as answered

    def queued(self, seq: int, update_id: int) -> None:
        self.message_seq[self.telegram.message_id_of(update_id)] = seq

    def on_draft(self, params: dict[str, Any]) -> None:
        seq = self.message_seq.get(int(params.get("draft_id") or 0))
        if seq is not None and seq in self.sent_at:
            self.first_ms.setdefault(seq, 1000 * (time.perf_counter() - self.sent_at[seq]))

    def on_sent(self, params: dict[str, Any]) -> None:
        super().on_sent(params)
        found = SEQUENCE.search(str(params.get("text", "")))
        if found is not None and (seq := int(found.group(1))) in self.latencies_ms:
            self.first_ms.setdefault(seq, self.latencies_ms[seq])
            self.answered_in.setdefault(int(params["chat_id"]), []).append(seq)


@dataclass
class StreamResult:
    stream: bool
    planned: int
    first_ms: list[float]
    whole_ms: list[float]
    out_of_order: int  # chats whose answers arrived in another order than their messages


async def stream_run(stream: bool, rate: float, seconds: float, chats: int, writing_seconds: float) -> StreamResult:
    ids = [FIRST_CHAT + n for n in range(chats)]
    STREAM[0] = stream
    with FakeTelegramServer() as telegram, FakeOpenAIServer() as model, \
            tempfile.TemporaryDirectory(prefix="picoclaw-bench-telegram-") as tmp:
        model.responder = writing(writing_seconds)
        home = Path(tmp) / "home"
        config = prepare_home(home, telegram.origin, model.base_url, [WARM_UP_CHAT, *ids])
        async with serving(config, home, model.base_url):
            await polled(telegram)
            await warm_up(telegram)
            loop = StreamLoop(telegram, ids, rate, seconds, slow_chat=0)
            telegram.on_sent, telegram.on_draft = loop.on_sent, loop.on_draft
            pacer = threading.Thread(target=loop.pace, name="bench-pacer", daemon=True)
            pacer.start()
            await asyncio.to_thread(pacer.join)
            await asyncio.to_thread(loop.done.wait, 30 + 2 * writing_seconds)
            telegram.on_sent = telegram.on_draft = None
    disorder = sum(answers != sorted(answers) for answers in loop.answered_in.values())
    return StreamResult(stream, loop.planned, list(loop.first_ms.values()), list(loop.latencies_ms.values()),
                        disorder)


def run_stream(args: argparse.Namespace) -> None:
    """Streaming off and on, alternating run by run (the same minutes), each an open loop of a writing model."""
    results: dict[bool, list[StreamResult]] = {False: [], True: []}
    chosen = STREAM[0]
    for i in range(args.open_runs):
        for stream in (False, True):
            results[stream].append(asyncio.run(stream_run(stream, args.rate, args.seconds, args.open_chats,
                                                          args.writing_seconds)))
            print(f"stream {'on' if stream else 'off'}: run {i + 1}/{args.open_runs} done", file=sys.stderr)
    STREAM[0] = chosen
    print(f"streaming: {args.rate:g} messages/s for {args.seconds:g} s over {args.open_chats} private chats, a model "
          f"that takes {args.writing_seconds:g} s to write each answer; first text = a draft or the answer, "
          f"whichever the user sees first; medians over {args.open_runs} run(s)")
    rows, firsts = [], {}
    for stream, runs in results.items():
        figures = [[r.planned, len(r.whole_ms), r.planned - len(r.whole_ms), r.out_of_order, median(r.first_ms),
                    p95(r.first_ms), median(r.whole_ms), p95(r.whole_ms)] for r in runs]
        sent, answered, lost, disorder, *ms = [statistics.median(column) for column in zip(*figures)]
        firsts[stream] = ms[0]
        rows.append(("on" if stream else "off", f"{sent:.0f}", f"{answered:.0f}", f"{lost:.0f}", f"{disorder:.0f}",
                     *(f"{x:.0f}" for x in ms)))
    print_table(("stream", "sent", "answered", "lost", "chats out of order", "first text p50 ms",
                 "first text p95 ms", "whole answer p50 ms", "whole answer p95 ms"), rows)
    print(f"first text p50, streaming on / off: {firsts[True] / firsts[False]:.2f}")


# -- rss ----------------------------------------------------------------------------------------------


class ChatPool:
    """Closed loop per chat, `width` chats at a time; a chat that had its answers makes room for the next."""

    def __init__(self, telegram: FakeTelegramServer, chats: Sequence[int], per_chat: int, width: int):
        self.telegram = telegram
        self.waiting = list(reversed(chats))  # popped from the end: first chat first
        self.per_chat = per_chat
        self.width = width
        self.answered: dict[int, int] = {}  # chats under way → answers they had
        self.left = len(chats)
        self.done = threading.Event()

    def start(self) -> None:
        for _ in range(min(self.width, len(self.waiting))):
            self._open_next()

    def _open_next(self) -> None:
        chat = self.waiting.pop()
        self.answered[chat] = 0
        self._send(chat)

    def _send(self, chat: int) -> None:
        n = self.answered[chat]
        self.telegram.send_text(chat, chat, f"{TEXTS[n % 2]} ({n})")

    def on_sent(self, params: dict[str, Any]) -> None:
        chat = int(params["chat_id"])
        self.answered[chat] += 1
        if self.answered[chat] < self.per_chat:
            self._send(chat)
            return
        del self.answered[chat]
        self.left -= 1
        if self.waiting:
            self._open_next()
        elif self.left == 0:
            self.done.set()


@dataclass
class RssResult:
    checkpoints: list[tuple[int, dict[str, int]]]  # (chats done, footprint)
    seconds: float


def rss_run(chats: int, first: int, per_chat: int, width: int) -> RssResult:
    ids = range(FIRST_CHAT, FIRST_CHAT + chats)
    with FakeTelegramServer() as telegram, FakeOpenAIServer() as model, \
            tempfile.TemporaryDirectory(prefix="picoclaw-bench-telegram-") as tmp:
        home = Path(tmp) / "home"
        prepare_home(home, telegram.origin, model.base_url, ids)
        with BotProcess(home, model.base_url) as bot:
            checkpoints = [(0, bot.ask("footprint"))]
            telegram.wait_until(lambda: bool(telegram.calls("getUpdates")), 60)
            started = time.perf_counter()
            for batch in (ids[:first], ids[first:]):
                pool = ChatPool(telegram, batch, per_chat, width)
                telegram.on_sent = pool.on_sent
                pool.start()
                if not pool.done.wait(600):
                    raise RuntimeError(f"{pool.left} of {len(batch)} chats did not get all their answers")
                checkpoints.append((batch.stop - FIRST_CHAT, bot.ask("footprint")))
            seconds = time.perf_counter() - started
    return RssResult(checkpoints, seconds)


def print_rss(result: RssResult, per_chat: int) -> None:
    done = result.checkpoints[-1][0]
    print(f"rss: {done} chats x {per_chat} messages in {result.seconds:.0f} s, the bot in a process of its own")
    header = ("chats done", "VmRSS MiB", "VmHWM MiB", "sessions loaded", "session locks", "chat locks", "in flight")
    print_table(header, [(str(n), f"{f['rss_kib'] / 1024:.1f}", f"{f['peak_kib'] / 1024:.1f}",
                          str(f["sessions_loaded"]), str(f["session_locks"]), str(f["chat_locks"]),
                          str(f["in_flight"])) for n, f in result.checkpoints])
    (first, a), (last, b) = result.checkpoints[-2:]
    print(f"VmRSS after {last} chats / after {first}: {b['rss_kib'] / a['rss_kib']:.3f}")


# -- main ---------------------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--part", choices=("closed", "open", "slow", "stream", "rss", "all"), default="all")
    parser.add_argument("--quick", action="store_true",
                        help="closed 1 run, open loops 10 s, rss 2,000 chats (explicit options win)")
    parser.add_argument("--chats", type=int, default=100, help="closed: chats talking at once (default 100)")
    parser.add_argument("--messages", type=int, default=10, help="closed: messages per chat (default 10)")
    parser.add_argument("--runs", type=int, help="closed: runs, each with a fresh home (default 3)")
    parser.add_argument("--rate", type=float, default=30.0, help="open/slow: messages per second (default 30)")
    parser.add_argument("--seconds", type=float, help="open/slow: how long messages arrive (default 60)")
    parser.add_argument("--open-chats", type=int, default=200, help="open/slow: chats (default 200)")
    parser.add_argument("--open-runs", type=int, default=1, help="open/slow: runs of each variant (default 1)")
    parser.add_argument("--slow-delay", type=float, default=2.0,
                        help="slow: seconds the slow chat's embedding requests wait (default 2)")
    parser.add_argument("--rss-chats", type=int, help="rss: distinct chats (default 10,000)")
    parser.add_argument("--rss-first", type=int, default=1000, help="rss: first checkpoint (default 1,000)")
    parser.add_argument("--rss-width", type=int, default=200, help="rss: chats at a time (default 200)")
    parser.add_argument("--writing-seconds", type=float, default=3.0,
                        help="stream: seconds the model takes to write each answer (default 3)")
    parser.add_argument("--stream", choices=("on", "off"), default="off",
                        help="channels.telegram.stream: answers streamed to a preview, or sent whole (default off)")
    args = parser.parse_args(argv)
    STREAM[0] = args.stream == "on"
    args.runs = args.runs or (1 if args.quick else 3)
    args.seconds = args.seconds or (10.0 if args.quick else 60.0)
    args.rss_chats = args.rss_chats or (2000 if args.quick else 10_000)
    if min(args.chats, args.messages, args.runs, args.open_chats, args.open_runs, args.rss_width) < 1 \
            or args.chats * args.messages < 2:
        parser.error("counts must be at least 1 (and at least 2 closed-loop messages in all)")
    if args.rate <= 0 or args.seconds <= 0 or args.rate * args.seconds < 2:
        parser.error("--rate and --seconds must be positive, with at least 2 messages in all")
    if not 0 < args.rss_first < args.rss_chats:
        parser.error("--rss-first must be between 0 and --rss-chats")
    return args


def run_closed(args: argparse.Namespace) -> None:
    results = []
    for i in range(args.runs):
        results.append(asyncio.run(closed_run(args.chats, args.messages)))
        print(f"closed: run {i + 1}/{args.runs} done", file=sys.stderr)
    print(f"closed loop: {args.chats} chats x {args.messages} messages, model answering at once")
    print_closed_table(results)


def run_open(args: argparse.Namespace, variants: list[OpenVariant]) -> None:
    measured = []
    for variant in variants:
        results = []
        for i in range(args.open_runs):
            results.append(open_run(variant, args.rate, args.seconds, args.open_chats))
            print(f"{variant.label}: run {i + 1}/{args.open_runs} done", file=sys.stderr)
        measured.append((variant, results))
    print_open_table(measured, args.rate, args.seconds, args.open_chats)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING)
    parts = {"closed", "open", "slow", "stream", "rss"} if args.part == "all" else {args.part}
    # The open and slow variants share one table, so (b) reads beside (a).
    variants = []
    if "open" in parts:
        variants.append(OpenVariant("index off", index=False, slow_delay=0.0))
    if "slow" in parts:
        variants += [OpenVariant("index on", index=True, slow_delay=0.0),
                     OpenVariant(SLOW_VARIANT, index=True, slow_delay=args.slow_delay)]
    if "closed" in parts:
        run_closed(args)
        print(flush=True)
    if variants:
        run_open(args, variants)
        print(flush=True)
    if "stream" in parts:
        run_stream(args)
        print(flush=True)
    if "rss" in parts:
        print_rss(rss_run(args.rss_chats, args.rss_first, RSS_MESSAGES, args.rss_width), RSS_MESSAGES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
