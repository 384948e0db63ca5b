"""The memory index on pgvector: chunks with their vectors and keyword terms."""

from __future__ import annotations

DDL = """
"""
