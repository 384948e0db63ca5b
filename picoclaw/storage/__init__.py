"""The storage layer (DESIGN §1.1): one contract, the files backend and the PostgreSQL backend."""

from picoclaw.storage.backend import Storage
from picoclaw.storage.errors import SchemaTooNew, StorageError, StorageUnavailable
from picoclaw.storage.files import FilesStorage
from picoclaw.storage.jobs import JOBS_VERSION, FilesJobTable, JobRecord, JobsDocument, JobTable
from picoclaw.storage.mounts import cross_process_lock, mount, storage_for, unmount
from picoclaw.storage.opening import open_storage

__all__ = [
    "JOBS_VERSION",
    "FilesJobTable",
    "FilesStorage",
    "JobRecord",
    "JobTable",
    "JobsDocument",
    "SchemaTooNew",
    "Storage",
    "StorageError",
    "StorageUnavailable",
    "cross_process_lock",
    "mount",
    "open_storage",
    "storage_for",
    "unmount",
]
