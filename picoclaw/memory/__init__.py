"""Memory: the Markdown store, the policy that drives it, search over it, and the jobs that keep it.

What the memory layer offers the layers above it (agent, tools, channels, the CLI and app.py) is the imports of
the block below. Each name is imported on first use (picoclaw/lazy_exports.py): importing any memory module runs
this file first, and it must not bring the whole layer with it (pydantic, the tokenizer, the index, numpy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from picoclaw.lazy_exports import lazy_exports

if TYPE_CHECKING:
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
    from picoclaw.memory.job_outcomes import (
        COMPRESSION,
        GATE_FILE,
        REFLECTION,
        JobOutcome,
        last_compression,
        last_outcome,
        record_outcome,
    )
    from picoclaw.memory.learnings import DRAFTED_CORRECTION, instruction_lesson, keeps_point, lesson_of, stands
    from picoclaw.memory.media_folder import MediaFolder, image_type, safe_name
    from picoclaw.memory.model_usage import ModelUsage
    from picoclaw.memory.policy import EffectivePolicy, PolicyChange, PolicyError, PolicyManager
    from picoclaw.memory.receipts import LEARNINGS, LONG_TERM, MemoryWrite, TurnWrites, WriteLog, current_turn
    from picoclaw.memory.rewrite_guard import missing_facts
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
        record_use,
        search_method,
        select_turn_memory,
        select_turn_memory_now,
        split_blocks,
        standing_lessons,
    )
    from picoclaw.memory.spend import Day, Hold, SpendLedger, Spent
    from picoclaw.memory.stats import MemoryStats, entry_injections, memory_stats
    from picoclaw.memory.store import BACKUPS_DIR, LONG_TERM_FILE, DailyNote, MemoryStore
    from picoclaw.memory.turn_metrics import TurnMetrics
    from picoclaw.memory.workspace import Workspace

__getattr__, __dir__ = lazy_exports(__name__)
