"""The one path sandbox: every file tool turns the model's path into a real path inside the workspace here.

The check is done on the fully resolved path (symlinks followed, `..` applied the way the kernel applies
it), so `../x`, `/etc/passwd`, a symlinked file or folder pointing outside, and a dangling symlink whose
target is outside are all refused, while absolute paths that really lie inside the workspace are accepted.
"""

from __future__ import annotations

import os
from pathlib import Path

from picoclaw.tools.base import ToolError


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
