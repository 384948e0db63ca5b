"""Scheduled jobs on PostgreSQL: one row a job, due rows claimed with FOR UPDATE SKIP LOCKED."""

from __future__ import annotations

DDL = """
-- Scheduled jobs: one row a job; due rows are claimed with FOR UPDATE SKIP LOCKED.
create table jobs (
    scope      text not null,
    id         text not null,
    job        jsonb not null,
    position   bigserial,
    primary key (scope, id)
);
"""
