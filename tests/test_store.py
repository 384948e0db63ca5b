"""MemoryStore: MEMORY.md entries, daily notes by local date, backups, restore, and refused input."""

from __future__ import annotations

from datetime import date, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from freezegun import freeze_time

from picoclaw import clock
from picoclaw.errors import MemoryStoreError, PicoclawError
from picoclaw.memory.entries import MAX_ENTRY_CHARS
from picoclaw.memory.search import split_blocks
from picoclaw.memory.store import MemoryStore
from picoclaw.memory.workspace import Workspace
from tests.stores import memory_store

SHANGHAI = ZoneInfo("Asia/Shanghai")  # UTC+8, no daylight saving time
UTC = ZoneInfo("UTC")
COFFEE = "我的咖啡偏好是无糖拿铁"


@pytest.fixture
def memory_dir(tmp_path: Path) -> Path:
    return tmp_path / "memory"


@pytest.fixture
def store(memory_dir: Path) -> MemoryStore:
    """A store in Asia/Shanghai, the timezone of the test homes (tests/zones.py)."""
    return memory_store(memory_dir, SHANGHAI, backup_keep=50)


def _section_headings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("## ")]


# -- MEMORY.md entries -----------------------------------------------------------------------------


@freeze_time("2026-03-10 02:00:00")  # 10:00 in Shanghai
def test_entries_have_a_date_heading_and_a_blank_line_between(store: MemoryStore) -> None:
    assert store.read_long_term() == ""  # no file yet is not an error
    first = store.append_long_term(COFFEE).text
    assert first == f"## 2026-03-10\n{COFFEE}\n"
    second = store.append_long_term("  Lives in Hangzhou.\r\nWorks remotely.  \n\n").text
    assert second == "## 2026-03-10\nLives in Hangzhou.\nWorks remotely.\n"
    assert store.long_term_path == store.memory_dir / "MEMORY.md"
    assert store.long_term_path.read_text(encoding="utf-8") == first + "\n" + second


@freeze_time("2026-03-10 02:00:00")
def test_entry_follows_a_hand_written_preamble(store: MemoryStore) -> None:
    store.memory_dir.mkdir(parents=True)
    # A person edited the file and left extra blank lines at its end.
    store.long_term_path.write_text("# Long-term memory\n\nAbout the user.\n\n\n", encoding="utf-8")
    store.append_long_term("Prefers tea in the evening.")
    assert store.read_long_term() == (
        "# Long-term memory\n\nAbout the user.\n\n## 2026-03-10\nPrefers tea in the evening.\n"
    )


def test_entry_date_is_the_local_date_in_the_configured_timezone(memory_dir: Path) -> None:
    # 17:00 UTC on 31 March is already 01:00 on 1 April in Shanghai.
    with freeze_time("2026-03-31 17:00:00"):
        shanghai = memory_store(memory_dir / "sh", SHANGHAI).append_long_term("x").text
        utc = memory_store(memory_dir / "utc", UTC).append_long_term("x").text
    assert shanghai.startswith("## 2026-04-01\n")
    assert utc.startswith("## 2026-03-31\n")


@pytest.mark.parametrize(
    "content",
    [
        "intro\n## not a new block\nmore",
        "# A title line\nbody",
        "body\n##",  # a bare "##" as the last line
        "body\r## after a lone carriage return",
        "body\u2028## after a Unicode line separator",
        "body\r\n## after CRLF\n### already deeper",
    ],
)
def test_heading_lines_inside_an_entry_keep_it_one_block(store: MemoryStore, content: str) -> None:
    store.append_long_term("an earlier entry")
    entry = store.append_long_term(content).text
    text = store.read_long_term()
    assert text.endswith(entry)  # what was written is what the file holds
    assert len(_section_headings(text)) == 2  # one per entry: the date headings only
    blocks = split_blocks(text, store.long_term_path)
    assert len(blocks) == 2
    assert blocks[1].heading == f"## {store.today().isoformat()}"
    assert "###" in blocks[1].text  # demoted, not dropped
    assert "### already deeper" in text or "already deeper" not in content


def test_chinese_content_round_trips_exactly_as_utf8(store: MemoryStore) -> None:
    content = "用户喜欢：无糖拿铁☕，周末去西湖散步。\n「引号」与全角符号——保持原样 🎉"
    entry = store.append_long_term(content).text
    raw = store.long_term_path.read_bytes()
    assert raw == entry.encode("utf-8")
    assert store.read_long_term().endswith(content + "\n")

    rewritten = "# 记忆\n\n## 2026-01-01\n" + content + "\n"
    backup = store.rewrite_long_term(rewritten)
    assert store.long_term_path.read_bytes() == rewritten.encode("utf-8")
    assert backup is not None and backup.read_bytes() == raw

    note = store.append_note(content)
    assert note.read_text(encoding="utf-8").endswith(content + "\n")


# -- refused input ---------------------------------------------------------------------------------


def _snapshot(store: MemoryStore) -> tuple[bytes, list[str]]:
    return store.long_term_path.read_bytes(), [path.name for path in store.backups()]


@pytest.mark.parametrize("content", ["", "   ", " \n\t\r\n  ", "\u3000\n"])
def test_empty_entry_is_refused_and_nothing_changes(store: MemoryStore, content: str) -> None:
    store.append_long_term("existing entry")
    store.append_long_term("second entry")  # so there is a backup whose list must not grow
    before = _snapshot(store)
    with pytest.raises(MemoryStoreError, match="empty"):
        store.append_long_term(content)
    assert _snapshot(store) == before


def test_over_long_entry_is_refused_and_nothing_changes(store: MemoryStore) -> None:
    store.append_long_term("existing entry")
    before = _snapshot(store)
    with pytest.raises(MemoryStoreError, match="too long") as caught:
        store.append_long_term("记" * (MAX_ENTRY_CHARS + 1))
    assert isinstance(caught.value, PicoclawError)  # shown to the user as one line
    assert "\n" not in str(caught.value)
    assert _snapshot(store) == before


def test_entry_of_exactly_the_limit_is_accepted(store: MemoryStore) -> None:
    # Surrounding whitespace does not count against the limit.
    entry = store.append_long_term("  " + "x" * MAX_ENTRY_CHARS + "\n\n").text
    assert entry.count("x") == MAX_ENTRY_CHARS
    assert store.read_long_term() == entry


def test_refused_note_creates_no_file(store: MemoryStore) -> None:
    with pytest.raises(MemoryStoreError):
        store.append_note("  \n ")
    with pytest.raises(MemoryStoreError):
        store.append_note("x" * (MAX_ENTRY_CHARS + 1))
    assert store.note_files() == []


# -- daily notes -----------------------------------------------------------------------------------


@freeze_time("2026-03-10 02:05:00")  # 10:05 in Shanghai
def test_daily_note_path_and_entry_format(store: MemoryStore) -> None:
    path = store.append_note("Asked about latte recipes.")
    assert path == store.memory_dir / "202603" / "20260310.md"
    assert path.read_text(encoding="utf-8") == "# 2026-03-10\n\n## 10:05\nAsked about latte recipes.\n"


def test_daily_notes_across_a_month_boundary(store: MemoryStore) -> None:
    # Local (Shanghai) 2026-01-31 23:30 is 15:30 UTC.
    with freeze_time("2026-01-31 15:30:00") as frozen:
        january = store.append_note("late-night note")
        first_entry = store.append_long_term("January fact").text
        frozen.move_to("2026-01-31 16:10:00")  # 00:10 on 1 February in Shanghai
        february = store.append_note("just after midnight")
        second_entry = store.append_long_term("February fact").text
        recent = store.read_recent_notes(2)

    assert january == store.memory_dir / "202601" / "20260131.md"
    assert february == store.memory_dir / "202602" / "20260201.md"
    assert january.read_text(encoding="utf-8") == "# 2026-01-31\n\n## 23:30\nlate-night note\n"
    assert february.read_text(encoding="utf-8") == "# 2026-02-01\n\n## 00:10\njust after midnight\n"
    assert first_entry.startswith("## 2026-01-31\n")
    assert second_entry.startswith("## 2026-02-01\n")
    assert [note.day for note in recent] == [date(2026, 1, 31), date(2026, 2, 1)]
    assert store.note_files() == [january, february]


def test_the_notes_listed_are_the_folders_as_it_is_now(store: MemoryStore) -> None:
    march = store.append_note("三月的笔记 / a March note", at=datetime(2026, 3, 2, 9, 0, tzinfo=SHANGHAI))
    january = store.append_note("一月的笔记 / a January note", at=datetime(2026, 1, 5, 9, 0, tzinfo=SHANGHAI))
    # Only YYYYMM/YYYYMMDD.md counts: not a file named like a month, a note in a folder of another name, or
    # a name of the wrong length.
    (store.memory_dir / "202612").write_text("not a folder", encoding="utf-8")
    (store.memory_dir / "notes").mkdir()
    (store.memory_dir / "notes" / "20260210.md").write_text("elsewhere", encoding="utf-8")
    (store.memory_dir / "202601" / "2026011.md").write_text("short", encoding="utf-8")
    (store.memory_dir / "202601" / "20260106.md.bak").write_text("backup", encoding="utf-8")
    # Nor a link named like a month that loops, or that leads through a file: skipped, as by pathlib's glob.
    (store.memory_dir / "202609").symlink_to("202609")
    (store.memory_dir / "202610").symlink_to("202612/x")
    assert store.notes() == [(january, january), (march, march)]
    assert store.notes() == [(january, january), (march, march)]  # asked again: the same, from the folder
    january.unlink()
    february = store.append_note("二月 / February", at=datetime(2026, 2, 14, 9, 0, tzinfo=SHANGHAI))
    assert store.note_files() == [february, march]  # gone and added: seen at once


@freeze_time("2026-03-31 17:00:00")
def test_daily_note_uses_the_local_date_of_the_configured_timezone(memory_dir: Path) -> None:
    # Still 31 March in UTC, already 1 April in Shanghai.
    shanghai = memory_store(memory_dir / "sh", SHANGHAI)
    path = shanghai.append_note("早上好")
    assert path == memory_dir / "sh" / "202604" / "20260401.md"
    assert path.read_text(encoding="utf-8") == "# 2026-04-01\n\n## 01:00\n早上好\n"
    assert shanghai.append_long_term("早上好").text.startswith("## 2026-04-01\n")

    utc = memory_store(memory_dir / "utc", UTC)
    assert utc.append_note("good evening") == memory_dir / "utc" / "202603" / "20260331.md"


def test_note_at_an_explicit_moment_is_filed_by_its_local_time(store: MemoryStore) -> None:
    # 23:50 in New York on 9 March is 11:50 on 10 March in Shanghai (EDT, UTC-4).
    moment = datetime(2026, 3, 9, 23, 50, tzinfo=ZoneInfo("America/New_York"))
    path = store.append_note("from a traveller", at=moment)
    assert path == store.memory_dir / "202603" / "20260310.md"
    assert "## 11:50\nfrom a traveller\n" in path.read_text(encoding="utf-8")


def test_later_notes_of_a_day_are_appended_in_order(store: MemoryStore) -> None:
    day = datetime(2026, 3, 10, 9, 0, tzinfo=SHANGHAI)
    store.append_note("one", at=day)
    path = store.append_note("two", at=day.replace(hour=21, minute=45))
    assert path.read_text(encoding="utf-8") == "# 2026-03-10\n\n## 09:00\none\n\n## 21:45\ntwo\n"


def test_read_recent_notes_returns_the_last_n_days_oldest_first(store: MemoryStore) -> None:
    for day in (1, 2, 3, 4, 6, 7):  # nothing on the 5th; the 7th is "tomorrow" below
        store.append_note(f"note of March {day}", at=datetime(2026, 3, day, 12, 0, tzinfo=SHANGHAI))

    with freeze_time("2026-03-06 04:00:00"):  # 12:00 on 6 March in Shanghai
        three = store.read_recent_notes(3)
        one = store.read_recent_notes(1)
        none = store.read_recent_notes(0)
        thirty = store.read_recent_notes(30)

    # 4th, (5th missing), 6th: a missing day is skipped, not replaced by an older one.
    assert [note.day for note in three] == [date(2026, 3, 4), date(2026, 3, 6)]
    assert three[0].path == store.memory_dir / "202603" / "20260304.md"
    assert three[0].text == "# 2026-03-04\n\n## 12:00\nnote of March 4\n"
    assert [note.day for note in one] == [date(2026, 3, 6)]
    assert none == []
    # Never a note from after today.
    assert [note.day.day for note in thirty] == [1, 2, 3, 4, 6]


def test_read_recent_notes_crosses_into_the_previous_month(store: MemoryStore) -> None:
    for moment in (datetime(2026, 2, 27, 8, 0), datetime(2026, 2, 28, 8, 0), datetime(2026, 3, 1, 8, 0)):
        store.append_note(f"note {moment.date()}", at=moment.replace(tzinfo=SHANGHAI))
    with freeze_time("2026-03-01 00:00:00"):  # 08:00 on 1 March in Shanghai
        recent = store.read_recent_notes(2)
    assert [(note.day, note.text.splitlines()[-1]) for note in recent] == [
        (date(2026, 2, 28), "note 2026-02-28"),
        (date(2026, 3, 1), "note 2026-03-01"),
    ]


# -- backups ---------------------------------------------------------------------------------------


@freeze_time("2026-03-10 02:00:00")
def test_no_backup_before_memory_md_exists(store: MemoryStore) -> None:
    store.append_long_term("first")
    assert store.backups() == []
    assert not store.backups_dir.exists() or list(store.backups_dir.iterdir()) == []


def test_first_rewrite_has_nothing_to_back_up(store: MemoryStore) -> None:
    assert store.rewrite_long_term("fresh") is None
    assert store.read_long_term() == "fresh"


@freeze_time("2026-03-10 02:00:00")  # one frozen second; names are in UTC, whatever the timezone
def test_every_rewrite_is_backed_up_with_unique_names_within_one_second(store: MemoryStore) -> None:
    store.rewrite_long_term("## 2026-03-10\none\n")
    versions = []
    for content in ("two", "三", "four"):
        versions.append(store.read_long_term())
        store.rewrite_long_term(f"{store.read_long_term()}\n## 2026-03-10\n{content}\n")
    backups = store.backups()
    assert [path.name for path in backups] == [
        "20260310_020000Z_MEMORY.md",
        "20260310_020000Z_1_MEMORY.md",
        "20260310_020000Z_2_MEMORY.md",
    ]
    # Each backup is MEMORY.md as it was just before that change.
    assert [path.read_text(encoding="utf-8") for path in backups] == versions
    assert store.read_long_term().count("## 2026-03-10") == 4


@freeze_time("2026-03-10 02:00:00")
def test_an_append_takes_no_backup(store: MemoryStore) -> None:
    # An appended entry is undone by deleting it: copying the whole file for each one is what made appends
    # to a large MEMORY.md slow. Rewrites still back it up (above).
    for content in ("one", "二", "three / 三"):
        store.append_long_term(content)
    assert store.backups() == []
    assert store.read_long_term() == "## 2026-03-10\none\n\n## 2026-03-10\n二\n\n## 2026-03-10\nthree / 三\n"


def test_rewrite_returns_the_backup_of_the_previous_text(store: MemoryStore) -> None:
    with freeze_time("2026-03-10 02:00:00"):
        store.rewrite_long_term("version A\n")
    with freeze_time("2026-03-10 02:00:07"):
        backup = store.rewrite_long_term("version B\n")
    assert backup == store.backups_dir / "20260310_020007Z_MEMORY.md"
    assert backup.read_text(encoding="utf-8") == "version A\n"
    assert store.read_long_term() == "version B\n"


def test_backups_are_pruned_to_backup_keep_oldest_first(memory_dir: Path) -> None:
    store = memory_store(memory_dir, SHANGHAI, backup_keep=3)
    before_change: dict[str, str] = {}
    with freeze_time("2026-03-10 02:00:00") as frozen:
        store.rewrite_long_term("v0")
        for number in range(1, 7):
            frozen.tick(1)
            previous = store.read_long_term()
            backup = store.rewrite_long_term(f"v{number}")
            assert backup is not None
            before_change[backup.name] = previous
    # A stray file in backups/ is not a backup and must survive pruning.
    (store.backups_dir / "README.txt").write_text("mine", encoding="utf-8")
    with freeze_time("2026-03-10 02:00:10"):
        store.rewrite_long_term("v7")

    remaining = store.backups()
    assert [path.name for path in remaining] == [
        "20260310_020005Z_MEMORY.md",
        "20260310_020006Z_MEMORY.md",
        "20260310_020010Z_MEMORY.md",
    ]
    assert [path.read_text(encoding="utf-8") for path in remaining] == ["v4", "v5", "v6"]
    assert before_change["20260310_020005Z_MEMORY.md"] == "v4"
    assert (store.backups_dir / "README.txt").read_text(encoding="utf-8") == "mine"


@freeze_time("2026-03-10 02:00:00")
def test_pruning_within_one_second_keeps_the_highest_counters(memory_dir: Path) -> None:
    store = memory_store(memory_dir, SHANGHAI, backup_keep=3)
    store.rewrite_long_term("v0")
    for number in range(1, 13):  # 12 backups in one second: counters 0..11
        store.rewrite_long_term(f"v{number}")
    remaining = store.backups()
    # Counter 10 sorts after 9 (as text it would sort before 2 and be pruned too early).
    assert [path.name for path in remaining] == [
        "20260310_020000Z_9_MEMORY.md",
        "20260310_020000Z_10_MEMORY.md",
        "20260310_020000Z_11_MEMORY.md",
    ]
    assert [path.read_text(encoding="utf-8") for path in remaining] == ["v9", "v10", "v11"]
    assert sorted(p.name for p in store.backups_dir.iterdir()) == sorted(p.name for p in remaining)


def test_restore_backup_backs_up_the_current_file_first(store: MemoryStore) -> None:
    with freeze_time("2026-03-10 02:00:00"):
        store.rewrite_long_term("# 记忆\n\n## 2026-03-10\n原来的版本\n")
    with freeze_time("2026-03-10 02:00:01"):
        old = store.rewrite_long_term("a bad rewrite\n")
    assert old is not None
    with freeze_time("2026-03-10 02:00:02"):
        safety = store.restore_backup(old.name)

    assert store.long_term_path.read_bytes() == old.read_bytes()
    assert store.read_long_term() == "# 记忆\n\n## 2026-03-10\n原来的版本\n"
    assert safety == store.backups_dir / "20260310_020002Z_MEMORY.md"
    assert safety.read_text(encoding="utf-8") == "a bad rewrite\n"  # the restore can itself be undone
    assert store.backups() == [old, safety]


@pytest.mark.parametrize(
    "name",
    [
        "../../etc/passwd",
        "/etc/passwd",
        "../MEMORY.md",
        "../outside_MEMORY.md",
        "backups/20260310_100000_MEMORY.md",
        "20260310_100000_MEMORY.md/../../MEMORY.md",
        "20991231_235959_MEMORY.md",
        "",
        ".",
    ],
)
def test_restore_rejects_unknown_and_hostile_names(store: MemoryStore, name: str) -> None:
    with freeze_time("2026-03-10 02:00:00"):
        store.rewrite_long_term("v1\n")
        store.rewrite_long_term("v2\n")
    # A file outside backups/ that a "../" name could reach.
    (store.memory_dir / "outside_MEMORY.md").write_text("attacker", encoding="utf-8")
    before = _snapshot(store)
    with pytest.raises(MemoryStoreError, match="no backup named"):
        store.restore_backup(name)
    assert _snapshot(store) == before


def test_restore_rejects_an_absolute_path_to_a_real_backup(store: MemoryStore) -> None:
    with freeze_time("2026-03-10 02:00:00"):
        store.rewrite_long_term("v1\n")
        backup = store.rewrite_long_term("v2\n")
    assert backup is not None
    before = _snapshot(store)
    with pytest.raises(MemoryStoreError):
        store.restore_backup(str(backup))  # a name is asked for, not a path
    assert _snapshot(store) == before


def test_restore_without_any_backups_is_an_error(store: MemoryStore) -> None:
    with pytest.raises(MemoryStoreError):
        store.restore_backup("20260310_100000_MEMORY.md")
    assert not store.long_term_path.exists()


# -- wiring ----------------------------------------------------------------------------------------


def test_workspace_store_uses_the_configured_memory_folder(workspace: Workspace) -> None:
    store = workspace.store
    assert store.memory_dir == workspace.root / "memory"
    assert store.backup_keep == workspace.config.memory.backup_keep
    store.append_long_term(COFFEE)
    assert COFFEE in (workspace.root / "memory" / "MEMORY.md").read_text(encoding="utf-8")
    # Real clock here: read it on both sides, in case the test runs across midnight.
    before = datetime.now(UTC).astimezone(workspace.tz).date()
    today = store.today()
    after = datetime.now(UTC).astimezone(workspace.tz).date()
    assert today in (before, after)


# -- backups are ordered by time, whatever the timezone ----------------------------------------------


def test_changing_the_timezone_keeps_the_newest_backup(memory_dir: Path) -> None:
    with freeze_time("2026-03-10 02:00:00") as frozen:
        shanghai = memory_store(memory_dir, SHANGHAI, backup_keep=50)
        for number in range(52):
            frozen.tick(1)
            shanghai.rewrite_long_term(f"{shanghai.read_long_term()}fact {number}\n")
        # 10:00 in Shanghai is 03:00 in Berlin: local-time names would file the next backup as the oldest.
        berlin = memory_store(memory_dir, ZoneInfo("Europe/Berlin"), backup_keep=50)
        frozen.tick(1)
        before_last = berlin.read_long_term()
        berlin.rewrite_long_term(f"{before_last}fact 52\n")
        newest = berlin.backups()[-1]
        assert len(berlin.backups()) == 50
        assert newest.read_text(encoding="utf-8") == before_last  # not pruned as it was written
        frozen.tick(1)
        berlin.restore_backup(newest.name)
    assert "fact 51" in berlin.read_long_term()


def test_a_daylight_saving_fall_back_does_not_reorder_backups(memory_dir: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    store = memory_store(memory_dir, ZoneInfo("Europe/Berlin"), backup_keep=2)

    def at(utc: str) -> None:
        # Real datetimes, not freezegun's: its astimezone drops `fold`, the bit that tells the repeated hour apart.
        moment = datetime.fromisoformat(utc)
        monkeypatch.setattr(clock, "now", lambda tz=None: moment.astimezone(tz) if tz is not None else moment)

    at("2026-10-25T00:00:00+00:00")
    store.rewrite_long_term("v0")
    at("2026-10-25T00:30:00+00:00")  # 02:30 summer time
    store.rewrite_long_term("v1")
    at("2026-10-25T00:59:00+00:00")  # 02:59 summer time
    store.rewrite_long_term("v2")
    at("2026-10-25T01:10:00+00:00")  # 02:10 winter time: earlier on the wall clock, yet later
    newest = store.rewrite_long_term("v3")
    assert [path.read_text(encoding="utf-8") for path in store.backups()] == ["v1", "v2"]
    assert store.backups()[-1] == newest


def test_a_legacy_backup_named_in_the_future_does_not_push_out_the_new_one(memory_dir: Path) -> None:
    store = memory_store(memory_dir, SHANGHAI, backup_keep=2)
    store.rewrite_long_term("v0")
    store.backups_dir.mkdir(parents=True, exist_ok=True)
    # Written by an older picoclaw in a local time now unknown, the name claims a far-future moment.
    legacy = store.backups_dir / "20991231_235959_MEMORY.md"
    legacy.write_text("legacy", encoding="utf-8")
    first = store.rewrite_long_term("v1")
    second = store.rewrite_long_term("v2")
    assert first is not None and second is not None
    assert store.backups() == [first, second]  # the legacy file was the oldest, so it was pruned
    assert [path.read_text(encoding="utf-8") for path in store.backups()] == ["v0", "v1"]


def test_an_entry_is_edited_or_deleted_only_as_it_was_read(store: MemoryStore) -> None:
    from picoclaw.errors import MemoryStoreError
    from picoclaw.memory.entries import entry_version, long_term_entries

    store.append_long_term("I live in Lisbon")
    store.append_long_term("我的柯基叫豆豆")
    store.append_long_term("Dentist on Friday")
    first, corgi, dentist = list(long_term_entries(store.read_long_term()))
    backup = store.replace_long_term_entry(corgi.line, entry_version(corgi.text), "我的柯基叫豆豆，三岁了")
    assert backup is not None and "我的柯基叫豆豆\n" in backup.read_text(encoding="utf-8")
    text = store.read_long_term()
    assert "我的柯基叫豆豆，三岁了" in text and "I live in Lisbon" in text and "Dentist on Friday" in text

    before = store.long_term_path.read_bytes()
    for line, version, content in ((corgi.line, entry_version(corgi.text), "stale edit"),  # changed since
                                   (first.line + 1, entry_version(first.text), "wrong line"),
                                   (first.line, entry_version(first.text), "   ")):  # empty
        with pytest.raises(MemoryStoreError):
            store.replace_long_term_entry(line, version, content)
        assert store.long_term_path.read_bytes() == before

    entries = list(long_term_entries(store.read_long_term()))
    store.replace_long_term_entry(entries[0].line, entry_version(entries[0].text), None)
    left = [entry.text.split("\n")[1] for entry in long_term_entries(store.read_long_term())]
    assert left == ["我的柯基叫豆豆，三岁了", "Dentist on Friday"]
    assert "\n\n\n" not in store.read_long_term()
