"""Sessions on PostgreSQL: the `messages` table, one row a transcript record."""

from __future__ import annotations

DDL = """
-- Conversations: one row a session, one row a record of its transcript (messages, summaries, marks).
create table sessions (
    scope       text not null,
    session_key text not null,
    last_seq    bigint not null default 0,
    primary key (scope, session_key)
);
create table messages (
    scope       text not null,
    session_key text not null,
    seq         bigint not null,
    record      jsonb not null,
    primary key (scope, session_key, seq)
);
"""
