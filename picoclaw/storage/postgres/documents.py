"""Memory documents as rows: the Markdown a file would hold, its versions, and this machine's copy."""

from __future__ import annotations

DDL = """
create sequence document_revision;
-- A memory document: exactly the bytes the file would hold. `revision` grows with every change anywhere,
-- so a machine brings its copy up to date with the rows past the last revision it saw.
create table documents (
    scope      text not null,
    name       text not null,            -- the path under the scope's root, "/"-separated
    content    bytea,                    -- null: deleted (kept so other machines learn of it)
    revision   bigint not null default nextval('document_revision'),
    updated_at timestamptz not null default now(),
    primary key (scope, name)
);
create index documents_revision on documents (revision);
-- What a document held before each replace (the backups of the files backend), pruned to backup_keep.
create table document_versions (
    id          bigserial primary key,
    scope       text not null,
    name        text not null,
    content     bytea not null,
    replaced_at timestamptz not null default now()
);
create index document_versions_name on document_versions (scope, name, id);
"""
