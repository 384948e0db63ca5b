"""open_storage: the configured backend of one workspace folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from picoclaw.storage.backend import Storage
from picoclaw.storage.files import FilesStorage

if TYPE_CHECKING:  # an annotation only: importing the storage root must not load the config module
    from picoclaw.config import Config


def open_storage(config: Config, root: Path) -> Storage:
    """The backend config.json names, for the workspace folder `root`; the caller closes it."""
    if config.storage.backend == "postgres":
        from picoclaw.storage.postgres.storage import PostgresStorage

        return PostgresStorage(root, config.postgres_dsn(), config.storage.postgres.pool_size,
                               lock_wait=config.storage.lock_wait_seconds)
    return FilesStorage(root, lock_wait=config.storage.lock_wait_seconds)
