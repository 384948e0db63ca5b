"""The agent: context building, the turn loop, sessions, and their background work.

What the agent layer offers the channels and the face (the imports of the block below): `AgentLoop` (where a message
becomes a model call), its `Reply`, the sinks a channel passes for streamed text, tool calls, notices and
memory writes, the slot a channel may have each model call wait for (`ModelSlot`), the approver and chooser a
channel supplies (from the tools layer: channels do not import it), the slash-command table (/help's text and
Telegram's menu) and parser, and `WindowedProvider` (a provider whose replies fit the window).
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
    from picoclaw.agent.model_slots import ModelSlot
    from picoclaw.agent.receipt_delivery import MemorySink, NoticeSink
    from picoclaw.agent.slash_commands import SLASH_COMMANDS, Command, CommandEntry, parse_command
    from picoclaw.agent.streaming import TextSink
    from picoclaw.agent.usage_report import SpendReport, purpose_name, report_lines, spend_report
    from picoclaw.tools import ApprovalRequest, Approver, Chooser, Verdict

__getattr__, __dir__ = lazy_exports(__name__)
