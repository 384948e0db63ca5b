#!/usr/bin/env python3
"""Newest fact wins: when a memory holds a fact and a later entry that contradicts it, does the search put
the newer entry first?

What is measured
    30 cases (bench/newest_fact_cases.json: 15 English, 15 Chinese), each its own MEMORY.md: a fact ("My
    sister Claire lives in Lyon"), a later entry that contradicts it ("Claire moved to Toronto in August"),
    two entries that share its words ("Claire's birthday is on 14 March"), and ten unrelated background
    entries of the case's language; every entry a `## YYYY-MM-DD` block, dated as in the file. The question
    ("Where does my sister live?") is searched with `search(question, 10)`; the search's "today" is a week
    after the newest entry. Two ways of storing the same entries:

    * ranking alone: MEMORY.md written whole (`MemoryStore.rewrite_long_term`), nothing marked: the order
      comes from the search only (a hand-edited or imported memory);
    * update rule: each entry appended on its own date through `MemoryStore.append_long_term`, as the
      runtime stores a memory, so the store's update rule (memory/supersede.py) marks the older entry
      "> superseded …" when it recognises the update.

    "newer above": the newer entry is found and the older one is not found or ranks below it; "newer
    first": the newer entry is the first hit. Before: `KeywordSearch`, the plain search as it is. After:
    the same wrapped in `RerankedSearch` with the policy's default weights (no access counts: a fresh
    memory). A case that fails is listed with the ranks of both entries (0: not in the top 10). "marked":
    in how many cases the update rule marked the older entry superseded.

    Every newer entry shares a word with its question: the bench measures which of two entries found comes
    first, not whether a paraphrase is found at all (that is the retrieval benches' business).

Run (from the repository root):
    python bench/newest_fact.py
    python bench/newest_fact.py --lang zh --show-misses
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from picoclaw.memory.entries import SUPERSEDED  # noqa: E402
from picoclaw.memory.search.blocks import Hit  # noqa: E402
from picoclaw.memory.search.keyword import KeywordSearch  # noqa: E402
from picoclaw.memory.search.protocol import MemorySearch  # noqa: E402
from picoclaw.memory.search.reranking import RerankedSearch  # noqa: E402
from picoclaw.memory.store import MemoryStore  # noqa: E402
from picoclaw.policy_schema import MemoryPolicy  # noqa: E402

CASES = Path(__file__).with_name("newest_fact_cases.json")
LIMIT = 10
LAYOUTS = ("ranking alone", "update rule")


class DatedStore(MemoryStore):
    """A MemoryStore whose "today" is set by the bench: an entry is appended on its own date."""

    day = date(2025, 1, 1)

    def today(self) -> date:
        return self.day


@dataclass(frozen=True)
class Case:
    lang: str
    question: str
    old: tuple[str, str]
    new: tuple[str, str]
    others: list[tuple[str, str]]

    def entries(self, background: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Every entry of the case's memory, oldest first (the file order the runtime would make)."""
        return sorted([*background, *self.others, self.old, self.new], key=lambda entry: entry[0])


def _entry(pair: list[str]) -> tuple[str, str]:
    day, text = pair
    return day, text


def load(lang: str) -> tuple[list[Case], dict[str, list[tuple[str, str]]]]:
    """The cases of `lang` ("all": both) and the background entries of each language."""
    data = json.loads(CASES.read_text(encoding="utf-8"))
    cases = [Case(c["lang"], c["question"], _entry(c["old"]), _entry(c["new"]), [_entry(o) for o in c["others"]])
             for c in data["cases"] if lang in ("all", c["lang"])]
    background = {key: [_entry(pair) for pair in value] for key, value in data["background"].items()}
    return cases, background


def build(root: Path, case: Case, background: list[tuple[str, str]], layout: str) -> DatedStore:
    store = DatedStore(root, UTC)
    entries = case.entries(background)
    if layout == "ranking alone":
        store.rewrite_long_term("# Long-term memory\n\n" + "\n".join(f"## {day}\n{text}\n" for day, text in entries))
    else:
        for day, text in entries:
            store.day = date.fromisoformat(day)
            store.append_long_term(text)
    store.day = date.fromisoformat(case.new[0]) + timedelta(days=7)
    return store


def rank_of(hits: Sequence[Hit], text: str) -> int:
    """1-based rank of the block holding `text`, 0 when it is not among the hits (a superseded mark, which
    quotes the newer entry, does not count as holding it)."""
    def entry(hit: Hit) -> str:
        return "\n".join(line for line in hit.block.text.split("\n") if not line.startswith(SUPERSEDED))
    return next((n for n, hit in enumerate(hits, start=1) if text in entry(hit)), 0)


def run(cases: list[Case], background: dict[str, list[tuple[str, str]]], show_misses: bool
        ) -> tuple[dict[tuple[str, str], tuple[float, float]], int]:
    """(layout, search) → (share newer above, share newer first); and in how many cases the update rule
    marked the older entry."""
    results: dict[tuple[str, str], list[tuple[bool, bool]]] = {}
    marked = 0
    for layout in LAYOUTS:
        for case in cases:
            with tempfile.TemporaryDirectory() as tmp:
                store = build(Path(tmp), case, background[case.lang], layout)
                marked += f"{case.old[1]}\n{SUPERSEDED}" in store.read_long_term()
                plain = KeywordSearch(store)
                searches: dict[str, MemorySearch] = {"before": plain,
                                                     "after": RerankedSearch(plain, store, MemoryPolicy)}
                for name, search in searches.items():
                    hits = search.search(case.question, LIMIT)
                    old, new = rank_of(hits, case.old[1]), rank_of(hits, case.new[1])
                    above, first = bool(new) and (not old or new < old), new == 1
                    results.setdefault((layout, name), []).append((above, first))
                    if show_misses and not above:
                        print(f"  miss [{layout}, {name}] {case.question}  newer #{new or '-'}, older #{old or '-'}")
    shares = {key: (sum(a for a, _ in rows) / len(rows), sum(f for _, f in rows) / len(rows))
              for key, rows in results.items()}
    return shares, marked


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lang", choices=("all", "en", "zh"), default="all")
    parser.add_argument("--show-misses", action="store_true", help="list the cases where the newer entry lost")
    args = parser.parse_args(argv)
    cases, background = load(args.lang)
    langs = ["en", "zh"] if args.lang == "all" else [args.lang]
    print(f"newest fact wins: {len(cases)} cases, top {LIMIT}")
    print(f"{'lang':4}  {'stored by':13}  {'search':6}  {'newer above':>11}  {'newer first':>11}  marked")
    for lang in [*langs, *(["all"] if len(langs) > 1 else [])]:
        chosen = [case for case in cases if lang in ("all", case.lang)]
        shares, marked = run(chosen, background, args.show_misses and lang != "all")
        for layout in LAYOUTS:
            for name in ("before", "after"):
                above, first = shares[(layout, name)]
                rule = f"{marked}/{len(chosen)}" if layout == "update rule" else "-"
                print(f"{lang:4}  {layout:13}  {name:6}  {above:11.2f}  {first:11.2f}  {rule:>6}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
