#!/usr/bin/env python3
"""How much of each request is a byte-identical prefix of the previous one: what a prompt cache can reuse.

What is measured
    A temporary home is onboarded; MEMORY.md gets 60 short facts, half English, half Chinese, each naming
    two people or places (fact n names thing n and thing n+1), so that every message of the session
    matches a different pair of blocks, one of them new. One session of ``--turns`` turns (default 50)
    asks about thing 1, 2, 3 … through the real AgentLoop and openai client; the fake OpenAI-compatible
    server of the tests answers each turn with one short sentence and records every request.
    Summaries are kept from firing (``--summaries`` lets them), so the table shows the prompt itself.

    share = (bytes at the start of this request's prompt identical to the start of the previous one's) /
    (bytes of this prompt); a prompt is the tool schemas and the messages, what a server renders and caches,
    not the sampling fields around them (max_tokens shrinks as a small window fills). A provider or a local
    server (llama.cpp, vLLM) reuses its cache for that prefix: the closer to 1, the less it has to read again.
    The summary line also counts the turns whose prompt began with the whole previous one (all but its closing
    brackets): the claim the share stands for, which an early turn's share understates (its new part is large
    beside a short history). Before the prompt was reordered (issue 11),
    this was 0.53-0.70 and fell as the session grew; the target is >= 0.95 from turn 3 on.

    First, the size of the first request of a freshly onboarded workspace (a one-line question): what a CPU
    model reads before its first answer. picoclaw's token count is tiktoken's (an estimate offline);
    ``--server URL`` also sends that request, with ``max_tokens`` 1, to a real OpenAI-compatible server
    (llama.cpp's, see shared/real-model/) and prints the prompt tokens it counted. Target (issue 24): under
    1,500; before it, 2,419 on llama-cpp-python with Qwen2.5-Coder-1.5B.

    ``--image-turn N`` runs one more session whose turn N sends a photo (issue 43): the shares around it.

    ``--lessons`` runs the session twice more, without lessons and with LEARNINGS.md holding 20 lessons (one
    for every third place, so a third of the questions bring one, plus two standing lessons that every
    conversation carries), and prints both shares side by side (issue 27: not lower with lessons than without).

    The table has a column for a 128k window (config.json's number, the old default) and one for an 8k window
    (a local server's ``--n_ctx 8192``); on the 8k window a summary may fire even with summaries off (the token
    trigger), and the turn after it starts again from the summary, so its share is lower.

    Background calls (issue 41): with ``--summaries``, every flush and summary request between turns is measured
    against the conversation request before it, and each turn after them against the request sent just before it
    (what a single-slot local server, llama.cpp or llama-cpp-python, still holds) and against the conversation
    request before the background calls (what an undisturbed cache would hold). Those shares compare prompts: the
    tool schemas and the messages as sent, what a server renders and caches, not the sampling fields around them
    (a background call's max_tokens and tool_choice "none"). The same session runs twice: background calls in
    their own prompts (as before issue 41), and asked after the conversation's last request (now); a third row
    shows the share the background calls would have if they dropped the tool schemas (why they keep them).

Run (from the repository root):
    python bench/prompt_cache.py
    python bench/prompt_cache.py --lessons
    python bench/prompt_cache.py --turns 80 --summaries
    python bench/prompt_cache.py --turns 30 --summaries --background-only
    python bench/prompt_cache.py --server http://127.0.0.1:8765/v1
    python bench/prompt_cache.py --turns 20 --image-turn 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from picoclaw.agent.cache_prefix import LastRequests  # noqa: E402
from picoclaw.app import App  # noqa: E402
from picoclaw.config import Config, load_config  # noqa: E402
from picoclaw.curation.flush import FLUSH_INSTRUCTIONS, FLUSH_ROLE  # noqa: E402
from picoclaw.curation.lesson_drafting import LESSON_INSTRUCTIONS, LESSON_ROLE  # noqa: E402
from picoclaw.curation.session_summary import SUMMARY_INSTRUCTIONS, SUMMARY_TASK  # noqa: E402
from picoclaw.onboard import onboard  # noqa: E402
from picoclaw.providers.base import BETWEEN_TURNS  # noqa: E402
from picoclaw.providers.openai_compat import OpenAICompatProvider  # noqa: E402
from picoclaw.tokens import count_tokens, is_exact  # noqa: E402
from tests.fakes import FakeOpenAIServer, Text  # noqa: E402
from tests.fakes.openai_server import RecordedRequest  # noqa: E402

SESSION = "cli:bench"
TARGET = 0.95
WINDOWS = {"128k": 128_000, "8k": 8_192}
SUMMARY = ("## Goal\nTalk about places.\n## Constraints and preferences\nShort answers.\n## Progress\nAsked about "
           "several places.\n## Key decisions\nNone.\n## Next steps\nMore places.\n## Key context\nSee MEMORY.md.")
FIRST_TARGET = 1500  # tokens of the first request (issue 24)
FIRST_BEFORE = 2419  # what llama-cpp-python's server counted for it before issue 24
FIRST_QUESTION = "What is the capital of France?"
THINGS_EN = ["Aurora", "Bramble", "Cobalt", "Dahlia", "Ember", "Fjord", "Garnet", "Harbor", "Indigo", "Juniper",
             "Kestrel", "Lagoon", "Meadow", "Nimbus", "Orchid", "Pebble", "Quartz", "Russet", "Saffron", "Tundra",
             "Umber", "Violet", "Willow", "Xenon", "Yarrow", "Zephyr", "Alder", "Birch", "Cedar", "Dune"]
# No character in two names: Chinese is matched by characters and pairs, and the bench wants each question
# to find its own fact (and its neighbour's), not every name that shares a character.
THINGS_ZH = ["青岛", "桂林", "丽江", "大理", "厦门", "苏州", "洛阳", "开封", "敦煌", "拉萨", "喀什", "漠河", "三亚",
             "凤凰", "婺源", "黄山", "平遥", "周庄", "乌镇", "南宁", "鼓浪屿", "张家界", "九寨沟", "香格里", "泰安",
             "峨眉", "成都", "重庆", "昆明", "贵阳"]


IMAGE = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40  # what the image turn sends (a stand-in: never decoded)


def facts() -> tuple[list[str], list[str]]:
    """The MEMORY.md entries and one question per entry (English and Chinese alternating)."""
    things = [thing for pair in zip(THINGS_EN, THINGS_ZH) for thing in pair]
    entries, questions = [], []
    for n, thing in enumerate(things):
        following = things[(n + 1) % len(things)]
        day = f"2025-{1 + n // 28:02d}-{1 + n % 28:02d}"
        if n % 2 == 0:
            entries.append(f"## {day}\n{thing} is where we met; {following} came up on the same trip.")
            questions.append(f"What happened at {thing}?")
        else:
            entries.append(f"## {day}\n{thing}是我们常去的地方；{following}也在计划里。")
            questions.append(f"{thing}怎么样？")
    return entries, questions


def lessons() -> str:
    """LEARNINGS.md with a lesson for every third place and two standing lessons."""
    things = [thing for pair in zip(THINGS_EN, THINGS_ZH) for thing in pair]
    entries = ["## 2025-01-01\nAlways answer in the language of the question.\nSource: bench",
               "## 2025-01-01\n以后提到地点时都附上所在的省份。\nSource: bench"]
    for n, thing in enumerate(things[::3]):
        entries.append(f"## 2025-02-{1 + n % 28:02d}\nWhen {thing} comes up, check the trip dates in MEMORY.md "
                       "before answering.\nSource: bench")
    return "# Lessons\n\n" + "\n\n".join(entries) + "\n"


def shared_prefix(previous: bytes, current: bytes) -> int:
    """Length of the common start of two byte strings."""
    limit = min(len(previous), len(current))
    low, high = 0, limit
    while low < high:  # binary search on equal prefixes: fast for the ~100 KB requests of a long session
        middle = (low + high + 1) // 2
        if previous[:middle] == current[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def kind_of(body: dict[str, object]) -> str:
    """"turn", or the background call a chat request is: "summary", "flush" or "lesson" (either shape)."""
    messages = body["messages"]
    assert isinstance(messages, list)
    first, last = str(messages[0].get("content") or ""), str(messages[-1].get("content") or "")
    for kind, instructions, task in (("summary", SUMMARY_INSTRUCTIONS, SUMMARY_TASK),
                                     ("flush", FLUSH_INSTRUCTIONS, FLUSH_ROLE),
                                     ("lesson", LESSON_INSTRUCTIONS, LESSON_ROLE)):
        if first == instructions or last.startswith(f"{BETWEEN_TURNS}\n{task}"):
            return kind
    return "turn"


def answer(body: dict[str, object]) -> Text:
    kind = kind_of(body)
    if kind == "summary":
        return Text(SUMMARY)
    if kind == "flush":
        return Text("NONE")
    # Each turn's answer its own, as a model's are: the same words to another question would be taken for an echo
    # of the previous answer and asked again with the message alone (agent/empty_reply.py).
    messages = body.get("messages")
    asked = sum(1 for message in messages if isinstance(message, dict) and message.get("role") == "user"
                ) if isinstance(messages, list) else 0
    return Text(f"Noted ({asked}); that matches what you told me before. 好的。")


async def run_session(turns: int, summaries: bool, with_lessons: bool = False, window: int = WINDOWS["128k"],
                      continued: bool = True, image_turn: int | None = None) -> list[RecordedRequest]:
    """Every chat request of one session of `turns` turns, in order (background calls included).

    `continued` off: background calls use their own prompts, as before issue 41 and as for a cloud endpoint (the loop
    remembers no request). On: the fake server is on 127.0.0.1, a local endpoint, so app.py continues them."""
    entries, questions = facts()
    with FakeOpenAIServer() as model, tempfile.TemporaryDirectory(prefix="picoclaw-bench-cache-") as tmp:
        home = Path(tmp) / "home"
        onboard(home)
        config_path = home / "config.json"
        data = json.loads(config_path.read_text(encoding="utf-8"))
        data["agents"]["defaults"]["context_window"] = window
        data["agents"]["defaults"]["vision"] = True
        if not summaries:
            data["memory"].update(session_summary_message_threshold=1000, session_summary_token_percent=95)
        config_path.write_text(json.dumps(data), encoding="utf-8")
        memory = home / "workspace" / "memory" / "MEMORY.md"
        memory.write_text("# Long-term memory\n\n" + "\n\n".join(entries) + "\n", encoding="utf-8")
        if with_lessons:
            (memory.parent / "LEARNINGS.md").write_text(lessons(), encoding="utf-8")
        model.responder = answer

        def connect(config: Config) -> OpenAICompatProvider:
            return OpenAICompatProvider(name="openai", api_base=model.base_url, api_key="sk-bench",
                                        defaults=config.agents.defaults, timeout=30.0, max_retries=0)

        async with App(load_config(home), home, make_provider=connect) as app:
            agent = app.agent()
            assert agent.last_requests.size > 0, "the fake server is local: app.py continues background calls"
            if not continued:
                agent.last_requests = LastRequests(0)  # what a cloud endpoint gets
            for n in range(turns):
                question = questions[n % len(questions)]
                if n + 1 == image_turn:  # a photo with the question as its caption, as a channel sends it
                    saved_as = agent.workspace.media().save(IMAGE, "photo.png")
                    await agent.handle(SESSION, f"{question}\n[image: {saved_as}]", images=[IMAGE])
                else:
                    await agent.handle(SESSION, question)
                await agent.wait_background()
        return [request for request in model.requests if request.path.endswith("/chat/completions")]


def turn_bodies(requests: list[RecordedRequest]) -> list[bytes]:
    """The prompts of the session's turns (background calls left out): the tool schemas and the messages, without
    the sampling fields (max_tokens shrinks as a small window fills, and a server does not cache it)."""
    return [prompt_of(request.json) for request in requests if kind_of(request.json) == "turn"]


async def first_request() -> dict[str, object]:
    """The first chat request of a freshly onboarded workspace, as sent."""
    with FakeOpenAIServer() as model, tempfile.TemporaryDirectory(prefix="picoclaw-bench-first-") as tmp:
        home = Path(tmp) / "home"
        onboard(home)
        model.reply_text("Paris.")

        def connect(config: Config) -> OpenAICompatProvider:
            return OpenAICompatProvider(name="openai", api_base=model.base_url, api_key="sk-bench",
                                        defaults=config.agents.defaults, timeout=30.0, max_retries=0)

        async with App(load_config(home), home, make_provider=connect) as app:
            await app.agent().handle(SESSION, FIRST_QUESTION)
        return model.chat_requests()[0]


def server_prompt_tokens(url: str, body: dict[str, object]) -> int:
    """The prompt tokens a real server counts for `body` (sent once, answered with one token)."""
    import urllib.request

    request = {**body, "max_tokens": 1, "stream": False}
    request.pop("stream_options", None)
    sent = urllib.request.Request(url.rstrip("/") + "/chat/completions", data=json.dumps(request).encode(),
                                  headers={"Content-Type": "application/json", "Authorization": "Bearer sk-local"})
    with urllib.request.urlopen(sent, timeout=1800) as answer:
        return int(json.load(answer)["usage"]["prompt_tokens"])


def print_first_request(server: str | None) -> None:
    body = asyncio.run(first_request())
    messages = body["messages"]
    tools = body.get("tools") or []
    assert isinstance(messages, list) and isinstance(tools, list)
    system = str(messages[0]["content"])
    parts = {"system prompt": system, "tool schemas": json.dumps(tools, ensure_ascii=False),
             "this turn (context + question)": str(messages[-1]["content"])}
    counter = "tiktoken o200k_base" if is_exact() else "estimate: tiktoken not available offline"
    print(f"first request of a fresh workspace ({len(tools)} tools), {FIRST_QUESTION!r}; tokens by picoclaw's "
          f"counter ({counter})")
    print(f"| {'part':<30} | {'characters':>10} | {'tokens':>6} |")
    print(f"|{'-' * 32}|{'-' * 12}|{'-' * 8}|")
    for name, text in parts.items():
        print(f"| {name:<30} | {len(text):>10,} | {count_tokens(text):>6,} |")
    whole = json.dumps(body, ensure_ascii=False)
    print(f"| {'whole request body':<30} | {len(whole):>10,} | {count_tokens(whole):>6,} |")
    if server:
        counted = server_prompt_tokens(server, body)
        print(f"\nthe server at {server} counts {counted:,} prompt tokens (target < {FIRST_TARGET:,}; before issue "
              f"24: {FIRST_BEFORE:,}; ratio {counted / FIRST_BEFORE:.2f}): "
              f"{'met' if counted < FIRST_TARGET else 'NOT met'}")
    print()


def prompt_of(body: dict[str, object], tools: bool = True) -> bytes:
    """What a server renders into its prompt and caches, in the order Qwen2.5's chat template (the local model of
    shared/real-model/) renders it: the system message's text, the tool schemas, then the other messages, as the
    client sends them (compact JSON, UTF-8); `tools` off: as if the request offered none."""
    messages = body["messages"]
    assert isinstance(messages, list)
    parts = {"system": messages[:1], "tools": body.get("tools") if tools else None, "messages": messages[1:]}
    return json.dumps(parts, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass
class Background:
    """One session's background calls, measured: each call's share of its prompt already in the conversation
    request before it (with the tools it sent, and as if it had sent none), and for each turn after such calls its
    share against the request just before it and against the conversation request before the calls."""

    calls: dict[str, list[float]] = field(default_factory=dict)
    without_tools: list[float] = field(default_factory=list)
    after_single_slot: list[float] = field(default_factory=list)
    after_undisturbed: list[float] = field(default_factory=list)


def measure_background(requests: list[RecordedRequest]) -> Background:
    measured = Background()
    conversation: RecordedRequest | None = None  # the last turn's request so far
    previous: RecordedRequest | None = None  # the request sent just before
    disturbed = False
    for request in requests:
        kind = kind_of(request.json)
        if kind != "turn":
            assert conversation is not None
            body, before = request.json, conversation.json
            measured.calls.setdefault(kind, []).append(share(prompt_of(before), prompt_of(body)))
            measured.without_tools.append(share(prompt_of(before), prompt_of(body, tools=False)))
            disturbed = True
        else:
            if disturbed and previous is not None and conversation is not None:
                measured.after_single_slot.append(share(prompt_of(previous.json), prompt_of(request.json)))
                measured.after_undisturbed.append(share(prompt_of(conversation.json), prompt_of(request.json)))
            conversation, disturbed = request, False
        previous = request
    return measured


def share(previous: bytes, current: bytes) -> float:
    return shared_prefix(previous, current) / len(current)


def print_background(turns: int) -> None:
    print(f"\nbackground calls between turns ({turns} turns, summaries on; shares of the prompt: system, tools, "
          "messages)")
    print(f"| {'window':<6} | {'background calls':<35} | {'calls':<18} | {'call vs conversation':>20} | "
          f"{'next turn vs last request':>25} | {'next turn vs conversation':>25} |")
    print(f"|{'-' * 8}|{'-' * 37}|{'-' * 20}|{'-' * 22}|{'-' * 27}|{'-' * 27}|")
    for window_name, window in WINDOWS.items():
        for name, continued in (("own prompts (before issue 41)", False), ("after the conversation (now)", True)):
            measured = measure_background(asyncio.run(run_session(turns, True, window=window, continued=continued)))
            calls = [value for values in measured.calls.values() for value in values]
            counts = ", ".join(f"{len(values)} {kind}" for kind, values in sorted(measured.calls.items()))
            print(f"| {window_name:<6} | {name:<35} | {counts:<18} | {_spread(calls):>20} | "
                  f"{_spread(measured.after_single_slot):>25} | {_spread(measured.after_undisturbed):>25} |")
            if continued:
                print(f"| {window_name:<6} | {'now, but without the tool schemas':<35} | {counts:<18} | "
                      f"{_spread(measured.without_tools):>20} | {'–':>25} | {'–':>25} |")


def _spread(values: list[float]) -> str:
    """Median and range of `values` ("–" when there are none)."""
    if not values:
        return "–"
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def shares_from_turn_3(requests: list[bytes]) -> list[float]:
    """The share of each request from the third on."""
    return [shared_prefix(previous, current) / len(current)
            for n, (previous, current) in enumerate(zip(requests, requests[1:]), start=2) if n >= 3]


def print_lessons_comparison(turns: int, summaries: bool) -> None:
    print(f"\nwith and without lessons ({turns} turns each; issue 27: not lower with lessons)")
    print(f"| {'LEARNINGS.md':<28} | {'min share':>9} | {'median share':>12} | {'median bytes':>12} | "
          f"{'new bytes/turn':>14} |")
    print(f"|{'-' * 30}|{'-' * 11}|{'-' * 14}|{'-' * 14}|{'-' * 16}|")
    for name, with_lessons in (("onboarding header only", False), ("20 lessons, 2 standing", True)):
        requests = turn_bodies(asyncio.run(run_session(turns, summaries, with_lessons)))
        shares = shares_from_turn_3(requests)
        new = [len(current) - shared_prefix(previous, current) for previous, current in zip(requests, requests[1:])]
        print(f"| {name:<28} | {min(shares):>9.4f} | {statistics.median(shares):>12.4f} | "
              f"{statistics.median(len(r) for r in requests):>12,.0f} | {statistics.median(new):>14,.0f} |")


def print_image_turn(turns: int, at: int) -> None:
    """Each turn's share around a turn that carries an image (issue 43): only that turn's request holds the image;
    the turns after it send its text, so from the second turn after it every prompt begins with the previous one."""
    requests = turn_bodies(asyncio.run(run_session(turns, False, image_turn=at)))
    print(f"\nturn {at} carries an image ({len(IMAGE):,} bytes; 128k window, {turns} turns)")
    print(f"| {'turn':>4} | {'request bytes':>13} | {'shared bytes':>12} | {'share':>6} | began with the previous |")
    print(f"|{'-' * 6}|{'-' * 15}|{'-' * 14}|{'-' * 8}|{'-' * 24}|")
    for n in range(max(at - 1, 2), min(at + 4, len(requests) + 1)):
        previous, current = requests[n - 2], requests[n - 1]
        shared = shared_prefix(previous, current)
        whole = "yes" if shared >= len(previous) - len(b"]}") else "no"
        print(f"| {n:>4} | {len(current):>13,} | {shared:>12,} | {shared / len(current):>6.3f} | {whole:<22} |")
    after = [shared_prefix(previous, current) / len(current)
             for n, (previous, current) in enumerate(zip(requests, requests[1:]), start=2) if n >= at + 2]
    whole = sum(shared_prefix(previous, current) >= len(previous) - len(b"]}")
                for n, (previous, current) in enumerate(zip(requests, requests[1:]), start=2) if n >= at + 2)
    print(f"from turn {at + 2} on: min share {min(after):.3f}, median {statistics.median(after):.3f}; began with the "
          f"whole previous prompt: {whole} of {len(after)} turns (turn {at + 1} reads again from the message that "
          "held the image, which later requests send as its text)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=50, help="turns of the session (default 50)")
    parser.add_argument("--summaries", action="store_true", help="let session summaries fire (default: off)")
    parser.add_argument("--server", help="a real OpenAI-compatible server's base URL, to count the first request")
    parser.add_argument("--lessons", action="store_true", help="also compare the share with and without lessons")
    parser.add_argument("--background-only", action="store_true",
                        help="with --summaries: only the background calls' table")
    parser.add_argument("--image-turn", type=int, help="also run a session whose turn N carries an image")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if not args.background_only:
        print_first_request(args.server)
        print_turns(args.turns, args.summaries)
        if args.lessons:
            print_lessons_comparison(args.turns, args.summaries)
    if args.summaries:
        print_background(args.turns)
    if args.image_turn:
        print_image_turn(args.turns, args.image_turn)


def print_turns(turns: int, summaries: bool) -> None:
    """Each turn's share of the previous turn's request, on each window."""
    sessions = {name: turn_bodies(asyncio.run(run_session(turns, summaries, window=window)))
                for name, window in WINDOWS.items()}
    main = sessions["128k"]
    print(f"{len(main)} turns of one session; share = byte-identical prefix of the previous turn's request "
          "(background calls left out)")
    print(f"| {'turn':>4} | {'request bytes':>13} | {'shared bytes':>12} | {'new bytes':>9} | {'share 128k':>10} | "
          f"{'share 8k':>8} |")
    print(f"|{'-' * 6}|{'-' * 15}|{'-' * 14}|{'-' * 11}|{'-' * 12}|{'-' * 10}|")
    for n, (previous, current) in enumerate(zip(main, main[1:]), start=2):
        shared = shared_prefix(previous, current)
        small = sessions["8k"]
        other = f"{share(small[n - 2], small[n - 1]):>8.3f}" if n - 1 < len(small) else f"{'–':>8}"
        print(f"| {n:>4} | {len(current):>13,} | {shared:>12,} | {len(current) - shared:>9,} | "
              f"{shared / len(current):>10.3f} | {other} |")
    for name, requests in sessions.items():
        later = shares_from_turn_3(requests)
        pairs = list(zip(requests, requests[1:]))
        new = [len(current) - shared_prefix(previous, current) for previous, current in pairs]
        whole = sum(shared_prefix(previous, current) >= len(previous) - len(b"]}") for previous, current in pairs)
        print(f"\n{name} window, from turn 3 on: min {min(later):.3f}, median {statistics.median(later):.3f} "
              f"(target >= {TARGET}; before issue 11: 0.53-0.70, falling): "
              f"{'met' if min(later) >= TARGET else 'NOT met'}; new bytes per turn: median "
              f"{statistics.median(new):,.0f}; began with the whole previous prompt: {whole} of {len(pairs)} turns")
    print("(new bytes: the question, its memory, the previous answer: a smaller fixed prefix makes the same new part "
          "a larger share of an early turn; on a small window a summary starts the history again from the summary)")


if __name__ == "__main__":
    main()
