"""Query expansion by pseudo-relevance feedback (memory/search/query_expansion.py, bm25.rank with feedback)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from picoclaw.memory.search import Block, Hit, KeywordSearch
from picoclaw.memory.search.bm25 import FileIndex, rank
from picoclaw.memory.search.query_expansion import FEEDBACK_MIN_BLOCKS, feedback_terms
from picoclaw.memory.store import MemoryStore
from picoclaw.memory.terms import terms
from tests.stores import memory_store

SHANGHAI = ZoneInfo("Asia/Shanghai")

# Per language: the query, the best hit (it holds every query word), the entry that answers the question
# with one common query word and the best hit's topic words, one with the topic words only, and short
# entries that hold the common word and nothing of the topic (BM25 alone ranks them above the answer).
CASES = {
    "en": ("family hikes",
           "We took the family hiking and toasted marshmallows over a campfire.",
           "Our family camping weekend: marshmallows and ghost stories by the campfire, every summer without "
           "fail, the best part of the year for all of us.",
           "Marshmallows by a campfire at the lake.",
           ["My family likes pizza.", "Family dinner on Sunday.", "Family photos hang in the hall.",
            "The family car is blue.", "Family game night was fun.", "Our family dog is old.",
            "Family visit in April.", "Family recipes in a box.", "A family wedding soon.",
            "Family bikes in the shed.", "Family trip to Rome.", "The family garden grows beans.",
            "Family jokes at lunch.", "Family movie on Friday.", "Family chores on Saturday.",
            "Family budget for May.", "Family plans for winter.", "Family tree research."]),
    "zh": ("家人徒步",
           "带家人去徒步，在篝火旁烤棉花糖。",
           "全家人的露营周末：篝火旁讲鬼故事、烤棉花糖，每年夏天都不落下，是我们一年里最开心的时候。",
           "湖边的篝火和棉花糖。",
           ["家人爱吃披萨。", "家人周日聚餐。", "家人合照挂在走廊。", "家人的车是蓝色。", "家人游戏之夜。",
            "家人养的狗老了。", "四月家人来访。", "家人的菜谱。", "家人婚礼快到了。", "家人的自行车。",
            "家人去罗马。", "家人种豆子。", "家人午饭说笑。", "家人周五看电影。", "家人周六做家务。",
            "家人五月预算。", "家人冬季计划。", "家人族谱研究。"]),
}
FILLER = {"en": "Nothing to see.", "zh": "无关。"}


def memory(tmp_path: Path, entries: list[str]) -> MemoryStore:
    store = memory_store(tmp_path / "memory", SHANGHAI)
    store.rewrite_long_term("".join(f"## 2025-{1 + n // 28:02d}-{1 + n % 28:02d}\n{text}\n\n"
                                    for n, text in enumerate(entries)))
    return store


def bodies(hits: list[Hit]) -> list[str]:
    return [hit.block.text.split("\n", 1)[1] for hit in hits]


def case_store(tmp_path: Path, lang: str) -> tuple[MemoryStore, str, str, str, str]:
    query, best, answer, topic_only, others = CASES[lang]
    # Under the best hit, an entry of nothing the query holds: its neighbour's share lifts no other entry.
    store = memory(tmp_path, [best, FILLER[lang], *others[:9], answer, topic_only, *others[9:]])
    return store, query, best, answer, topic_only


def ranked(store: MemoryStore, query: str, *, feedback: bool, limit: int = 5) -> list[str]:
    index = FileIndex.build(KeywordSearch(store).long_term_blocks())
    return bodies(rank([index], query, limit, neighbours=0.0, feedback=feedback))


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_best_hits_topic_words_lift_the_answer(tmp_path: Path, lang: str) -> None:
    store, query, best, answer, _ = case_store(tmp_path, lang)
    # Keywords alone: the short entries holding the common word outrank the answer.
    assert answer not in ranked(store, query, feedback=False)
    assert ranked(store, query, feedback=True)[:2] == [best, answer]
    assert bodies(KeywordSearch(store).search(query, 2)) == [best, answer]  # the keyword search expands


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_added_terms_never_add_a_block_that_matches_none_of_the_query(tmp_path: Path, lang: str) -> None:
    store, query, _, _, topic_only = case_store(tmp_path, lang)
    assert topic_only not in bodies(KeywordSearch(store).search(query, 50))


@pytest.mark.parametrize("side", ["above", "below"])
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_block_next_to_the_added_terms_gains_its_neighbours_share(tmp_path: Path, lang: str, side: str) -> None:
    query, best, answer, topic_only, others = CASES[lang]
    twin = others[0]
    filler = FILLER[lang]
    # Two equal entries matching the query, each between entries that do not: only the first has the best
    # hit's topic words next to it (above it or below). On equal scores the later one would come first.
    near = [topic_only, twin, filler] if side == "above" else [filler, twin, topic_only]
    store = memory(tmp_path, [best, filler, *others[1:10], answer, filler, *near, filler, *others[10:],
                              filler, twin, filler])
    twins = [hit.block.start_line for hit in KeywordSearch(store).search(query, 50) if hit.block.text.endswith(twin)]
    assert len(twins) == 2 and twins[0] < twins[1]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_small_memory_is_not_expanded(tmp_path: Path, lang: str) -> None:
    query, best, answer, topic_only, others = CASES[lang]
    entries = [best, *others[:FEEDBACK_MIN_BLOCKS - 4], answer, topic_only]
    small = memory(tmp_path / "small", entries)
    assert ranked(small, query, feedback=True) == ranked(small, query, feedback=False)
    # One more block that matches nothing and the same query is expanded: the answer moves up.
    larger = memory(tmp_path / "larger", [*entries, FILLER[lang]])
    assert ranked(larger, query, feedback=True) != ranked(larger, query, feedback=False)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_part_of_a_large_file_is_not_expanded(tmp_path: Path, lang: str) -> None:
    store, query, _, _, _ = case_store(tmp_path, lang)
    index = FileIndex.build(KeywordSearch(store).long_term_blocks())
    whole = rank([index], query, 5, feedback=True)
    # As large_files.large_index marks the part of a file it indexed: statistics of the whole file given.
    index.doc_freqs = {term: len(found) for term, found in index.postings.items()}
    assert rank([index], query, 5, feedback=True) != whole
    assert rank([index], query, 5, feedback=True) == rank([index], query, 5, feedback=False)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_added_terms_weights_follow_the_blocks_searched(tmp_path: Path, lang: str) -> None:
    # The weights kept per feedback block hold while the same files are searched: daily notes that join the
    # search, or change, make them again (their words' document frequencies move).
    store, query, _, _, topic_only = case_store(tmp_path, lang)
    searcher = KeywordSearch(store)
    alone = searcher.search(query, 10)
    assert alone == KeywordSearch(store).search(query, 10)
    # A dozen entries of the best hit's topic words: they are no longer rare, other words are added instead.
    note = store.append_note("\n\n".join([topic_only] * 12), at=datetime(2025, 6, 1, 9, 0, tzinfo=SHANGHAI))
    with_notes = searcher.search(query, 10, include_notes=True)
    assert with_notes == KeywordSearch(store).search(query, 10, include_notes=True)
    assert [hit.score for hit in with_notes[:3]] != [hit.score for hit in alone[:3]]
    assert searcher.search(query, 10) == alone  # MEMORY.md alone again: as before
    note.write_text(note.read_text(encoding="utf-8").replace(topic_only, FILLER[lang]), encoding="utf-8")
    changed = searcher.search(query, 10, include_notes=True)
    assert changed == KeywordSearch(store).search(query, 10, include_notes=True)
    assert [hit.score for hit in changed[:3]] != [hit.score for hit in with_notes[:3]]


@pytest.mark.parametrize(("text", "rare", "common"),
                         [("marshmallows campfire", "campfir", "marshmallow"), ("棉花 篝火", "篝火", "棉花")])
def test_feedback_terms_prefer_the_rarer_term(text: str, rare: str, common: str) -> None:
    df = {rare: 2, common: 5}
    assert feedback_terms(set(), [Counter(terms(text))], lambda term: df.get(term, 9), 100, limit=2) == [rare, common]


@pytest.mark.parametrize(
    ("text", "frequent", "once"),
    [("marshmallows campfire campfire", "campfir", "marshmallow"), ("棉花 篝火 篝火", "篝火", "棉花")],
)
def test_feedback_terms_prefer_the_term_a_block_repeats(text: str, frequent: str, once: str) -> None:
    found = feedback_terms(set(), [Counter(terms(text))], lambda term: 2, 100, limit=50)
    assert found.index(frequent) < found.index(once)


@pytest.mark.parametrize(("text", "query_term"), [("campfire family", "famili"), ("篝火 家人", "家人")])
def test_feedback_terms_leave_out_the_query_terms(text: str, query_term: str) -> None:
    counts = Counter(terms(text))
    found = feedback_terms({query_term}, [counts], lambda term: 2, 100, limit=50)
    assert query_term not in found and found


@pytest.mark.parametrize(("text", "single"), [("campfire lake", "lake"), ("篝火 湖边", "湖边")])
def test_feedback_terms_leave_out_terms_of_one_block(text: str, single: str) -> None:
    counts = Counter(terms(text))
    found = feedback_terms(set(), [counts], lambda term: 1 if term == single else 3, 100, limit=50)
    assert single not in found and found


def test_feedback_terms_leave_out_lone_chinese_characters_not_latin_letters() -> None:
    counts = Counter(terms("篝火 x"))
    assert set(counts) >= {"篝", "火", "篝火", "x"}
    assert sorted(feedback_terms(set(), [counts], lambda term: 2, 100, limit=50)) == ["x", "篝火"]


@pytest.mark.parametrize("texts", [("campfire lake", "lake campfire"), ("篝火 湖边", "湖边 篝火")])
def test_feedback_terms_on_equal_weight_keep_the_order_of_first_occurrence(texts: tuple[str, str]) -> None:
    for text in texts:
        counts = Counter(terms(text))
        found = feedback_terms(set(), [counts], lambda term: 2, 100, limit=50)
        assert found == [term for term in counts if len(term) > 1 or term.isascii()]


@pytest.mark.parametrize(
    ("before", "text", "heading"),
    [("Alice asked about Lisbon.", "Bob booked the flight.", "## 2025-03-04"),
     ("爱丽丝问起里斯本。", "鲍勃订了机票。", "## 2025-03-04")],
)
def test_a_blocks_own_terms_leave_out_the_previous_block_and_the_date_in_words(
    before: str, text: str, heading: str
) -> None:
    path = Path("MEMORY.md")
    blocks = [Block(path, heading, f"{heading}\n{before}", 1, 2), Block(path, heading, f"{heading}\n{text}", 3, 4)]
    index = FileIndex.build(blocks, with_previous=True)
    own = index.own_terms(1)
    assert own == Counter(terms(f"{heading}\n{text}"))
    assert not set(terms(before)) & set(own)
    assert "march" not in own and "2025年3月" not in own
    assert "march" in index.postings  # the block itself is found by its date in words
