"""The jobs port on both backends (the same tests, parametrised): add/list/remove, due runs claimed once by
any number of schedulers (on PostgreSQL: two folders, each with a storage of its own, as two machines),
one-time and recurring runs, export → import byte for byte, and bad input as one clear error."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from picoclaw import clock
from picoclaw.jobs import Job, JobsFileError, JobStore, Scheduler, SessionAgent, make_schedule
from picoclaw.storage import FilesStorage, Storage, StorageError
from picoclaw.storage.postgres.connection import open_pool
from picoclaw.storage.postgres.storage import PostgresStorage

SHANGHAI = ZoneInfo("Asia/Shanghai")
START = datetime(2026, 3, 10, 2, 0, tzinfo=UTC)
TEXTS = ("Stand up and stretch", "该喝水了，记得休息一下")
OpenAt = Callable[[Path], Storage]


class Clock:
    """The project's clock (picoclaw.clock.now), set by the test: no real waiting, and the pools' own
    timers (which freezegun would stop too) keep running."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.moment = START
        monkeypatch.setattr(clock, "now", self.now)

    def now(self, tz: Any = None) -> datetime:
        return self.moment.astimezone(tz) if tz is not None else self.moment

    def advance(self, seconds: float) -> None:
        self.moment += timedelta(seconds=seconds)


class Delivered:
    """The outbox both schedulers deliver to: one record a firing, whoever fired it."""

    name = "telegram"

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self.guard = threading.Lock()

    async def deliver(self, key: str, text: str) -> None:
        await asyncio.sleep(0)  # let the other scheduler's claims interleave with this one's
        with self.guard:
            self.sent.append((key, text))


def no_agent(scope: str | None) -> SessionAgent:
    raise AssertionError("message jobs need no agent")


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


@pytest.fixture(params=["files", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def open_at(backend: str, request: pytest.FixtureRequest) -> Iterator[OpenAt]:
    """Open the backend of a workspace folder (for PostgreSQL each folder is a machine of its own)."""
    dsn = str(request.getfixturevalue("postgres_dsn")) if backend == "postgres" else ""
    opened: list[Storage] = []

    def opening(root: Path) -> Storage:
        storage: Storage = PostgresStorage(root, dsn, 4) if dsn else FilesStorage(root)
        opened.append(storage)
        return storage

    yield opening
    for storage in opened:
        storage.close()


def jobs_at(root: Path, storage: Storage) -> JobStore:
    return JobStore(root / "cron" / "jobs.json", SHANGHAI, storage=storage)


def scheduler_of(jobs: JobStore, outbox: Delivered) -> Scheduler:
    """A scheduler of message jobs only, on the jobs' own storage (as App builds one)."""
    return Scheduler(jobs, no_agent, outbox, storage=jobs.storage, channels=("telegram",))


def machines(backend: str, tmp_path: Path, open_at: OpenAt) -> tuple[JobStore, JobStore]:
    """Two schedulers' stores: one folder for files (two processes share it), two folders for PostgreSQL."""
    first = tmp_path / "machine-a"
    second = first if backend == "files" else tmp_path / "machine-b"
    mine = open_at(first)
    theirs = mine if second == first else open_at(second)
    return jobs_at(first, mine), jobs_at(second, theirs)


def add_reminder(jobs: JobStore, text: str, target: str = "telegram:1", **schedule: Any) -> Job:
    return jobs.add(make_schedule(tz=SHANGHAI, now=clock.now(), **schedule), "message", text, target)


def test_add_list_remove_round_trip_in_english_and_chinese(backend: str, tmp_path: Path, open_at: OpenAt,
                                                           now: Clock) -> None:
    mine, theirs = machines(backend, tmp_path, open_at)
    english = add_reminder(mine, TEXTS[0], in_="20 minutes")
    chinese = add_reminder(mine, TEXTS[1], every=3600)
    seen = theirs.load()  # as another process (or machine) lists them
    assert [(job.id, job.text) for job in seen] == [(english.id, TEXTS[0]), (chinese.id, TEXTS[1])]
    assert seen == mine.load()
    assert theirs.remove(english.id).text == TEXTS[0]
    assert [job.text for job in mine.load()] == [TEXTS[1]]
    with pytest.raises(Exception, match="no job with id"):
        mine.remove(english.id)
    # On PostgreSQL the rows are the truth: no jobs.json is written into the folder.
    assert mine.path.exists() == (backend == "files")


def test_two_schedulers_fire_every_due_job_exactly_once(backend: str, tmp_path: Path, open_at: OpenAt,
                                                        now: Clock) -> None:
    first, second = machines(backend, tmp_path, open_at)
    added = [add_reminder(first, f"{TEXTS[index % 2]} #{index}", f"telegram:{index % 5 + 1}", in_="1 minute")
             for index in range(10)]
    added += [add_reminder(first, f"{TEXTS[index % 2]} 每小时 #{index}", f"telegram:{index + 1}", every=3600)
              for index in range(4)]
    delivered = Delivered()
    schedulers = [scheduler_of(jobs, delivered) for jobs in (first, second)]

    async def both_run() -> None:
        await asyncio.gather(*(scheduler.run_due() for scheduler in schedulers))

    asyncio.run(both_run())
    assert delivered.sent == []  # nothing is due yet
    for _ in range(2):  # the one-time jobs are due, then the hourly ones too; each pass races both schedulers
        now.advance(3601)
        asyncio.run(both_run())
    fired = sorted(text for _, text in delivered.sent)
    expected = [job.text for job in added if job.schedule.at is not None] + [
        job.text for job in added if job.schedule.every is not None] * 2
    assert fired == sorted(expected)


def test_threads_claiming_one_run_at_once_take_it_once(backend: str, tmp_path: Path, open_at: OpenAt,
                                                       now: Clock) -> None:
    first, second = machines(backend, tmp_path, open_at)
    job = add_reminder(first, TEXTS[1], every=3600)
    now.advance(3600)
    start = threading.Barrier(8)
    taken: list[Job] = []

    def claim(jobs: JobStore) -> None:
        def take(stored: Job) -> bool:
            if stored.next_run != job.next_run:
                return False  # the run seen is gone: another claimed it
            stored.next_run = clock.now() + timedelta(hours=1)
            return True

        start.wait()
        won = jobs.claim(job.id, take)
        if won is not None:
            taken.append(won)

    threads = [threading.Thread(target=claim, args=(jobs,)) for jobs in (first, second) * 4]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(taken) == 1
    assert second.load()[0].next_run == START + timedelta(hours=2)


def test_a_one_time_job_fires_once_and_is_gone_after_a_week(backend: str, tmp_path: Path, open_at: OpenAt,
                                                           now: Clock) -> None:
    jobs, _ = machines(backend, tmp_path, open_at)
    job = add_reminder(jobs, TEXTS[1], in_="5 minutes")
    delivered = Delivered()
    scheduler = scheduler_of(jobs, delivered)
    now.advance(301)
    assert [ran.job_id for ran in asyncio.run(scheduler.run_due())] == [job.id]
    now.advance(3600)
    assert asyncio.run(scheduler.run_due()) == []
    assert delivered.sent == [("telegram:1", TEXTS[1])]
    (done,) = jobs.load()
    assert done.next_run is None and done.last_outcome == "ok"
    assert jobs.claim(job.id, lambda stored: True) is None  # no run left to take
    now.advance(8 * 86400)
    add_reminder(jobs, TEXTS[0], in_="1 hour")  # the next write prunes what ran over a week ago
    assert [left.text for left in jobs.load()] == [TEXTS[0]]


def test_a_recurring_jobs_next_run_moves_forward(backend: str, tmp_path: Path, open_at: OpenAt,
                                                 now: Clock) -> None:
    jobs, _ = machines(backend, tmp_path, open_at)
    job = add_reminder(jobs, TEXTS[0], every=3600)
    assert job.next_run == START + timedelta(hours=1)
    delivered = Delivered()
    scheduler = scheduler_of(jobs, delivered)
    now.advance(3600)
    asyncio.run(scheduler.run_due())
    assert jobs.load()[0].next_run == START + timedelta(hours=2)
    now.advance(1800)
    asyncio.run(scheduler.run_due())  # half an hour on: not due again yet
    assert len(delivered.sent) == 1
    now.advance(1800)
    asyncio.run(scheduler.run_due())
    assert len(delivered.sent) == 2 and jobs.load()[0].next_run == START + timedelta(hours=3)


# -- bad input ----------------------------------------------------------------------------------------------

def stored_state(backend: str, jobs: JobStore, dsn: str) -> object:
    """What the backend holds, byte for byte: the file, or the rows."""
    if backend == "files":
        return jobs.path.read_bytes()
    with psycopg.connect(dsn) as conn:
        return conn.execute("select scope, id, job::text, due, position from jobs order by id").fetchall()


def test_a_malformed_job_is_one_clear_error_and_nothing_changes(backend: str, tmp_path: Path, open_at: OpenAt,
                                                               now: Clock, request: pytest.FixtureRequest) -> None:
    jobs, _ = machines(backend, tmp_path, open_at)
    add_reminder(jobs, TEXTS[1], every=3600)
    malformed = '{"id": "bad1", "text": "没有时间表"}'  # no schedule, no target
    dsn = ""
    if backend == "files":
        jobs.path.write_text(f'{{"version": 1, "jobs": [{malformed}]}}', encoding="utf-8")
    else:
        dsn = str(request.getfixturevalue("postgres_dsn"))
        with psycopg.connect(dsn) as conn:
            conn.execute("insert into jobs (scope, id, job, position) values ('', 'bad1', %s::json, 9)", (malformed,))
    before = stored_state(backend, jobs, dsn)
    with pytest.raises(JobsFileError) as caught:
        jobs.load()
    message = str(caught.value)
    assert "schedule" in message and "\n" not in message
    with pytest.raises(JobsFileError):
        add_reminder(jobs, TEXTS[0], in_="1 hour")
    delivered = Delivered()
    now.advance(7200)
    assert asyncio.run(scheduler_of(jobs, delivered).run_due()) == []
    assert stored_state(backend, jobs, dsn) == before and delivered.sent == []


def test_a_server_gone_is_one_clear_error_and_the_rows_stay(tmp_path: Path, postgres_dsn: str, now: Clock) -> None:
    storage = PostgresStorage(tmp_path, postgres_dsn, 2)
    try:
        jobs = jobs_at(tmp_path, storage)
        add_reminder(jobs, TEXTS[1], every=3600)
        # Connections the server dropped (a restart) are replaced when the pool hands them out; the pool sees a
        # dropped one by its closed socket, so each is waited for until it has ended.
        name = psycopg.conninfo.conninfo_to_dict(postgres_dsn)["dbname"]
        with psycopg.connect(postgres_dsn, dbname="postgres", autocommit=True) as admin:
            admin.execute("select pg_terminate_backend(pid, 30000) from pg_stat_activity where datname = %s "
                          "and pid <> pg_backend_pid()", (name,))
        add_reminder(jobs, "Check the oven 看看烤箱", every=7200)
        before = stored_state("postgres", jobs, postgres_dsn)
        storage.pool.close()  # the server is out of reach for this process
        with pytest.raises(JobsFileError) as caught:
            add_reminder(jobs, TEXTS[0], in_="1 hour")
        message = str(caught.value)
        assert "cannot be reached" in message and "\n" not in message and "该喝水" not in message
        assert stored_state("postgres", jobs, postgres_dsn) == before  # the failed add left the rows as they were
        storage.pool = open_pool(postgres_dsn, 2)  # back again
        now.advance(3600)
        delivered = Delivered()
        assert len(asyncio.run(scheduler_of(jobs, delivered).run_due())) == 1
        assert delivered.sent == [("telegram:1", TEXTS[1])]
    finally:
        storage.close()


# -- moving between backends --------------------------------------------------------------------------------

def test_export_then_import_is_byte_for_byte(tmp_path: Path, postgres_dsn: str, now: Clock) -> None:
    source = tmp_path / "files-workspace"
    files = FilesStorage(source)
    shared = jobs_at(source, files)
    add_reminder(shared, TEXTS[0], in_="2 hours")
    add_reminder(shared, TEXTS[1], cron="0 8 * * 1")
    own = JobStore(source / "users" / "u42" / "cron" / "jobs.json", SHANGHAI, storage=files)
    add_reminder(own, "只给我一个人的提醒", "telegram:42", every=86400)
    storage = PostgresStorage(tmp_path / "server-workspace", postgres_dsn, 2)
    try:
        assert storage.import_jobs(source, replace=False) == 3
        assert storage.import_jobs(source, replace=False) == 3  # the same again: nothing to refuse
        assert storage.job_counts() == {"jobs": 3, "jobs_to_run": 3}
        exported = tmp_path / "exported"
        storage.export_jobs(exported)
        for path in (shared.path, own.path):
            assert (exported / path.relative_to(source)).read_bytes() == path.read_bytes()
        other = tmp_path / "other-workspace"
        add_reminder(jobs_at(other, FilesStorage(other)), "another workspace's job", every=600)
        with pytest.raises(StorageError, match="replace"):
            storage.import_jobs(other, replace=False)
        assert storage.job_counts()["jobs"] == 3  # refused: nothing changed
        assert storage.import_jobs(other, replace=True) == 1
        again = tmp_path / "exported-again"
        storage.export_jobs(again)
        assert (again / "cron" / "jobs.json").read_bytes() == (other / "cron" / "jobs.json").read_bytes()
        assert not (again / "users").exists()
    finally:
        storage.close()
