"""The storage layer (DESIGN §1.1): one contract, the files backend and the PostgreSQL backend."""

from picoclaw.storage.backend import Storage
from picoclaw.storage.errors import SchemaTooNew, StorageError, StorageUnavailable
from picoclaw.storage.files import FilesStorage
from picoclaw.storage.inbox import Inbox, InboxUpdate
from picoclaw.storage.jobs import JOBS_VERSION, FilesJobTable, JobRecord, JobsDocument, JobTable
from picoclaw.storage.mounts import cross_process_lock, mount, storage_for, unmount
from picoclaw.storage.opening import open_storage
from picoclaw.storage.sessions import (
    ARCHIVE_DIR,
    LOCK_FILE,
    SUFFIX,
    FilesSessionLog,
    SessionLog,
    Transcript,
    transcript_files,
)
from picoclaw.storage.transfer import Moved, export_workspace, import_workspace

__all__ = [
    "ARCHIVE_DIR",
    "LOCK_FILE",
    "SUFFIX",
    "FilesSessionLog",
    "SessionLog",
    "Transcript",
    "transcript_files",
    "FilesStorage",
    "Inbox",
    "InboxUpdate",
    "Moved",
    "JOBS_VERSION",
    "FilesJobTable",
    "JobRecord",
    "JobTable",
    "JobsDocument",
    "SchemaTooNew",
    "Storage",
    "StorageError",
    "StorageUnavailable",
    "cross_process_lock",
    "export_workspace",
    "import_workspace",
    "mount",
    "open_storage",
    "storage_for",
    "unmount",
]
