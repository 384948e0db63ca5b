"""Where a channel's message becomes a turn: the `Inbound` message, the `TurnHooks` that show the turn, `run_turn`.

A channel (channels/base.py) turns the events of its world into `Inbound` messages and hands each to `run_turn`,
the one place a message becomes a model call (`AgentLoop.handle`: one process needs no bus between them). How it
shows a turn while it runs (streamed text, tool calls, the notice of work after the reply, the receipt of a memory
write) is the `TurnHooks` it fills in; a hook left out shows nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from picoclaw.agent import (
        AgentLoop,
        Approver,
        Chooser,
        MemorySink,
        ModelSlot,
        NoticeSink,
        Reply,
        TextSink,
        ToolSink,
    )


@dataclass(frozen=True)
class Inbound:
    """One message a person sent: who, in which conversation (its session key), what, and what it answers."""

    sender: str  # the channel's id of the person: a Telegram user id, "terminal"
    session_key: str
    text: str
    reply_to: int | None = None  # the channel's id of the message this one replies to, when it replies to one
    images: tuple[bytes, ...] = ()  # what the message shows, for a model that sees; `text` names where each is kept


@dataclass(frozen=True)
class TurnHooks:
    """How a channel shows one turn while it runs. A hook left None shows nothing of its kind; without
    `on_text` the answer is not streamed at all, and comes whole in the turn's reply."""

    on_text: TextSink | None = None  # the answer as it is written
    on_tool: ToolSink | None = None  # each tool call as it starts: (name, arguments as JSON text)
    # (session key, text) of work the turn set off after its reply, such as a summary starting. Shaped like
    # `Channel.deliver`, but a notice that cannot be shown is dropped (logged), never raised into that work.
    on_notice: NoticeSink | None = None
    # (session key, MemoryWrite) of each write to MEMORY.md or LEARNINGS.md that the turn or its background work
    # made without a command of the user's (the memory flush, memory_append, a lesson): its receipt, to show
    # once (`MemoryWrite.notice` is the line: "remembered: …"). Shaped and handled like `on_notice`. Left None,
    # no receipt is shown (`/memory recent` still lists the write).
    on_memory: MemorySink | None = None
    # Asks the user who sent the message before an ask-first tool call runs (Approve / Deny, y/N); None: no one can
    # be asked here, and such a call does not run (unless tools.approval.unattended is "allow").
    approver: Approver | None = None
    # Shows ask_user's question and options (buttons, a numbered list); None: the model asks in its reply instead.
    chooser: Chooser | None = None
    # Held around each model call of the turn: a webhook worker's slot (at most max_parallel calls at once). None:
    # no bound on this channel's side.
    model_slot: ModelSlot | None = None


async def run_turn(agent: AgentLoop, message: Inbound, hooks: TurnHooks = TurnHooks()) -> Reply:
    """The one place a channel's message becomes a model call: one `AgentLoop.handle` of its session."""
    return await agent.handle(message.session_key, message.text, notify=hooks.on_notice, on_text=hooks.on_text,
                              on_tool=hooks.on_tool, remembered=hooks.on_memory, images=message.images,
                              approver=hooks.approver, chooser=hooks.chooser, model_slot=hooks.model_slot)
