"""Scores of bench/answers.py: token F1 against a gold answer, and the LLM judge's yes/no read robustly. They live in
picoclaw/memory/eval/answer_scoring.py, which `picoclaw memory eval --answers` scores with too."""

from __future__ import annotations

from picoclaw.memory import answer_tokens, parse_verdict, token_f1

__all__ = ["answer_tokens", "parse_verdict", "token_f1"]
