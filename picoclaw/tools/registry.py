"""Assemble the model's tools for one workspace."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from picoclaw.memory.workspace import Workspace
from picoclaw.tools.base import Tool, ToolRegistry
from picoclaw.tools.cron import Cron
from picoclaw.tools.exec import Exec
from picoclaw.tools.files import AppendFile, EditFile, ListDir, ReadFile, WorkspaceFiles, WriteFile
from picoclaw.tools.memory import MemoryAppend, MemorySearch
from picoclaw.tools.skills import SkillTool
from picoclaw.tools.web import WebFetch, WebSearch

# The tools of a default config, in the order offered. web_search and exec join them when configured.
TOOL_CLASSES = (MemorySearch, MemoryAppend, ReadFile, WriteFile, EditFile, AppendFile, ListDir, Cron, SkillTool,
                WebFetch)


def build_tools(workspace: Workspace, extra: Sequence[Tool] = ()) -> ToolRegistry:
    """Every tool, bound to `workspace` (a per-user workspace gets its own registry), then `extra` (MCP servers'
    tools, shared by every workspace) in the order given."""
    files = WorkspaceFiles(workspace)  # one set of path rules shared by the tools of this workspace
    tools_config = workspace.config.tools
    classes: list[Callable[[Workspace, WorkspaceFiles], Tool]] = [cls for cls in TOOL_CLASSES
                                 if cls is not WebFetch or tools_config.web.fetch_enabled]
    if tools_config.web.search is not None:
        classes.append(WebSearch)
    if tools_config.exec.enabled:
        classes.append(Exec)
    return ToolRegistry([cls(workspace, files) for cls in classes] + list(extra))
