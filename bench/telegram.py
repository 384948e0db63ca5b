#!/usr/bin/env python3
"""Throughput and added latency of the Telegram channel: 100 chats × 10 messages through the fake Bot API.

What is measured
    The bot (`TelegramChannel`: aiogram long polling, per-chat locks, the whole AgentLoop turn, HTML
    rendering, sendMessage) runs against the tests' fake Telegram Bot API server and fake OpenAI-compatible
    model (``tests/fakes``, real aiohttp servers on 127.0.0.1); the model answers every request at once.
    Each of ``--chats`` chats (default 100, each an allowed user) sends ``--messages`` messages (default 10,
    English and Chinese in turn), each as soon as the answer to its previous one arrived, so 100 users
    are talking at once and every chat stays in order.

    latency  = time from the update being queued at the fake Bot API to the bot's sendMessage arriving
               there (long-poll delivery, aiogram, the turn, the model call, the send);
    added    = latency − the bare model round trip (``provider.chat`` with one short message, median of
               50, measured in the same run): what the channel and the agent add to a model call.
    throughput = messages answered / wall time of the run.

    The two fake servers run in threads of this same process, so they share its GIL (and the machine's
    two cores) with the bot: the figures are an upper bound on what the channel itself costs.
    Summaries, compression and reflection are kept from firing so that every turn does the same work.
    ``--runs`` runs (default 3), each with a fresh home; the last row is the median over the runs.

Run (from the repository root):
    python bench/telegram.py
    python bench/telegram.py --chats 20 --messages 5 --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python bench/telegram.py` without installing picoclaw
    sys.path.insert(0, str(REPO))

from picoclaw.app import App  # noqa: E402
from picoclaw.channels.telegram import TelegramChannel, make_bot  # noqa: E402
from picoclaw.config import Config  # noqa: E402
from picoclaw.memory.workspace import Workspace  # noqa: E402
from picoclaw.onboard import onboard  # noqa: E402
from picoclaw.providers.openai_compat import OpenAICompatProvider  # noqa: E402
from tests.fakes import FakeOpenAIServer  # noqa: E402
from tests.fakes.telegram_server import TOKEN, FakeTelegramServer  # noqa: E402

QUIET_POLICY = {"session_summary_message_threshold": 1000, "session_summary_token_percent": 95,
                "long_term_compress_char_threshold": 0, "evolution_enabled": False}
TEXTS = ("What is on my calendar tomorrow?", "明天杭州的天气怎么样？")


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


def p95(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def prepare_home(home: Path, telegram: FakeTelegramServer, model: FakeOpenAIServer, chats: list[int]) -> Workspace:
    onboard(home)
    path = home / "config.json"
    config = orjson.loads(path.read_bytes())
    config["providers"]["openai"] = {"api_key": "sk-bench", "api_base": model.base_url}
    config["channels"]["telegram"].update({"enabled": True, "token": TOKEN, "api_base": telegram.origin,
                                          "allow_from": chats})
    config["memory"].update(QUIET_POLICY)
    path.write_bytes(orjson.dumps(config))
    return App.open(home).workspace


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


async def bare_round_trip(provider: OpenAICompatProvider) -> float:
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        await provider.chat([{"role": "user", "content": "ping"}])
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


async def one_run(chats: int, per_chat: int) -> RunResult:
    ids = [10_000 + n for n in range(chats)]
    with FakeTelegramServer() as telegram, FakeOpenAIServer() as model, \
            tempfile.TemporaryDirectory(prefix="picoclaw-bench-telegram-") as tmp:
        workspace = prepare_home(Path(tmp) / "home", telegram, model, ids)
        bot = make_bot(workspace.config.channels.telegram, TOKEN)
        def connect(config: Config) -> OpenAICompatProvider:
            return OpenAICompatProvider(name="openai", api_base=model.base_url, api_key="sk-bench",
                                        defaults=config.agents.defaults, timeout=30.0, max_retries=0)

        async with App(workspace.config, workspace.home, make_provider=connect) as app:
            bare = await bare_round_trip(app.provider())
            channel = TelegramChannel(workspace.config.channels.telegram, bot, app.agent)
            running = asyncio.create_task(channel.run(handle_signals=False, polling_timeout=1))
            await asyncio.to_thread(telegram.wait_until, lambda: bool(telegram.calls("getUpdates")))
            conversation = Conversation(telegram, ids, per_chat)
            telegram.on_sent = conversation.on_sent
            started = time.perf_counter()
            for chat in ids:
                conversation.send(chat)
            finished = await asyncio.to_thread(conversation.done.wait, 300)
            seconds = time.perf_counter() - started
            await channel.stop()
            await running
        if not finished:
            raise RuntimeError(f"only {len(conversation.latencies)} of {chats * per_chat} answers arrived")
    return RunResult(len(conversation.latencies), seconds, conversation.latencies, bare)


def print_table(results: list[RunResult]) -> None:
    header = (f"| {'run':>6} | {'messages':>8} | {'seconds':>7} | {'msgs/s':>7} | {'bare model ms':>13} | "
              f"{'latency p50 ms':>14} | {'latency p95 ms':>14} | {'added p50 ms':>12} | {'added p95 ms':>12} |")
    print(header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    rows = [(str(i + 1), r.messages, r.seconds, r.throughput, r.bare_ms, statistics.median(r.latencies_ms),
             p95(r.latencies_ms), statistics.median(r.added_ms), p95(r.added_ms)) for i, r in enumerate(results)]
    rows.append(("median", results[0].messages, *(statistics.median(row[k] for row in rows) for k in range(2, 9))))
    for name, n, seconds, rate, bare, lat50, lat95, add50, add95 in rows:
        print(f"| {name:>6} | {n:>8} | {seconds:>7.2f} | {rate:>7.1f} | {bare:>13.2f} | {lat50:>14.1f} | "
              f"{lat95:>14.1f} | {add50:>12.1f} | {add95:>12.1f} |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chats", type=int, default=100, help="chats talking at once (default 100)")
    parser.add_argument("--messages", type=int, default=10, help="messages per chat (default 10)")
    parser.add_argument("--runs", type=int, default=3, help="runs, each with a fresh home (default 3)")
    args = parser.parse_args(argv)
    if args.chats < 1 or args.messages < 1 or args.runs < 1 or args.chats * args.messages < 2:
        parser.error("--chats, --messages and --runs must be at least 1 (and at least 2 messages in all)")
    logging.basicConfig(level=logging.WARNING)
    results = []
    for i in range(args.runs):
        results.append(asyncio.run(one_run(args.chats, args.messages)))
        print(f"run {i + 1}/{args.runs} done", file=sys.stderr)
    print(f"{args.chats} chats x {args.messages} messages, model answering at once")
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
