"""The retrieval an eval scores, which `picoclaw memory search` prints: one function, so the two always agree.

A turn searches the memory documents (MEMORY.md and the daily notes) for the user's message with the workspace's
search, re-ranked by standing under the policy in force, `retrieve_limit` blocks, and LEARNINGS.md apart for
lessons. The eval searches the case's question the same way (`retrieve`), with two differences a turn has and the
eval leaves out on purpose: no query rewrite (a model call; the question is searched as written), and with the
optional index the question's embedding is waited for, where a turn waits at most `max_wait_seconds` and then
ranks by keywords alone (a figure must not depend on how busy the embedder was).
"""

from __future__ import annotations

from dataclasses import dataclass

from picoclaw.memory.search import Hit, MemorySearch, RerankedSearch
from picoclaw.policy_schema import MemoryPolicy


@dataclass(frozen=True)
class Retrieved:
    """What a search for one question found: memory blocks and lessons, each best first."""

    facts: list[Hit]
    lessons: list[Hit]


def retrieve(search: MemorySearch, question: str, limit: int) -> Retrieved:
    """The best `limit` blocks of MEMORY.md and the daily notes for `question`, and the best `limit` lessons."""
    return Retrieved(search.search(question, limit, include_notes=True), search.search_learnings(question, limit))


def under_policy(search: MemorySearch, policy: MemoryPolicy) -> MemorySearch:
    """`search` re-ranked under `policy` instead of the policy in force (the same inner search and use counts)."""
    if isinstance(search, RerankedSearch):
        return RerankedSearch(search.inner, search.store, lambda: policy)
    return search
