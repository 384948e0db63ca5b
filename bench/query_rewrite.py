#!/usr/bin/env python3
"""Query rewriting (picoclaw/agent/query_rewrite.py) on a slice of LoCoMo dev questions, English and Chinese.

The slice
    In each dev conversation, in the order of its question list, the first ``--per-conversation`` questions
    (categories 1-4, with evidence) that name exactly one of the two speakers, in the English and the Chinese
    file alike, and that have an earlier question about the same speaker alone. Each makes three items:

    * ``follow-up``: the earlier question and its gold answer are the previous turn (user, assistant); the
      message is the question with the speaker's name turned into a pronoun ("When did Caroline go to …?"
      → "When did she go to …?"; 卡罗琳 → 她), so only the previous turn says who is meant. (In this
      layout every block holds both speakers' names, so the name itself finds nothing: this shape mostly
      shows what a rewrite costs when it changes more than the pronoun.)
    * ``elliptic``: the question and its gold answer are the previous turn, and the message says nothing
      searchable ("Tell me more about that." / "再多说说那件事。"): the "and what about her sister?" case,
      where only a rewrite can find the question's evidence.
    * ``standalone``: the follow-up's previous turn, the question as asked: a rewrite must not make it worse.

Capture (``--capture``, against a real OpenAI-compatible server; by hand, never in CI)
    Each item's request is built by picoclaw's own ``rewrite_request`` and sent with ``max_tokens =
    MAX_TOKENS`` and the default temperature; the raw replies are saved unedited to ``--captured``
    (default tests/data/real_query_rewrites.json) with the model, the date, the prompt version and the
    request messages.

Replay (the default)
    Each captured reply is served by the fake OpenAI server (tests/fakes) to picoclaw's ``QueryRewriter``
    through the real provider, so the validator and the fallback run as in a turn (the replayed request must
    equal the captured one, or the prompt changed since the capture and the run stops). Each query is then
    searched over the conversation's MEMORY.md layout exactly as bench/retrieval_quality.py does (five turns
    a block, ``KeywordSearch.search(query, 10)``), and B@10 (share of the evidence turns inside the top 10
    blocks) is averaged per row:

    * ``as asked``: the standalone question itself (what a follow-up could reach at best);
    * ``<shape>, no rewrite``: the message searched as it is (the switch off);
    * ``<shape>, rewrite alone``: the accepted rewrite (the message when refused);
    * ``<shape>, message + rewrite``: both in one query (what picoclaw searches with, ``search_query``);
    * ``<shape>, two searches fused``: the message and the rewrite searched apart, reciprocal-rank fused.

Run (from the repository root):
    python bench/query_rewrite.py
    python bench/query_rewrite.py --capture --api-base http://127.0.0.1:8766/v1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python bench/query_rewrite.py` without installing picoclaw
    sys.path.insert(0, str(REPO))

from bench.retrieval_quality import (  # noqa: E402
    DEFAULT_DATA,
    DEV,
    FILES,
    LANG_NAMES,
    build_memory_workspace,
    load_conversations,
)
from picoclaw.agent.query_rewrite import (  # noqa: E402
    MAX_TOKENS,
    PROMPT_VERSION,
    QueryRewriter,
    earlier_turns,
    rewrite_request,
)
from picoclaw.config import AgentDefaults  # noqa: E402
from picoclaw.memory.search import KeywordSearch  # noqa: E402
from picoclaw.providers.base import Message  # noqa: E402
from picoclaw.providers.openai_compat import OpenAICompatProvider  # noqa: E402

CAPTURED = REPO / "tests/data/real_query_rewrites.json"
LIMIT = 10
RRF_K = 60
SHAPES = ("follow-up", "elliptic", "standalone")
# The elliptic follow-ups: nothing in them to search for; what they are about is the previous turn.
ELLIPTIC = {"en": ("Tell me more about that.", "What else do you know about it?"),
            "zh": ("再多说说那件事。", "关于这个你还知道什么？")}
_EVIDENCE = re.compile(r"D:?(\d+):(\d+)")
# The Chinese file's spellings of the dev speakers' names (梅拉妮 beside 梅兰妮, 玛利亚 beside 玛丽亚).
ZH_NAMES = {"Caroline": ("卡罗琳",), "Melanie": ("梅兰妮", "梅拉妮"), "Jon": ("乔恩",), "Gina": ("吉娜",),
            "John": ("约翰",), "Maria": ("玛丽亚", "玛利亚"), "Joanna": ("乔安娜",), "Nate": ("内特",),
            "Tim": ("蒂姆",)}
FEMALE = frozenset({"Caroline", "Melanie", "Gina", "Maria", "Joanna"})
# A name right after one of these words is the subject of its clause ("When did Caroline go" → she).
_SUBJECT_BEFORE = frozenset("did does do is was has had would will can could when where why how what who "
                            "that if and".split())


@dataclass(frozen=True)
class Item:
    """One message to rewrite: its previous turn, the message, and the evidence turns of its question."""

    id: str
    lang: str
    conversation: str
    shape: str
    question: str  # the standalone question as LoCoMo asks it
    message: str  # what the user sends: the question, or its pronoun form
    earlier: list[Message]
    evidence: frozenset[str]


def pronoun_form_en(question: str, name: str) -> str | None:
    """`question` with `name` turned into a pronoun, or None when the name does not occur."""
    female = name in FEMALE
    out: list[str] = []
    words = question.split(" ")
    found = False
    for n, word in enumerate(words):
        bare = word.rstrip("?,.")
        tail = word[len(bare):]
        if bare == f"{name}'s":
            out.append(("her" if female else "his") + tail)
        elif bare == name:
            before = words[n - 1].lower() if n else ""
            subject = n == 0 or before in _SUBJECT_BEFORE
            out.append(("she" if female else "he") + tail if subject else ("her" if female else "him") + tail)
        else:
            out.append(word)
            continue
        found = True
    if not found:
        return None
    text = " ".join(out)
    return text[0].upper() + text[1:]


def pronoun_form_zh(question: str, name: str) -> str | None:
    """`question` with every spelling of `name` turned into 她 / 他, or None when none occurs."""
    spellings = [s for s in ZH_NAMES[name] if s in question]
    if not spellings:
        return None
    for spelling in spellings:
        question = question.replace(spelling, "她" if name in FEMALE else "他")
    return question


def _names_in(text: str, names: Sequence[str]) -> list[str]:
    return [name for name in names if re.search(rf"\b{name}\b", text)]


def build_slice(data: Path, per_conversation: int) -> list[Item]:
    """The items of the slice (see the module doc), English then Chinese, follow-ups then standalones."""
    raw = {lang: {s["sample_id"]: s for s in json.loads((data / FILES[lang]).read_text(encoding="utf-8"))}
           for lang in FILES}
    items: list[Item] = []
    for conv_id in DEV:
        en, zh = raw["en"][conv_id], raw["zh"][conv_id]
        speakers = [en["conversation"]["speaker_a"], en["conversation"]["speaker_b"]]
        last_about: dict[str, int] = {}  # speaker → index of the latest question about them alone
        chosen = 0
        for index, qa in enumerate(en["qa"]):
            names = _names_in(str(qa["question"]), speakers)
            if len(names) != 1 or "answer" not in qa:
                continue
            name = names[0]
            zh_qa = zh["qa"][index]
            previous = last_about.get(name)
            last_about[name] = index
            evidence = frozenset(f"D{int(s)}:{int(t)}" for e in qa.get("evidence") or []
                                 for s, t in _EVIDENCE.findall(str(e)))
            if previous is None or qa.get("category") not in (1, 2, 3, 4) or not evidence:
                continue
            forms = {"en": pronoun_form_en(str(qa["question"]), name),
                     "zh": pronoun_form_zh(str(zh_qa["question"]), name)}
            prior = {"en": en["qa"][previous], "zh": zh["qa"][previous]}
            if None in forms.values() or any("answer" not in p for p in prior.values()):
                continue
            for lang, form in forms.items():
                this = qa if lang == "en" else zh_qa
                asked = str(this["question"])
                earlier: list[Message] = [{"role": "user", "content": str(prior[lang]["question"])},
                                          {"role": "assistant", "content": str(prior[lang]["answer"])}]
                asked_before: list[Message] = [{"role": "user", "content": asked},
                                               {"role": "assistant", "content": str(this.get("answer", ""))}]
                shapes = (("follow-up", form, earlier), ("elliptic", ELLIPTIC[lang][chosen % 2], asked_before),
                          ("standalone", asked, earlier))
                for shape, message, before in shapes:
                    items.append(Item(f"{lang}-{conv_id}-q{index}-{shape}", lang, conv_id, shape, asked,
                                      str(message), before, evidence))
            chosen += 1
            if chosen >= per_conversation:
                break
    # Shape by shape, the languages taking turns: a capture cut short still has both languages of a shape.
    return sorted(items, key=lambda item: (SHAPES.index(item.shape), item.id.split("-", 1)[1], item.lang))


# -- capture ---------------------------------------------------------------------------------------


async def capture(items: list[Item], api_base: str, model: str, out: Path) -> None:
    """Ask the real server for each item's rewrite and save every reply unedited.

    The file is written after each reply, and items it already holds are not asked again: a capture
    stopped part way goes on where it stopped.
    """
    defaults = AgentDefaults(model=model)
    document: dict[str, Any] = (json.loads(out.read_text(encoding="utf-8")) if out.exists() else {
        "model": "Qwen2.5-Coder-1.5B-Instruct Q4 GGUF (llama-cpp-python server, stock chat format)",
        "served_as": model, "api_base": api_base, "captured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "prompt_version": PROMPT_VERSION, "max_tokens": MAX_TOKENS, "temperature": defaults.temperature,
        "note": "raw replies, unedited; the slice is bench/query_rewrite.py's (LoCoMo dev split only)",
        "items": []})
    if document["prompt_version"] != PROMPT_VERSION:
        raise SystemExit(f"{out} holds replies to prompt v{document['prompt_version']}; move it aside first")
    done = {record["id"] for record in document["items"]}
    async with OpenAICompatProvider(name="capture", api_base=api_base, api_key="sk-local", defaults=defaults,
                                    timeout=300.0) as provider:
        for n, item in enumerate(items, 1):
            if item.id in done:
                continue
            request = rewrite_request(item.message, earlier_turns(item.earlier))
            started = time.perf_counter()
            reply = await provider.chat(request, None, max_tokens=MAX_TOKENS)
            seconds = round(time.perf_counter() - started, 2)
            usage = reply.usage
            document["items"].append({
                "id": item.id, "lang": item.lang, "shape": item.shape, "message": item.message,
                "earlier": item.earlier, "request": request, "reply": reply.content, "seconds": seconds,
                "usage": None if usage is None else {"prompt_tokens": usage.prompt_tokens,
                                                     "completion_tokens": usage.completion_tokens}})
            partial = out.with_suffix(".partial")
            partial.write_text(json.dumps(document, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
            partial.replace(out)
            print(f"{n}/{len(items)} {seconds:5.1f} s {item.message!r} → {reply.content!r}", file=sys.stderr)


# -- replay ----------------------------------------------------------------------------------------


async def replay(items: list[Item], captured: dict[str, Any]) -> dict[str, tuple[str, str | None, str | None]]:
    """item id → (query searched, accepted rewrite or None, refusal reason) from the captured replies."""
    from tests.fakes import FakeOpenAIServer

    by_id = {record["id"]: record for record in captured["items"]}
    out: dict[str, tuple[str, str | None, str | None]] = {}
    with FakeOpenAIServer() as server:
        async with OpenAICompatProvider(name="replay", api_base=server.base_url, api_key="sk-test",
                                        defaults=AgentDefaults(model="replay")) as provider:
            rewriter = QueryRewriter(provider)
            for item in items:
                record = by_id[item.id]
                server.reply_text(record["reply"] or "")
                result = await rewriter.rewrite(item.message, item.earlier)
                sent = server.chat_requests()[-1]["messages"]
                if sent != record["request"]:
                    raise SystemExit(f"{item.id}: the request differs from the captured one; capture again")
                out[item.id] = (result.query, result.rewritten, result.refused)
    return out


def ranked_blocks(search: KeywordSearch, query: str, limit: int) -> list[tuple[int, int]]:
    return [(hit.block.start_line, hit.block.end_line) for hit in search.search(query, limit, include_notes=False)]


def fused(search: KeywordSearch, queries: Sequence[str]) -> list[tuple[int, int]]:
    """Reciprocal-rank fusion of the queries' rankings (top 50 each), best `LIMIT` first."""
    score: dict[tuple[int, int], float] = {}
    for query in dict.fromkeys(queries):
        for rank, key in enumerate(ranked_blocks(search, query, 50)):
            score[key] = score.get(key, 0.0) + 1.0 / (RRF_K + rank + 1)
    return [key for key, _ in sorted(score.items(), key=lambda kv: -kv[1])[:LIMIT]]


def measure(data: Path, items: list[Item], results: dict[str, tuple[str, str | None, str | None]]
            ) -> dict[tuple[str, str], list[float]]:
    """(language, row) → B@10 of each item of that row."""
    scores: dict[tuple[str, str], list[float]] = {}
    for lang in FILES:
        for conv in load_conversations(data / FILES[lang], "dev"):
            mine = [item for item in items if item.lang == lang and item.conversation == conv.sample_id]
            if not mine:
                continue
            with tempfile.TemporaryDirectory(prefix="picoclaw-rewrite-") as tmp:
                ws = build_memory_workspace(Path(tmp), conv, lang)
                search = KeywordSearch(ws.store)
                lines = ws.line_turn[str(ws.store.long_term_path)]

                def b_at_10(blocks: Sequence[tuple[int, int]], evidence: frozenset[str]) -> float:
                    found = {lines[n] for start, end in blocks for n in range(start, end + 1) if n < len(lines)}
                    return len(evidence & found) / len(evidence)

                for item in mine:
                    query, rewritten, _ = results[item.id]
                    alone = rewritten if rewritten is not None else item.message
                    rows = {"as asked": ranked_blocks(search, item.question, LIMIT),
                            f"{item.shape}, no rewrite": ranked_blocks(search, item.message, LIMIT),
                            f"{item.shape}, rewrite alone": ranked_blocks(search, alone, LIMIT),
                            f"{item.shape}, message + rewrite": ranked_blocks(search, query, LIMIT),
                            f"{item.shape}, two searches fused": fused(search, [item.message, alone])}
                    for row, blocks in rows.items():
                        if row == "as asked" and item.shape != "follow-up":
                            continue  # counted once per question
                        scores.setdefault((lang, row), []).append(b_at_10(blocks, item.evidence))
    return scores


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"LoCoMo folder (default {DEFAULT_DATA})")
    parser.add_argument("--captured", type=Path, default=CAPTURED, help=f"captured replies (default {CAPTURED})")
    parser.add_argument("--per-conversation", type=int, default=8, help="questions per dev conversation (8)")
    parser.add_argument("--capture", action="store_true", help="ask a real server and write --captured")
    parser.add_argument("--api-base", default="http://127.0.0.1:8766/v1", help="the server for --capture")
    parser.add_argument("--model", default="local", help="the model name sent with --capture")
    args = parser.parse_args(argv)

    items = build_slice(args.data, args.per_conversation)
    if args.capture:
        asyncio.run(capture(items, args.api_base, args.model, args.captured))
        return 0
    captured = json.loads(args.captured.read_text(encoding="utf-8"))
    held = {record["id"] for record in captured["items"]}
    if len(held) < len(items):
        print(f"{len(items) - len(held)} of {len(items)} items have no captured reply and are left out",
              file=sys.stderr)
        items = [item for item in items if item.id in held]
    results = asyncio.run(replay(items, captured))
    scores = measure(args.data, items, results)
    print(f"Query rewriting on LoCoMo dev, {args.per_conversation} questions a conversation; replies of "
          f"{captured['model']}, prompt v{captured['prompt_version']}, captured {captured['captured_at']}")
    print(f"| {'language':<8} | {'searched with':<35} | {'items':>5} | {'B@10':>6} |")
    print(f"|{'-' * 10}|{'-' * 37}|{'-' * 7}|{'-' * 8}|")
    for (lang, row), values in scores.items():
        print(f"| {LANG_NAMES[lang]:<8} | {row:<35} | {len(values):>5} | {sum(values) / len(values):>6.3f} |")
    print("\nrewrites refused (the message searched instead):")
    for lang in FILES:
        for shape in SHAPES:
            reasons = Counter(results[item.id][2] for item in items if item.lang == lang and item.shape == shape)
            accepted = reasons.pop(None, 0)
            detail = ", ".join(f"{reason} {count}" for reason, count in reasons.most_common()) or "none"
            print(f"  {LANG_NAMES[lang]} {shape}: {accepted} accepted; refused: {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
