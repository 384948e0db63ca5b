"""A large MEMORY.md: an append adds its entry in place, without copying or backing up the file, and
still finds what is already stored anywhere in it; a crash or a full disk mid-append leaves the old file;
a search of a file over LARGE_FILE reads it a MiB at a time instead of indexing it whole."""

from __future__ import annotations

import logging
import os
import random
import re
import signal
import subprocess
import sys
import tracemalloc
from datetime import date, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from freezegun import freeze_time

import picoclaw
from picoclaw.app import App
from picoclaw.cli import main
from picoclaw.memory.search import KeywordSearch, bm25, keyword, large_files
from picoclaw.memory.search.blocks import entry_blocks
from picoclaw.memory.terms import stem
from tests.stores import memory_store
from tests.zones import SHANGHAI

FROZEN = "2025-03-10 02:00:00"  # 10:00 in Asia/Shanghai, the test homes' timezone (tests/zones.py)
REPO = Path(picoclaw.__file__).resolve().parent.parent
NAMES = "Alice Bob Carol Priya Mateo Hannah Kenji Olga Samir Fatima Lucas Chloe".split()
ZH_NAMES = "张伟 王芳 李娜 刘洋 陈静 杨磊 赵敏 黄勇 周杰 吴霞".split()
PLACES = "Lisbon Tokyo Berlin Nairobi Oslo Seoul Lima Prague 成都 杭州 西安 厦门".split()
FIRST = "## 2020-01-02\nAlice moved the build server to Lisbon; ticket OPS-1001.\n"  # the file's first entry
# Seconds a test: a 2.4 MB MEMORY.md appended to and searched, processes killed mid-append, every word's needle.
pytestmark = pytest.mark.slow


def _entries(count: int, seed: int = 23) -> str:
    rng = random.Random(seed)
    day = date(2020, 1, 2)
    parts = [FIRST]
    for number in range(1, count):
        day += timedelta(days=rng.choice((0, 1)))
        if number % 2:
            text = (f"{rng.choice(NAMES)} booked a trip to {rng.choice(PLACES)} for review {number}, "
                    f"seat {rng.randint(1, 40)}{rng.choice('ABCDEF')}.")
        else:
            text = (f"{rng.choice(ZH_NAMES)}在{rng.choice(PLACES)}吃了火锅，第 {number} 次聚餐，"
                    f"花了 {rng.randint(50, 900)} 元。")
        parts.append(f"## {day.isoformat()}\n{text}\n")
    return "# Long-term memory\n\n" + "\n".join(parts)


@pytest.fixture(scope="module")
def big_text() -> str:
    """About 2.4 MB of entries, English and Chinese: over LARGE_FILE, and over two of the table's MiB blocks."""
    text = _entries(32_000)
    assert len(text.encode("utf-8")) > (2 << 20) + (256 << 10)  # large_files.LARGE_FILE is 2 MiB
    return text


@pytest.fixture
def memory(home: Path, big_text: str) -> Path:
    path = home / "workspace" / "memory" / "MEMORY.md"
    path.write_text(big_text, encoding="utf-8")
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- appending -------------------------------------------------------------------------------------------


@freeze_time(FROZEN)
def test_an_append_adds_the_entry_in_place_without_a_copy_or_a_backup(
        memory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before, inode = memory.read_bytes(), memory.stat().st_ino
    for text in ("Prefers green tea after lunch", "喜欢午饭后喝绿茶"):
        code, out, _ = run(capsys, "memory", "append", text)
        assert code == 0 and out.startswith("appended to")
    # The same file (not a new one renamed over it), its bytes kept as they were, the entries after them.
    assert memory.stat().st_ino == inode
    assert memory.read_bytes() == before + "\n## 2025-03-10\nPrefers green tea after lunch\n\n" \
                                           "## 2025-03-10\n喜欢午饭后喝绿茶\n".encode()
    assert not (memory.parent / "backups").exists() or not list((memory.parent / "backups").iterdir())
    assert run(capsys, "memory", "backups")[1].startswith("no backups yet")


@freeze_time(FROZEN)
def test_what_is_stored_anywhere_is_found_again(memory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = memory.read_bytes()
    # The file's first entry, written again in another case, width and punctuation.
    code, out, _ = run(capsys, "memory", "append", "ALICE moved the build server to Lisbon — ticket OPS－１００１")
    assert (code, out) == (0, f"already stored: {memory}:3 under '## 2020-01-02'; nothing was added\n")
    lines = before.decode("utf-8").splitlines()
    chinese = next(n for n, line in enumerate(lines, start=1) if "第 30000 次聚餐" in line)
    code, out, _ = run(capsys, "memory", "append", lines[chinese - 1].replace("，", ", ").replace("。", "!"))
    assert out == f"already stored: {memory}:{chinese - 1} under '{lines[chinese - 2]}'; nothing was added\n"
    assert memory.read_bytes() == before
    # Once more, from the table the first append made: the same answers.
    assert run(capsys, "memory", "append", "alice moved the build server to lisbon ticket ops 1001")[1].startswith(
        f"already stored: {memory}:3 ")
    assert (memory.parent / ".MEMORY.md.entries").exists()


@freeze_time(FROZEN)
def test_an_edit_by_hand_is_seen_by_the_next_append(memory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "memory", "append", "Owns a bicycle / 有一辆自行车")  # the table now describes the file
    text = memory.read_text(encoding="utf-8")
    # An edit in the middle that moves every later byte: the first entry stays, the rest is rescanned.
    middle = text.index("## ", len(text) // 2)
    edited = text[:middle] + "## 2021-06-01\n手工添加的条目：小明的生日是六月一日\n\n" + text[middle:]
    memory.write_text(edited.replace("Owns a bicycle", "Owns a red bicycle"), encoding="utf-8")
    line = edited[:middle].count("\n") + 1
    assert run(capsys, "memory", "append", "手工添加的条目：小明的生日是六月一日")[1].startswith(
        f"already stored: {memory}:{line} under '## 2021-06-01'")
    assert run(capsys, "memory", "append", "owns a red bicycle / 有一辆自行车")[1].startswith("already stored")
    # The old text is gone: stored again.
    assert run(capsys, "memory", "append", "Owns a bicycle / 有一辆自行车")[1].startswith("appended")
    assert run(capsys, "memory", "append", "ALICE moved the build server to Lisbon, ticket OPS-1001")[1].startswith(
        f"already stored: {memory}:3 ")


@freeze_time(FROZEN)
def test_an_edit_keeping_size_and_time_is_seen_too(memory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "memory", "append", "The spare key is under the blue pot / 备用钥匙在蓝色花盆下")
    info = memory.stat()
    raw = memory.read_bytes()
    at = raw.rindex(b"blue pot")
    with open(memory, "r+b") as handle:  # as an editor saving in place, in the same instant
        handle.seek(at)
        handle.write(b"gray pot")
    os.utime(memory, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert memory.stat().st_size == info.st_size and memory.stat().st_mtime_ns == info.st_mtime_ns
    assert run(capsys, "memory", "append", "the spare key is under the gray pot / 备用钥匙在蓝色花盆下")[1].startswith(
        "already stored")


@freeze_time(FROZEN)
def test_an_update_in_a_large_memory_marks_the_older_entry(memory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "memory", "append", "My locker number is 217 / 我的储物柜是 217 号")
    run(capsys, "memory", "append", "My locker number is 305 / 我的储物柜是 305 号")
    text = memory.read_text(encoding="utf-8")
    assert "我的储物柜是 217 号\n> superseded by the 2025-03-10 entry: My locker number is 305" in text
    # Marking an older entry rewrites the file, so that one change is backed up.
    [backup] = (memory.parent / "backups").iterdir()
    saved = backup.read_text(encoding="utf-8")
    assert saved.endswith("我的储物柜是 217 号\n") and "My locker number is 305" not in saved


@freeze_time(FROZEN)
def test_updates_are_looked_for_among_the_newest_entries_only(
        memory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "memory", "append", "My locker number is 217 / 我的储物柜是 217 号")
    for number in range(3):
        run(capsys, "memory", "append", f"Read chapter {'one two three'.split()[number]} of 三体")
    # The locker entry is the fourth newest: outside a window of the three newest.
    memory_store(memory.parent, ZoneInfo(SHANGHAI), update_window=3).append_long_term(
        "My locker number is 305 / 我的储物柜是 305 号")
    assert "superseded" not in memory.read_text(encoding="utf-8")


# -- a crash, a full disk ----------------------------------------------------------------------------------

CHILD = """
import resource, signal, sys
from picoclaw.cli import main
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
# "crash": the write past the limit kills the process, mid-write. "full": Python ignores the signal, and
# the write fails with EFBIG as it would on a full disk.
signal.signal(signal.SIGXFSZ, signal.SIG_DFL if sys.argv[2] == "crash" else signal.SIG_IGN)
sys.exit(main(["memory", "append", sys.argv[3]]))
"""


def _append_limited(home: Path, limit: int, mode: str, text: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PICOCLAW_HOME": str(home), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", CHILD, str(limit), mode, text], env=env, capture_output=True,
                          text=True, encoding="utf-8", timeout=120)


# No freeze_time around a child process: the timeout of subprocess.run counts on the real clock.
def test_an_append_killed_half_way_is_undone_by_the_next_reader(
        memory: Path, home: Path, caplog: pytest.LogCaptureFixture) -> None:
    with freeze_time(FROZEN):
        assert main(["memory", "append", "First an ordinary entry / 先加一条"]) == 0  # the table is made here
    before = memory.read_bytes()
    entry = "猫" * 30_000 + " cat"  # 90 kB: the process may only grow files by half of it
    done = _append_limited(home, len(before) + 45_000, "crash", entry)
    assert done.returncode == -signal.SIGXFSZ  # killed mid-write, as by a crash
    torn = memory.read_bytes()
    assert torn.startswith(before) and before != torn  # half an entry at the end, for now
    with caplog.at_level(logging.WARNING):
        text = App.open(home).workspace.store.read_long_term()  # any reader (or writer) repairs it first
    assert memory.read_bytes() == before and text == before.decode("utf-8")
    assert any("an append was cut off" in record.getMessage() for record in caplog.records)
    assert not [path for path in memory.parent.iterdir() if path.name.endswith(".append")]
    with freeze_time(FROZEN):
        assert main(["memory", "append", entry]) == 0  # and the next append adds it whole
    assert memory.read_bytes() == before + f"\n## 2025-03-10\n{entry}\n".encode()


def test_a_full_disk_mid_append_leaves_the_file_as_it_was(memory: Path, home: Path) -> None:
    with freeze_time(FROZEN):
        assert main(["memory", "append", "First an ordinary entry / 先加一条"]) == 0
    before = memory.read_bytes()
    done = _append_limited(home, len(before) + 45_000, "full", "狗" * 30_000 + " dog")
    assert done.returncode == 1 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("picoclaw: error: ") and "File too large" in line
    assert memory.read_bytes() == before
    assert not [path for path in memory.parent.iterdir() if path.name.endswith((".append", ".tmp"))]


# -- searching -------------------------------------------------------------------------------------------


def test_a_large_memory_is_searched_without_indexing_it_whole(memory: Path, home: Path) -> None:
    with open(memory, "a", encoding="utf-8") as handle:
        handle.write("\n## 2025-03-01\nThe quokka at the zoo is called Quentin.\n"
                     "\n## 2025-03-02\n我的柯基犬叫豆豆，三岁了。\n")
    total_lines = memory.read_text(encoding="utf-8").count("\n")
    assert memory.stat().st_size > 2 << 20  # over large_files.LARGE_FILE
    retriever = KeywordSearch(App.open(home).workspace.store)
    tracemalloc.start()
    try:
        english = retriever.search("What is the quokka called?", 5)
        chinese = retriever.search("柯基叫什么", 5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The whole file's index takes some 20 bytes per byte of text (here 50 MB); read a MiB at a time, a few MiB.
    assert peak < 12 << 20, peak
    assert english[0].block.text == "## 2025-03-01\nThe quokka at the zoo is called Quentin."
    assert (english[0].block.start_line, english[0].block.end_line) == (total_lines - 4, total_lines - 3)
    assert chinese[0].block.text == "## 2025-03-02\n我的柯基犬叫豆豆，三岁了。"
    assert chinese[0].block.start_line == total_lines - 1
    # Its newest blocks, for a turn without a hit, and a block's neighbours, with their real line numbers.
    tail = retriever.long_term_blocks()
    assert tail[-1] == chinese[0].block and 0 < len(tail) < 32_000
    assert retriever.neighbours(english[0].block, 1, 1)[1:] == [english[0].block, chinese[0].block]


def test_a_large_memory_ranks_as_its_whole_index_does(memory: Path, home: Path) -> None:
    path = memory
    whole = bm25.FileIndex.build(entry_blocks(keyword._read_text(path), path))  # as a search of a smaller file makes it
    # Queries with one best answer (the synthetic entries are otherwise alike: their order is a matter of ties).
    for query in ("a trip for review 31001", "第 31002 次聚餐花了多少", "Who moved the build server to Lisbon?"):
        exact = bm25.rank([whole], query, 5, neighbours=bm25.NEIGHBOUR_WEIGHT)
        streamed = bm25.rank([large_files.large_index(path, query, 5)], query, 5, neighbours=bm25.NEIGHBOUR_WEIGHT)
        assert streamed[0].block == exact[0].block, query
        assert streamed[0].score == pytest.approx(exact[0].score, rel=0.2)


@pytest.mark.parametrize(("first", "asked", "added", "asked_added"), [
    ("The quokka at the zoo is called Quentin.", "What is the quokka called?",
     "The wombat at the zoo is called Wally.", "What is the wombat called?"),
    ("我的柯基犬叫豆豆，三岁了。", "柯基叫什么", "我的鹦鹉叫小绿，会说你好。", "鹦鹉叫什么"),
], ids=["english", "chinese"])
def test_a_large_memory_is_kept_between_searches_until_it_changes(
    memory: Path, home: Path, first: str, asked: str, added: str, asked_added: str
) -> None:
    with open(memory, "a", encoding="utf-8") as handle:
        handle.write(f"\n## 2025-03-01\n{first}\n")
    retriever = KeywordSearch(App.open(home).workspace.store)
    found = retriever.search(asked, 5)
    assert found[0].block.text == f"## 2025-03-01\n{first}"
    kept = retriever.large_cache.get(memory)
    assert kept is not None and kept.holders  # the sections of the query's terms are kept
    # The same question again reads no section anew: what it found is kept, by the file's identity.
    sections = dict(kept._sections)
    assert retriever.search(asked, 5) == found
    assert retriever.large_cache.get(memory) is kept and dict(kept._sections) == sections
    # An append is a new file identity: the new entry is found, at its own line.
    with open(memory, "a", encoding="utf-8") as handle:
        handle.write(f"\n## 2025-03-02\n{added}\n")
    lines = memory.read_text(encoding="utf-8").count("\n")
    found = retriever.search(asked_added, 5)
    assert retriever.large_cache.get(memory) is not kept
    assert found[0].block.text == f"## 2025-03-02\n{added}" and found[0].block.start_line == lines - 1
    # An edit in the middle moves every later line: the old entry is found at its new line.
    text = memory.read_text(encoding="utf-8")
    middle = text.index("## ", len(text) // 2)
    memory.write_text(text[:middle] + "## 2021-06-01\nAn entry added by hand.\n\n" + text[middle:], encoding="utf-8")
    found = retriever.search(asked_added, 5)
    assert found[0].block.text == f"## 2025-03-02\n{added}" and found[0].block.start_line == lines + 2


def test_what_is_kept_answers_as_a_fresh_search_when_its_bounds_drop_some(memory: Path) -> None:
    kept = large_files.LargeMemory.scan(memory)
    assert kept is not None
    kept.held_kept, kept.sections_kept = 2_000, 50  # far below what the queries below find
    queries = ["a trip for review 31001", "第 31002 次聚餐花了多少", "Who moved the build server to Lisbon?",
               "Hannah booked a trip to Oslo", "王芳在成都吃了火锅"]
    for query in queries * 2:
        again = bm25.rank([kept.index(query, 5)], query, 5, neighbours=bm25.NEIGHBOUR_WEIGHT)
        fresh = bm25.rank([large_files.large_index(memory, query, 5)], query, 5, neighbours=bm25.NEIGHBOUR_WEIGHT)
        assert [(hit.block, hit.score) for hit in again] == [(hit.block, hit.score) for hit in fresh], query
    assert (kept._held <= 2_000 or len(kept.holders) == 1) and len(kept._sections) <= 50  # the bounds held
    kept.sections_kept, kept.section_bytes_kept = large_files.SECTIONS_KEPT, 4_000  # few bytes, many sections
    for query in queries:
        again = bm25.rank([kept.index(query, 5)], query, 5, neighbours=bm25.NEIGHBOUR_WEIGHT)
        fresh = bm25.rank([large_files.large_index(memory, query, 5)], query, 5, neighbours=bm25.NEIGHBOUR_WEIGHT)
        assert [(hit.block, hit.score) for hit in again] == [(hit.block, hit.score) for hit in fresh], query
    assert kept._section_bytes == sum(size for _, _, size in kept._sections.values())
    assert kept._section_bytes <= 4_000 or len(kept._sections) == 1


PEAK = """
import re, sys
from pathlib import Path
from picoclaw.cli import main
code = main(sys.argv[1:])
# The peak of this process since it started (its VmHWM), in kB; ru_maxrss would count its parent's too.
print(re.search(r"VmHWM:\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1), file=sys.stderr)
sys.exit(code)
"""


def _peak_mb(home: Path, *argv: str) -> float:
    env = {**os.environ, "PICOCLAW_HOME": str(home), "PYTHONPATH": str(REPO)}
    child = subprocess.run([sys.executable, "-c", PEAK, *argv], env=env, capture_output=True, text=True,
                           encoding="utf-8", timeout=120)
    assert child.returncode == 0 and child.stdout, child.stderr
    return int(child.stderr.split()[-1]) / 1024


def test_search_of_a_large_memory_in_a_process_stays_small(memory: Path, home: Path) -> None:
    small = home / "small"
    small_memory = small / "workspace" / "memory" / "MEMORY.md"
    subprocess.run([sys.executable, "-m", "picoclaw", "onboard"], env={**os.environ, "PICOCLAW_HOME": str(small),
                   "PYTHONPATH": str(REPO)}, capture_output=True, check=True, timeout=120)
    small_memory.write_text("## 2025-03-01\n和朋友在成都吃了火锅 / hot pot in Chengdu\n", encoding="utf-8")
    floor = _peak_mb(small, "memory", "search", "火锅 Lisbon")  # the interpreter and picoclaw themselves
    peak = _peak_mb(home, "memory", "search", "火锅 Lisbon")
    # The whole index of these 2.4 MB alone took some 40 MB more.
    assert peak < floor + 16, (peak, floor)


# -- the prefilter's rule --------------------------------------------------------------------------------

ENDINGS = ("", "s", "es", "ed", "ing", "ly", "ness", "ful", "fulness", "ation", "ational", "ization", "izer",
           "ability", "ibility", "ities", "ity", "ive", "iveness", "ous", "ousness", "ously", "ment", "ence",
           "ance", "ency", "ancy", "alism", "ality", "ally", "ically", "icate", "iciti", "ical", "er", "est")


def test_every_word_holds_the_needle_of_its_term() -> None:
    from picoclaw.memory.prefilter import needle

    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "picoclaw").rglob("*.py"))]
    text = "".join(path.read_text(encoding="utf-8") for path in docs)
    roots = sorted({word.lower() for word in re.findall(r"[A-Za-z]{3,}", text)})
    assert len(roots) > 3000
    special = ["dying", "lying", "tying", "skies", "skis", "idly", "gently", "ugly", "early", "only", "singly",
               "happily", "relational", "generalizations", "possibility", "visibility", "cries", "agreed"]
    for word in special + [root + ending for root in roots for ending in ENDINGS]:
        assert needle(stem(word)) in word, (word, stem(word), needle(stem(word)))
    # CJK text and words that are no stems are their own needles, lower-cased.
    assert needle("猫叫") == "猫叫" and needle("5月") == "5月" and needle("ci-1.example.com") == "ci-1.example.com"
