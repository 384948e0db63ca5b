"""`memory eval --answers`: each case answered end to end by the configured model from the memory a turn would
carry for its question (select_turn_memory under the policy, nothing counted as used), and scored.

Scoring, published with the figures: token F1 of the answer against the case's expect (the part of the entry that
answers it; answer_scoring.py), and with `--judge` the model's own yes/no on JUDGE_PROMPT, which is printed with the
figures. The judge is told that a hedge, a partial answer and "I don't know" are wrong: the usual judge accepts
most wrong answers. The prompt is a short fixed one, not the agent's system prompt: it measures what memory
gives the model, not the persona. A failed or refused call (the day's budget) ends the answers with those made.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from picoclaw.memory.eval.answer_scoring import parse_verdict, token_f1
from picoclaw.memory.eval.cases import EvalCase
from picoclaw.memory.search import InjectedMemory, MemorySearch, select_turn_memory
from picoclaw.memory.store import MemoryStore
from picoclaw.policy_schema import MemoryPolicy
from picoclaw.providers.base import ChatProvider, ProviderError

ANSWER_TOKENS = 120
JUDGE_TOKENS = 5
ANSWER_INSTRUCTIONS = (
    "Answer the user's question from their memory in the <context> block, in one short sentence, in the language "
    "of the question. If the memory does not say, answer that you do not know."
)
JUDGE_PROMPT = (
    "You grade an assistant's answer against the expected answer. Reply yes only when the answer states the "
    "expected fact (in other words is fine). Reply no when it is wrong, only partly right, names several options, "
    "or says it does not know. Reply with yes or no only.\n\n"
    "Question: {question}\nExpected answer: {expect}\nAssistant's answer: {answer}"
)


@dataclass(frozen=True)
class Answered:
    """One case's answer, its token F1 against the expect, and the judge's verdict (None: not judged)."""

    case: EvalCase
    answer: str
    f1: float
    verdict: bool | None = None


@dataclass
class AnswerRun:
    """The answers made, and why they stopped early (a failed or refused model call), if they did."""

    answered: list[Answered] = field(default_factory=list)
    stopped: str | None = None
    judged: bool = False

    def figures(self) -> dict[str, Any]:
        """The answers' figures as JSON values."""
        judged = [a.verdict for a in self.answered if a.verdict is not None]
        return {"answers": {
            "answered": len(self.answered),
            "mean_f1": round(statistics.fmean(a.f1 for a in self.answered), 4) if self.answered else None,
            "judge_prompt": JUDGE_PROMPT if self.judged else None,
            "judged_correct": round(sum(judged) / len(judged), 4) if judged else None,
            "stopped": self.stopped,
            "each": [{"question": a.case.question, "expect": a.case.expect, "answer": a.answer,
                      "f1": round(a.f1, 4), "judge": a.verdict} for a in self.answered]}}


def context_block(memory: InjectedMemory) -> str:
    """The memory a turn would carry, as the turn's data block lays it out (lessons, memory, notes)."""
    lines = ["<context>"]
    for tag, blocks in (("lessons", [hit.block for hit in memory.lessons]),
                        ("memory", [hit.block for hit in memory.blocks]), ("notes", memory.notes)):
        if blocks:
            lines += [f"<{tag}>", *(block.text.strip() for block in blocks), f"</{tag}>"]
    lines.append("</context>")
    return "\n".join(lines)


async def answer_cases(provider: ChatProvider, search: MemorySearch, store: MemoryStore, policy: MemoryPolicy,
                       cases: Sequence[EvalCase], *, judge: bool = False) -> AnswerRun:
    """Each case answered from the memory a turn would carry, scored (and judged, with `judge`)."""
    run = AnswerRun(judged=judge)
    for case in cases:
        memory = await select_turn_memory(search, store, policy, case.question, count_use=False)
        try:
            reply = await provider.chat([{"role": "system", "content": ANSWER_INSTRUCTIONS},
                                         {"role": "user", "content": f"{context_block(memory)}\n\n{case.question}"}],
                                        max_tokens=ANSWER_TOKENS)
            answer = (reply.content or "").strip()
            verdict = None
            if judge:
                prompt = JUDGE_PROMPT.format(question=case.question, expect=case.expect, answer=answer)
                verdict = parse_verdict((await provider.chat([{"role": "user", "content": prompt}],
                                                             max_tokens=JUDGE_TOKENS)).content)
        except ProviderError as exc:
            run.stopped = str(exc)
            break
        run.answered.append(Answered(case, answer, token_f1(answer, case.expect), verdict))
    return run
