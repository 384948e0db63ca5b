"""ask_user: the model asks the user a question with 2–8 short answers to pick from.

The channel shows them as it can (`Chooser`, through `current_chooser`): Telegram as inline buttons, whose press
comes back as the user's next message; the terminal as a numbered list, where typing the number sends the option.
The question ends the turn: the answer is a message of its own. Where there is no chooser (a scheduled job, the
console), the model is told to ask in its reply instead.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from picoclaw.memory import Workspace
from picoclaw.tools.base import Tool, ToolError
from picoclaw.tools.sandbox import WorkspaceFiles

MAX_OPTIONS = 8
OPTION_CHARS = 40  # a button's label on a phone: longer ones are cut by Telegram's client
QUESTION_CHARS = 300

SHOWN = ("shown: the question is on the user's screen with the options to pick from; their choice comes as their "
         "next message. End this turn now with one short line at most, without repeating the question or options.")
NO_CHOOSER = ("not shown: this chat has no buttons. Ask the question in your reply, with the options as a "
              "numbered list; the user answers in their next message.")


class Chooser(Protocol):
    """Shows a question with options to the user of the turn. Channels implement it without inheriting."""

    async def offer(self, question: str, options: list[str]) -> bool:
        """Show them; whether they were shown (False: the model asks in its reply instead)."""
        ...


# The chooser of the turn running (AgentLoop.handle sets it from the channel's TurnHooks); None: no buttons here.
current_chooser: ContextVar[Chooser | None] = ContextVar("current_chooser", default=None)


class AskUser(Tool):
    """ask_user: a question with a few answers to pick from, shown as buttons."""

    name = "ask_user"
    description = (f"Ask the user to pick one of 2-{MAX_OPTIONS} short options (buttons); their pick is their "
                   "next message. Only when a choice is really needed.")

    class Args(BaseModel):
        model_config = ConfigDict(extra="forbid")
        question: str = Field(min_length=1, max_length=QUESTION_CHARS)
        options: list[str] = Field(min_length=2, max_length=MAX_OPTIONS)

    def __init__(self, workspace: Workspace, files: WorkspaceFiles | None = None):
        self.workspace = workspace

    async def run(self, args: Any) -> str:
        question = " ".join(args.question.split())
        options = [" ".join(option.split()) for option in args.options]
        if not question:
            raise ToolError("the question is empty")
        for number, option in enumerate(options, 1):
            if not option:
                raise ToolError(f"option {number} is empty")
            if len(option) > OPTION_CHARS:
                raise ToolError(f"option {number} is {len(option)} characters long; at most {OPTION_CHARS}")
        if len({option.casefold() for option in options}) != len(options):
            raise ToolError("two options are the same; each must differ")
        chooser = current_chooser.get()
        if chooser is None or not await chooser.offer(question, options):
            return NO_CHOOSER
        return SHOWN
