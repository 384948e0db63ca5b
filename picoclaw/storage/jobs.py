"""The jobs port: scheduled jobs as plain JSON, changed atomically, and due runs claimed once.

The Job model lives in `picoclaw.jobs`; this layer sees only the JSON that jobs.json holds: the document
`{"version": 1, "jobs": [record, …]}`, each record one job. Of a record it reads `id`, and `next_run` and
`enabled` to know when it is due. `FilesJobTable` keeps the document as `cron/jobs.json` (the default);
the PostgreSQL table (storage/postgres/jobs.py) keeps one row a job.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

import orjson

from picoclaw.disk.atomic import atomic_write
from picoclaw.disk.bounded_read import FileTooLargeError, read_bounded
from picoclaw.disk.file_identity import file_key
from picoclaw.disk.links import NotAFileError
from picoclaw.storage.errors import StorageError
from picoclaw.storage.waits import LOCK_WAIT_SECONDS, BoundedFileLock

T = TypeVar("T")

JobRecord = dict[str, Any]  # one job, as jobs.json holds it
JobsDocument = dict[str, Any]  # {"version": 1, "jobs": [JobRecord, …]}
# The edit of `JobTable.change`: given the stored document (None: none yet), the document to store instead
# (None: leave it as it is) and what `change` returns.
DocumentEdit = Callable[[Any], tuple[JobsDocument | None, T]]
# The taking of `JobTable.claim`: given a due record, the record to store for the run it takes, or None
# when the run is not to be taken (it changed since the caller saw it).
Take = Callable[[JobRecord], JobRecord | None]

JOBS_VERSION = 1
MAX_FILE_BYTES = 16 << 20  # thousands of jobs of the longest text; /dev/zero, or the wrong file, is refused at once


class JobTable(Protocol):
    """The scheduled jobs of one workspace (one jobs.json): read, changed atomically, due runs claimed."""

    path: Path  # the jobs.json this table is (files) or stands for (postgres)
    where: str  # how messages name it: the file's path, or the table and its scope

    def read(self) -> Any:
        """The stored document as parsed JSON, not yet checked (None when nothing is stored); StorageError
        (one line, naming `where`) when it cannot be read."""
        ...

    def stamp(self) -> Hashable | None:
        """A value that changes whenever the stored jobs change (None: nothing stored), for cheap polling."""
        ...

    def exists(self) -> bool:
        """Whether anything is stored at all (files: the file exists)."""
        ...

    def change(self, edit: DocumentEdit[T]) -> T:
        """Run `edit` on the document under the backend's lock (transaction) and store what it returns.

        Nothing is stored when `edit` raises or returns None as the document; changes from other processes
        and machines are serialised: none is lost.
        """
        ...

    def claim(self, job_id: str, now: datetime, take: Take) -> JobRecord | None:
        """Take the due run of job `job_id`: the one place that decides "this run is mine".

        When the job is due at `now` (enabled, next run ≤ now) and no other scheduler holds it, `take` gets
        its record and the record it returns is stored before this returns (it moves the next run on, so
        the same run is never taken twice, whatever the number of schedulers). None: not taken.
        """
        ...


def due_of(record: Mapping[str, Any]) -> datetime | None:
    """When `record` is next due: its `next_run` if it is enabled, else None; StorageError if unreadable."""
    if record.get("enabled", True) is False or record.get("next_run") is None:
        return None
    value = record["next_run"]
    try:
        due = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        due = None
    if due is None or due.utcoffset() is None:
        raise StorageError(f"job {str(record.get('id'))[:40]!r}: next_run {str(value)[:40]!r} is not a time with "
                           "a UTC offset")
    return due


def records_of(document: Any, where: str) -> list[JobRecord]:
    """The job records of a document, each an object with a text id; StorageError naming `where` if not."""
    jobs = document.get("jobs", []) if isinstance(document, dict) else None
    if not isinstance(jobs, list) or not all(isinstance(job, dict) and isinstance(job.get("id"), str)
                                             for job in jobs):
        raise StorageError(f"{where}: not a jobs document (an object whose \"jobs\" is a list of jobs with ids); "
                           "it is left unchanged")
    return jobs


def document_of(records: list[JobRecord]) -> JobsDocument:
    """The document holding `records`, as the files backend writes it."""
    return {"version": JOBS_VERSION, "jobs": records}


def document_bytes(document: JobsDocument) -> bytes:
    """jobs.json's bytes for `document`: what the files backend writes, and what an export writes."""
    return orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n"


class FilesJobTable:
    """jobs.json, changed under a `filelock` lock file beside it and written atomically."""

    def __init__(self, path: Path, *, lock_wait: float = LOCK_WAIT_SECONDS, root: Path | None = None):
        self.path = Path(path)
        self.where = str(self.path)
        self.lock_path = self.path.with_name(f".{self.path.name}.lock")
        self.lock_wait = lock_wait
        self.root = root  # the workspace root, for the lock's name in a failed wait

    def read(self) -> Any:
        """The file parsed (None when it is missing or blank)."""
        try:
            raw = read_bounded(self.path, MAX_FILE_BYTES)
        except FileNotFoundError:
            return None
        except (FileTooLargeError, NotAFileError) as exc:  # a link to /dev/zero, a FIFO: refused, not read
            raise StorageError(f"{exc}; it is left unchanged") from None
        except OSError as exc:
            raise StorageError(f"{self.path}: cannot read ({exc.strerror})") from None
        if not raw.strip():
            return None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise StorageError(f"{self.path}: not valid JSON ({exc.msg}); fix or remove the file, "
                               "it is left unchanged") from None

    def stamp(self) -> Hashable | None:
        return file_key(self.path)

    def exists(self) -> bool:
        return self.path.exists()

    def change(self, edit: DocumentEdit[T]) -> T:
        # The lock, then a fresh read under it: what another process wrote meanwhile is seen, never overwritten.
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        with BoundedFileLock(self.lock_path, self.lock_wait, self.root):
            written, result = edit(self.read())
            if written is not None:
                atomic_write(self.path, document_bytes(written))
            return result

    def claim(self, job_id: str, now: datetime, take: Take) -> JobRecord | None:
        def take_due(document: Any) -> tuple[JobsDocument | None, JobRecord | None]:
            if document is None:
                return None, None
            records = records_of(document, self.where)
            for index, record in enumerate(records):
                if record["id"] == job_id:
                    due = due_of(record)
                    taken = take(record) if due is not None and due <= now else None
                    if taken is None:
                        return None, None
                    return {**document, "jobs": [*records[:index], taken, *records[index + 1:]]}, taken
            return None, None

        return self.change(take_due)
