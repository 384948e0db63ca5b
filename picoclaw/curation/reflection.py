"""Reflection: every `evolution_interval_messages` messages of a session, the model may tune the policy.

The suggestion itself (prompt, tolerant parsing, strict validation) is curation/policy_suggestions.py. Here: when a
session is due, what it is shown, and applying a valid change through PolicyManager.set (snapshot, atomic
write of the overrides, a history line), which every running agent reads on its next turn. When the memory has
an eval set, the change is first tried against it (retrieval only, memory/eval/policy_check.py): one that finds
fewer of the cases is refused, and the refusal kept in the policy history with both figures; one that keeps or
raises recall applies, its history line carrying the figures too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from picoclaw.curation.policy_suggestions import SuggestionError, suggest_policy_change
from picoclaw.curation.session_summary import render_transcript
from picoclaw.memory import REFLECTION, CaseFileError, PolicyCheck, PolicyError, PolicyManager, record_outcome
from picoclaw.policy_schema import MemoryPolicy
from picoclaw.providers.base import ChatProvider, Continuation, Message
from picoclaw.transcripts import Session, SessionStore, StoredMessage

log = logging.getLogger(__name__)

SOURCE = "evolution"

# Tries a change of policy keys against the memory's eval set; None when there is none (memory/eval/).
EvalCheck = Callable[[dict[str, Any]], PolicyCheck | None]
TRANSCRIPT_CHARS = 12_000  # the newest part of the conversation; enough to judge, cheap to send


@dataclass(frozen=True)
class ReflectionOutcome:
    """What one reflection did: the changes applied (empty: none), or why nothing was written."""

    changes: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    snapshot: Path | None = None
    refused: str | None = None

    @property
    def status(self) -> str:
        """One word: "changed", "unchanged" or "refused"."""
        return "refused" if self.refused is not None else "changed" if self.changes else "unchanged"

    def describe(self) -> str:
        """What was changed and why, or why nothing was."""
        if self.refused is not None:
            return self.refused
        if not self.changes:
            return self.reason or "the model suggested no change"
        changed = ", ".join(f"{key} → {value}" for key, value in self.changes.items())
        return f"{changed} ({self.reason})" if self.reason else changed


def reflection_due(policy: MemoryPolicy, session: Session) -> bool:
    """Evolution is on and the session has had `evolution_interval_messages` messages since the last one."""
    return policy.evolution_enabled and session.messages_since_reflection() >= policy.evolution_interval_messages


def recent_transcript(messages: list[Message]) -> str:
    """The conversation as text for the model, cut to its newest TRANSCRIPT_CHARS characters."""
    transcript = render_transcript(messages)
    return "[…]\n" + transcript[-TRANSCRIPT_CHARS:] if len(transcript) > TRANSCRIPT_CHARS else transcript


class Reflector:
    """Asks one provider for policy suggestions and applies the valid ones to one PolicyManager."""

    def __init__(self, policy: PolicyManager, provider: ChatProvider, check: EvalCheck | None = None):
        self.policy = policy
        self.provider = provider
        self.check = check  # run in a worker thread: it searches the memory once per case, twice

    async def maybe_reflect(self, sessions: SessionStore, session: Session,
                            after: Callable[[list[StoredMessage]], Continuation | None] = lambda stored: None
                            ) -> ReflectionOutcome | None:
        """Reflect on the session's messages since the last reflection, if due; else None. `after(stored)`: how to
        ask about those messages after the session's last request, if they end it (agent/cache_prefix.py)."""
        if not reflection_due(self.policy.current(), session):
            return None
        stored = [m for m in session.messages if m.id > session.reflected_through]
        # Recorded before the model call: a turn ending meanwhile does not start a second reflection, and
        # a failing model is asked once per interval, not after every turn.
        await asyncio.to_thread(sessions.add_reflection, session, session.last_id)
        return await self.reflect(session.key, [m.message for m in stored], after(stored))

    async def reflect(self, session_key: str, messages: list[Message],
                      after: Continuation | None = None) -> ReflectionOutcome:
        """Ask for a suggestion about `messages` and apply it if it is valid; what came of it is kept as the
        last reflection's outcome (memory/job_outcomes.py), a reflection that changed nothing too. `after`: a
        request ending with `messages` to ask after, and which part of it they are."""
        try:
            outcome = await self._reflect(session_key, messages, after)
        except Exception as exc:
            await asyncio.to_thread(self._record, session_key, "failed", f"{type(exc).__name__}: {exc}")
            raise
        await asyncio.to_thread(self._record, session_key, outcome.status, outcome.describe())
        return outcome

    def _record(self, session_key: str, status: str, detail: str) -> None:
        # Beside the policy it tunes: the owner's, shared by every memory scope.
        record_outcome(self.policy.documents, self.policy.memory_dir, REFLECTION, status,
                       f"session {session_key}: {detail}")

    async def _reflect(self, session_key: str, messages: list[Message],
                       after: Continuation | None) -> ReflectionOutcome:
        try:
            suggestion = await suggest_policy_change(
                self.provider, self.policy, recent_transcript(messages), after=after)
        except SuggestionError as exc:
            return self._refused(session_key, str(exc))
        if not suggestion.changes:
            log.info("session %s: reflection suggests no change", session_key)
            return ReflectionOutcome(reason=suggestion.reason)
        if not self.policy.current().evolution_enabled:  # switched off while the model was thinking
            return self._refused(session_key, "evolution was switched off meanwhile")
        check: PolicyCheck | None = None
        if self.check is not None:
            try:
                check = await asyncio.to_thread(self.check, suggestion.changes)
            except CaseFileError as exc:  # an eval set that cannot be read cannot say yes
                return self._refused(session_key, f"the eval could not check the change: {exc}")
        if check is not None and check.lowers:
            changed = ", ".join(f"{key} → {value}" for key, value in suggestion.changes.items())
            why = f"{changed} would lower {check.describe()}"
            await asyncio.to_thread(self.policy.record_refusal, suggestion.changes, why, source=SOURCE,
                                    session=session_key, check=check.record(),
                                    reason=f"not applied: {why}" + (f" (the model's reason: {suggestion.reason})"
                                                                    if suggestion.reason else ""))
            return self._refused(session_key, f"not applied: {why}")
        try:
            snapshot = await asyncio.to_thread(self.policy.set, suggestion.changes, source=SOURCE,
                                               session=session_key, reason=suggestion.reason,
                                               check=None if check is None else check.record())
        except PolicyError as exc:  # the policy changed meanwhile (another process) and no longer fits
            return self._refused(session_key, str(exc))
        log.info("session %s: reflection changed the policy %s (%s)", session_key, suggestion.changes,
                 suggestion.reason)
        return ReflectionOutcome(suggestion.changes, suggestion.reason, snapshot)

    @staticmethod
    def _refused(session_key: str, why: str) -> ReflectionOutcome:
        log.warning("session %s: reflection wrote nothing: %s", session_key, why)
        return ReflectionOutcome(refused=why)
