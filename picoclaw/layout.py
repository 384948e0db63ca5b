"""Where a workspace keeps each thing on disk: the one place these folders are spelled out.

With Telegram's memory_scope "per_user", each user's memory and conversations live in a scope folder of
their own, `users/<user_key>/`, laid out like the workspace itself (`memory/`, `sessions/`). Everything
that reads or writes these folders asks the layout for them, so a per-user scope can never be half
applied (its memory in one place, its transcripts searched in another).

The file tools are rooted in the scope folder too: a per-user model reaches only `users/<user_key>/`
(its `memory/` is that user's memory, any other file it writes lives there as well), so nothing one user's
model writes can be read by another's. The shared bootstrap files at the workspace root, which every
user's system prompt carries, are read-only to a per-user model (see `bootstrap_path`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from picoclaw.config import Config

MEMORY_DIR = "memory"
MEDIA_DIR = "media"  # photos and files people sent (memory/media_folder.py), in the scope folder: per user, the user's
SESSIONS_DIR = "sessions"
USERS_DIR = "users"
INDEX_DIR = "index"
CRON_DIR = "cron"
JOBS_FILE = "jobs.json"
HEARTBEAT_FILE = "HEARTBEAT.md"
SKILLS_DIR = "skills"
SKILL_DRAFTS_DIR = "_drafts"  # inside SKILLS_DIR: skills drafted from lessons, never loaded until accepted
# The workspace's own files that go into every system prompt, in this order (the prompt of every scope).
BOOTSTRAP_FILES = ("IDENTITY.md", "SOUL.md", "AGENTS.md", "USER.md")


@dataclass(frozen=True)
class WorkspaceLayout:
    """The folders of one workspace, and of the memory scope in use (the workspace, or one user's folder)."""

    home: Path
    root: Path
    scope_dir: Path  # `root`, or `root/users/<user_key>` for one user's own memory

    @classmethod
    def of(cls, config: Config, home: Path) -> WorkspaceLayout:
        """The shared scope of the workspace `config` names (relative to `home`)."""
        from picoclaw.config import workspace_dir  # the layout's names load without pydantic's config models

        root = workspace_dir(config, home)
        return cls(home, root, root)

    def for_user(self, user_key: str) -> WorkspaceLayout:
        """The same workspace with `users/<user_key>/` as the scope; the key must be a safe folder name."""
        if not user_key or not all(c.isalnum() or c in "-_" for c in user_key):
            raise ValueError(f"unsafe user key {user_key!r}")
        return replace(self, scope_dir=self.root / USERS_DIR / user_key)

    @property
    def is_per_user(self) -> bool:
        return self.scope_dir != self.root

    @property
    def files_root(self) -> Path:
        """Where the model's file tools are rooted: the workspace, or the user's own folder.

        Per user means per user for every path a model can reach: were a per-user model's tools rooted in
        the workspace, what one user's model wrote there (a note, USER.md) would reach the next user.
        """
        return self.scope_dir

    def bootstrap_path(self, name: str) -> Path | None:
        """The shared bootstrap file `name` names (compared case-folded), or None if it names none."""
        folded = name.casefold()
        match = next((known for known in BOOTSTRAP_FILES if known.casefold() == folded), None)
        return self.root / match if match is not None else None

    @property
    def memory_dir(self) -> Path:
        """MEMORY.md, daily notes, backups, policy files and the index of this scope."""
        return self.scope_dir / MEMORY_DIR

    @property
    def sessions_dir(self) -> Path:
        """The conversation transcripts (`<key>.jsonl`) of this scope."""
        return self.scope_dir / SESSIONS_DIR

    @property
    def shared_memory_dir(self) -> Path:
        return self.root / MEMORY_DIR

    @property
    def shared_sessions_dir(self) -> Path:
        """Where transcripts live in the shared scope (and where per-user ones lived before they moved)."""
        return self.root / SESSIONS_DIR

    @property
    def users_dir(self) -> Path:
        return self.root / USERS_DIR

    @property
    def media_dir(self) -> Path:
        """The photos and files this scope's people sent, where the file tools reach them too."""
        return self.scope_dir / MEDIA_DIR

    @property
    def index_dir(self) -> Path:
        return self.memory_dir / INDEX_DIR

    @property
    def jobs_path(self) -> Path:
        """Scheduled jobs of every scope: one file at the workspace root (a job names its own scope)."""
        return self.root / CRON_DIR / JOBS_FILE

    @property
    def skills_dir(self) -> Path:
        """The installed skills (`<name>/SKILL.md`), shared by every scope of the workspace."""
        return self.root / SKILLS_DIR

    @property
    def skill_drafts_dir(self) -> Path:
        """Skills drafted from lessons (`<name>/SKILL.md`), waiting for the user to accept or reject them."""
        return self.root / SKILLS_DIR / SKILL_DRAFTS_DIR

    @property
    def heartbeat_path(self) -> Path:
        """The owner's standing tasks, read by the scheduler every heartbeat interval."""
        return self.root / HEARTBEAT_FILE

    @property
    def config_file(self) -> Path:
        from picoclaw.config import CONFIG_FILE

        return self.home / CONFIG_FILE

    def telegram_lock_path(self, token: str) -> Path:
        """The lock a process polling the bot `token` holds: one per token and workspace.

        In the workspace, not the home: every process that would store this bot's chats here shares it,
        whichever config (home) pointed it here; pollers of the same token elsewhere get Telegram's 409
        instead. Named by a hash of the token: a file name must not carry the secret.
        """
        digest = hashlib.sha256(token.encode("utf-8")).hexdigest()[:16]
        return self.root / f".telegram-{digest}.lock"
