"""Errors that reach the user as one clear line."""

from __future__ import annotations


class PicoclawError(Exception):
    """An error whose message is meant for the user, printed as one line without a traceback."""


class ConfigError(PicoclawError):
    """config.json (or another user-edited JSON file) is missing, malformed or invalid."""


class MemoryStoreError(PicoclawError):
    """A memory file could not be read or written as asked."""
