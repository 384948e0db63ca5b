"""BM25 sums in numpy arrays (memory/search/array_scores.py): the dicts' ranking to the last bit, used only for a
large file searched before."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from picoclaw.memory.search import Block, Hit, KeywordSearch
from picoclaw.memory.search.array_scores import ArrayScores, TermArrays
from picoclaw.memory.search.bm25 import NEIGHBOUR_WEIGHT, DictScores, FileIndex, FileScores, ScoresKind, rank
from picoclaw.memory.search.keyword import ARRAYS_FROM
from tests.stores import memory_store

WORDS = {
    "en": ("family hiking campfire marshmallows deadline project falcon silver kubernetes migration latency "
           "dentist thursday lisbon flight budget offsite redis cache timeout postgres pool priya jenkins").split(),
    "zh": ["家人", "徒步", "篝火", "棉花糖", "项目", "截止", "日期", "数据库", "迁移", "延迟", "牙医", "预约",
           "成都", "高铁", "缓存", "超时", "连接池", "配置", "王芳", "火锅"],
}
QUERIES = {
    "en": ["family hiking", "project falcon deadline", "kubernetes migration latency", "redis cache timeout",
           "dentist on thursday", '"silver falcon"', "nothing matches xylophone"],
    "zh": ["家人徒步", "项目截止日期", "数据库迁移延迟", "缓存超时", "牙医预约", "「成都高铁」", "量子色动力学"],
}


NOTE = {"en": "A picnic by the lighthouse with the family.", "zh": "和家人在灯塔边野餐。"}
NOTE_QUERY = {"en": "picnic lighthouse", "zh": "灯塔野餐"}


def corpus(lang: str, seed: int, blocks: int, path: Path) -> list[Block]:
    """`blocks` look-alike one-line entries (so scores tie often), in one file."""
    rng = random.Random(seed)
    words = WORDS[lang]
    joiner = " " if lang == "en" else "，"
    found = []
    for n in range(blocks):
        heading = f"## 2025-{1 + n // 28 % 12:02d}-{1 + n % 28:02d}"
        text = joiner.join(rng.choice(words) for _ in range(rng.randint(1, 6)))
        found.append(Block(path, heading, f"{heading}\n{text}", 3 * n + 1, 3 * n + 2))
    return found


def ranked(indexes: list[FileIndex], query: str, limit: int, neighbours: float, feedback: bool,
           scores: ScoresKind) -> list[tuple[Block, float]]:
    return [(hit.block, hit.score)
            for hit in rank(indexes, query, limit, neighbours=neighbours, feedback=feedback, scores=scores)]


def first_in_arrays(index: FileIndex, avg_length: float, neighbours: float) -> FileScores:
    """Arrays for the corpus's first file (MEMORY.md), dicts for the others: a search mixes both."""
    kind: ScoresKind = ArrayScores if index.blocks[0].path.name == "MEMORY.md" else DictScores
    return kind(index, avg_length, neighbours)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_arrays_rank_as_the_dicts_do_to_the_last_bit(lang: str, tmp_path: Path) -> None:
    memory = FileIndex.build(corpus(lang, 1, 400, tmp_path / "MEMORY.md"))
    notes = [FileIndex.build(corpus(lang, seed, 30, tmp_path / f"2025-01-0{seed}.md"), with_previous=True)
             for seed in (2, 3)]
    compared = 0
    for indexes in ([memory], [memory, *notes], notes[:1]):
        for query in QUERIES[lang]:
            for limit in (1, 10, 30, 1000):
                for neighbours in (0.0, NEIGHBOUR_WEIGHT):
                    for feedback in (False, True):
                        dicts = ranked(indexes, query, limit, neighbours, feedback, DictScores)
                        arrays = ranked(indexes, query, limit, neighbours, feedback, ArrayScores)
                        mixed = ranked(indexes, query, limit, neighbours, feedback, first_in_arrays)
                        assert arrays == dicts, (query, limit, neighbours, feedback)  # blocks, order, scores
                        assert mixed == dicts, (query, limit, neighbours, feedback)
                        compared += bool(dicts)
    assert compared > 200  # most cases rank something: the comparison is not between empty lists


def search_store(tmp_path: Path, lang: str, blocks: int, notes: int = 0) -> KeywordSearch:
    store = memory_store(tmp_path / "memory", ZoneInfo("Asia/Shanghai"))
    store.rewrite_long_term("".join(f"{block.text}\n\n" for block in corpus(lang, 7, blocks, Path("MEMORY.md"))))
    for day in range(notes):
        for entry in [*corpus(lang, day, 4, Path("note.md")), *corpus(lang, day, 1, Path("note.md"))]:
            store.append_note(entry.text.split("\n", 1)[1], at=datetime(2025, 3, 1 + day, 9, tzinfo=UTC))
        store.append_note(NOTE[lang], at=datetime(2025, 3, 1 + day, 10, tzinfo=UTC))
    return KeywordSearch(store)


def index_of(search: KeywordSearch) -> FileIndex:
    index = search.cache.get(search.store.long_term_path, search.store.local(search.store.long_term_path))
    assert index is not None
    return index


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_large_memory_is_scored_in_arrays_from_its_second_search(lang: str, tmp_path: Path) -> None:
    search = search_store(tmp_path, lang, ARRAYS_FROM)
    query = QUERIES[lang][1]
    first = search.search(query, 10)
    assert first and index_of(search).arrays is None  # one search (a short command) never builds arrays
    second = search.search(query, 10)
    assert index_of(search).arrays is not None
    assert second == first


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_daily_notes_beside_a_large_memory_stay_in_dicts(lang: str, tmp_path: Path) -> None:
    # Each note is a few blocks: numpy's cost per call would outweigh what it saves there.
    search = search_store(tmp_path, lang, ARRAYS_FROM, notes=3)
    first = search.search(NOTE_QUERY[lang], 10, include_notes=True)
    second = search.search(NOTE_QUERY[lang], 10, include_notes=True)
    assert search.search(f"{NOTE_QUERY[lang]} {QUERIES[lang][1]}", 10, include_notes=True)  # all files match
    notes = [search.notes_cache.get(note, file) for note, file in search.store.notes()]
    assert len(notes) == 3 and all(note is not None and note.arrays is None for note in notes)
    assert index_of(search).arrays is not None
    assert first == second and [hit.block.path.name for hit in first][:3] == [note.blocks[0].path.name
                                                                              for note in reversed(notes)]


def test_a_small_memory_is_never_scored_in_arrays(tmp_path: Path) -> None:
    search = search_store(tmp_path, "en", ARRAYS_FROM - 1)
    hits: list[Hit] = []
    for _ in range(3):
        hits = search.search("project falcon deadline", 10)
    assert hits and index_of(search).arrays is None


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_terms_no_block_holds_are_not_kept(lang: str, tmp_path: Path) -> None:
    # A turn searches every daily note: most terms asked are in none of a note's few blocks, and a year of notes
    # kept an entry for each (105 MB after 150 queries over 365 notes). Only terms some block holds are kept.
    note = FileIndex.build(corpus(lang, 3, 6, tmp_path / "2025-01-03.md"), with_previous=True)
    memory = FileIndex.build(corpus(lang, 4, 50, tmp_path / "MEMORY.md"))
    held = set(note.postings)
    for kind in (DictScores, ArrayScores):
        for n in range(40):
            rank([memory, note], f"{QUERIES[lang][n % 5]} word{n} 词{n}", 10, neighbours=NEIGHBOUR_WEIGHT,
                 feedback=True, scores=kind)
    kept = {term for term, _ in note._parts}  # the dicts' per-term cache (FileIndex.weighted_parts)
    assert isinstance(note.arrays, TermArrays)
    kept_in_arrays = set(note.arrays.postings) | {term for term, _ in note.arrays.parts}
    assert kept and kept <= held
    assert kept_in_arrays and kept_in_arrays <= held


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_file_holding_no_word_of_the_query_gets_no_sums(lang: str, tmp_path: Path) -> None:
    # A turn searches every daily note; most hold no word of a given question, and each would cost its sums.
    memory = FileIndex.build(corpus(lang, 5, 60, tmp_path / "MEMORY.md"))
    notes = [FileIndex.build([Block(tmp_path / f"2025010{n}.md", "## 09:00", f"## 09:00\n{NOTE[lang]}", 3, 4)],
                             with_previous=True) for n in range(1, 4)]
    scored: list[FileIndex] = []

    def counting(index: FileIndex, avg_length: float, neighbours: float) -> FileScores:
        scored.append(index)
        return DictScores(index, avg_length, neighbours)

    corpus_ = [memory, *notes]
    found = ranked(corpus_, QUERIES[lang][1], 10, NEIGHBOUR_WEIGHT, True, counting)
    assert found and scored == [memory]  # the notes hold none of its words
    assert found == ranked(corpus_, QUERIES[lang][1], 10, NEIGHBOUR_WEIGHT, True, DictScores)
    scored.clear()
    hits = ranked(corpus_, NOTE_QUERY[lang], 10, NEIGHBOUR_WEIGHT, True, counting)
    assert scored == notes and sorted(block.path.name for block, _ in hits) == ["20250101.md", "20250102.md",
                                                                                  "20250103.md"]
    assert hits == ranked(corpus_, NOTE_QUERY[lang], 10, NEIGHBOUR_WEIGHT, True, DictScores)
