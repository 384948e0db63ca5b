"""The run: every case's question searched as a turn searches it (retrieval.py), and where its answer ranked.

A case is found when a block among the top K (MEMORY.md and notes, or lessons) holds its expect: exactly when
`picoclaw memory search QUESTION --limit K` prints a block that holds it. Its rank is the best place of such a
block in either list. A miss is searched again DEEP deep to say where its entry ranked after all (a deeper search
weighs more candidates, so once in a while that place is inside K). A case whose expect is in no memory document
any more is an answer gone: counted apart, never as a miss. Figures: recall@1, @3 and @K over the cases scored,
the mean rank of those found, recall by document and by age bucket (of the entry holding the expect), and the time
each search took.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from picoclaw.memory.eval.cases import EvalCase, holds
from picoclaw.memory.eval.retrieval import Retrieved, retrieve
from picoclaw.memory.eval.targets import AGES, DOCUMENTS, Entry, memory_entries
from picoclaw.memory.search import Hit, MemorySearch
from picoclaw.memory.store import MemoryStore

DEEP = 100  # how deep a miss is searched again for where its entry ranked
CUTOFFS = (1, 3)  # recall is given at these ranks and at K


@dataclass(frozen=True)
class CaseResult:
    """One case: its rank within K (None: not found there), for a miss where a deeper search ranked its entry
    (None: not within DEEP either), whether its answer is gone, the entry's document and age, the search time."""

    case: EvalCase
    rank: int | None
    gone: bool
    document: str | None
    age: str | None
    ms: float
    deep_rank: int | None = None

    @property
    def found(self) -> bool:
        return self.rank is not None


@dataclass(frozen=True)
class Group:
    """Recall of one group of cases (a document, an age bucket)."""

    cases: int
    found: int

    @property
    def recall(self) -> float:
        return self.found / self.cases if self.cases else 0.0


@dataclass(frozen=True)
class EvalReport:
    """The figures of one run over a case set at one K."""

    k: int
    results: list[CaseResult]
    policy: str = "in force"  # the policy searched under: "in force", or the file given
    extra: dict[str, Any] = field(default_factory=dict)  # --answers' figures, when asked for

    @property
    def scored(self) -> list[CaseResult]:
        return [result for result in self.results if not result.gone]

    @property
    def gone(self) -> list[CaseResult]:
        return [result for result in self.results if result.gone]

    @property
    def found(self) -> int:
        return sum(1 for result in self.scored if result.found)

    @property
    def missed(self) -> list[CaseResult]:
        return [result for result in self.scored if not result.found]

    def cutoffs(self) -> list[int]:
        """The ranks recall is given at: 1, 3 and K (those not above K)."""
        return sorted({*(cut for cut in CUTOFFS if cut < self.k), self.k})

    def recall_at(self, cut: int) -> float:
        scored = self.scored
        hits = sum(1 for result in scored if result.rank is not None and result.rank <= cut)
        return hits / len(scored) if scored else 0.0

    @property
    def recall(self) -> float:
        return self.recall_at(self.k)

    @property
    def mean_rank(self) -> float | None:
        ranks = [result.rank for result in self.scored if result.rank is not None]
        return statistics.fmean(ranks) if ranks else None

    def by(self, attribute: str, order: Sequence[str]) -> dict[str, Group]:
        """Recall by the entry's document or age bucket, in `order` (groups with no case left out)."""
        groups: dict[str, Group] = {}
        for name in order:
            members = [result for result in self.scored if getattr(result, attribute) == name]
            if members:
                groups[name] = Group(len(members), sum(1 for result in members if result.found))
        return groups

    def by_document(self) -> dict[str, Group]:
        return self.by("document", DOCUMENTS)

    def by_age(self) -> dict[str, Group]:
        return self.by("age", AGES)

    def ms(self) -> tuple[float, float] | None:
        """The median and the slowest search time per question (ms); None with no case searched."""
        times = [result.ms for result in self.results if not result.gone]
        return (statistics.median(times), max(times)) if times else None

    def to_json(self) -> dict[str, Any]:
        """The run as one JSON object: at least cases, found, recall (@K), k and missed (their questions)."""
        timing = self.ms()
        return {
            "cases": len(self.results), "scored": len(self.scored), "found": self.found, "k": self.k,
            "recall": round(self.recall, 4),
            "recall_at": {str(cut): round(self.recall_at(cut), 4) for cut in self.cutoffs()},
            "mean_rank": None if self.mean_rank is None else round(self.mean_rank, 3),
            "missed": [result.case.question for result in self.missed],
            "misses": [{"question": result.case.question, "expect": result.case.expect,
                        "document": result.document, "age": result.age, "deeper_rank": result.deep_rank}
                       for result in self.missed],
            "answer_gone": [{"question": result.case.question, "expect": result.case.expect}
                            for result in self.gone],
            "by_document": {name: {"cases": g.cases, "found": g.found, "recall": round(g.recall, 4)}
                            for name, g in self.by_document().items()},
            "by_age": {name: {"cases": g.cases, "found": g.found, "recall": round(g.recall, 4)}
                       for name, g in self.by_age().items()},
            "ms_per_query": None if timing is None else {"median": round(timing[0], 3), "max": round(timing[1], 3)},
            "policy": self.policy, **self.extra,
        }


def best_rank(found: Retrieved, expect: str) -> int | None:
    """The best place (1-based) in either list of a block holding `expect`; None when none does."""
    ranks = [_rank(found.facts, expect), _rank(found.lessons, expect)]
    return min((rank for rank in ranks if rank is not None), default=None)


def _rank(hits: list[Hit], expect: str) -> int | None:
    return next((n for n, hit in enumerate(hits, start=1) if holds(hit.block.text, expect)), None)


def evaluate(search: MemorySearch, store: MemoryStore, cases: Sequence[EvalCase], k: int, *,
             deep: bool = True, policy: str = "in force") -> EvalReport:
    """Search every case's question for its top `k` and score it; with `deep`, misses are searched DEEP deep."""
    entries = memory_entries(store)
    results = []
    for case in cases:
        where = entries.locate(case.expect)
        if where is None:
            results.append(CaseResult(case, None, True, None, None, 0.0))
            continue
        document, age = (where.document, where.age) if isinstance(where, Entry) else (where, None)
        started = time.perf_counter()
        found = retrieve(search, case.question, k)
        ms = (time.perf_counter() - started) * 1000
        rank = best_rank(found, case.expect)
        deep_rank = best_rank(retrieve(search, case.question, max(DEEP, k)), case.expect) \
            if rank is None and deep else None
        results.append(CaseResult(case, rank, False, document, age, ms, deep_rank))
    return EvalReport(k, results, policy)

