"""The path rules of the file tools: every path the model gives becomes a real path inside its workspace here,
and is sorted into an ordinary file, MEMORY.md or a daily note, or refused.

`resolve_in_workspace` is the sandbox. The check is done on the fully resolved path (symlinks followed, `..`
applied the way the kernel applies it), so `../x`, `/etc/passwd`, a symlinked file or folder pointing outside,
and a dangling symlink whose target is outside are all refused, while absolute paths that really lie inside
the workspace are accepted.

`WorkspaceFiles` adds one workspace's rules on top:

- A per-user workspace (memory_scope "per_user") is rooted in its own folder `users/<key>/`: `memory/` is
  that user's memory and every other file it writes lives there too, so one user's model can neither
  read nor plant what another's wrote. The shared bootstrap files (USER.md, AGENTS.md, SOUL.md,
  IDENTITY.md) go into every user's prompt: such a model may read them, never write them. `users/…` and
  `sessions/` are refused there outright, even for reading.
- LEARNINGS.md (lessons) is read like any file but written only through memory_append, so the store's
  rule that a restated lesson updates its entry holds for the model too.
- Store and policy bookkeeping (`memory/backups/`, `memory/policy_*`, `memory/index/`, the memory folder's
  dot files, `sessions/`, the jobs in `cron/`) is refused for writing; the home's config.json (secrets) is
  refused entirely.
- Skills are the user's to install: `skills/` is refused for writing, so the model can neither write a skill
  it would then load nor accept a draft of its own (`picoclaw skills accept` is the only way in), and
  `skills/_drafts/` is refused even for reading (a draft is not used before the user accepts it).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Literal

from picoclaw.layout import INDEX_DIR, MEMORY_DIR
from picoclaw.memory import BACKUPS_DIR, Workspace
from picoclaw.tools.base import ToolError

__all__ = ["Target", "TargetKind", "WorkspaceFiles", "resolve_in_workspace"]

_MONTH_DIR = re.compile(r"^\d{6}$")
_NOTE_FILE = re.compile(r"^(\d{8})\.md$")
# Top-level entries of the memory folder that the store or the policy own (compared case-folded, so a
# case-insensitive file system cannot be used to slip past).
_STORE_OWNED = (BACKUPS_DIR, INDEX_DIR)
_POLICY_PREFIX = "policy_"


def resolve_in_workspace(root: Path, user_path: str) -> Path:
    """The real (symlink-free) path of `user_path` if it lies inside `root`; ToolError otherwise.

    `user_path` is relative to `root`, or absolute if it resolves inside `root`. The path need not exist.
    """
    if not isinstance(user_path, str):
        raise ToolError("path must be a string")
    if "\x00" in user_path:
        raise ToolError("path contains a NUL byte")
    if not user_path.strip():
        raise ToolError("path is empty; give a path relative to the workspace, e.g. 'notes/todo.md'")
    base = Path(os.path.realpath(root))
    absolute_root = os.path.abspath(root)
    joined = os.path.join(absolute_root, os.path.expanduser(user_path))  # an absolute user_path wins the join
    # realpath walks the components in order, following each symlink before applying a later `..`,
    # which is how the kernel will resolve the path when we open it; a lexical normpath would not be.
    real = Path(os.path.realpath(joined))
    if real.is_relative_to(base):
        return real
    lexical = Path(os.path.normpath(joined))
    if lexical.is_relative_to(absolute_root) or lexical.is_relative_to(base):
        raise ToolError(f"path {user_path!r} leads outside the workspace through a symbolic link")
    raise ToolError(f"path {user_path!r} is outside the workspace; use a path relative to the workspace, "
                    "e.g. 'memory/MEMORY.md'")


TargetKind = Literal["file", "long_term", "note"]


@dataclass(frozen=True)
class Target:
    """A resolved tool path: where it really is, how to show it to the model, and who owns the file."""

    path: Path
    shown: str
    kind: TargetKind
    day: date | None = None


class WorkspaceFiles:
    """The path rules of one workspace: sandboxing, memory-owned files, and what tools may not write."""

    def __init__(self, workspace: Workspace):
        self.workspace = workspace
        layout = workspace.layout
        self.layout = layout
        self.per_user = layout.is_per_user
        # The folder the tools are rooted in: the workspace, or (per user) the user's own folder.
        self.files_root = layout.files_root
        self.root = Path(os.path.realpath(layout.files_root))
        self.memory_dir = Path(os.path.realpath(workspace.store.memory_dir))
        self.long_term = Path(os.path.realpath(workspace.store.long_term_path))
        self.learnings = Path(os.path.realpath(workspace.store.learnings_path))
        self.users_dir = Path(os.path.realpath(layout.users_dir))  # per-user scopes (shared scope's view)
        self.sessions_dir = Path(os.path.realpath(layout.sessions_dir))
        self.cron_dir = Path(os.path.realpath(layout.jobs_path.parent))
        self.skills_dir = Path(os.path.realpath(layout.skills_dir))
        self.drafts_dir = Path(os.path.realpath(layout.skill_drafts_dir))
        self.config_file = Path(os.path.realpath(layout.config_file))

    def shown(self, path: Path) -> str:
        """`path` as the model should see it: relative to the tools' root (own memory as `memory/…`)."""
        for candidate in (path, Path(os.path.realpath(path))):  # store paths are not resolved; ours are
            if candidate.is_relative_to(self.memory_dir):
                return (Path(MEMORY_DIR) / candidate.relative_to(self.memory_dir)).as_posix()
            if candidate.is_relative_to(self.root):
                return candidate.relative_to(self.root).as_posix() or "."
        return path.as_posix()

    def target(self, user_path: str, *, writing: bool) -> Target:
        """Sandbox `user_path` and classify it; ToolError for paths the tools must not touch."""
        path = resolve_in_workspace(self.files_root, user_path)
        if self.per_user:
            shared = self._per_user_rules(path, writing=writing)
            if shared is not None:
                return shared
        shown = self.shown(path)
        if _same_file(path, self.config_file):
            raise ToolError(f"{shown} is picoclaw's config file (it holds secrets); file tools cannot open it")
        if _same_file(path, self.long_term):
            return Target(path, shown, "long_term")
        if writing and _same_file(path, self.learnings):  # the store keeps one entry a lesson, with backups
            raise ToolError(f"{shown} holds lessons; save one with memory_append (slot learnings), which "
                            "updates a lesson it restates instead of adding it twice")
        if not path.is_relative_to(self.memory_dir):
            if not self.per_user and path.is_relative_to(self.users_dir):  # users' memory is private, even to read
                raise ToolError(f"{shown} holds a user's private memory; file tools cannot open it "
                                "(your own memory is under memory/)")
            if writing and path.is_relative_to(self.sessions_dir):
                raise ToolError(f"{shown} belongs to the session store; file tools cannot write there")
            if path.is_relative_to(self.cron_dir):  # every chat's jobs: the cron tool shows each chat its own
                raise ToolError(f"{shown} holds the scheduled jobs; use the cron tool to see or change them")
            if path.is_relative_to(self.drafts_dir):
                raise ToolError(f"{shown} is a skill draft waiting for the user's review; it cannot be used or "
                                "changed until the user accepts it")
            if writing and path.is_relative_to(self.skills_dir):
                raise ToolError(f"{shown} is in the skills folder, which only the user changes; file tools cannot "
                                "write there (load a skill with the skill tool)")
            return Target(path, shown, "file")
        parts = path.relative_to(self.memory_dir).parts
        if not parts:
            return Target(path, shown, "file")  # the memory folder itself (list_dir)
        first = parts[0].casefold()
        if writing and (first in _STORE_OWNED or first.startswith(_POLICY_PREFIX)
                        or (len(parts) == 1 and first.startswith("."))):
            raise ToolError(f"{shown} is managed by picoclaw's memory store or policy; file tools cannot write "
                            "there (use memory_append to save memories)")
        day = self._note_day(parts, shown) if writing else None
        if day is not None:
            return Target(path, shown, "note", day)
        return Target(path, shown, "file")

    def _per_user_rules(self, path: Path, *, writing: bool) -> Target | None:
        """The paths of a per-user folder that are not simply that user's files (`path` is sandboxed).

        The names a model knows from the workspace mean, in its own folder:
        - a bootstrap file at the top (USER.md …): the shared one, read-only (it is in every user's prompt);
        - `users/…`: other users' folders, refused even to read (its own folder is its root);
        - `sessions/…`: the session store, refused even to read (as when it held every user's chats).
        None: an ordinary path of the user's folder.
        """
        parts = path.relative_to(self.root).parts if path.is_relative_to(self.root) else ()
        if not parts:
            path.mkdir(parents=True, exist_ok=True)  # a new user's folder: list_dir "." shows it empty
            return None
        first = parts[0].casefold()
        shown = "/".join(parts)
        if first == self.layout.users_dir.name.casefold():
            raise ToolError(f"{shown} holds a user's private memory; file tools cannot open it "
                            "(your own memory is under memory/)")
        if first == self.layout.sessions_dir.name.casefold():
            raise ToolError(f"{shown} is the session store (it held the conversations of all users); "
                            "file tools cannot open it here")
        bootstrap = self.layout.bootstrap_path(parts[0]) if len(parts) == 1 else None
        if bootstrap is None:
            return None
        if writing:
            raise ToolError(f"{bootstrap.name} is read-only here: it is the bootstrap file every user's prompt "
                            "carries (shared by all users); save what you learn with memory_append")
        return Target(resolve_in_workspace(self.layout.root, bootstrap.name), bootstrap.name, "file")

    @staticmethod
    def _note_day(parts: tuple[str, ...], shown: str) -> date | None:
        # Anything shaped like YYYYMM/YYYYMMDD.md is read as a daily note by the store, so a malformed
        # one is refused rather than written where retrieval would pick it up under a wrong date.
        if len(parts) != 2 or not _MONTH_DIR.match(parts[0]):
            return None
        match = _NOTE_FILE.match(parts[1])
        if match is None:
            return None
        stamp = match.group(1)
        try:
            day = date(int(stamp[:4]), int(stamp[4:6]), int(stamp[6:]))
        except ValueError:
            raise ToolError(f"{shown} is not a valid daily note: {stamp} is not a date "
                            "(use YYYYMM/YYYYMMDD.md)") from None
        if stamp[:6] != parts[0]:
            raise ToolError(f"{shown} is not a valid daily note: it belongs in memory/{stamp[:6]}/")
        return day


def _same_file(path: Path, other: Path) -> bool:
    if path == other:
        return True
    try:  # also catches a hard link, or another spelling on a case-insensitive file system
        return os.path.samefile(path, other)
    except OSError:
        return False
