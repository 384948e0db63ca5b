#!/usr/bin/env python3
"""`picoclaw memory eval --generate N` then `picoclaw memory eval` over LoCoMo's dev conversations, with timing.

What is run
    Each dev conversation (conv-26 conv-30 conv-41 conv-42 conv-43), English and Chinese, is written as MEMORY.md
    the way bench/retrieval_quality.py's ``memory`` layout does (every five turns of a session one ``## <date>``
    entry) into a fresh onboarded home. Then, through the real command line in-process (``picoclaw.cli.main``):
    ``memory eval --generate N --json`` (the model writes N cases from chosen entries; its checks refuse copies and
    expects not in the entry) and ``memory eval --json`` --runs times on the cases it saved.

The model
    By default the fake OpenAI-compatible server of tests/fakes, answering as a mechanical question writer: from the
    entry's longest turn it takes a topic word and asks what the speaker said about it ("Tell me what Caroline said
    about adoption back then." / "Caroline那次说到领养时讲了些什么？"), the expect being the few words after the
    topic. Its figures measure the pipeline and the search on questions that share one or two words with their
    entry, not a model's questions. With ``--base-url`` (e.g. a local llama.cpp server,
    http://127.0.0.1:8765/v1) the real model writes them; on a CPU that is about a minute a call, so use a small
    ``--generate`` and ``--conversations``.

Table
    One row per language and conversation: entries in MEMORY.md, cases generated (of N) and refused, model calls,
    generation time; recall@1 / @3 / @10, mean rank of the found, the eval's wall time (median of --runs) and its
    median time per query (median over the runs). Below: the same over all rows (cases pooled).

Run (from the repository root):
    python bench/memory_eval.py                       # fake model, --generate 50, both languages
    python bench/memory_eval.py --lang en --conversations conv-26 --generate 5 \\
        --base-url http://127.0.0.1:8765/v1 --model qwen
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python bench/memory_eval.py` without installing picoclaw
    sys.path.insert(0, str(REPO))

from bench.retrieval_quality import DEV, FILES, TURNS_PER_BLOCK, Conversation, load_conversations, turn_text  # noqa: E402
from picoclaw.cli import main  # noqa: E402
from picoclaw.memory.eval.generate import INSTRUCTIONS  # noqa: E402
from tests.fakes import FakeOpenAIServer  # noqa: E402
from tests.zones import onboard_in_shanghai  # noqa: E402

DATA = Path("/work/shared/bench-data/locomo")
KEY = "sk-bench-eval-0123456789"
_LATIN = re.compile(r"[A-Za-z]{5,}")
_CJK_RUN = re.compile(r"[\u4e00-\u9fff]{6,}")
_COMMON = frozenset("about after again being could doing going great really should there these thing things think "
                    "those through thanks would yeah your you're that's what's i'm it's".split())


def memory_text(conv: Conversation, lang: str) -> str:
    """The conversation as MEMORY.md: each TURNS_PER_BLOCK turns of a session one `## <date>` entry."""
    parts = ["# Long-term memory\n"]
    for _, moment, turns in conv.sessions:
        for start in range(0, len(turns), TURNS_PER_BLOCK):
            lines = [" ".join(turn_text(turn, lang).split()) for turn in turns[start:start + TURNS_PER_BLOCK]]
            parts.append(f"## {moment.date().isoformat()}\n" + "\n".join(lines) + "\n")
    return "\n".join(parts)


def fake_writer(body: dict[str, Any]) -> str:
    """The mechanical question writer (see the module doc)."""
    if body["messages"][0]["content"] != INSTRUCTIONS:
        return "ok"
    entry = body["messages"][1]["content"].split("\n", 1)[1]
    line = max(entry.splitlines(), key=len)
    speaker, _, text = line.partition(": ")
    cjk = _CJK_RUN.search(text)
    if cjk:
        run = cjk.group(0)
        topic, expect = run[:2], run[2:6]
        return json.dumps({"question": f"{speaker}那次说到{topic}时讲了些什么？", "expect": expect}, ensure_ascii=False)
    words = [m for m in _LATIN.finditer(text) if m.group(0).lower() not in _COMMON]
    if not words:
        return "I cannot write a question about this entry."
    topic = max(words, key=lambda m: len(m.group(0)))
    after = text[topic.end():].split()[:3]
    if not after:
        return "I cannot write a question about this entry."
    expect = " ".join(after).strip(".,!?\"'")
    return json.dumps({"question": f"Tell me what {speaker} said about {topic.group(0)} back then.",
                       "expect": expect})


def picoclaw(*argv: str) -> tuple[int, str]:
    """Run the CLI in-process; its exit code and stdout."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(list(argv))
    return code, out.getvalue()


def prepare(home: Path, conv: Conversation, lang: str, base_url: str, api_key: str, model: str | None) -> int:
    """An onboarded home whose MEMORY.md holds the conversation; its number of entries."""
    onboard_in_shanghai(home)
    path = home / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    # A local model on a CPU takes minutes a call when the machine is busy: the timeout of a local server entry.
    config["providers"]["openai"] = {"api_key": api_key, "api_base": base_url, "timeout": 600, "max_retries": 0}
    if model:
        config["agents"]["defaults"]["model"] = model
    path.write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    text = memory_text(conv, lang)
    (home / "workspace" / "memory" / "MEMORY.md").write_text(text, encoding="utf-8")
    return text.count("\n## ")


def run_one(conv: Conversation, lang: str, args: argparse.Namespace, base_url: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="picoclaw-eval-bench-") as folder:
        home = Path(folder) / "home"
        os.environ["PICOCLAW_HOME"] = str(home)
        entries = prepare(home, conv, lang, base_url, args.api_key, args.model)
        started = time.perf_counter()
        code, out = picoclaw("memory", "eval", "--generate", str(args.generate), "--json")
        generation = time.perf_counter() - started
        made = json.loads(out)
        row: dict[str, Any] = {"lang": lang, "conv": conv.sample_id, "entries": entries,
                               "generated": made["generated"], "refused": sum(made["refused"].values()),
                               "refusals": made["refused"], "calls": made["calls"], "gen_s": generation,
                               "stopped": made["stopped"]}
        if code != 0 or not made["generated"]:
            return row
        walls, medians, report = [], [], {}
        for _ in range(args.runs):
            started = time.perf_counter()
            code, out = picoclaw("memory", "eval", "--json")
            walls.append(time.perf_counter() - started)
            report = json.loads(out)
            medians.append(report["ms_per_query"]["median"])
        row.update(report=report, wall_s=statistics.median(walls), ms=statistics.median(medians))
        return row


def table(rows: list[dict[str, Any]], asked: int) -> list[str]:
    head = ("lang", "conv", "entries", f"cases/{asked}", "refused", "calls", "gen s", "R@1", "R@3", "R@10",
            "mean rank", "eval s", "ms/query")
    body = []
    for row in rows:
        report = row.get("report")
        if report is None:
            body.append((row["lang"], row["conv"], str(row["entries"]), str(row["generated"]), str(row["refused"]),
                         str(row["calls"]), f"{row['gen_s']:.1f}", "–", "–", "–", "–", "–", "–"))
            continue
        at = report["recall_at"]
        body.append((row["lang"], row["conv"], str(row["entries"]), str(row["generated"]), str(row["refused"]),
                     str(row["calls"]), f"{row['gen_s']:.1f}", f"{at.get('1', 0):.3f}", f"{at.get('3', 0):.3f}",
                     f"{at.get(str(report['k']), 0):.3f}", f"{report['mean_rank'] or 0:.2f}",
                     f"{row['wall_s']:.2f}", f"{row['ms']:.2f}"))
    scored = [row for row in rows if row.get("report")]
    if scored:
        def pooled(cut: str) -> str:
            found = sum(row["report"]["recall_at"].get(cut, 0) * row["report"]["scored"] for row in scored)
            return f"{found / sum(row['report']['scored'] for row in scored):.3f}"
        body.append(("all", "", str(sum(r["entries"] for r in rows)), str(sum(r["generated"] for r in rows)),
                     str(sum(r["refused"] for r in rows)), str(sum(r["calls"] for r in rows)),
                     f"{sum(r['gen_s'] for r in rows):.1f}", pooled("1"), pooled("3"), pooled("10"), "",
                     f"{statistics.median(r['wall_s'] for r in scored):.2f}",
                     f"{statistics.median(r['ms'] for r in scored):.2f}"))
    widths = [max(len(line[n]) for line in (head, *body)) for n in range(len(head))]
    return ["  ".join(cell.rjust(width) for cell, width in zip(line, widths)) for line in (head, *body)]


def main_bench() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--lang", choices=("en", "zh", "both"), default="both")
    parser.add_argument("--conversations", nargs="*", default=list(DEV))
    parser.add_argument("--generate", type=int, default=50)
    parser.add_argument("--runs", type=int, default=5, help="eval runs per conversation (timing: their median)")
    parser.add_argument("--base-url", help="a real OpenAI-compatible server (default: the fake question writer)")
    parser.add_argument("--api-key", default=KEY)
    parser.add_argument("--model")
    args = parser.parse_args()
    langs = ("en", "zh") if args.lang == "both" else (args.lang,)
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        base_url = args.base_url
        if base_url is None:
            server = stack.enter_context(FakeOpenAIServer())
            server.responder = fake_writer
            base_url = server.base_url
        for lang in langs:
            for conv in load_conversations(args.data / FILES[lang], "dev"):
                if conv.sample_id in args.conversations:
                    row = run_one(conv, lang, args, base_url)
                    rows.append(row)
                    print(f"{lang} {conv.sample_id}: {row['generated']} cases, refused {row['refusals']}"
                          + (f", stopped: {row['stopped']}" if row["stopped"] else ""), file=sys.stderr)
    model = "fake question writer (tests/fakes)" if args.base_url is None else f"{args.model} at {args.base_url}"
    print(f"memory eval on LoCoMo dev as MEMORY.md; model: {model}; --generate {args.generate}; "
          f"timing: median of {args.runs} eval runs")
    print("\n".join(table(rows, args.generate)))


if __name__ == "__main__":
    main_bench()
