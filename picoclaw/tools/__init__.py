"""Tools the model can call: memory search/append, workspace files, web, exec, skills, cron and MCP servers' tools.

What this layer offers the layers above: the tool contract (`Tool`, `ToolError`, `ToolRegistry`,
`current_session`, `ERROR_PREFIX`, from `base.py`), `build_tools` and `TOOL_CLASSES` (one workspace's tools), the
MCP servers (`McpServers`), the skills (`SkillCatalog`, `shared_catalog`, `skills_prompt`) and the drafts that
wait for the user (`SkillDrafts`, `SkillDraftError`, `safe_name`). Importing any submodule runs
this file first, so only the contract is imported at once; the rest, which brings httpx, YAML and the memory
store, is imported on first use (picoclaw/lazy_exports.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from picoclaw.lazy_exports import lazy_exports
from picoclaw.tools.base import ERROR_PREFIX, Tool, ToolError, ToolRegistry, current_session

if TYPE_CHECKING:
    from picoclaw.tools.drafts import SkillDraftError, SkillDrafts, safe_name
    from picoclaw.tools.mcp import McpServers
    from picoclaw.tools.registry import TOOL_CLASSES, build_tools
    from picoclaw.tools.skills import SkillCatalog, shared_catalog, skills_prompt

__all__ = [
    "ERROR_PREFIX",
    "TOOL_CLASSES",
    "McpServers",
    "SkillCatalog",
    "SkillDraftError",
    "SkillDrafts",
    "Tool",
    "ToolError",
    "ToolRegistry",
    "build_tools",
    "current_session",
    "safe_name",
    "shared_catalog",
    "skills_prompt",
]


__getattr__, __dir__ = lazy_exports(__name__, {
    "picoclaw.tools.drafts": ("SkillDraftError", "SkillDrafts", "safe_name"),
    "picoclaw.tools.mcp": ("McpServers",),
    "picoclaw.tools.registry": ("TOOL_CLASSES", "build_tools"),
    "picoclaw.tools.skills": ("SkillCatalog", "shared_catalog", "skills_prompt"),
})
