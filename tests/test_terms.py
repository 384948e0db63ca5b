"""The tokenizer (picoclaw.memory.terms): Snowball stems, question words in queries, dates in words, and `words`."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from picoclaw.memory.index.chunks import DEFAULT_LIMIT, markdown_chunks
from picoclaw.memory.terms import block_dates, block_terms, date_terms, query_terms, stem, terms, words

# -- stemming ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("word", ["running", "runs", "run", "Running"])
def test_english_inflections_share_one_stem(word: str) -> None:
    assert terms(word) == ["run"]


def test_stems_of_nouns_and_verbs() -> None:
    assert terms("paintings painted paints") == ["paint", "paint", "paint"]
    assert terms("adoption adopted") == ["adopt", "adopt"]


def test_chinese_is_not_stemmed_and_latin_words_inside_it_are() -> None:
    # Chinese terms come out as they were written; the English word in the same sentence is stemmed.
    assert terms("他在跑步 running") == ["他在", "在跑", "跑", "跑步", "步", "run"]
    assert stem("跑步") == "跑步"


def test_numbers_and_mixed_words_are_not_stemmed() -> None:
    assert stem("2023") == "2023" and stem("v2s") == "v2s"
    assert terms("ipv6 routes") == ["ipv6", "ipv", "6", "rout"]  # the whole word unstemmed, then its parts


# -- question words ----------------------------------------------------------------------------------------


def test_english_question_words_are_dropped_from_queries_only() -> None:
    query = "What kind of music would Tim likely enjoy? Which songs did he play?"
    assert query_terms(query) == ["music", "tim", "enjoy", "song", "play"]
    # A document keeps them: "kind" may be what the memory is about.
    assert "kind" in terms("Tim is kind to his neighbours.")


def test_chinese_question_words_are_dropped_from_queries_only() -> None:
    # No bigram across a question word either (么时, 候去 would match unrelated text).
    assert query_terms("梅兰妮什么时候去了哪里？") == ["梅", "梅兰", "兰", "兰妮", "妮", "去", "去了"]
    assert query_terms("为什么要搬家呢") == ["要", "要搬", "搬", "搬家", "家"]
    assert "什么" in terms("他问什么时候出发。")


@pytest.mark.parametrize(("query", "expected"), [("what kind?", ["kind"]), ("什么时候？", ["什么", "么时", "时候"])])
def test_a_query_of_only_question_words_keeps_its_terms(query: str, expected: list[str]) -> None:
    assert query_terms(query) == expected


def test_query_terms_are_distinct_and_compared_before_stemming() -> None:
    # "does" is a question word, but "Doe" (stem "doe") is a name to find.
    assert query_terms("Does John Doe run? runs!") == ["john", "doe", "run"]


# -- dates -------------------------------------------------------------------------------------------------


def test_a_date_in_words_in_english_and_chinese() -> None:
    assert date_terms(date(2023, 5, 8)) == ("8", "may", "2023", "2023年", "5", "5月", "8日")
    # Month names go through the same stemmer as the query will.
    assert set(terms("September 2023")) <= set(date_terms(date(2023, 9, 18)))


def test_a_number_against_a_cjk_character_gives_the_pair() -> None:
    assert terms("2023年5月8日") == ["2023", "2023年", "年", "5", "5月", "月", "8", "8日", "日"]
    assert "5月" not in terms("2023年6月5日")


@pytest.mark.parametrize(
    ("heading", "path", "expected"),
    [
        ("## 2023-05-08", Path("MEMORY.md"), [date(2023, 5, 8)]),
        ("## 10:30", Path("memory/202305/20230509.md"), [date(2023, 5, 9)]),
        ("## 2023-05-08", Path("memory/202305/20230509.md"), [date(2023, 5, 8), date(2023, 5, 9)]),
        ("## Preferences", Path("MEMORY.md"), []),
        ("## 2023-02-30", Path("memory/202302/20230230.md"), []),  # no such day: an ordinary word
        ("Notes 2023-05-08", None, []),
    ],
)
def test_block_dates(heading: str, path: Path | None, expected: list[date]) -> None:
    assert block_dates(heading, path) == expected


@pytest.mark.parametrize(
    ("query", "expected"),
    [("in May 2023", {"may", "2023"}), ("8 May 2023", {"8", "may", "2023"}),
     ("2023年5月", {"2023", "2023年", "5", "5月"}), ("2023年5月8日", {"2023年", "5月", "8日"})],
)
def test_date_queries_meet_a_dated_blocks_terms(query: str, expected: set[str]) -> None:
    heading_block = set(block_terms("## 2023-05-08\nWent hiking.", "## 2023-05-08", Path("MEMORY.md")))
    note_block = set(block_terms("## 10:30\n去爬山了。", "## 10:30", Path("memory/202305/20230508.md")))
    undated = set(block_terms("## Hiking\nWent hiking.", "## Hiking", Path("MEMORY.md")))
    assert expected <= set(query_terms(query))
    assert expected <= heading_block and expected <= note_block
    assert not expected & undated


def test_index_chunks_carry_the_same_terms_as_the_plain_retriever() -> None:
    note = Path("memory/202305/20230508.md")
    text = "# 2023-05-08\n\n## 10:30\nWent running with Alice.\n\n## 11:00\n和爱丽丝去跑步了。\n"
    chunks = markdown_chunks(text, note, DEFAULT_LIMIT)
    assert [c.heading for c in chunks] == ["## 10:30", "## 11:00"]  # the title is not a chunk
    for chunk in chunks:
        assert chunk.terms.split() == block_terms(chunk.text, chunk.heading, note)
        assert {"may", "2023", "5月", "8日"} <= set(chunk.terms.split())
    assert "run" in chunks[0].terms.split()


# -- words: what two entries must share to be about one thing ----------------------------------------------


def test_a_character_of_a_longer_cjk_run_is_no_word() -> None:
    assert words("护照") == {"护照"}
    assert words("用户的妹妹是护士") >= {"妹妹", "护士"} and "护" not in words("用户的妹妹是护士")
    assert not words("护照") & words("护士") and not words("护照") & words("照片")
    assert words("图书馆") == {"图书", "书馆"} and not words("图书馆") & words("看书，逛博物馆")


def test_a_character_standing_alone_is_a_word_and_numbers_are_none() -> None:
    assert words("猫，狗") == {"猫", "狗"}
    assert words("locker 217, 5月 ipv6") == {"locker", "ipv6", "ipv", "月"}


def test_english_words_are_its_terms() -> None:
    assert words("My sister Claire lives in Lyon") == {"sister", "clair", "live", "lyon"}
