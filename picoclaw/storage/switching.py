"""A workspace whose config.json moved from files to PostgreSQL while its folder still holds the files' content.

Moving to a server is `picoclaw memory import`; a user who only edits config.json would meet an assistant that has
forgotten its conversations and jobs (the database never takes them from the folder by itself). `switch_warning`
says so in one line at every start until the database holds them or an import ran. It asks only what is cheap
(which of the folder's transcripts, and which scopes' jobs and memory entries, the database holds at all), and a
clean verdict is remembered per database in the workspace's work folder, so a workspace pays for it once.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import orjson

from picoclaw import clock
from picoclaw.disk.atomic import atomic_write
from picoclaw.disk.bounded_read import read_regular
from picoclaw.layout import CRON_DIR, JOBS_FILE, MEMORY_DIR
from picoclaw.storage.backend import Storage
from picoclaw.storage.stored_files import scope_roots, session_names
from picoclaw.storage.work import WORK_DIR

if TYPE_CHECKING:
    from picoclaw.storage.postgres.storage import PostgresStorage

SWITCH_FILE = "imported.json"  # in WORK_DIR: database → when the folder's own content was found in it
NOTE_NAME = re.compile(r"^\d{8}\.md$")  # a daily note, memory/<yyyymm>/<yyyymmdd>.md
ENTRY = re.compile(rb"(^|\n)## ")  # an entry's heading in MEMORY.md or LEARNINGS.md
ENTRY_DOCUMENTS = ("MEMORY.md", "LEARNINGS.md")
# The scopes holding a live document with content: a daily note, or MEMORY.md / LEARNINGS.md with an entry.
_SCOPES_WITH_ENTRIES = (
    "select distinct scope from documents where content is not null and (name ~ %s or "
    "(name = any(%s) and (position(%s::bytea in content) > 0 or substring(content from 1 for 3) = %s::bytea)))")


@dataclass
class FolderContent:
    """What the files backend left in a workspace folder that a person would miss, per scope ("" or a user key)."""

    transcripts: set[tuple[str, str]] = field(default_factory=set)  # (scope, file name under sessions/)
    jobs: set[str] = field(default_factory=set)  # scopes whose cron/jobs.json holds a job
    entries: set[str] = field(default_factory=set)  # scopes with a daily note or an entry in MEMORY/LEARNINGS.md

    def __bool__(self) -> bool:
        return bool(self.transcripts or self.jobs or self.entries)


def folder_content(root: Path) -> FolderContent:
    """The files backend's content under the workspace folder `root`: names and headings only, never whole
    transcripts."""
    found = FolderContent()
    for scope, scope_root in scope_roots(root):
        found.transcripts.update((scope, PurePosixPath(name).name) for name in session_names(scope_root))
        if _holds_jobs(scope_root / CRON_DIR / JOBS_FILE):
            found.jobs.add(scope)
        if _holds_entries(scope_root / MEMORY_DIR):
            found.entries.add(scope)
    return found


def _holds_jobs(path: Path) -> bool:
    try:
        document = orjson.loads(read_regular(path))
    except (OSError, orjson.JSONDecodeError):
        return False  # no jobs file, or one no backend could load: nothing an import would bring
    return isinstance(document, dict) and bool(document.get("jobs"))


def _holds_entries(memory: Path) -> bool:
    for name in ENTRY_DOCUMENTS:
        try:
            if ENTRY.search(read_regular(memory / name)):
                return True
        except OSError:
            pass
    if not memory.is_dir():
        return False
    return any(month.is_dir() and any(NOTE_NAME.match(note.name) for note in month.iterdir())
               for month in memory.iterdir() if month.name.isdigit() and len(month.name) == 6)


def database_lacks(storage: PostgresStorage, found: FolderContent) -> FolderContent:
    """What of `found` the database does not hold at all: transcripts by name, jobs and entries by scope."""
    with storage.pool.connection() as conn:
        transcripts = {(str(scope), str(name)) for scope, name in conn.execute("select scope, name from sessions")}
        job_scopes = {str(row[0]) for row in conn.execute("select distinct scope from jobs")}
        entry_scopes = {str(row[0]) for row in conn.execute(
            _SCOPES_WITH_ENTRIES, (rf"^{MEMORY_DIR}/[0-9]{{6}}/[0-9]{{8}}\.md$",
                                   [f"{MEMORY_DIR}/{name}" for name in ENTRY_DOCUMENTS], b"\n## ", b"## "))}
    return FolderContent(found.transcripts - transcripts, found.jobs - job_scopes, found.entries - entry_scopes)


def switch_warning(storage: Storage) -> str | None:
    """One line when the workspace folder holds files-backend content the PostgreSQL database lacks, else None.

    Call it before the memory documents are opened (`Storage.documents`): a database holding nothing of the
    workspace takes the folder's documents then, but never its sessions or jobs.
    """
    if storage.backend != "postgres":
        return None
    import psycopg

    from picoclaw.storage.postgres.storage import PostgresStorage

    if not isinstance(storage, PostgresStorage):
        return None
    try:
        if _key(storage) in _marks(storage.root):
            return None
        found = folder_content(storage.root)
        lacking = database_lacks(storage, found) if found else found
    except psycopg.Error:
        return None  # a check that cannot ask must not stop the command: its own storage calls say what is wrong
    if not lacking:
        remember_imported(storage)
        return None
    what = []
    if lacking.transcripts:
        count = len(lacking.transcripts)
        what.append(f"{count} conversation{'' if count == 1 else 's'}")
    if lacking.jobs:
        what.append("scheduled jobs")
    if lacking.entries:
        what.append("memory entries or notes")
    from picoclaw.storage.postgres.connection import server_name

    folder = shlex.quote(str(storage.root))  # a command to paste into a shell as it is
    return (f"the workspace folder {storage.root} holds {_listed(what)} from the files backend that the PostgreSQL "
            f"database at {server_name(storage.dsn)} lacks: run `picoclaw memory import {folder}` to move them in")


def remember_imported(storage: Storage) -> None:
    """Note that this workspace's folder needs nothing imported into its database any more (after an import, or
    a check that found nothing missing), so later starts skip the check."""
    if storage.backend != "postgres":
        return
    from picoclaw.storage.postgres.storage import PostgresStorage

    if not isinstance(storage, PostgresStorage):
        return
    import psycopg

    try:
        marks = _marks(storage.root)
        marks[_key(storage)] = clock.now().isoformat()
        atomic_write(storage.root / WORK_DIR / SWITCH_FILE, orjson.dumps(marks, option=orjson.OPT_INDENT_2))
    except (OSError, psycopg.Error):
        pass  # a mark not written only costs the check again at the next start


def _key(storage: PostgresStorage) -> str:
    """The database: its server (never the user or password) and its name."""
    from picoclaw.storage.postgres.connection import server_name

    with storage.pool.connection() as conn:
        return f"{server_name(storage.dsn)}/{conn.info.dbname}"


def _marks(root: Path) -> dict[str, object]:
    try:
        marks = orjson.loads(read_regular(root / WORK_DIR / SWITCH_FILE))
    except (OSError, orjson.JSONDecodeError):
        return {}  # none yet, or damaged: the check runs again, and finds what it finds
    return marks if isinstance(marks, dict) else {}


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
