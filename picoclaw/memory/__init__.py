"""Memory: the Markdown store, the policy that drives it, search over it, and the jobs that keep it.

What the memory layer offers the layers above it (agent, tools, channels, the CLI and app.py) is listed in
`__all__`. Each name is imported on first use (picoclaw/lazy_exports.py): importing any memory module runs
this file first, and it must not bring the whole layer with it (pydantic, the tokenizer, the index, numpy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from picoclaw.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from picoclaw.memory.compression import CompressionResult, LongTermCompressor, format_missing, why_not_due
    from picoclaw.memory.deferred_flushes import DeferredFlush, DeferredFlushes
    from picoclaw.memory.entries import (
        SUPERSEDED,
        LongTermEntry,
        demote_headings,
        entry_version,
        is_superseded,
        long_term_entries,
        models_entry,
    )
    from picoclaw.memory.eval.answer_scoring import answer_tokens, parse_verdict, token_f1
    from picoclaw.memory.eval.answers import JUDGE_PROMPT, AnswerRun, answer_cases
    from picoclaw.memory.eval.case_set import eval_set, save_cases, saved_cases
    from picoclaw.memory.eval.cases import CASES_NAME, CaseFileError, EvalCase, merged, parse_cases, read_case_file
    from picoclaw.memory.eval.generate import Generated, generate_cases
    from picoclaw.memory.eval.policy_check import PolicyCheck, check_change
    from picoclaw.memory.eval.retrieval import Retrieved, retrieve, under_policy
    from picoclaw.memory.eval.run import EvalReport, evaluate
    from picoclaw.memory.eval.run_log import EvalRun, log_run, logged_runs
    from picoclaw.memory.eval.targets import memory_entries
    from picoclaw.memory.feedback import FeedbackLedger, Reaction, verdict_of
    from picoclaw.memory.flush import flush_facts
    from picoclaw.memory.flush_counts import FlushCounts, FlushTally
    from picoclaw.memory.grounding import (
        QUESTION,
        UNGROUNDED,
        Known,
        Said,
        added_text,
        check,
        grounded,
        not_a_fact,
        overlap,
        same_words,
        sources_changed,
        user_texts,
    )
    from picoclaw.memory.index.embedders import (
        DEFAULT_LOCAL_MODEL,
        LOCAL,
        REMOTE_RETRIES,
        REMOTE_TIMEOUT,
        E5Embedder,
        Embedder,
        EmbeddingUnavailable,
        LocalEmbedder,
        OpenAICompatEmbedder,
    )
    from picoclaw.memory.index.memory_index import MemoryIndex
    from picoclaw.memory.index.status import IndexStatus
    from picoclaw.memory.index.sync import SyncReport
    from picoclaw.memory.job_outcomes import COMPRESSION, REFLECTION, JobOutcome, last_outcome, record_outcome
    from picoclaw.memory.learnings import DRAFTED_CORRECTION, instruction_lesson, keeps_point, lesson_of, stands
    from picoclaw.memory.media_folder import MediaFolder, image_type, safe_name
    from picoclaw.memory.model_usage import ModelUsage
    from picoclaw.memory.policy import EffectivePolicy, PolicyChange, PolicyError, PolicyManager
    from picoclaw.memory.policy_suggestions import SuggestionError, suggest_policy_change
    from picoclaw.memory.receipts import LEARNINGS, LONG_TERM, MemoryWrite, TurnWrites, WriteLog, current_turn
    from picoclaw.memory.search import (
        Block,
        Hit,
        IndexedSearch,
        InjectedMemory,
        KeywordSearch,
        MemorySearch,
        index_of,
        open_search,
        rank_blocks,
        search_method,
        select_turn_memory,
        split_blocks,
        standing_lessons,
    )
    from picoclaw.memory.session import UNDELIVERED, Session, SessionStore, StoredMessage, summary_of, with_summary
    from picoclaw.memory.spend import Day, Hold, SpendLedger, Spent
    from picoclaw.memory.stats import MemoryStats, entry_injections, memory_stats
    from picoclaw.memory.store import BACKUPS_DIR, DailyNote, MemoryStore
    from picoclaw.memory.turn_metrics import TurnMetrics
    from picoclaw.memory.workspace import Workspace

__all__ = [
    "BACKUPS_DIR", "Block", "COMPRESSION", "DRAFTED_CORRECTION", "CompressionResult", "DEFAULT_LOCAL_MODEL",
    "DailyNote", "Day", "DeferredFlush", "DeferredFlushes", "Hold", "Spent", "SpendLedger", "E5Embedder",
    "EffectivePolicy", "Embedder", "EmbeddingUnavailable", "FeedbackLedger", "FlushCounts", "FlushTally", "Hit",
    "IndexStatus",
    "IndexedSearch", "InjectedMemory", "JobOutcome", "KeywordSearch", "Known", "LEARNINGS", "LOCAL", "LONG_TERM",
    "LocalEmbedder", "LongTermCompressor", "LongTermEntry", "MemoryIndex", "MemorySearch", "MemoryStats",
    "MediaFolder", "MemoryStore", "MemoryWrite", "ModelUsage", "OpenAICompatEmbedder", "PolicyChange",
    "PolicyError",
    "PolicyManager", "QUESTION", "REFLECTION", "Reaction", "REMOTE_RETRIES", "REMOTE_TIMEOUT", "SUPERSEDED", "Said",
    "Session",
    "SessionStore", "StoredMessage", "SuggestionError", "SyncReport", "TurnMetrics", "TurnWrites", "UNDELIVERED",
    "UNGROUNDED",
    "Workspace",
    "WriteLog", "added_text", "check", "current_turn", "demote_headings", "entry_injections",
    "entry_version", "flush_facts",
    "format_missing", "grounded", "image_type", "index_of", "instruction_lesson", "is_superseded", "keeps_point",
    "last_outcome",
    "lesson_of", "long_term_entries", "memory_stats", "models_entry", "not_a_fact", "open_search", "overlap",
    "rank_blocks", "record_outcome", "safe_name", "same_words", "search_method", "select_turn_memory",
    "sources_changed", "split_blocks", "standing_lessons", "stands",
    "suggest_policy_change", "summary_of", "user_texts", "verdict_of", "why_not_due", "with_summary",
    # memory/eval/: `picoclaw memory eval`
    "AnswerRun", "CASES_NAME", "CaseFileError", "EvalCase", "EvalReport", "EvalRun", "Generated", "JUDGE_PROMPT",
    "PolicyCheck", "Retrieved", "answer_cases", "answer_tokens", "check_change", "eval_set", "evaluate",
    "generate_cases", "log_run", "logged_runs", "memory_entries", "merged", "parse_cases", "parse_verdict",
    "read_case_file", "retrieve", "save_cases", "saved_cases", "token_f1", "under_policy",
]

# The module each name of __all__ is imported from when it is first asked for.
_HOMES = {
    "picoclaw.memory.compression": ("CompressionResult", "LongTermCompressor", "format_missing", "why_not_due"),
    "picoclaw.memory.entries": ("SUPERSEDED", "LongTermEntry", "demote_headings", "entry_version", "is_superseded",
                                "long_term_entries", "models_entry"),
    "picoclaw.memory.eval.answers": ("JUDGE_PROMPT", "AnswerRun", "answer_cases"),
    "picoclaw.memory.eval.case_set": ("eval_set", "save_cases", "saved_cases"),
    "picoclaw.memory.eval.cases": ("CASES_NAME", "CaseFileError", "EvalCase", "merged", "parse_cases",
                                    "read_case_file"),
    "picoclaw.memory.eval.generate": ("Generated", "generate_cases"),
    "picoclaw.memory.eval.policy_check": ("PolicyCheck", "check_change"),
    "picoclaw.memory.eval.retrieval": ("Retrieved", "retrieve", "under_policy"),
    "picoclaw.memory.eval.run": ("EvalReport", "evaluate"),
    "picoclaw.memory.eval.run_log": ("EvalRun", "log_run", "logged_runs"),
    "picoclaw.memory.eval.answer_scoring": ("answer_tokens", "parse_verdict", "token_f1"),
    "picoclaw.memory.eval.targets": ("memory_entries",),
    "picoclaw.memory.policy_suggestions": ("SuggestionError", "suggest_policy_change"),
    "picoclaw.memory.feedback": ("FeedbackLedger", "Reaction", "verdict_of"),
    "picoclaw.memory.flush": ("flush_facts",),
    "picoclaw.memory.flush_counts": ("FlushCounts", "FlushTally"),
    "picoclaw.memory.grounding": ("QUESTION", "UNGROUNDED", "Known", "Said", "added_text", "check", "grounded",
                                  "not_a_fact", "overlap", "same_words", "sources_changed", "user_texts"),
    "picoclaw.memory.index.embedders": ("DEFAULT_LOCAL_MODEL", "LOCAL", "REMOTE_RETRIES", "REMOTE_TIMEOUT",
                                        "E5Embedder", "Embedder", "EmbeddingUnavailable", "LocalEmbedder",
                                        "OpenAICompatEmbedder"),
    "picoclaw.memory.index.memory_index": ("MemoryIndex",),
    "picoclaw.memory.index.status": ("IndexStatus",),
    "picoclaw.memory.index.sync": ("SyncReport",),
    "picoclaw.memory.job_outcomes": ("COMPRESSION", "REFLECTION", "JobOutcome", "last_outcome", "record_outcome"),
    "picoclaw.memory.learnings": ("DRAFTED_CORRECTION", "instruction_lesson", "keeps_point", "lesson_of", "stands"),
    "picoclaw.memory.media_folder": ("MediaFolder", "image_type", "safe_name"),
    "picoclaw.memory.model_usage": ("ModelUsage",),
    "picoclaw.memory.deferred_flushes": ("DeferredFlush", "DeferredFlushes"),
    "picoclaw.memory.spend": ("Day", "Hold", "Spent", "SpendLedger"),
    "picoclaw.memory.policy": ("EffectivePolicy", "PolicyChange", "PolicyError", "PolicyManager"),
    "picoclaw.memory.receipts": ("LEARNINGS", "LONG_TERM", "MemoryWrite", "TurnWrites", "WriteLog", "current_turn"),
    "picoclaw.memory.search": ("Block", "Hit", "IndexedSearch", "InjectedMemory", "KeywordSearch", "MemorySearch",
                               "index_of", "open_search", "rank_blocks", "search_method", "select_turn_memory",
                               "split_blocks", "standing_lessons"),
    "picoclaw.memory.session": ("UNDELIVERED", "Session", "SessionStore", "StoredMessage", "summary_of",
                                "with_summary"),
    "picoclaw.memory.stats": ("MemoryStats", "entry_injections", "memory_stats"),
    "picoclaw.memory.store": ("BACKUPS_DIR", "DailyNote", "MemoryStore"),
    "picoclaw.memory.turn_metrics": ("TurnMetrics",),
    "picoclaw.memory.workspace": ("Workspace",),
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
