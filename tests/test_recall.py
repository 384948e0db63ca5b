"""What the plain retriever and the index find thanks to the tokenizer and neighbour-aware scoring."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from picoclaw.config import IndexConfig
from picoclaw.memory.index import MemoryIndex
from picoclaw.memory.search import Hit, KeywordSearch
from picoclaw.memory.store import MemoryStore
from tests.stores import memory_store

SHANGHAI = ZoneInfo("Asia/Shanghai")


def memory(tmp_path: Path, text: str) -> MemoryStore:
    store = memory_store(tmp_path / "memory", SHANGHAI)
    store.rewrite_long_term(text)
    return store


def bodies(hits: list[Hit]) -> list[str]:
    return [hit.block.text.split("\n", 1)[1] for hit in hits]


# -- stemming ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("query", ["running", "runs", "Who runs?", "跑步 run"])
def test_inflected_english_finds_the_base_form(tmp_path: Path, query: str) -> None:
    store = memory(tmp_path, "## 2025-03-01\nI run every morning. 每天早上跑步。\n\n"
                             "## 2025-03-02\nI swim on Sundays.\n")
    assert bodies(KeywordSearch(store).search(query, 5)) == ["I run every morning. 每天早上跑步。"]


def test_base_form_finds_inflected_english_inside_chinese_notes(tmp_path: Path) -> None:
    store = memory(tmp_path, "## 2025-03-01\n周末去了两次 hiking trips，爬了香山。\n\n## 2025-03-02\n周末在家看书。\n")
    assert bodies(KeywordSearch(store).search("hike trip", 5)) == ["周末去了两次 hiking trips，爬了香山。"]


# -- question words ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "found"),
    [("What kind of pet might Alice have?", "Alice has a pet corgi."),
     ("宠物是什么？", "宠物是一只柯基。")],
)
def test_question_words_do_not_match_blocks_that_hold_them(tmp_path: Path, query: str, found: str) -> None:
    # Each unrelated block holds the query's question word (kind, 什么): only the pet block may come back.
    store = memory(tmp_path, "## 2025-03-01\nA kind neighbour fixed the fence.\n\n"
                             "## 2025-03-02\nAlice has a pet corgi.\n\n"
                             "## 2025-03-03\n他问什么时候出发。\n\n"
                             "## 2025-03-04\n宠物是一只柯基。\n")
    assert bodies(KeywordSearch(store).search(query, 5)) == [found]


@pytest.mark.parametrize(("query", "found"), [("what kind?", "A kind neighbour fixed the fence."),
                                              ("什么时候？", "他问什么时候出发。")])
def test_a_query_of_only_question_words_still_searches(tmp_path: Path, query: str, found: str) -> None:
    store = memory(tmp_path, "## 2025-03-01\nA kind neighbour fixed the fence.\n\n"
                             "## 2025-03-03\n他问什么时候出发。\n\n## 2025-03-04\n宠物是一只柯基。\n")
    assert bodies(KeywordSearch(store).search(query, 5)) == [found]


# -- dates in words ----------------------------------------------------------------------------------------

DATED = ("# Long-term memory\n\n## 2023-05-08\nWent hiking with Alice. 和爱丽丝去爬山。\n\n"
         "## 2023-06-05\nBought a bike. 买了自行车。\n\n## Preferences\nLikes green tea. 喜欢绿茶。\n")


@pytest.mark.parametrize("query", ["What did I do in May 2023?", "8 May 2023", "2023年5月", "2023年5月8日做了什么"])
def test_a_date_heading_is_found_by_the_date_in_words(tmp_path: Path, query: str) -> None:
    store = memory(tmp_path, DATED)
    hits = KeywordSearch(store).search(query, 5)
    assert hits[0].block.heading == "## 2023-05-08"
    # The other dated entry is of June: "5" (its day) and "2023" alone must not put it level with May.
    assert all(hit.score < hits[0].score for hit in hits[1:])
    assert "May" not in store.long_term_path.read_text(encoding="utf-8")  # the file holds only the ISO date


@pytest.mark.parametrize("query", ["May 2023", "on 8 May 2023", "2023年5月", "2023年5月8日"])
def test_a_daily_note_is_found_by_its_file_date_in_words(tmp_path: Path, query: str) -> None:
    store = memory_store(tmp_path / "memory", SHANGHAI)
    note = store.append_note("Went hiking. 去爬山了。", at=datetime(2023, 5, 8, 10, 30, tzinfo=SHANGHAI))
    store.append_note("Read a book. 看了书。", at=datetime(2023, 6, 5, 21, 0, tzinfo=SHANGHAI))
    hits = KeywordSearch(store).search(query, 5, include_notes=True)
    assert note.name == "20230508.md"
    assert [hit.block.path for hit in hits][:1] == [note]
    assert hits[0].block.heading == "## 10:30"  # the entry, not the note's "# 2023-05-08" title
    assert "May" not in note.read_text(encoding="utf-8")


# -- neighbour-aware scoring -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "context", "near", "far"),
    [("holiday in Lisbon", "We planned the summer holiday.", "Lisbon has good food.", "Lisbon has bad traffic."),
     ("暑假去里斯本", "我们计划了暑假。", "里斯本美食。", "里斯本堵车。")],
)
def test_a_block_next_to_a_match_ranks_above_an_equal_one_far_away(
    tmp_path: Path, query: str, context: str, near: str, far: str
) -> None:
    # `near` and `far` score the same on their own; on equal scores the later block (`far`) would win.
    store = memory(tmp_path, f"## 2025-03-01\n{context}\n\n## 2025-03-01\n{near}\n\n"
                             f"## 2025-03-02\nDentist at nine. 九点看牙医。\n\n## 2025-03-01\n{far}\n")
    assert bodies(KeywordSearch(store).search(query, 3)) == [context, near, far]
    assert bodies(KeywordSearch(store, neighbour_weight=0.0).search(query, 3)) == [context, far, near]


@pytest.mark.parametrize(
    ("query", "question", "answer"),
    [("summer holiday plans", "Alice: Where shall we go for the summer holiday?", "Bob: Lisbon, definitely."),
     ("暑假计划", "爱丽丝：暑假计划去哪里玩？", "鲍勃：当然是里斯本。")],
)
def test_a_note_entry_is_found_with_the_entry_before_it(
    tmp_path: Path, query: str, question: str, answer: str
) -> None:
    store = memory_store(tmp_path / "memory", SHANGHAI)
    for minute, text in enumerate([question, answer, "Carol: 天气不错 nice weather."]):
        store.append_note(text, at=datetime(2025, 3, 9, 10, minute, tzinfo=SHANGHAI))
    found = bodies(KeywordSearch(store).search(query, 5, include_notes=True))
    # The answer holds none of the query's words: the question just before it brings it along.
    assert found == [question, answer]


def test_a_block_that_matches_nothing_is_not_returned_for_its_neighbours(tmp_path: Path) -> None:
    store = memory(tmp_path, "## 2025-03-01\n宠物狗叫 Bob。\n\n## 2025-03-02\n住在上海浦东。\n\n"
                             "## 2025-03-03\nMy dog is a corgi.\n")
    assert bodies(KeywordSearch(store).search("我的狗叫什么", 10)) == ["宠物狗叫 Bob。"]
    assert bodies(KeywordSearch(store).search("corgi", 10)) == ["My dog is a corgi."]


def test_neighbours_of_a_hit_in_file_order(tmp_path: Path) -> None:
    store = memory(tmp_path, "# Long-term memory\n\nIntro.\n\n## 2025-03-01\nOne 一\n\n## 2025-03-02\nTwo 二\n\n"
                             "Two, second paragraph 二之二\n\n## 2025-03-03\nThree 三\n")
    retriever = KeywordSearch(store)
    hit = retriever.search("二之二", 1)[0].block
    assert bodies([Hit(b, 0) for b in retriever.neighbours(hit)]) == ["Two 二", "Two, second paragraph 二之二",
                                                                      "Three 三"]
    first = retriever.search("One", 1)[0].block
    assert bodies([Hit(b, 0) for b in retriever.neighbours(first, before=2, after=2)]) == [
        "One 一", "Two 二", "Two, second paragraph 二之二"]  # the intro is not a block
    store.rewrite_long_term("## 2025-03-05\nSomething else 别的\n")
    assert retriever.neighbours(first) == []  # the block is gone from the file


def test_neighbours_in_a_daily_note_leave_out_its_title(tmp_path: Path) -> None:
    store = memory_store(tmp_path / "memory", SHANGHAI)
    for minute, text in enumerate(["早上跑步", "Lunch with Alice", "晚上看书"]):
        store.append_note(text, at=datetime(2025, 3, 9, 8, minute, tzinfo=SHANGHAI))
    retriever = KeywordSearch(store)
    first = retriever.search("跑步", 1, include_notes=True)[0].block
    assert [b.heading for b in retriever.neighbours(first, before=2, after=1)] == ["## 08:00", "## 08:01"]


# -- the index uses the same terms -------------------------------------------------------------------------


@pytest.fixture
def index(tmp_path: Path) -> Iterator[MemoryIndex]:
    store = memory_store(tmp_path / "memory", SHANGHAI)
    store.rewrite_long_term("## 2023-06-05\nI run every morning. 每天早上跑步。\n")
    store.append_note("Went hiking. 去爬山了。", at=datetime(2023, 5, 8, 10, 30, tzinfo=SHANGHAI))
    store.append_note("What kind of day: 什么都没做。", at=datetime(2023, 7, 1, 9, 0, tzinfo=SHANGHAI))
    index = MemoryIndex(store, IndexConfig(enabled=True, sources=["memory", "notes"]), None,
                        sessions_dir=tmp_path / "sessions")
    index.sync()
    yield index
    index.close()


@pytest.mark.parametrize(
    ("query", "found"),
    [("runs", "I run every morning. 每天早上跑步。"), ("在2023年5月做了什么", "Went hiking. 去爬山了。"),
     ("What kind of thing in May 2023?", "Went hiking. 去爬山了。"),
     ("2023年6月", "I run every morning. 每天早上跑步。")],
)
def test_the_index_finds_stems_and_dates_and_ignores_question_words(index: MemoryIndex, query: str, found: str) -> None:
    assert bodies(index.search(query, 5))[:1] == [found]


def test_an_index_made_with_older_terms_is_re_tokenised(index: MemoryIndex) -> None:
    # As an index written before stems and date words: unstemmed terms, and the chunking key of then.
    with sqlite3.connect(index.path) as conn:
        conn.execute("UPDATE meta SET value = 'o200k:400:2' WHERE key = 'chunking'")
        conn.execute("DELETE FROM chunks_fts")
        conn.execute("INSERT INTO chunks_fts(rowid, terms) SELECT id, lower(text) FROM chunks")
    conn.close()
    index.mark_changed(index.store.long_term_path)
    index.sync()
    # Both need the new terms in the index: the stem "hike", the date words of the note's file name.
    assert bodies(index.search("hiking", 5)) == ["Went hiking. 去爬山了。"]
    assert bodies(index.search("2023年5月", 5))[:1] == ["Went hiking. 去爬山了。"]
