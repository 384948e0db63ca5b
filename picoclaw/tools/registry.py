"""Assemble the model's tools for one workspace."""

from __future__ import annotations

from picoclaw.memory.workspace import Workspace
from picoclaw.tools.base import ToolRegistry
from picoclaw.tools.cron import Cron
from picoclaw.tools.files import AppendFile, EditFile, ListDir, ReadFile, WorkspaceFiles, WriteFile
from picoclaw.tools.memory import MemoryAppend, MemorySearch

TOOL_CLASSES = (MemorySearch, MemoryAppend, ReadFile, WriteFile, EditFile, AppendFile, ListDir, Cron)


def build_tools(workspace: Workspace) -> ToolRegistry:
    """Every tool, bound to `workspace` (a per-user workspace gets its own registry)."""
    files = WorkspaceFiles(workspace)  # one set of path rules shared by the tools of this workspace
    return ToolRegistry([cls(workspace, files) for cls in TOOL_CLASSES])
