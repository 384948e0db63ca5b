"""The agent: context building, the turn loop, sessions, and their background work.

What the agent layer offers the channels and the face is listed in `__all__`: `AgentLoop` (where a message
becomes a model call), its `Reply`, the sinks a channel passes for streamed text, tool calls, notices and
memory writes, the approver and chooser a channel supplies (from the tools layer: channels do not import
it), the slash-command table (/help's text and Telegram's menu) and parser, and `WindowedProvider` (a
provider whose replies fit the window).
Each is imported on first use (picoclaw/lazy_exports.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from picoclaw.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from picoclaw.agent.allowance import (
        EVAL,
        PURPOSES,
        Allowance,
        MeteredProvider,
        OverBudget,
        is_background,
        spend_line,
    )
    from picoclaw.agent.background_room import WindowedProvider
    from picoclaw.agent.loop import AgentLoop, Reply, ToolSink
    from picoclaw.agent.receipt_delivery import MemorySink, NoticeSink
    from picoclaw.agent.slash_commands import SLASH_COMMANDS, Command, CommandEntry, parse_command
    from picoclaw.agent.streaming import TextSink
    from picoclaw.agent.usage_report import SpendReport, purpose_name, report_lines, spend_report
    from picoclaw.tools import ApprovalRequest, Approver, Chooser, Verdict

__all__ = ["EVAL", "PURPOSES", "SLASH_COMMANDS", "AgentLoop", "Allowance", "ApprovalRequest", "Approver", "Chooser",
           "Command", "CommandEntry", "MemorySink", "MeteredProvider", "NoticeSink", "OverBudget", "Reply",
           "SpendReport", "TextSink", "ToolSink", "Verdict", "WindowedProvider", "is_background", "parse_command",
           "purpose_name", "report_lines", "spend_line", "spend_report"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "picoclaw.agent.allowance": ("EVAL", "PURPOSES", "Allowance", "MeteredProvider", "OverBudget", "is_background",
                                 "spend_line"),
    "picoclaw.agent.usage_report": ("SpendReport", "purpose_name", "report_lines", "spend_report"),
    "picoclaw.agent.background_room": ("WindowedProvider",),
    "picoclaw.agent.slash_commands": ("SLASH_COMMANDS", "Command", "CommandEntry", "parse_command"),
    "picoclaw.agent.loop": ("AgentLoop", "Reply", "ToolSink"),
    "picoclaw.agent.receipt_delivery": ("MemorySink", "NoticeSink"),
    "picoclaw.agent.streaming": ("TextSink",),
    # What a channel's approver and chooser speak (tools/approval.py, tools/choices.py): channels do not import tools.
    "picoclaw.tools": ("ApprovalRequest", "Approver", "Chooser", "Verdict"),
})
