"""Transcripts: each conversation's messages as its session keeps them, below memory and the agent.

A `SessionStore` reads and appends a chat's transcript through the storage's session log; the agent holds a
`Session` per chat, and memory reads transcripts for the index, stats and the eval. What it offers is the
imports of the block below, each imported on first use (picoclaw/lazy_exports.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from picoclaw.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from picoclaw.transcripts.session_store import (
        LOCK_FILE,
        UNDELIVERED,
        Session,
        SessionStore,
        StoredMessage,
        reported_usage,
        said_lines,
        summary_of,
        transcript_files,
        with_summary,
    )

__getattr__, __dir__ = lazy_exports(__name__)
