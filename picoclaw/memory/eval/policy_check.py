"""A policy change tried against the eval before it applies: the same cases searched under the policy in force and
under the changed one (retrieval only, no model call), each at its own `retrieve_limit` (what a turn would carry).
A change that finds fewer of the cases lowers recall@K: reflection refuses it, `policy set --check` too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from picoclaw.memory.eval.case_set import eval_set
from picoclaw.memory.eval.cases import EvalCase
from picoclaw.memory.eval.retrieval import under_policy
from picoclaw.memory.eval.run import evaluate
from picoclaw.memory.workspace import Workspace
from picoclaw.policy_schema import MemoryPolicy


@dataclass(frozen=True)
class PolicyCheck:
    """Recall@K of one eval set under the policy before and after a change (K: each policy's retrieve_limit)."""

    cases: int  # scored (answers gone left out)
    k_before: int
    found_before: int
    k_after: int
    found_after: int

    @property
    def recall_before(self) -> float:
        return self.found_before / self.cases if self.cases else 0.0

    @property
    def recall_after(self) -> float:
        return self.found_after / self.cases if self.cases else 0.0

    @property
    def lowers(self) -> bool:
        """Whether the change finds fewer of the cases: it lowers recall@K."""
        return self.found_after < self.found_before

    def describe(self) -> str:
        """Both figures in one phrase: `recall@10 0.850 → recall@5 0.700 on 20 eval cases`."""
        return (f"recall@{self.k_before} {self.recall_before:.3f} → recall@{self.k_after} {self.recall_after:.3f} "
                f"on {self.cases} eval case{'s' if self.cases != 1 else ''}")

    def record(self) -> dict[str, Any]:
        """Both figures for the policy history."""
        return {"cases": self.cases, "before": {"k": self.k_before, "found": self.found_before,
                                                "recall": round(self.recall_before, 4)},
                "after": {"k": self.k_after, "found": self.found_after, "recall": round(self.recall_after, 4)}}


def compare_policies(workspace: Workspace, cases: list[EvalCase], before: MemoryPolicy,
                     after: MemoryPolicy) -> PolicyCheck:
    """The eval of `cases` under `before` and under `after`."""
    search, store = workspace.searcher, workspace.store
    old = evaluate(under_policy(search, before), store, cases, before.retrieve_limit, deep=False)
    new = evaluate(under_policy(search, after), store, cases, after.retrieve_limit, deep=False)
    return PolicyCheck(len(old.scored), old.k, old.found, new.k, new.found)


def check_change(workspace: Workspace, changes: dict[str, Any]) -> PolicyCheck | None:
    """The eval's verdict on `changes` to the policy in force; None when there is no eval set (nothing to check
    with). CaseFileError when the saved case file cannot be used."""
    cases = eval_set(workspace)
    if not cases:
        return None
    before = workspace.policy.current()
    after = MemoryPolicy(**{**before.model_dump(), **changes})
    return compare_policies(workspace, cases, before, after)
