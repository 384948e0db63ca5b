"""A workspace opened from config: its folders, its storage and the memory objects of one memory scope."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import tzinfo
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from picoclaw.clock import resolve_timezone
from picoclaw.config import Config
from picoclaw.layout import WorkspaceLayout
from picoclaw.memory.media_folder import MediaFolder
from picoclaw.memory.policy import PolicyManager
from picoclaw.memory.store import MemoryStore
from picoclaw.storage import Storage
from picoclaw.transcripts import LOCK_FILE, SessionStore

if TYPE_CHECKING:
    from picoclaw.memory.index.embedders import Embedder
    from picoclaw.memory.search import MemorySearch


@dataclass
class Workspace:
    """Config, folders, storage, and the memory objects of one workspace (or of one user's scope in it)."""

    config: Config
    layout: WorkspaceLayout
    tz: tzinfo
    store: MemoryStore
    policy: PolicyManager
    storage: Storage  # opened and closed by the composition root; every scope of the workspace shares it
    embedder: Embedder | None = None  # for the optional index; one model serves every scope

    @cached_property
    def searcher(self) -> MemorySearch:
        """What to search with: the index when enabled, else the memory files directly.

        Made at first use, so a command that never searches (`policy show`) never loads search; and per
        instance, so a copy made with dataclasses.replace for another scope (per-user memory) gets its own.
        """
        from picoclaw.memory.search import open_search

        return open_search(self.config.memory.index, self.store, self.embedder,
                           sessions_dir=self.layout.sessions_dir, policy=self.policy.current)

    @classmethod
    def from_config(cls, config: Config, home: Path, storage: Storage, embedder: Embedder | None = None
                    ) -> Workspace:
        """The shared scope of the workspace of an already validated config, kept by `storage`."""
        layout = WorkspaceLayout.of(config, home)
        tz = resolve_timezone(config.timezone)
        store = MemoryStore(layout.memory_dir, tz, backup_keep=config.memory.backup_keep, storage=storage)
        policy = PolicyManager(layout.memory_dir, config.memory.policy_values(), tz, storage=storage)
        return cls(config, layout, tz, store, policy, storage, embedder)

    def for_user(self, user_key: str) -> Workspace:
        """The same workspace with the scope `users/<user_key>/` (memory_scope "per_user").

        The policy and the storage stay the workspace's own: the policy is the owner's setting, not each user's.
        """
        layout = self.layout.for_user(user_key)
        store = MemoryStore(layout.memory_dir, self.tz, backup_keep=self.config.memory.backup_keep,
                            storage=self.storage)
        return replace(self, layout=layout, store=store)

    @property
    def home(self) -> Path:
        return self.layout.home

    @property
    def root(self) -> Path:
        return self.layout.root

    @property
    def memory_dir(self) -> Path:
        return self.store.memory_dir

    def media(self) -> MediaFolder:
        """The photos and files this scope's people sent (media/, pruned as config.json's `media` says)."""
        settings = self.config.media
        return MediaFolder(self.layout.media_dir, self.layout.files_root, keep_days=settings.keep_days,
                           keep_bytes=settings.keep_megabytes * 1_000_000)

    def sessions(self) -> SessionStore:
        """The conversations of this scope; a per-user scope takes over its transcripts left in `sessions/`."""
        moved_from = self.layout.shared_sessions_dir if self.layout.is_per_user else None
        # The lock beside the memory folder's own locks: a dot file there that the file tools cannot write.
        return SessionStore(self.layout.sessions_dir, storage=self.storage, moved_from=moved_from,
                            lock_path=self.layout.memory_dir / LOCK_FILE)

    def close(self) -> None:
        """Close the index's database, if this scope has one (and opened its search)."""
        searcher = self.__dict__.get("searcher")  # what cached_property keeps; absent when never searched
        if searcher is not None:
            searcher.close()
