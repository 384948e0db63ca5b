"""Curation: the work that calls a model to keep memory and transcripts in shape, after a turn or on command.

Session summaries, the memory flush (and the flushes deferred at the budget's cap), compression of MEMORY.md,
the turn review that decides whether a turn taught something, the lesson drafted from it, skill drafts,
reflection, and the policy changes a model suggests. Each is handed a provider (the interface in
`picoclaw.providers.base`) and writes through the memory store; the agent runs them after its reply. What this
layer offers is the imports of the block below, each imported on first use (picoclaw/lazy_exports.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from picoclaw.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from picoclaw.curation.compression import CompressionResult, LongTermCompressor, format_missing, why_not_due
    from picoclaw.curation.deferred_flushes import DeferredFlush, DeferredFlushes
    from picoclaw.curation.flush import flush_facts
    from picoclaw.curation.lesson_drafting import Learner
    from picoclaw.curation.policy_suggestions import SuggestionError, suggest_policy_change
    from picoclaw.curation.reflection import Reflector, reflection_due
    from picoclaw.curation.session_summary import (
        CUT_SHORT,
        CompactResult,
        accept_summary,
        continued_summary_request,
        render_transcript,
        summary_request,
        unseen_answer_claims,
    )
    from picoclaw.curation.turn_review import FinishedTurn

__getattr__, __dir__ = lazy_exports(__name__)
