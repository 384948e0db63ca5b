"""Tools the model can call: memory search/append, workspace files, web, exec, skills, cron and MCP servers' tools.

What this layer offers the layers above: the tool contract (`Tool`, `ToolError`, `ToolRegistry`, `Toolset`,
`current_session`, `ERROR_PREFIX`, from `base.py`), the ask-first wrapper and the approver a channel supplies per
turn (`ApprovingTools`, `Approver`, `ApprovalRequest`, `Verdict`, `current_approver`), the chooser that shows
ask_user's options (`Chooser`, `current_chooser`), `build_tools` and `TOOL_CLASSES` (one workspace's tools), the
MCP servers (`McpServers`), the skills (`SkillCatalog`, `shared_catalog`, `skills_prompt`) and the drafts that
wait for the user (`SkillDrafts`, `SkillDraftError`, `safe_name`). Importing any submodule runs
this file first, so only the contract is imported at once; the rest, which brings httpx, YAML and the memory
store, is imported on first use (picoclaw/lazy_exports.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from picoclaw.lazy_exports import lazy_exports
from picoclaw.tools.base import ERROR_PREFIX, Tool, ToolError, ToolRegistry, Toolset, current_session

if TYPE_CHECKING:
    from picoclaw.tools.approval import ApprovalRequest, Approver, ApprovingTools, Verdict, current_approver
    from picoclaw.tools.choices import Chooser, current_chooser
    from picoclaw.tools.drafts import SkillDraftError, SkillDrafts, safe_name
    from picoclaw.tools.mcp import McpServers
    from picoclaw.tools.registry import TOOL_CLASSES, build_tools
    from picoclaw.tools.skills import SkillCatalog, shared_catalog, skills_prompt
    from picoclaw.tools.text_tool_calls import (
        RESPONSE_CLOSE,
        RESPONSE_OPEN,
        find_text_tool_call,
        offered_tools,
        without_response_wrapper,
    )

__getattr__, __dir__ = lazy_exports(__name__)
