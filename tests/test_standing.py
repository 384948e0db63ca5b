"""RerankedSearch (memory/search/reranking.py): the newer of two entries about one thing ranks above the older,
a mild recency prior, a use prior, and everything else left in relevance order; in English and Chinese."""

from __future__ import annotations

import asyncio
from datetime import UTC
from pathlib import Path

import pytest
from freezegun import freeze_time

from picoclaw.memory.search.blocks import Hit
from picoclaw.memory.search.keyword import KeywordSearch
from picoclaw.memory.search.reranking import RerankedSearch, block_date, recency
from picoclaw.memory.store import MemoryStore
from picoclaw.policy_schema import MemoryPolicy
from tests.stores import memory_store

NO_PRIORS = MemoryPolicy(memory_recency_boost_percent=0, memory_access_boost_percent=0)


def memory(tmp_path: Path, entries: list[tuple[str, str]]) -> MemoryStore:
    """A MEMORY.md of `## date` entries written whole: nothing marked superseded."""
    store = memory_store(tmp_path / "memory", UTC)
    store.rewrite_long_term("# Memory\n\n" + "\n".join(f"## {day}\n{text}\n" for day, text in entries))
    return store


def texts(hits: list[Hit]) -> list[str]:
    return [hit.block.text.split("\n")[1] for hit in hits]


def standing(store: MemoryStore, policy: MemoryPolicy = NO_PRIORS) -> RerankedSearch:
    return RerankedSearch(KeywordSearch(store), store, lambda: policy)


UPDATES = [
    ("Where does my sister live?", "My sister Claire lives in Lyon; she works at a bakery.",
     "My sister Claire moved to Toronto in August."),
    ("我姐姐住在哪里？", "我姐姐住在成都，在一家银行上班。", "姐姐八月份搬去深圳住了，在一家医院工作。"),
    ("What diet do I follow?", "I follow a vegetarian diet: no meat, but cheese and eggs are fine.",
     "My diet is fully vegan now, no cheese or eggs either."),
    ("我每天怎么去上班？", "我每天骑自行车上班，大概二十五分钟。", "自行车被偷了，这阵子坐公交上班。"),
]


@pytest.mark.parametrize(("question", "old", "new"), UPDATES)
def test_the_newer_of_two_unmarked_entries_ranks_above_the_older(tmp_path: Path, question: str, old: str,
                                                                 new: str) -> None:
    store = memory(tmp_path, [("2025-02-10", old), ("2025-03-01", "I like green tea. 我喜欢绿茶。"),
                              ("2025-09-03", new)])
    before = texts(KeywordSearch(store).search(question, 10))
    assert before.index(old) < before.index(new)  # by relevance alone the older one wins: the case is real
    after = texts(standing(store).search(question, 10))
    assert after.index(new) < after.index(old)  # the older is kept, below the newer
    assert after[-1] == "I like green tea. 我喜欢绿茶。" or "I like green tea. 我喜欢绿茶。" not in after


@pytest.mark.parametrize(("question", "old", "new"), UPDATES)
def test_an_entry_edited_between_searches_is_read_again(tmp_path: Path, question: str, old: str,
                                                        new: str) -> None:
    # What re-ranking reads from a block is kept between searches; an edit must not meet a stale reading.
    store = memory(tmp_path, [("2025-02-10", old), ("2025-09-03", new)])
    search = standing(store)
    assert texts(search.search(question, 10)).index(new) == 0
    # The same text now dated before the older entry: it no longer replaces it, relevance decides again.
    store.rewrite_long_term(f"# Memory\n\n## 2025-02-10\n{old}\n\n## 2025-01-05\n{new}\n")
    assert texts(search.search(question, 10)) == texts(KeywordSearch(store).search(question, 10))
    assert texts(search.search(question, 10)).index(old) == 0


@pytest.mark.parametrize(("question", "old", "new"), [UPDATES[0], UPDATES[1]])
def test_an_entry_the_store_marked_superseded_ranks_below_its_replacement(tmp_path: Path, question: str,
                                                                         old: str, new: str) -> None:
    store = memory_store(tmp_path / "memory", UTC)
    with freeze_time("2025-02-10 08:00:00"):
        store.append_long_term(old)
    with freeze_time("2025-09-03 08:00:00"):
        store.append_long_term(new)
    assert "> superseded by the 2025-09-03 entry" in store.read_long_term()
    hits = standing(store).search(question, 10)
    assert texts(hits) == [new, old]
    assert hits[0].score >= hits[1].score  # scores follow the order


@pytest.mark.parametrize(("question", "first", "second"), [
    # Two entries on one subject that do not contradict: the older, more relevant one keeps its place.
    ("Where does Claire live?", "My sister Claire lives in Lyon.", "Claire's birthday is on 14 March."),
    ("我姐姐住在哪里？", "我姐姐住在成都。", "姐姐的生日是 3 月 14 日。"),
])
def test_a_newer_entry_that_updates_nothing_is_not_moved_up(tmp_path: Path, question: str, first: str,
                                                            second: str) -> None:
    store = memory(tmp_path, [("2025-02-10", first), ("2025-03-02", second)])
    assert texts(standing(store).search(question, 10)) == texts(KeywordSearch(store).search(question, 10))
    assert texts(standing(store).search(question, 10))[0] == first


def test_blocks_of_several_lines_are_excerpts_and_keep_their_order(tmp_path: Path) -> None:
    old = "Ann: my sister lives in Lyon\nBob: nice, Lyon is lovely\nAnn: she loves it there"
    new = "Ann: my sister moved, she lives in Rome now\nBob: oh really"
    store = memory(tmp_path, [("2025-02-10", old), ("2025-09-03", new)])
    plain = KeywordSearch(store).search("where does my sister live in Lyon?", 10)
    assert [h.block for h in standing(store).search("where does my sister live in Lyon?", 10)] == \
        [h.block for h in plain]


def test_recency_is_a_mild_prior_that_policy_switches(tmp_path: Path) -> None:
    # Two entries that share one word only: neither updates the other, so only the priors can reorder them.
    store = memory(tmp_path, [("2025-01-01", "We hiked in the Alps, 20 km. 我们在阿尔卑斯山徒步。"),
                              ("2025-09-01", "Hiking boots: Salomon, size 43. 徒步鞋是 43 码。")])
    policy = NO_PRIORS
    search = RerankedSearch(KeywordSearch(store), store, lambda: policy)
    with freeze_time("2025-09-02"):
        for question in ("hiking", "徒步"):
            plain = texts(KeywordSearch(store).search(question, 10))
            policy = NO_PRIORS
            assert texts(search.search(question, 10)) == plain  # no prior: relevance order exactly
            policy = MemoryPolicy(memory_recency_boost_percent=100)  # read at each search: no restart
            assert texts(search.search(question, 10))[0].startswith("Hiking boots")
            policy = MemoryPolicy()  # the default is mild: no score rises by more than a tenth
            plain_scores = {hit.block: hit.score for hit in KeywordSearch(store).search(question, 10)}
            for hit in search.search(question, 10):
                assert plain_scores[hit.block] <= hit.score <= plain_scores[hit.block] * 1.1 + 1e-9


def test_block_dates_come_from_the_heading_or_the_note_file(tmp_path: Path) -> None:
    store = memory(tmp_path, [("2025-03-04", "A dated entry.")])
    block = KeywordSearch(store).long_term_blocks()[0]
    assert block_date(block) is not None and block_date(block).isoformat() == "2025-03-04"  # type: ignore[union-attr]
    with freeze_time("2025-04-03"):
        assert recency(block_date(block), store.today()) == pytest.approx(0.5)
    assert recency(None, store.today()) == 0.0


def test_blocks_used_often_rank_above_equal_ones(tmp_path: Path) -> None:
    # One shared word: neither entry updates the other.
    store = memory(tmp_path, [("2025-01-01", "Green tea in the morning."),
                              ("2025-01-01", "Tea ceremony 茶道 in Kyoto.")])
    search = standing(store, MemoryPolicy(memory_recency_boost_percent=0, memory_access_boost_percent=50))
    plain = KeywordSearch(store).search("tea", 10)
    second = plain[1].block
    for _ in range(20):
        search.record_injected([second])
    assert search.search("tea", 10)[0].block == second
    assert standing(store).search("tea", 10)[0].block == plain[0].block  # weight 0: counts ignored


def test_async_search_ranks_like_the_sync_one(tmp_path: Path) -> None:
    question, old, new = UPDATES[1]
    store = memory(tmp_path, [("2025-02-10", old), ("2025-09-03", new)])
    search = standing(store)
    assert asyncio.run(search.search_async(question, 10)) == search.search(question, 10)
    assert search.long_term_blocks() == KeywordSearch(store).long_term_blocks()
