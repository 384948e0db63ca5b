"""PolicyManager (memory/policy.py): layering with sources, live re-reads, tolerant overrides, and safe changes."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from freezegun import freeze_time

from picoclaw.errors import ConfigError
from picoclaw.memory import policy as policy_module
from picoclaw.memory.policy import PolicyError, PolicyManager, ValueChange
from picoclaw.memory.workspace import Workspace
from picoclaw.policy_schema import POLICY_KEYS, TUNABLE_KEYS, MemoryPolicy
from picoclaw.storage import FilesStorage

SHANGHAI = ZoneInfo("Asia/Shanghai")
# 02:00 UTC is 10:00 in Shanghai: history times are in the configured timezone, snapshot names in UTC.
FROZEN = "2025-03-10 02:00:00"


@pytest.fixture
def memory_dir(tmp_path: Path) -> Path:
    path = tmp_path / "memory"
    path.mkdir()
    return path


@pytest.fixture
def manager(memory_dir: Path) -> PolicyManager:
    """Config sets recent_days and retrieve_limit; everything else is default."""
    return PolicyManager(memory_dir, {"recent_days": 5, "retrieve_limit": 8}, SHANGHAI,
                         storage=FilesStorage(memory_dir.parent))


def write_overrides(manager: PolicyManager, content: object | str) -> None:
    """Write the overrides file by hand, as a person or another process would, and bump its mtime.

    The explicit mtime makes the change visible even on file systems with coarse timestamps,
    without sleeping.
    """
    raw = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    path = manager.overrides_path
    old_ns = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(raw, encoding="utf-8")
    bumped = max(old_ns, path.stat().st_mtime_ns) + 1_000_000_000
    os.utime(path, ns=(bumped, bumped))


def snapshot_dir_entries(manager: PolicyManager) -> list[str]:
    return sorted(p.name for p in manager.snapshots_dir.iterdir()) if manager.snapshots_dir.exists() else []


# -- layering ----------------------------------------------------------------------------------------


def test_defaults_only(memory_dir: Path) -> None:
    effective = PolicyManager(memory_dir, storage=FilesStorage(memory_dir.parent)).effective()
    assert effective.policy == MemoryPolicy()
    assert set(effective.sources.values()) == {"default"}
    assert set(effective.sources) == set(POLICY_KEYS)


def test_layers_default_config_overrides_with_sources(manager: PolicyManager) -> None:
    write_overrides(manager, {"retrieve_limit": 3, "evolution_enabled": True})
    effective = manager.effective()
    assert effective.policy.retrieve_limit == 3 and effective.sources["retrieve_limit"] == "overrides"
    assert effective.policy.evolution_enabled is True and effective.sources["evolution_enabled"] == "overrides"
    assert effective.policy.recent_days == 5 and effective.sources["recent_days"] == "config"
    assert effective.policy.memory_token_budget == 2000 and effective.sources["memory_token_budget"] == "default"


def test_workspace_policy_comes_from_config_json(workspace: Workspace) -> None:
    # onboard copies config.example.json, whose memory block spells out every key.
    effective = workspace.policy.effective()
    assert set(effective.sources.values()) == {"config"}
    assert effective.policy.retrieve_limit == 10


def test_unknown_config_policy_key_is_a_config_error(memory_dir: Path) -> None:
    with pytest.raises(ConfigError, match="retrive_limit"):
        PolicyManager(memory_dir, {"retrive_limit": 3}, storage=FilesStorage(memory_dir.parent))


def test_evolution_switch_is_not_tunable_by_reflection() -> None:
    assert "evolution_enabled" in POLICY_KEYS and "evolution_enabled" not in TUNABLE_KEYS
    # The switches are the user's, and so is the cap on background model calls: reflection tunes the rest.
    user_only = {"evolution_enabled", "memory_flush_enabled", "query_rewrite_enabled", "learning_enabled",
                 "learning_daily_calls", "prompt_tools_percent", "prompt_memory_percent", "prompt_reply_percent"}
    assert set(TUNABLE_KEYS) == set(POLICY_KEYS) - user_only


# -- live re-reading ------------------------------------------------------------------------------------


def test_overrides_file_is_reread_when_it_changes(manager: PolicyManager) -> None:
    assert manager.current().retrieve_limit == 8
    write_overrides(manager, {"retrieve_limit": 4})
    assert manager.current().retrieve_limit == 4
    write_overrides(manager, {"retrieve_limit": 6})  # same size, only the mtime and content differ
    assert manager.current().retrieve_limit == 6
    manager.overrides_path.unlink()
    assert manager.current().retrieve_limit == 8
    assert manager.effective().sources["retrieve_limit"] == "config"


def test_change_by_another_manager_applies_without_restart(manager: PolicyManager, memory_dir: Path) -> None:
    # Like `picoclaw policy set` in another process while the bot keeps running.
    assert manager.current().memory_token_budget == 2000
    other = PolicyManager(memory_dir, {"recent_days": 5, "retrieve_limit": 8}, SHANGHAI,
                          storage=FilesStorage(memory_dir.parent))
    other.set({"memory_token_budget": 4000}, source="cli")
    assert manager.current().memory_token_budget == 4000


def test_unchanged_overrides_are_not_reread(manager: PolicyManager, monkeypatch: pytest.MonkeyPatch) -> None:
    write_overrides(manager, {"retrieve_limit": 4})
    reads = []
    original = policy_module.read_json_object
    monkeypatch.setattr(policy_module, "read_json_object", lambda path: reads.append(path) or original(path))
    first = manager.effective()
    second = manager.effective()
    assert len(reads) == 1
    assert second is first
    write_overrides(manager, {"retrieve_limit": 5})
    assert manager.current().retrieve_limit == 5 and len(reads) == 2


# -- tolerant overrides -----------------------------------------------------------------------------------


def test_bad_override_keys_are_logged_and_skipped_the_rest_applies(
    manager: PolicyManager, caplog: pytest.LogCaptureFixture
) -> None:
    write_overrides(
        manager,
        {
            "retrive_limit": 3,  # typo
            "retrieve_limit": 99,  # out of bounds
            "recent_days": "15",  # a string is not an int: the model is strict
            "备注": "reflection 留下的说明",  # unknown, and not even English
            "memory_token_budget": 3000,
            "evolution_enabled": True,
        },
    )
    with caplog.at_level(logging.WARNING, logger="picoclaw.memory.policy"):
        effective = manager.effective()
    assert effective.policy.memory_token_budget == 3000 and effective.sources["memory_token_budget"] == "overrides"
    assert effective.policy.evolution_enabled is True
    assert effective.policy.retrieve_limit == 8 and effective.sources["retrieve_limit"] == "config"
    assert effective.policy.recent_days == 5 and effective.sources["recent_days"] == "config"
    text = caplog.text
    assert "'retrive_limit'" in text and "'备注'" in text
    assert "retrieve_limit" in text and "allowed 1–50" in text
    assert "recent_days" in text and "'15'" in text
    assert len(caplog.records) == 4
    assert all(str(manager.overrides_path) in r.getMessage() for r in caplog.records)


def test_malformed_overrides_file_is_logged_and_ignored(
    manager: PolicyManager, caplog: pytest.LogCaptureFixture
) -> None:
    write_overrides(manager, '{"retrieve_limit": 3,,}')
    with caplog.at_level(logging.WARNING, logger="picoclaw.memory.policy"):
        effective = manager.effective()
    assert effective.policy.retrieve_limit == 8
    assert "overrides" not in effective.sources.values()
    assert "not valid JSON" in caplog.text and str(manager.overrides_path) in caplog.text


def test_overrides_that_are_not_an_object_are_ignored(
    manager: PolicyManager, caplog: pytest.LogCaptureFixture
) -> None:
    write_overrides(manager, [{"retrieve_limit": 3}])
    with caplog.at_level(logging.WARNING, logger="picoclaw.memory.policy"):
        assert manager.current().retrieve_limit == 8
    assert "expected a JSON object" in caplog.text


@pytest.mark.parametrize("order", [("keep", "threshold"), ("threshold", "keep")])
def test_keys_valid_only_together_apply_in_any_file_order(
    manager: PolicyManager, caplog: pytest.LogCaptureFixture, order: tuple[str, str]
) -> None:
    # Regression: keep_count=30 alone is invalid against the default threshold 20, so checking keys one
    # by one in file order dropped it although `set` had accepted the pair.
    values = {"keep": ("session_summary_keep_count", 30), "threshold": ("session_summary_message_threshold", 50)}
    write_overrides(manager, dict(values[name] for name in order))
    with caplog.at_level(logging.WARNING, logger="picoclaw.memory.policy"):
        effective = manager.effective()
    assert effective.policy.session_summary_keep_count == 30
    assert effective.policy.session_summary_message_threshold == 50
    assert effective.sources["session_summary_keep_count"] == "overrides"
    assert caplog.records == []


def test_cross_key_violation_is_logged_with_the_key_name(
    manager: PolicyManager, caplog: pytest.LogCaptureFixture
) -> None:
    write_overrides(manager, {"session_summary_keep_count": 25, "recent_days": 1})
    with caplog.at_level(logging.WARNING, logger="picoclaw.memory.policy"):
        effective = manager.effective()
    assert effective.policy.session_summary_keep_count == 4 and effective.policy.recent_days == 1
    assert "ignoring session_summary_keep_count: session_summary_keep_count must be smaller" in caplog.text


def test_set_of_interdependent_keys_takes_effect(manager: PolicyManager) -> None:
    manager.set({"session_summary_keep_count": 30, "session_summary_message_threshold": 50}, source="cli")
    fresh = PolicyManager(manager.memory_dir, {"recent_days": 5, "retrieve_limit": 8}, SHANGHAI,
                          storage=FilesStorage(manager.memory_dir.parent))
    assert fresh.current().session_summary_keep_count == 30
    assert fresh.current().session_summary_message_threshold == 50


# -- set: validation, snapshots, history ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param({"retrive_limit": 5}, "unknown policy key 'retrive_limit'", id="unknown-key"),
        pytest.param({"retrieve_limit": 51}, "allowed 1–50", id="out-of-bounds"),
        pytest.param({"retrieve_limit": "15"}, "valid integer", id="string-for-int"),
        pytest.param({"evolution_enabled": "是"}, "valid boolean", id="chinese-string-for-bool"),
        pytest.param({"session_summary_keep_count": 20}, "must be smaller", id="keep-vs-threshold"),
        pytest.param({"long_term_compress_char_threshold": 999}, "at least 1000", id="compress"),
        pytest.param({"recent_days": 2, "memory_token_budget": 10}, "memory_token_budget", id="one-bad-of-two"),
    ],
)
def test_set_rejects_bad_changes_and_writes_nothing(
    manager: PolicyManager, changes: dict, message: str
) -> None:
    write_overrides(manager, '{"recent_days": 2}\n')
    before = manager.overrides_path.read_bytes()
    with pytest.raises(PolicyError, match=message):
        manager.set(changes, source="cli")
    assert manager.overrides_path.read_bytes() == before
    assert snapshot_dir_entries(manager) == []
    assert not manager.history_path.exists()
    assert manager.current().recent_days == 2


@freeze_time(FROZEN)
def test_set_snapshots_previous_overrides_and_records_history(manager: PolicyManager) -> None:
    snapshot = manager.set({"retrieve_limit": 5}, source="reflection", reason="用户说记忆太多 / too much memory",
                           session="telegram:42")
    assert snapshot.name == "20250310_020000Z.json"
    assert snapshot.read_bytes() == b"{}\n"  # there were no overrides before
    assert json.loads(manager.overrides_path.read_text()) == {"retrieve_limit": 5}
    assert manager.effective().sources["retrieve_limit"] == "overrides"
    [entry] = manager.history()
    assert entry.time == "2025-03-10T10:00:00+08:00"
    assert entry.source == "reflection" and entry.session == "telegram:42"
    assert entry.overrides == {"retrieve_limit": ValueChange(None, 5)}
    assert entry.reason == "用户说记忆太多 / too much memory"
    assert entry.snapshot == "20250310_020000Z.json"


@freeze_time(FROZEN)
def test_snapshot_names_are_unique_within_one_frozen_second(manager: PolicyManager) -> None:
    first = manager.set({"retrieve_limit": 5}, source="cli")
    second = manager.set({"retrieve_limit": 6}, source="cli")
    third = manager.set({"recent_days": 1}, source="cli")
    assert [first.name, second.name, third.name] == [
        "20250310_020000Z.json", "20250310_020000Z_1.json", "20250310_020000Z_2.json"]
    assert manager.snapshots() == [first, second, third]
    # Each snapshot holds the overrides as they were before its change.
    assert json.loads(first.read_text()) == {}
    assert json.loads(second.read_text()) == {"retrieve_limit": 5}
    assert json.loads(third.read_text()) == {"retrieve_limit": 6}
    history = manager.history()
    assert [h.overrides for h in history] == [
        {"retrieve_limit": ValueChange(None, 5)},
        {"retrieve_limit": ValueChange(5, 6)},
        {"recent_days": ValueChange(None, 1)},
    ]
    assert len(manager.history_path.read_text().splitlines()) == 3


def test_set_keeps_hand_written_keys_it_does_not_touch(manager: PolicyManager) -> None:
    write_overrides(manager, {"recent_days": 1, "备注": "手写的"})
    manager.set({"retrieve_limit": 5}, source="cli")
    assert json.loads(manager.overrides_path.read_text(encoding="utf-8")) == {
        "recent_days": 1, "备注": "手写的", "retrieve_limit": 5}


def test_history_skips_a_torn_last_line(manager: PolicyManager) -> None:
    manager.set({"retrieve_limit": 5}, source="cli")
    with open(manager.history_path, "ab") as fh:
        fh.write(b'{"time": "2025-')  # a crash mid-append
    assert len(manager.history()) == 1


# -- rollback and reset ------------------------------------------------------------------------------------


@freeze_time(FROZEN)
def test_rollback_restores_newest_snapshot_byte_for_byte(manager: PolicyManager) -> None:
    hand_written = '{"retrieve_limit":3,   "recent_days": 1, "备注": "手工"}\n'
    write_overrides(manager, hand_written)
    manager.set({"retrieve_limit": 7}, source="cli")
    assert manager.current().retrieve_limit == 7
    restored = manager.rollback()
    assert restored.name == "20250310_020000Z.json"
    assert manager.overrides_path.read_text(encoding="utf-8") == hand_written
    assert manager.current().retrieve_limit == 3 and manager.current().recent_days == 1
    # The overrides before the rollback were snapshotted, so the rollback can itself be undone.
    assert len(manager.snapshots()) == 2
    assert json.loads(manager.snapshots()[-1].read_text()) == {
        "retrieve_limit": 7, "recent_days": 1, "备注": "手工"}
    reasons = [h.reason for h in manager.history()]
    assert reasons[1] == "rollback to 20250310_020000Z.json"
    manager.rollback(manager.snapshots()[-1].name)  # undone by name; a bare rollback walks further back
    assert manager.current().retrieve_limit == 7


@freeze_time(FROZEN)
def test_rollback_to_a_named_snapshot(manager: PolicyManager) -> None:
    manager.set({"retrieve_limit": 5}, source="cli")  # snapshot 0: {}
    manager.set({"retrieve_limit": 6}, source="cli")  # snapshot _1: {5}
    manager.set({"retrieve_limit": 7}, source="cli")  # snapshot _2: {6}
    manager.rollback("20250310_020000Z_1.json")
    assert manager.current().retrieve_limit == 5
    manager.rollback("20250310_020000Z")  # the stem works too
    assert manager.current().retrieve_limit == 8  # back to config: that snapshot had no overrides
    assert manager.effective().sources["retrieve_limit"] == "config"


@freeze_time(FROZEN)
def test_reset_drops_overrides_and_can_be_undone(manager: PolicyManager) -> None:
    manager.set({"retrieve_limit": 5, "evolution_enabled": True}, source="cli")
    snapshot = manager.reset()
    assert json.loads(manager.overrides_path.read_text()) == {}
    assert manager.current().retrieve_limit == 8 and manager.current().evolution_enabled is False
    assert json.loads(snapshot.read_text()) == {"retrieve_limit": 5, "evolution_enabled": True}
    assert manager.history()[-1].reason == "reset"
    assert manager.history()[-1].overrides["evolution_enabled"] == ValueChange(True, None)
    manager.rollback()
    assert manager.current().retrieve_limit == 5 and manager.current().evolution_enabled is True


def test_rollback_without_snapshots_is_an_error(manager: PolicyManager) -> None:
    with pytest.raises(PolicyError, match="no policy snapshots"):
        manager.rollback()
    assert not manager.overrides_path.exists()


@pytest.mark.parametrize("name", ["20990101_000000.json", "不存在", "../policy_overrides.json", "/etc/passwd"])
def test_rollback_to_unknown_snapshot_is_an_error(manager: PolicyManager, name: str) -> None:
    manager.set({"retrieve_limit": 5}, source="cli")
    before = manager.overrides_path.read_bytes()
    snapshots = manager.snapshots()
    with pytest.raises(PolicyError, match="no snapshot named"):
        manager.rollback(name)
    assert manager.overrides_path.read_bytes() == before
    assert manager.snapshots() == snapshots


# -- time order across timezones, rollback as a stack, locked validation, torn history ---------------------


def test_changing_the_timezone_keeps_snapshots_in_time_order(memory_dir: Path) -> None:
    with freeze_time(FROZEN) as frozen:
        shanghai = PolicyManager(memory_dir, {}, SHANGHAI, storage=FilesStorage(memory_dir.parent))
        eleven = shanghai.set({"retrieve_limit": 11}, source="cli")
        frozen.tick(1)
        twelve = shanghai.set({"retrieve_limit": 12}, source="cli")
        # 10:00 in Shanghai is 03:00 in Berlin: local-time names would file the next snapshot first.
        berlin = PolicyManager(memory_dir, {}, ZoneInfo("Europe/Berlin"), storage=FilesStorage(memory_dir.parent))
        frozen.tick(1)
        thirteen = berlin.set({"retrieve_limit": 13}, source="cli")
        assert berlin.snapshots() == [eleven, twelve, thirteen]
        berlin.rollback()
    assert berlin.current().retrieve_limit == 12


@freeze_time(FROZEN)
def test_repeated_rollbacks_walk_back_one_change_at_a_time(manager: PolicyManager) -> None:
    for limit in (11, 12, 13):
        manager.set({"retrieve_limit": limit}, source="cli")
    manager.rollback()
    assert manager.current().retrieve_limit == 12
    manager.rollback()
    assert manager.current().retrieve_limit == 11
    manager.rollback()
    assert manager.current().retrieve_limit == 8  # the config value: the first change is undone too
    assert manager.effective().sources["retrieve_limit"] == "config"
    before = manager.overrides_path.read_bytes()
    with pytest.raises(PolicyError, match="nothing further back"):
        manager.rollback()
    assert manager.overrides_path.read_bytes() == before
    # Each rollback is in the history, naming the change it undid.
    history = manager.history()
    assert [entry.reason.split(" (")[0] for entry in history[3:]] == ["rollback to " + history[2].snapshot,
                                                                      "rollback to " + history[1].snapshot,
                                                                      "rollback to " + history[0].snapshot]
    assert [entry.undoes for entry in history] == [None, None, None, history[2].snapshot, history[1].snapshot,
                                                   history[0].snapshot]


@freeze_time(FROZEN)
def test_a_change_after_rollbacks_is_undone_first_then_the_walk_goes_on(manager: PolicyManager) -> None:
    for limit in (11, 12, 13):
        manager.set({"retrieve_limit": limit}, source="cli")
    manager.rollback()  # → 12
    manager.set({"recent_days": 1}, source="cli")
    manager.rollback()  # undoes recent_days=1
    assert (manager.current().retrieve_limit, manager.current().recent_days) == (12, 5)
    manager.rollback()  # 13 is undone already: undoes 12
    assert manager.current().retrieve_limit == 11


def _set_in_process(memory_dir: str, changes: dict[str, int], go: Any, results: Any) -> None:
    manager = PolicyManager(Path(memory_dir), storage=FilesStorage(Path(memory_dir).parent))
    go.wait()  # both processes set at once
    try:
        manager.set(changes, source="cli")
    except PolicyError:
        results.put("refused")
    else:
        results.put("set")


@pytest.mark.slow
def test_concurrent_sets_never_write_an_invalid_policy(tmp_path: Path) -> None:
    # Each change is valid alone (keep 10 < default threshold 20; default keep 4 < threshold 5), not together.
    ctx = multiprocessing.get_context("spawn")
    for trial in range(12):
        memory_dir = tmp_path / f"trial{trial}"
        memory_dir.mkdir()
        go = ctx.Barrier(2)
        results = ctx.Queue()
        workers = [
            ctx.Process(target=_set_in_process, args=(str(memory_dir), changes, go, results))
            for changes in ({"session_summary_message_threshold": 5}, {"session_summary_keep_count": 10})
        ]
        for process in workers:
            process.start()
        for process in workers:
            process.join(timeout=60)
        assert [process.exitcode for process in workers] == [0, 0], f"trial {trial}"
        outcomes = sorted(results.get(timeout=10) for _ in workers)
        assert outcomes == ["refused", "set"], f"trial {trial}"
        overrides = PolicyManager(memory_dir, storage=FilesStorage(Path(memory_dir).parent)).read_overrides()
        MemoryPolicy(**overrides)  # the written overrides are a valid policy as a whole


def test_a_set_after_a_torn_history_line_is_recorded(manager: PolicyManager) -> None:
    manager.set({"retrieve_limit": 5}, source="cli")
    with open(manager.history_path, "ab") as fh:
        fh.write(b'{"time": "2025-')  # a crash mid-append
    manager.set({"retrieve_limit": 6}, source="cli")
    history = manager.history()
    assert [entry.overrides for entry in history] == [
        {"retrieve_limit": ValueChange(None, 5)}, {"retrieve_limit": ValueChange(5, 6)}]


# -- the ranking keys (memory/search/reranking.py) --------------------------------------------------------------


RANKING_KEYS = ("memory_recency_boost_percent", "memory_access_boost_percent")


@pytest.mark.parametrize("key", RANKING_KEYS)
def test_ranking_keys_are_whole_percentages_within_bounds(manager: PolicyManager, key: str) -> None:
    assert getattr(manager.current(), key) == 10
    for good in (0, 100, 35):
        manager.set({key: good}, source="test")
        assert getattr(manager.current(), key) == good
    for bad in (-1, 101, 12.5, "20", True):
        with pytest.raises(PolicyError, match=key):
            manager.set({key: bad}, source="test")
    assert getattr(manager.current(), key) == 35  # a refused change wrote nothing


@pytest.mark.parametrize("key", RANKING_KEYS)
def test_ranking_keys_from_the_cli_the_overrides_file_and_reflection(
        home: Path, key: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    from picoclaw.cli import main
    from picoclaw.curation.policy_suggestions import SuggestionError, key_guide, validate_suggestion

    assert main(["policy", "set", f"{key}=25"]) == 0
    assert f"{key} = 25" in capsys.readouterr().out
    manager = Workspace.from_config(*_config_of(home)).policy
    assert getattr(manager.current(), key) == 25 and manager.effective().sources[key] == "overrides"
    # A bad value in the overrides file is logged and ignored; the other keys still apply.
    write_overrides(manager, {key: 250, "recent_days": 2})
    with caplog.at_level(logging.WARNING):
        assert getattr(manager.current(), key) == 10 and manager.current().recent_days == 2
    assert key in caplog.text
    # Reflection may tune them (they are numbers, not switches), inside the bounds only.
    assert key in TUNABLE_KEYS and f"- {key} = 10 (allowed 0–100)" in key_guide(manager.current())
    assert validate_suggestion({key: 20, "reason": "旧的事实总被提起"}, manager).changes == {key: 20}
    with pytest.raises(SuggestionError):
        validate_suggestion({key: 500}, manager)


def _config_of(home: Path) -> tuple[Any, Path, FilesStorage]:
    """What Workspace.from_config takes, as a fresh process would open it (the files backend)."""
    from picoclaw.config import load_config, workspace_dir

    config = load_config(home)
    return config, home, FilesStorage(workspace_dir(config, home))
