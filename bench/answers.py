#!/usr/bin/env python3
"""End-to-end answers: LoCoMo question answering through picoclaw's own retrieval and prompt.

What is measured
    Each chosen question of categories 1-4 that has evidence (category 5, adversarial, and questions without
    evidence are left out, as ../shared/bench-data/README.md says) is answered three ways, against the
    OpenAI-compatible endpoint given on the command line (--base-url, --api-key, --model):

    * ``picoclaw memory``: the conversation is stored in a temporary onboarded workspace the way
      bench/retrieval_quality.py stores its ``memory`` layout (every five turns of a session one
      ``## <session date>`` block of MEMORY.md), and the question is one real turn: ``App.agent().handle``
      in a fresh session, so the request is exactly what a user's turn sends (system prompt, tools, the
      memory the policy injects; the model may call tools, at most --tool-steps of them);
    * ``no memory``: the same turn in a workspace whose MEMORY.md is the onboarding template;
    * ``full context``: one request without tools: the same system prompt, then a user message holding the
      whole conversation as dated notes (``## YYYY-MM-DD HH:MM`` per session, a line "Speaker: text" a
      turn) in picoclaw's ``<context>`` frame, the question last (so consecutive questions share the
      prompt prefix a server caches). When system prompt + conversation + question + --max-tokens exceed
      --context-tokens (counted with picoclaw's token counter), or the endpoint answers "context too
      long", the question is counted "did not fit" for that column: nothing is ever truncated.

    The answer instruction is the same for all three and sits in the system prompt, in the workspace's
    USER.md (where a user says how to be answered): ANSWER_INSTRUCTION below. It is not put into the
    question, which is also the memory search query.

Scores
    Token F1 against the gold answer, LoCoMo/SQuAD-style (bench/answer_scoring.py): lower-cased, punctuation
    and the words a, an, the, and dropped, English words reduced to their Snowball stem. Chinese has no spaces,
    so for Chinese answers each CJK character is one token; Latin words inside them stay words. With --judge,
    the same endpoint grades each answer with a short yes/no prompt (JUDGE_PROMPT); a reply that is not
    clearly yes or no is "no verdict", counted apart. The judge share is yes / answered.
    Seconds per question are the answer's wall time (the judge not included). Did-not-fit and failed
    questions are left out of the means and counted in their own columns.

Questions: the first --questions N per conversation, in file order (--sample-seed S: a seeded random sample
of N instead, kept in file order). Default conversations: the dev split; the other five are held out and
must never be used to choose anything. --columns runs fewer columns. Ctrl-C (SIGINT) stops a slow run and
still prints the table of the answers made so far, marked "stopped early".

Run (from the repository root; a local llama.cpp server here):
    python bench/answers.py --base-url http://127.0.0.1:8765/v1 --api-key sk-local --model qwen \\
        --conversations conv-26 --questions 20 --lang en --context-tokens 32768 --judge
    python bench/answers.py --base-url https://api.openai.com/v1 --model gpt-4o-mini --judge --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python bench/answers.py` without installing picoclaw
    sys.path.insert(0, str(REPO))

from bench.answer_scoring import parse_verdict, token_f1  # noqa: E402
from bench.retrieval_quality import (  # noqa: E402
    CATEGORIES,
    CATEGORY_NAMES,
    DEFAULT_DATA,
    DEV,
    FILES,
    Conversation,
    build_memory_workspace,
    load_conversations,
    turn_text,
)
from picoclaw.app import App  # noqa: E402
from picoclaw.config import parse_config  # noqa: E402
from picoclaw.errors import ConfigError  # noqa: E402
from picoclaw.onboard import onboard  # noqa: E402
from picoclaw.providers import ChatProvider, Message, ProviderError  # noqa: E402
from picoclaw.tokens import count_tokens  # noqa: E402

COLUMNS = {"none": "no memory", "memory": "picoclaw memory", "full": "full context"}
API_KEY_ENV = "OPENAI_API_KEY"
ANSWER_INSTRUCTION = ("I ask short questions about conversations kept in your memory. Answer in a few words "
                      "(a name, a date, a short phrase), with no explanation.")
JUDGE_PROMPT = """You grade an answer to a question about a conversation.
Question: {question}
Gold answer: {gold}
Answer to grade: {answer}
Is the answer to grade correct: does it say what the gold answer says (other wording is fine)? \
Reply with one word: yes or no."""
JUDGE_MAX_TOKENS = 8
MESSAGE_OVERHEAD = 16  # tokens a chat template adds around two messages (role markers): a margin, not exact


class BenchInputError(Exception):
    """Bad command-line input or data: one line for the user, exit status 2."""


# -- questions -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Asked:
    """One question of one conversation, with its gold answer."""

    conversation: str
    number: int  # 1-based position among the conversation's usable questions (categories 1-4, evidence)
    category: int
    question: str
    gold: str


def load_plan(data: Path, lang: str, ids: Sequence[str], count: int | None, seed: int | None
              ) -> list[tuple[Conversation, list[Asked]]]:
    """The chosen conversations, each with the questions to ask; BenchInputError for bad input."""
    path = data / FILES[lang]
    if not path.is_file():
        raise BenchInputError(f"no LoCoMo file at {path} (give the folder with --data)")
    try:
        raw = {str(s["sample_id"]): s for s in json.loads(path.read_text(encoding="utf-8"))}
        convs = {c.sample_id: c for c in load_conversations(path, "all")}
    except (ValueError, KeyError, TypeError) as exc:
        raise BenchInputError(f"{path} is not a LoCoMo file: {exc}") from None
    unknown = [i for i in ids if i not in convs]
    if unknown:
        raise BenchInputError(f"unknown conversation {', '.join(unknown)} (known: {', '.join(convs)})")
    plan = []
    for sample_id in dict.fromkeys(ids):
        conv = convs[sample_id]
        qa = iter(raw[sample_id]["qa"])
        asked = []
        for number, q in enumerate(conv.questions, 1):
            # load_conversations keeps the file's order: the next qa with this text and category is this one.
            item = next(a for a in qa if a["question"] == q.text and a.get("category") == q.category)
            asked.append(Asked(sample_id, number, q.category, q.text, str(item.get("answer", ""))))
        if count is not None and seed is not None and count < len(asked):
            chosen = set(random.Random(f"{seed}:{sample_id}").sample(range(len(asked)), count))
            asked = [a for n, a in enumerate(asked) if n in chosen]
        elif count is not None:
            asked = asked[:count]
        plan.append((conv, asked))
    return plan


def conversation_notes(conv: Conversation, lang: str) -> str:
    """The whole conversation as dated notes: `## YYYY-MM-DD HH:MM` a session, one "Speaker: text" a turn."""
    parts = []
    for _, moment, turns in conv.sessions:
        lines = [" ".join(turn_text(turn, lang).split()) for turn in turns]
        parts.append(f"## {moment:%Y-%m-%d %H:%M}\n" + "\n".join(lines))
    return "\n\n".join(parts)


# -- answering -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    """The endpoint and how to ask it."""

    base_url: str
    api_key: str
    model: str
    lang: str
    context_tokens: int
    max_tokens: int
    temperature: float
    tool_steps: int
    timeout: float
    judge: bool
    quiet: bool
    columns: tuple[str, ...] = tuple(COLUMNS)


@dataclass
class Answer:
    """One question answered (or not) in one column, with its scores."""

    conversation: str
    number: int
    category: int
    column: str
    question: str
    gold: str
    status: str  # "answered" | "did not fit" | "error"
    answer: str = ""
    seconds: float = 0.0
    f1: float = 0.0
    verdict: bool | None = None
    judge_reply: str | None = None

    @classmethod
    def to(cls, asked: Asked, column: str) -> Answer:
        """A blank answer to `asked` in `column`, marked answered until told otherwise."""
        return cls(asked.conversation, asked.number, asked.category, column, asked.question, asked.gold, "answered")


def open_app(home: Path, settings: Settings) -> App:
    """An onboarded picoclaw home whose model is the endpoint; USER.md carries the answer instruction."""
    onboard(home)
    (home / "workspace" / "USER.md").write_text(f"# User\n\n{ANSWER_INSTRUCTION}\n", encoding="utf-8")
    config = {
        "workspace": str(home / "workspace"), "timezone": "UTC",
        "agents": {"defaults": {"provider": "bench", "model": settings.model, "max_tokens": settings.max_tokens,
                                "temperature": settings.temperature, "context_window": settings.context_tokens,
                                "max_tool_iterations": settings.tool_steps}},
        "providers": {"bench": {"api_key": settings.api_key, "api_base": settings.base_url,
                                "timeout": settings.timeout, "max_retries": 0}},
        # Questions are independent: a use prior built up by earlier questions, or a lesson one of them taught
        # (LEARNINGS.md), would make a question's memory depend on which questions ran before it; and a lesson's
        # drafting call would be a model call the table does not count.
        "memory": {"memory_access_boost_percent": 0, "learning_enabled": False},
    }
    return App(parse_config(config, "bench/answers.py settings"), home)


def progress(settings: Settings, answer: Answer, judged: bool = False) -> None:
    """One line on stderr per answer and per verdict: a run stopped early still leaves its record."""
    if settings.quiet:
        return
    where = f"  {answer.conversation} q{answer.number} (category {answer.category}) {COLUMNS[answer.column]}:"
    if judged:
        verdict = {True: "yes", False: "no", None: "no verdict"}[answer.verdict]
        print(f"{where} judge {verdict} {(answer.judge_reply or '')[:40]!r}", file=sys.stderr)
        return
    score = f"F1 {answer.f1:.2f}" if answer.status == "answered" else answer.status
    print(f"{where} {score} ({answer.seconds:.1f} s) {answer.answer[:60]!r}", file=sys.stderr)


async def ask_turn(app: App, column: str, asked: Asked) -> Answer:
    """The question as one user turn of a fresh session of `app`'s agent."""
    started = time.perf_counter()
    reply = await app.agent().handle(f"bench:{asked.conversation}:{asked.number}", asked.question)
    result = Answer.to(asked, column)
    result.seconds = time.perf_counter() - started
    if reply.error is not None:
        result.status = "did not fit" if reply.error.kind == "context_too_long" else "error"
        result.answer = str(reply.error)
    else:
        result.answer, result.f1 = reply.text, token_f1(reply.text, asked.gold)
    return result


async def ask_full(app: App, settings: Settings, notes: str, asked: Asked, now: datetime) -> Answer:
    """The question after the whole conversation, one request without tools; "did not fit" when too long."""
    system = app.agent().context.stable_prefix(now)
    user = (f"<context>\n<notes>\n{notes}\n</notes>\n<time>{now:%Y-%m-%d %H:%M}</time>\n</context>\n\n"
            f"{asked.question}")
    result = Answer.to(asked, "full")
    needed = count_tokens(system) + count_tokens(user) + settings.max_tokens + MESSAGE_OVERHEAD
    if needed > settings.context_tokens:
        result.status = "did not fit"
        result.answer = f"needs about {needed} tokens of {settings.context_tokens}"
        return result
    messages: list[Message] = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    started = time.perf_counter()
    try:
        reply = await app.provider().chat(messages, None)
    except ProviderError as exc:
        result.status = "did not fit" if exc.kind == "context_too_long" else "error"
        result.answer = str(exc)
    else:
        result.answer = (reply.content or "").strip()
        result.f1 = token_f1(result.answer, asked.gold)
    result.seconds = time.perf_counter() - started
    return result


async def judge(provider: ChatProvider, answer: Answer) -> None:
    """Grade one answer with the judge prompt on the same endpoint; a failed call is no verdict."""
    prompt = JUDGE_PROMPT.format(question=answer.question, gold=answer.gold, answer=answer.answer)
    try:
        reply = await provider.chat([{"role": "user", "content": prompt}], None, max_tokens=JUDGE_MAX_TOKENS)
    except ProviderError as exc:
        answer.judge_reply = f"(judge call failed: {exc})"
        return
    answer.judge_reply = reply.content or ""
    answer.verdict = parse_verdict(answer.judge_reply)


async def run_conversation(root: Path, conv: Conversation, questions: list[Asked], settings: Settings,
                           answers: list[Answer]) -> None:
    """Every question of one conversation in the chosen columns, then (with --judge) every answer graded.

    The full-context column goes first, question after question, so each request shares the long prefix of
    the one before (a server's prompt cache). Then each question as a memory turn and a no-memory turn, side
    by side (their system prompt and tools are one shared prefix too), so a run stopped early has compared
    the same questions in both.
    """
    build_memory_workspace(root / "memory-home" / "workspace", conv, settings.lang)
    memory_app = open_app(root / "memory-home", settings)
    none_app = open_app(root / "none-home", settings)
    try:
        notes, now = conversation_notes(conv, settings.lang), datetime.now(UTC)
        if "full" in settings.columns:
            for asked in questions:
                answers.append(await ask_full(memory_app, settings, notes, asked, now))
                progress(settings, answers[-1])
        turns = [(column, app) for column, app in (("memory", memory_app), ("none", none_app))
                 if column in settings.columns]
        for asked in questions:
            for column, app in turns:
                answers.append(await ask_turn(app, column, asked))
                progress(settings, answers[-1])
        if settings.judge:
            for answer in [a for a in answers if a.conversation == conv.sample_id]:
                if answer.status == "answered":
                    await judge(memory_app.provider(), answer)
                    progress(settings, answer, judged=True)
    finally:
        await memory_app.aclose()
        await none_app.aclose()


async def run_all(plan: list[tuple[Conversation, list[Asked]]], settings: Settings, answers: list[Answer]) -> None:
    """Every conversation of the plan, each answer appended to `answers` as it is made."""
    with tempfile.TemporaryDirectory(prefix="picoclaw-answers-") as tmp:
        for conv, questions in plan:
            await run_conversation(Path(tmp) / conv.sample_id, conv, questions, settings, answers)


# -- the table -------------------------------------------------------------------------------------

def summarize(answers: Sequence[Answer], category: int | None, column: str) -> dict[str, Any]:
    """Counts, mean F1, judge share and seconds per question of one column (one category, or all)."""
    rows = [a for a in answers if a.column == column and (category is None or a.category == category)]
    done = [a for a in rows if a.status == "answered"]
    judged = [a for a in done if a.judge_reply is not None]
    return {
        "category": "all" if category is None else f"{category} {CATEGORY_NAMES[category]}",
        "column": COLUMNS[column], "asked": len(rows), "answered": len(done),
        "did_not_fit": sum(a.status == "did not fit" for a in rows), "errors": sum(a.status == "error" for a in rows),
        "f1": sum(a.f1 for a in done) / len(done) if done else None,
        "judge_yes": sum(a.verdict is True for a in judged) / len(judged) if judged else None,
        "no_verdict": sum(a.verdict is None for a in judged) if judged else None,
        "seconds_per_question": sum(a.seconds for a in done) / len(done) if done else None,
    }


def summary_rows(answers: Sequence[Answer]) -> list[dict[str, Any]]:
    """One row per (category present, column), then the columns over all categories."""
    present = [c for c in CATEGORIES if any(a.category == c for a in answers)]
    columns = [c for c in COLUMNS if any(a.column == c for a in answers)]
    return [summarize(answers, category, column) for category in [*present, None] for column in columns]


def print_table(rows: list[dict[str, Any]], title: str) -> None:
    heads = ("category", "column", "asked", "answered", "did not fit", "errors", "F1", "judge yes", "no verdict",
             "s/question")
    keys = ("category", "column", "asked", "answered", "did_not_fit", "errors", "f1", "judge_yes", "no_verdict",
            "seconds_per_question")

    def cell(key: str, value: Any) -> str:
        if value is None:
            return "-"
        return f"{value:.1f}" if key == "seconds_per_question" else f"{value:.3f}" if isinstance(value, float) \
            else str(value)

    table = [[cell(k, row[k]) for k in keys] for row in rows]
    widths = [max(len(h), *(len(r[n]) for r in table)) for n, h in enumerate(heads)]
    print(title)
    print("| " + " | ".join(h.ljust(w) for h, w in zip(heads, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in table:
        print("| " + " | ".join(v.ljust(w) if n < 2 else v.rjust(w) for n, (v, w) in enumerate(zip(r, widths)))
              + " |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True, help="the OpenAI-compatible endpoint, e.g. http://host/v1")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV, ""),
                        help=f"default: ${API_KEY_ENV} (a local server accepts any placeholder)")
    parser.add_argument("--model", required=True, help="the model name the endpoint expects")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"LoCoMo folder (default {DEFAULT_DATA})")
    parser.add_argument("--lang", choices=tuple(FILES), default="en")
    parser.add_argument("--conversations", nargs="+", default=list(DEV), metavar="ID",
                        help="sample ids (default: the dev split; never tune on the other five)")
    parser.add_argument("--questions", type=int, metavar="N", help="first N usable questions per conversation")
    parser.add_argument("--sample-seed", type=int, metavar="S", help="with --questions: a seeded sample instead")
    parser.add_argument("--context-tokens", type=int, default=128_000,
                        help="the endpoint's context window (the full-context column must fit in it)")
    parser.add_argument("--max-tokens", type=int, default=100, help="most tokens of one answer (default 100)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--tool-steps", type=int, default=4, help="most model calls of one turn (default 4)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    parser.add_argument("--columns", nargs="+", choices=tuple(COLUMNS), default=list(COLUMNS),
                        help="which columns to run (default: all three)")
    parser.add_argument("--judge", action="store_true", help="also grade each answer with the same model")
    parser.add_argument("--json", action="store_true", help="print JSON (summary rows and every answer)")
    parser.add_argument("--quiet", action="store_true", help="no per-question progress on stderr")
    args = parser.parse_args(argv)

    settings = Settings(args.base_url, args.api_key, args.model, args.lang, args.context_tokens, args.max_tokens,
                        args.temperature, args.tool_steps, args.timeout, args.judge, args.quiet,
                        tuple(dict.fromkeys(args.columns)))
    try:
        if not args.api_key:
            raise BenchInputError(f"no API key: pass --api-key or set {API_KEY_ENV}")
        if args.questions is not None and args.questions < 1:
            raise BenchInputError("--questions must be at least 1")
        parse_config({"agents": {"defaults": {"max_tokens": settings.max_tokens, "context_window":
                      settings.context_tokens, "temperature": settings.temperature,
                      "max_tool_iterations": settings.tool_steps}}}, "the command line")
        plan = load_plan(args.data, args.lang, args.conversations, args.questions, args.sample_seed)
    except (BenchInputError, ConfigError) as exc:  # a ConfigError names the bad setting and its range
        print(f"answers: {exc}", file=sys.stderr)
        return 2
    held_out = [i for i in args.conversations if i not in DEV]
    if held_out:
        print(f"note: {', '.join(held_out)} held out: report only, never choose anything by it", file=sys.stderr)

    started = time.perf_counter()
    answers: list[Answer] = []
    try:
        asyncio.run(run_all(plan, settings, answers))
        stopped = ""
    except KeyboardInterrupt:  # Ctrl-C (SIGINT) on a slow run: the table of what was answered so far
        planned = len(settings.columns) * sum(len(questions) for _, questions in plan)
        stopped = f"stopped early: {len(answers)} of {planned} answers made"
        print(f"answers: {stopped}", file=sys.stderr)
    rows = summary_rows(answers)
    if args.json:
        print(json.dumps({"settings": {k: v for k, v in asdict(settings).items() if k != "api_key"},
                          "conversations": args.conversations, "questions": args.questions,
                          "sample_seed": args.sample_seed, "stopped": stopped or None, "summary": rows,
                          "answers": [asdict(a) for a in answers]}, ensure_ascii=False, indent=1))
        return 0
    how = ("all" if args.questions is None else f"first {args.questions}" if args.sample_seed is None
           else f"{args.questions} sampled (seed {args.sample_seed})")
    print_table(rows, f"LoCoMo question answering ({args.lang}), {' '.join(args.conversations)}: {how} questions "
                      f"each; model {args.model} at {args.base_url}")
    print(f"\n{stopped + '; ' if stopped else ''}total {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
