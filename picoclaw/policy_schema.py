"""The memory policy's schema: every key with its default, bounds and meaning, and the checks across keys.

The one thing config.json's `memory` block, the overrides file, `policy set` and reflection's suggestions
are validated against (memory/policy.py applies the overrides; config.py adds the store settings).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The shares of the window the tools, memory and reply may take together; the rest is the system prompt's, the
# history's and the user's.
PROMPT_SHARES_MAX = 80


class MemoryPolicy(BaseModel):
    """Every policy key with its default, bounds and meaning. Strict: "15" is not an int."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    retrieve_limit: int = Field(10, ge=1, le=50, description="most MEMORY.md blocks injected for a query")
    recent_days: int = Field(3, ge=0, le=30, description="days of daily notes injected")
    session_summary_message_threshold: int = Field(
        20, ge=4, le=1000, description="summarise the session when its history has more messages than this"
    )
    session_summary_token_percent: int = Field(
        75, ge=10, le=95, description="…or when its history is over this % of the context window"
    )
    session_summary_keep_count: int = Field(
        4, ge=1, le=100, description="recent messages kept verbatim after a summary (< the threshold)"
    )
    session_relevant_history_limit: int = Field(
        0, ge=0, le=100, description=">0: inject only this many past turns, chosen by relevance to the query"
    )
    session_relevant_fallback_keep: int = Field(
        8, ge=0, le=100, description="recent messages kept when no past turn is relevant"
    )
    long_term_compress_char_threshold: int = Field(
        0, ge=0, le=10_000_000,
        description=">0: compress MEMORY.md when longer than this (≥ 1000), at most once per 24 h"
    )
    evolution_enabled: bool = Field(False, description="reflection may tune the policy")
    evolution_interval_messages: int = Field(
        20, ge=2, le=1000, description="reflect every this many messages of a session"
    )
    memory_token_budget: int = Field(
        2000, ge=200, le=32000, description="most tokens of retrieved memory + notes put into one prompt"
    )
    memory_fallback_blocks: int = Field(
        0, ge=0, le=20, description="a message that matches no memory gets this many of the newest MEMORY.md blocks"
    )
    memory_flush_enabled: bool = Field(
        True, description="before a summary or /new, ask the model for the lasting facts and store them in MEMORY.md"
    )
    memory_recency_boost_percent: int = Field(
        10, ge=0, le=100,
        description="a memory block dated today scores up to this % more than an old one (halving every 30 days)"
    )
    memory_access_boost_percent: int = Field(
        10, ge=0, le=100,
        description="a memory block injected often before scores up to this % more than one never injected"
    )
    query_rewrite_enabled: bool = Field(
        False,
        description="one short model call turns the message into a standalone search query before memory is searched"
    )
    learning_enabled: bool = Field(
        True, description="after a turn that taught something, one short model call may write a lesson to LEARNINGS.md"
    )
    learning_daily_calls: int = Field(
        10, ge=0, le=200, description="most model calls a day that draft lessons (0: none)"
    )
    learning_token_percent: int = Field(
        20, ge=0, le=50, description="share (%) of memory_token_budget kept for lessons from LEARNINGS.md"
    )
    prompt_tools_percent: int = Field(
        25, ge=5, le=60,
        description="most share (%) of the context window the tool schemas take in full; above it their short form "
                    "is sent (names, one-line descriptions, parameters)"
    )
    prompt_memory_percent: int = Field(
        20, ge=5, le=50,
        description="most share (%) of the context window for memory and notes (memory_token_budget caps it too)"
    )
    prompt_reply_percent: int = Field(
        25, ge=5, le=50,
        description="share (%) of the context window kept free for the reply while the prompt is fitted (history and "
                    "memory give way to it); the reply's max_tokens is config's, lowered to what the prompt leaves"
    )
    skill_draft_successes: int = Field(
        3, ge=2, le=50, description="successes of the same tool workflow before a skill is drafted from its lessons"
    )

    @model_validator(mode="after")
    def _cross_checks(self) -> MemoryPolicy:
        if self.session_summary_keep_count >= self.session_summary_message_threshold:
            raise ValueError(
                "session_summary_keep_count must be smaller than session_summary_message_threshold "
                f"({self.session_summary_keep_count} ≥ {self.session_summary_message_threshold})"
            )
        if 0 < self.long_term_compress_char_threshold < 1000:
            raise ValueError("long_term_compress_char_threshold must be 0 (off) or at least 1000")
        shares = self.prompt_tools_percent + self.prompt_memory_percent + self.prompt_reply_percent
        if shares > PROMPT_SHARES_MAX:
            # The system prompt, the history and the user's message need the rest of the window.
            raise ValueError("prompt_tools_percent + prompt_memory_percent + prompt_reply_percent must be at most "
                             f"{PROMPT_SHARES_MAX} ({shares})")
        return self


POLICY_KEYS: tuple[str, ...] = tuple(MemoryPolicy.model_fields)
# Reflection tunes numbers; the switches (its own above all) are the user's.
SWITCHES = ("evolution_enabled", "memory_flush_enabled", "query_rewrite_enabled", "learning_enabled")
# …and so are the caps on what background work may spend: a model loop must not raise its own limit.
# The prompt's shares too: a tuned tools share would flip the tools' form mid-session (and the prompt cache with it).
USER_ONLY = (*SWITCHES, "learning_daily_calls", "prompt_tools_percent", "prompt_memory_percent", "prompt_reply_percent")
TUNABLE_KEYS: tuple[str, ...] = tuple(key for key in POLICY_KEYS if key not in USER_ONLY)
