"""A workspace opened from config: the objects every command and channel works through."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import tzinfo
from pathlib import Path
from typing import TYPE_CHECKING

from picoclaw.clock import resolve_timezone
from picoclaw.config import Config, home_dir, load_config, workspace_dir
from picoclaw.memory.policy import PolicyManager
from picoclaw.memory.retrieval import MemoryRetriever
from picoclaw.memory.store import MemoryStore

if TYPE_CHECKING:
    from picoclaw.memory.index.searcher import Searcher


USERS_DIR = "users"  # users/<user_key>/memory/: one memory folder per user with memory_scope "per_user"


@dataclass
class Workspace:
    """Config, paths, and the memory objects of one workspace (or one user's memory folder)."""

    home: Path
    config: Config
    root: Path
    tz: tzinfo
    store: MemoryStore
    policy: PolicyManager
    retriever: MemoryRetriever
    # What to search with: the index when enabled, else `retriever`. Derived, so that a copy made with
    # dataclasses.replace for another memory folder (a per-user scope) gets that folder's own index.
    searcher: Searcher = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.searcher = _searcher(self.config, self.retriever)

    @property
    def memory_dir(self) -> Path:
        return self.store.memory_dir

    def for_user(self, user_key: str) -> Workspace:
        """The same workspace with the memory folder `users/<user_key>/memory/` (memory_scope "per_user")."""
        if not user_key or not all(c.isalnum() or c in "-_" for c in user_key):
            raise ValueError(f"unsafe user key {user_key!r}")
        store = MemoryStore(self.root / USERS_DIR / user_key / "memory", self.tz,
                            backup_keep=self.config.memory.backup_keep)
        return replace(self, store=store, retriever=MemoryRetriever(store))

    @classmethod
    def from_config(cls, config: Config, home: Path) -> Workspace:
        """Build the workspace objects for an already validated config."""
        root = workspace_dir(config, home)
        tz = resolve_timezone(config.timezone)
        memory_dir = root / "memory"
        store = MemoryStore(memory_dir, tz, backup_keep=config.memory.backup_keep)
        policy = PolicyManager(memory_dir, config.memory.policy_values(), tz)
        return cls(home, config, root, tz, store, policy, MemoryRetriever(store))

    @classmethod
    def open(cls, home: Path | None = None) -> Workspace:
        """Load `<home>/config.json` (home from PICOCLAW_HOME or ~/.picoclaw) and open its workspace."""
        home = home or home_dir()
        return cls.from_config(load_config(home), home)


def _searcher(config: Config, retriever: MemoryRetriever) -> Searcher:
    if not config.memory.index.enabled:
        return retriever
    # Imported only when enabled: the index brings numpy (and, for local embeddings, torch) with it.
    from picoclaw.memory.index.searcher import open_searcher

    return open_searcher(config, retriever)
