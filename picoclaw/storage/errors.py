"""Storage errors: each reaches the user as one line, never with a password in it."""

from __future__ import annotations

from picoclaw.errors import PicoclawError


class StorageError(PicoclawError):
    """The storage backend could not do what was asked; nothing was half-written."""


class StorageUnavailable(StorageError):
    """The database server cannot be reached (the message names host and port, never the password)."""


class SchemaTooNew(StorageError):
    """The database was set up by a newer picoclaw than this one."""
