"""The storage layer: one contract, the files backend and the PostgreSQL backend.

`open_storage` opens the configured backend; the composition root (app.py) hands that one object to every
store that keeps bytes, so two workspaces in one process never share a backend by accident.

Where a write lands and when it is durable: memory documents go through `Storage.documents(scope)`
(documents.py). On files a write is the file itself, replaced atomically (an entry appended in place with a
journal), fsynced before the call returns (counters and caches written with durable=False are not fsynced).
On PostgreSQL it is the document's row, written in one statement and committed before the call returns.
Sessions, jobs and the inbox have their own ports and land the same way. Either way a writer killed half-way
leaves the old content or the new, never half.

Where a read comes from: the same port, at the moment of the read. On files, the file; on PostgreSQL, the row
(`Documents.local` hands a reader that wants a file this machine's cache of it under .picoclaw-work/documents/,
checked against the row's revision at that read). No lock, and no earlier call, decides what a read sees; the
workspace folder of a PostgreSQL workspace is never read as memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from picoclaw.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from picoclaw.storage.backend import Storage
    from picoclaw.storage.documents import MISSING, Changes, Document, Documents, StaleRevision
    from picoclaw.storage.errors import SchemaTooNew, StorageError, StorageUnavailable
    from picoclaw.storage.files import FilesStorage
    from picoclaw.storage.inbox import ASK_NOT_YOURS, ASK_STALE, ASK_TAKEN, Inbox, InboxUpdate
    from picoclaw.storage.jobs import JOBS_VERSION, FilesJobTable, JobRecord, JobsDocument, JobTable
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
    from picoclaw.storage.stored_files import is_stored_name
    from picoclaw.storage.switching import switch_warning
    from picoclaw.storage.telegram_replies import ReplyLog, SentReply
    from picoclaw.storage.transfer import Moved, export_workspace, import_workspace
    from picoclaw.storage.waits import LOCK_WAIT_SECONDS, LockWaitExpired
    from picoclaw.storage.workspace_documents import (
        document_of,
        edit_file,
        is_stored_document,
        local_file,
        local_folder,
        write_file,
    )

__getattr__, __dir__ = lazy_exports(__name__)
