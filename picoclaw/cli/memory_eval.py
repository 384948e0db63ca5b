"""`picoclaw memory eval`: how well memory finds the answers to your own questions (picoclaw/memory/eval/).

Handlers import what they use: building the parser (for `--help`) loads no config and no memory code.
"""

from __future__ import annotations

import argparse

from picoclaw.cli.command import Parser, bounded_int, opened_app
from picoclaw.cli.output import echo
from picoclaw.errors import PicoclawError

TYPE_CHECKING = False  # read as true by type checkers; `typing` is not loaded for it (see cli/command.py)
if TYPE_CHECKING:
    from picoclaw.app import App
    from picoclaw.memory import AnswerRun, EvalCase, EvalReport, Generated, Workspace
    from picoclaw.policy_schema import MemoryPolicy
    from picoclaw.providers import ChatProvider

NO_CASES = ("no eval cases yet: run `picoclaw memory eval --generate 20` to have the model write some from your "
            "memory, or pass your own with --cases FILE (one JSON object a line: "
            '{"question": …, "expect": …})')


def register(actions: argparse._SubParsersAction[Parser]) -> None:
    """Add `eval` to the `memory` group's actions."""
    run = actions.add_parser(
        "eval", help="how well memory finds the answers to your questions: recall@1/@3/@K, misses, time per query")
    run.add_argument("--cases", metavar="FILE", help="a JSONL file of cases, one {\"question\": …, \"expect\": …} a "
                                                     "line (default: memory/eval/cases.jsonl and past turns)")
    run.add_argument("--k", type=bounded_int(1, 100), help="how many results count as found (default: retrieve_limit)")
    run.add_argument("--json", action="store_true", help="the same figures as one JSON object")
    run.add_argument("--policy", metavar="FILE", help="search under these policy values (a JSON object of keys, "
                                                      "on top of the policy in force) instead")
    run.add_argument("--generate", type=bounded_int(1, 500), metavar="N",
                     help="have the model write N checked cases from your memory into memory/eval/cases.jsonl "
                          "(background budget); scores nothing")
    run.add_argument("--answers", action="store_true",
                     help="also answer each case with the configured model and score it (token F1 against the "
                          "expect; background budget)")
    run.add_argument("--judge", action="store_true", help="with --answers: the model judges each answer too (its "
                                                          "prompt is printed)")
    run.set_defaults(handler=cmd_memory_eval)


def cmd_memory_eval(args: argparse.Namespace) -> int:
    if args.judge and not args.answers:
        raise PicoclawError("--judge judges answers: use it with --answers")
    if args.generate is not None:
        if args.cases or args.answers or args.policy or args.k:
            raise PicoclawError("--generate writes cases and scores nothing: run it alone, then `picoclaw memory eval`")
        return _generate(args.generate, args.json)
    from picoclaw.memory import evaluate, log_run, read_case_file, under_policy

    with opened_app() as app:
        ws = app.workspace
        policy = _policy(ws, args.policy)
        cases = read_case_file(_path(args.cases)) if args.cases else _eval_set(ws)
        k = args.k or policy.retrieve_limit
        search = under_policy(ws.searcher, policy)
        report = evaluate(search, ws.store, cases, k, policy=args.policy or "in force")
        if not args.cases and not args.policy:  # the memory's own figures, for `memory stats` and its trend
            log_run(ws.store.documents, report, ws.tz)
        if args.answers:
            answered = _answers(app, policy, [result.case for result in report.scored], args.judge)
            report.extra.update(answered.figures())
    if args.json:
        from picoclaw.jsonio import dumps_pretty

        echo(dumps_pretty(report.to_json()).decode("utf-8").rstrip("\n"))
    else:
        echo("\n".join(eval_lines(report)))
    return 0


def _path(text: str) -> Path:
    from pathlib import Path

    return Path(text).expanduser()


def _eval_set(ws: Workspace) -> list[EvalCase]:
    from picoclaw.memory import eval_set

    cases = eval_set(ws)
    if not cases:
        raise PicoclawError(NO_CASES)
    return cases


def _policy(ws: Workspace, file: str | None) -> MemoryPolicy:
    """The policy in force, or with the values of `file` on top of it (one clear line when they are not valid)."""
    current = ws.policy.current()
    if file is None:
        return current
    from pydantic import ValidationError

    from picoclaw.jsonio import read_json_object
    from picoclaw.policy_schema import POLICY_KEYS, MemoryPolicy
    from picoclaw.pydantic_errors import describe_error

    values = read_json_object(_path(file))
    unknown = [key for key in values if key not in POLICY_KEYS]
    if unknown:
        raise PicoclawError(f"{file}: unknown policy key {unknown[0]!r}")
    try:
        return MemoryPolicy(**{**current.model_dump(), **values})
    except ValidationError as exc:
        raise PicoclawError(f"{file}: {describe_error(MemoryPolicy, exc)}") from None


def eval_provider(app: App) -> ChatProvider:
    """The model the eval's calls go to, each claimed against the day's background budget as "eval"."""
    from picoclaw.agent import EVAL

    return app.background_call(EVAL)


def _answers(app: App, policy: MemoryPolicy, cases: list[EvalCase], judge: bool) -> AnswerRun:
    import asyncio

    from picoclaw.memory import answer_cases, under_policy

    async def run() -> AnswerRun:
        async with app:
            ws = app.workspace
            return await answer_cases(eval_provider(app), under_policy(ws.searcher, policy), ws.store, policy, cases,
                                      judge=judge)

    return asyncio.run(run())


def _generate(count: int, as_json: bool) -> int:
    import asyncio

    from picoclaw.memory import CASES_NAME, generate_cases, memory_entries, merged, save_cases, saved_cases

    with opened_app() as app:
        ws = app.workspace
        saved = saved_cases(ws)  # a broken file is said before any model call is made
        memory = memory_entries(ws.store)
        if not memory.entries:
            raise PicoclawError("memory holds no entries yet to write eval cases from")

        async def run() -> Generated:
            async with app:
                return await generate_cases(eval_provider(app), memory, count, asked=saved, root=ws.root)

        made = asyncio.run(run())
        if made.cases:
            save_cases(ws, merged(saved, made.cases))
        total = len(merged(saved, made.cases))
    if as_json:
        from picoclaw.jsonio import dumps_pretty

        echo(dumps_pretty({"generated": len(made.cases), "asked": count, "calls": made.calls,
                           "refused": made.refused, "stopped": made.stopped, "saved": total,
                           "file": CASES_NAME}).decode("utf-8").rstrip("\n"))
        return 0 if made.cases else 1
    echo("\n".join(generated_lines(made, count, total)))
    return 0 if made.cases else 1


def generated_lines(made: Generated, count: int, total: int) -> list[str]:
    """What a generation made, what its checks refused and why, and where the cases are."""
    from picoclaw.memory import CASES_NAME

    refused = sum(made.refused.values())
    lines = [f"generated {len(made.cases)} of {count} cases with {made.calls} model call"
             f"{'s' if made.calls != 1 else ''}; {refused} refused by the checks"
             + (": " + ", ".join(f"{n} {why}" for why, n in sorted(made.refused.items(), key=lambda p: -p[1]))
                if refused else "")]
    if made.stopped:
        lines.append(f"stopped early: {made.stopped}")
    if made.cases:
        lines.append(f"saved to {CASES_NAME} ({total} cases in all): read and edit them, then run "
                     "`picoclaw memory eval`")
    else:
        lines.append("no case was saved")
    return lines


# -- the report as text -----------------------------------------------------------------------------------------


def _share(found: int, cases: int) -> str:
    return f"{found / cases:.3f} ({found}/{cases})" if cases else "– (0 cases)"


def eval_lines(report: EvalReport) -> list[str]:
    """`picoclaw memory eval` as a person reads it."""
    from picoclaw.printable import printable

    scored, gone = report.scored, report.gone
    lines = [f"memory eval: {len(report.results)} case{'s' if len(report.results) != 1 else ''} "
             f"({len(scored)} scored, {len(gone)} answer gone), K = {report.k}, policy {report.policy}"]
    width = len(f"recall@{report.k}")
    for cut in report.cutoffs():
        found = sum(1 for result in scored if result.rank is not None and result.rank <= cut)
        lines.append(f"  {f'recall@{cut}':<{width}}  {_share(found, len(scored))}")
    mean = report.mean_rank
    lines.append(f"  mean rank of those found: {'–' if mean is None else f'{mean:.2f}'}")
    for title, groups in (("by document", report.by_document()), ("by age", report.by_age())):
        if groups:
            lines.append(f"  {title}: " + " · ".join(f"{name} {_share(g.found, g.cases)}"
                                                      for name, g in groups.items()))
    timing = report.ms()
    if timing is not None:
        lines.append(f"  time per query: median {timing[0]:.1f} ms, slowest {timing[1]:.1f} ms")
    if report.missed:
        lines.append(f"missed ({len(report.missed)}):")
        for result in report.missed:
            where = (f"ranked {result.deep_rank} in a deeper search" if result.deep_rank is not None
                     else "not in the top 100 either")
            lines.append(f"  {printable(result.case.question)!r} (expect {printable(result.case.expect)!r}, "
                         f"{result.document}): {where}")
    if gone:
        lines.append(f"answer gone ({len(gone)}): no memory document holds the expect any more")
        lines += [f"  {printable(r.case.question)!r} (expect {printable(r.case.expect)!r})" for r in gone]
    answers = report.extra.get("answers")
    if answers:
        lines += _answer_lines(answers)
    return lines


def _answer_lines(answers: dict[str, object]) -> list[str]:
    mean, judged = answers.get("mean_f1"), answers.get("judged_correct")
    lines = [f"answers: {answers.get('answered')} (the memory a turn would carry, the configured model); "
             f"mean token F1 against the expect {'–' if mean is None else f'{mean:.3f}'}"
             + ("" if judged is None else f"; judged correct {judged:.3f}")]
    if answers.get("stopped"):
        lines.append(f"  stopped early: {answers['stopped']}")
    prompt = answers.get("judge_prompt")
    if isinstance(prompt, str):
        lines.append("judge prompt:")
        lines += [f"  {line}" for line in prompt.splitlines()]
    return lines


if TYPE_CHECKING:
    from pathlib import Path
