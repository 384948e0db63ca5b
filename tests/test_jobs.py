"""Jobs on disk (picoclaw/jobs/: model, schedule, store): schedules, next runs in Asia/Shanghai and across
Berlin's DST, the file."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import orjson
import pytest
from freezegun import freeze_time

from picoclaw.jobs import (
    Job,
    JobError,
    JobsFileError,
    JobStore,
    Schedule,
    cron_after,
    first_run,
    following_run,
    make_schedule,
    parse_relative,
)
from picoclaw.storage import FilesStorage

SHANGHAI = ZoneInfo("Asia/Shanghai")
BERLIN = ZoneInfo("Europe/Berlin")
NOW = "2025-03-10 02:00:00"  # a Monday, 10:00 in Shanghai


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def store(tmp_path: Path, tz: ZoneInfo = SHANGHAI) -> JobStore:
    return JobStore(tmp_path / "cron" / "jobs.json", tz, storage=FilesStorage(tmp_path))


# -- schedules --------------------------------------------------------------------------------------------


@freeze_time(NOW)
def test_first_runs_in_shanghai() -> None:
    now = datetime.now(UTC)
    at = make_schedule(at="2025-03-10T18:00", tz=SHANGHAI)  # no offset: the configured timezone
    assert first_run(at, now, SHANGHAI) == utc("2025-03-10 10:00")
    assert first_run(make_schedule(at="2025-03-10T18:00+00:00", tz=SHANGHAI), now, SHANGHAI) == utc("2025-03-10 18:00")
    assert first_run(make_schedule(in_="in 20 minutes", tz=SHANGHAI), now, SHANGHAI) == utc("2025-03-10 02:20")
    assert first_run(make_schedule(every=3600, tz=SHANGHAI), now, SHANGHAI) == utc("2025-03-10 03:00")
    # Monday 08:00 has passed today (it is 10:00): next Monday, 08:00 Shanghai = 00:00 UTC.
    monday = make_schedule(cron="0 8 * * 1", tz=SHANGHAI)
    assert first_run(monday, now, SHANGHAI) == utc("2025-03-17 00:00")
    assert first_run(make_schedule(cron="0 12 * * *", tz=SHANGHAI), now, SHANGHAI) == utc("2025-03-10 04:00")


def test_a_daily_cron_job_keeps_its_local_time_across_both_berlin_changes() -> None:
    spring = [utc("2026-03-28 07:00")]  # 08:00 CET, the day before clocks go forward
    for _ in range(2):
        spring.append(cron_after("0 8 * * *", spring[-1], BERLIN))
    assert spring[1:] == [utc("2026-03-29 06:00"), utc("2026-03-30 06:00")]  # 08:00 CEST
    autumn = [utc("2026-10-24 06:00")]  # 08:00 CEST
    for _ in range(2):
        autumn.append(cron_after("0 8 * * *", autumn[-1], BERLIN))
    assert autumn[1:] == [utc("2026-10-25 07:00"), utc("2026-10-26 07:00")]  # 08:00 CET


def test_the_missing_and_the_repeated_hour_in_berlin() -> None:
    # 02:30 does not exist on 29 March 2026: the job runs at 03:00 CEST that day, then 02:30 again.
    first = cron_after("30 2 * * *", utc("2026-03-28 12:00"), BERLIN)
    assert first == utc("2026-03-29 01:00")
    assert cron_after("30 2 * * *", first, BERLIN) == utc("2026-03-30 00:30")
    # 02:30 happens twice on 25 October 2026 (CEST, then CET): the job runs once, like cron.
    first = cron_after("30 2 * * *", utc("2026-10-24 12:00"), BERLIN)
    assert first == utc("2026-10-25 00:30")
    assert cron_after("30 2 * * *", first, BERLIN) == utc("2026-10-26 01:30")


def test_a_half_hourly_job_runs_once_per_wall_clock_time_through_the_repeated_hour() -> None:
    runs = [utc("2026-10-24 23:45")]  # 01:45 CEST on 25 October 2026
    while runs[-1] < utc("2026-10-25 03:00"):
        runs.append(cron_after("*/30 * * * *", runs[-1], BERLIN))
    walls = [f"{run.astimezone(BERLIN):%H:%M %Z}" for run in runs[1:]]
    # 02:00 and 02:30 CET come again an hour later; cron does not run them twice.
    assert walls == ["02:00 CEST", "02:30 CEST", "03:00 CET", "03:30 CET", "04:00 CET"]


def test_one_time_and_interval_jobs_across_berlin_changes_keep_real_time() -> None:
    # An interval is real seconds: an hourly job runs every 60 minutes through both changes.
    for start in (utc("2026-03-29 00:30"), utc("2026-10-25 00:30")):
        job = Job(id="a", schedule=Schedule(every=3600), action="message", text="x", target="telegram:1",
                  created_at=start, next_run=start)
        following = following_run(job, start, BERLIN)
        assert following == start + timedelta(hours=1)
    # "at 02:30" given without an offset on the day of the repeated hour is the first 02:30 (CEST).
    with freeze_time("2026-10-24 12:00:00"):
        at = make_schedule(at="2026-10-25T02:30", tz=BERLIN)
        assert first_run(at, datetime.now(UTC), BERLIN) == utc("2026-10-25 00:30")
    # A relative time is real time too: "in 2 hours" at 01:30 CEST is 02:30 CET.
    with freeze_time("2026-10-24 23:30:00"):
        later = make_schedule(in_="in 2 hours", tz=BERLIN).at
    assert later is not None
    # (read back outside freezegun, whose datetimes lose zoneinfo's fold)
    assert f"{datetime.fromtimestamp(later.timestamp(), BERLIN):%H:%M %Z}" == "02:30 CET"


@pytest.mark.parametrize(("text", "seconds"), [
    ("in 20 minutes", 1200), ("2 hours", 7200), ("in 3 days", 3 * 86400), ("1h 30m", 5400),
    ("in 1 week", 7 * 86400), ("20分钟后", 1200), ("20分钟以后", 1200), ("10分钟之后", 600),
    ("2小时", 7200), ("3天后", 3 * 86400), ("90 seconds", 90),
])
def test_relative_times(text: str, seconds: int) -> None:
    assert parse_relative(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["soon", "in 0 minutes", "in 5 fortnights", "tomorrow", ""])
def test_unreadable_delays_are_one_clear_error(text: str) -> None:
    with pytest.raises(JobError) as caught:
        parse_relative(text)
    assert "\n" not in str(caught.value)


@freeze_time(NOW)
@pytest.mark.parametrize(("given", "message"), [
    ({"at": "2025-03-10T09:00"}, "is in the past"),  # 09:00 Shanghai, an hour ago
    ({"at": "next tuesday"}, "ISO 8601"),
    ({"cron": "0 8 * *"}, "5 fields"),
    ({"cron": "0 8 * * * *"}, "5 fields"),
    ({"cron": "61 8 * * *"}, "not valid"),
    ({"every": 30}, "at least 60"),
    ({}, "exactly one"),
    ({"every": 3600, "cron": "0 8 * * *"}, "exactly one"),
])
def test_bad_schedules_are_one_clear_error(given: dict[str, object], message: str) -> None:
    with pytest.raises(JobError, match=message) as caught:
        make_schedule(tz=SHANGHAI, **given)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)


def test_a_stored_schedule_is_exactly_one_kind() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Schedule.model_validate({"at": "2026-01-01T00:00:00Z", "every": 60})
    with pytest.raises(ValueError, match="exactly one"):
        Schedule.model_validate({})
    with pytest.raises(ValueError):
        Schedule.model_validate({"weekly": "monday"})  # an unknown kind
    with pytest.raises(ValueError, match="UTC offset"):
        Schedule.model_validate({"at": "2026-01-01T09:00"})
    assert Schedule(cron="0  8 * * 1").model_dump(mode="json") == {"cron": "0 8 * * 1"}


def test_following_runs_skip_what_was_missed() -> None:
    now = utc("2025-03-10 12:00")
    job = Job(id="a", schedule=Schedule(every=3600), action="message", text="x", target="telegram:1",
              created_at=now, next_run=utc("2025-03-10 11:59:30"))
    assert following_run(job, now, SHANGHAI) == utc("2025-03-10 12:59:30")  # on the grid: no drift
    job.next_run = utc("2025-03-10 07:00")  # five runs missed: one run now, then an hour from now
    assert following_run(job, now, SHANGHAI) == utc("2025-03-10 13:00")
    job.schedule, job.next_run = Schedule(cron="0 8 * * *"), utc("2025-03-07 00:00")
    assert following_run(job, now, SHANGHAI) == utc("2025-03-11 00:00")
    job.schedule = Schedule(at=utc("2025-03-10 11:00"))
    assert following_run(job, now, SHANGHAI) is None


# -- the file --------------------------------------------------------------------------------------------


@freeze_time(NOW)
def test_add_list_remove_round_trip_in_chinese(tmp_path: Path) -> None:
    jobs = store(tmp_path)
    assert jobs.load() == []
    one = jobs.add(make_schedule(in_="in 20 minutes", tz=SHANGHAI), "message", "给银行打电话", "telegram:42")
    two = jobs.add(make_schedule(cron="0 8 * * 1", tz=SHANGHAI), "agent", "总结我这周的笔记", "telegram:42",
                   created_by="telegram:42", scope="42")
    assert one.id != two.id and len(one.id) == 8
    loaded = JobStore(jobs.path, SHANGHAI, storage=jobs.storage).load()  # as another process reads it
    assert loaded == [one, two]
    assert loaded[0].next_run == utc("2025-03-10 02:20") and loaded[0].text == "给银行打电话"
    assert loaded[1].scope == "42" and loaded[1].created_by == "telegram:42"
    assert "给银行打电话" in jobs.path.read_text(encoding="utf-8")  # readable, not \\u-escaped
    assert jobs.remove(one.id) == one
    assert [job.id for job in jobs.load()] == [two.id]
    with pytest.raises(JobError, match="no job with id"):
        jobs.remove(one.id)
    assert jobs.lock_path.parent == jobs.path.parent


@freeze_time(NOW)
def test_nothing_is_written_for_a_bad_job(tmp_path: Path) -> None:
    jobs = store(tmp_path)
    with pytest.raises(JobError, match="session key"):
        jobs.add(make_schedule(every=3600, tz=SHANGHAI), "message", "x", "whatsapp:1")
    with pytest.raises(JobError, match="empty"):
        jobs.add(make_schedule(every=3600, tz=SHANGHAI), "message", "  ", "telegram:1")
    assert not jobs.path.exists()


@freeze_time(NOW)
@pytest.mark.parametrize("content", [b"{not json", b'{"version": 1, "jobs": [{"id": "x"}]}', b"[]"],
                         ids=["not-json", "bad-job", "not-an-object"])
def test_a_malformed_file_is_one_clear_error_and_left_unchanged(tmp_path: Path, content: bytes) -> None:
    jobs = store(tmp_path)
    jobs.path.parent.mkdir(parents=True)
    jobs.path.write_bytes(content)
    with pytest.raises(JobsFileError) as caught:
        jobs.load()
    assert str(jobs.path) in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(JobsFileError):
        jobs.add(make_schedule(every=3600, tz=SHANGHAI), "message", "x", "telegram:1")
    assert jobs.path.read_bytes() == content


def test_a_finished_one_time_job_is_kept_a_week_then_pruned(tmp_path: Path) -> None:
    jobs = store(tmp_path)
    with freeze_time(NOW) as frozen:
        done = jobs.add(make_schedule(in_="1 minute", tz=SHANGHAI), "message", "x", "telegram:1")
        jobs.update(done.id, lambda job: bool(setattr(job, "next_run", None) or setattr(job, "last_run",
                                                                                     datetime.now(UTC)) or True))
        frozen.tick(timedelta(days=6))
        jobs.add(make_schedule(every=3600, tz=SHANGHAI), "message", "y", "telegram:1")
        assert done.id in [job.id for job in jobs.load()]
        frozen.tick(timedelta(days=2))
        jobs.add(make_schedule(every=3600, tz=SHANGHAI), "message", "z", "telegram:1")
        assert done.id not in [job.id for job in jobs.load()]
        assert len(orjson.loads(jobs.path.read_bytes())["jobs"]) == 2
