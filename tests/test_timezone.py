"""The timezone: onboarding writes "local" (the machine's zone), which resolves to the zone by name when the
machine says which (TZ, the /etc/localtime link, /etc/timezone) and is shown resolved; a zone written in
config.json stays. No test here depends on the machine's own zone: TZ and the files are given."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from picoclaw import clock
from picoclaw.agent.context import ContextBuilder
from picoclaw.app import App
from picoclaw.onboard import onboard
from tests.fakes.console import Console
from tests.homes import edit_config
from tests.test_web_console import logged_in
from tests.zones import SHANGHAI, in_zone

NOWHERE = Path("/nonexistent/picoclaw-test")


@pytest.fixture
def machine_tz(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Set TZ for a test (and tell the C library, for `datetime.astimezone`); the real zone comes back after."""
    yield monkeypatch
    monkeypatch.undo()
    time.tzset()


def test_onboarding_writes_the_machines_zone_and_keeps_one_written(
        tmp_path: Path, machine_tz: pytest.MonkeyPatch) -> None:
    machine_tz.setenv("TZ", "Europe/Berlin")
    home = tmp_path / "家"
    onboard(home)
    assert json.loads((home / "config.json").read_text(encoding="utf-8"))["timezone"] == "local"
    app = App.open(home)
    try:
        assert app.workspace.tz == ZoneInfo("Europe/Berlin")
    finally:
        app.close()

    written = tmp_path / "shanghai"
    onboard(written, configure=in_zone(SHANGHAI))
    before = (written / "config.json").read_bytes()
    assert [step.outcome for step in onboard(written) if step.path.name == "config.json"] == ["kept"]
    assert (written / "config.json").read_bytes() == before
    assert json.loads(before)["timezone"] == SHANGHAI


def test_local_zone_name_from_tz_the_localtime_link_or_etc_timezone(tmp_path: Path) -> None:
    link = tmp_path / "localtime"
    link.symlink_to("/usr/share/zoneinfo/America/New_York")  # only the link's text is read: no file needed
    relative = tmp_path / "relative"
    relative.symlink_to("../usr/share/zoneinfo/Asia/Shanghai")
    named = tmp_path / "timezone"
    named.write_text("Europe/Berlin\n", encoding="utf-8")
    copied = tmp_path / "copied"  # a zone file copied, not linked: its name is lost
    copied.write_bytes(b"TZif2")

    assert clock.local_zone_name({"TZ": "Europe/Berlin"}, link, named) == "Europe/Berlin"  # TZ wins
    assert clock.local_zone_name({"TZ": ":Asia/Tokyo"}, NOWHERE, NOWHERE) == "Asia/Tokyo"
    assert clock.local_zone_name({}, link, named) == "America/New_York"
    assert clock.local_zone_name({}, relative, NOWHERE) == "Asia/Shanghai"
    assert clock.local_zone_name({}, copied, named) == "Europe/Berlin"
    assert clock.local_zone_name({}, NOWHERE, named) == "Europe/Berlin"
    # What names no zone gives None (the zone is then the current offset), never an error.
    assert clock.local_zone_name({"TZ": "CST-8"}, link, named) is None  # POSIX rules: TZ still rules
    assert clock.local_zone_name({"TZ": "/etc/passwd"}, NOWHERE, NOWHERE) is None
    assert clock.local_zone_name({"TZ": "../../../etc/passwd"}, NOWHERE, NOWHERE) is None
    assert clock.local_zone_name({"TZ": "上海"}, NOWHERE, NOWHERE) is None
    assert clock.local_zone_name({}, NOWHERE, NOWHERE) is None
    named.write_bytes(b"\xff\xfe not text")
    assert clock.local_zone_name({}, copied, named) is None


def test_local_resolves_to_the_zone_with_its_summer_time(machine_tz: pytest.MonkeyPatch) -> None:
    machine_tz.setenv("TZ", "Europe/Berlin")
    zone = clock.resolve_timezone("local")
    # By name, not the offset of the day it was resolved: a bot started in winter keeps the right hour in summer.
    assert datetime(2025, 1, 15, 12, tzinfo=zone).utcoffset() == ZoneInfo("Europe/Berlin").utcoffset(
        datetime(2025, 1, 15, 12))
    assert datetime(2025, 7, 15, 12, tzinfo=zone).strftime("%z") == "+0200"
    assert datetime(2025, 1, 15, 12, tzinfo=zone).strftime("%z") == "+0100"


def test_describe_timezone(machine_tz: pytest.MonkeyPatch) -> None:
    assert clock.describe_timezone(SHANGHAI) == SHANGHAI
    machine_tz.setenv("TZ", "Europe/Berlin")
    assert clock.describe_timezone("local") == "local (Europe/Berlin)"
    machine_tz.setenv("TZ", "<+08>-8")  # POSIX rules, no zone name: the offset says what it is
    time.tzset()
    assert clock.describe_timezone("local") == "local (UTC+08:00)"


def test_console_status_page_shows_the_resolved_zone(home: Path, machine_tz: pytest.MonkeyPatch) -> None:
    with edit_config(home) as config:
        config["timezone"] = "local"
    machine_tz.setenv("TZ", "Europe/Berlin")
    app = App.open(home)
    try:
        with Console(app) as console:
            client = logged_in(console)
            page = client.get("/status").text
            chinese = client.get("/status", headers={"Accept-Language": "zh-CN"}).text
    finally:
        app.close()
    assert "<th>timezone</th><td>local (Europe/Berlin)</td>" in page
    assert "<th>时区</th><td>local (Europe/Berlin)</td>" in chinese


def test_the_models_today_line_names_the_zone(home: Path, machine_tz: pytest.MonkeyPatch) -> None:
    with edit_config(home) as config:
        config["timezone"] = "local"
    machine_tz.setenv("TZ", "Europe/Berlin")
    app = App.open(home)
    try:
        prefix = ContextBuilder(app.workspace).stable_prefix(datetime(2025, 3, 10, 9, tzinfo=app.workspace.tz))
    finally:
        app.close()
    assert prefix.endswith("## Today\nMonday 2025-03-10 (local (Europe/Berlin))")  # not a bare "(local)"
