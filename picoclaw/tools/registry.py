"""Assemble the model's tools for one workspace."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from picoclaw.memory import Workspace
from picoclaw.tools.base import Tool, ToolRegistry
from picoclaw.tools.choices import AskUser
from picoclaw.tools.cron import Cron
from picoclaw.tools.exec import Exec
from picoclaw.tools.files import AppendFile, EditFile, ListDir, ReadFile, WriteFile
from picoclaw.tools.memory import MemoryAppend, MemorySearch
from picoclaw.tools.sandbox import WorkspaceFiles
from picoclaw.tools.skills import SkillTool, shared_catalog
from picoclaw.tools.web import WebFetch, WebSearch

# The tools of a default config, in the order offered. The skill tool is left out when no skill loads; web_search,
# exec and ask_user join them when configured.
TOOL_CLASSES = (MemorySearch, MemoryAppend, ReadFile, WriteFile, EditFile, AppendFile, ListDir, Cron, SkillTool,
                WebFetch)


def build_tools(workspace: Workspace, extra: Sequence[Tool] = ()) -> ToolRegistry:
    """Every tool, bound to `workspace` (a per-user workspace gets its own registry), then `extra` (MCP servers'
    tools, shared by every workspace) in the order given."""
    files = WorkspaceFiles(workspace)  # one set of path rules shared by the tools of this workspace
    tools_config = workspace.config.tools
    left_out: set[type[Tool]] = set()
    if not tools_config.web.fetch_enabled:
        left_out.add(WebFetch)
    # Decided once per process (SkillCatalog.offered), so every agent's tool list, and so its schema prefix,
    # stays the same while it runs.
    if not shared_catalog(workspace.layout.skills_dir).offered():
        left_out.add(SkillTool)
    classes: list[Callable[[Workspace, WorkspaceFiles], Tool]] = [cls for cls in TOOL_CLASSES if cls not in left_out]
    if tools_config.web.search is not None and tools_config.web.search.enabled:
        classes.append(WebSearch)
    if tools_config.exec.enabled:
        classes.append(Exec)
    if tools_config.ask_user:
        classes.append(AskUser)
    return ToolRegistry([cls(workspace, files) for cls in classes] + list(extra))
