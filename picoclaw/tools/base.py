"""The tool contract: one pydantic model per tool gives both its JSON schema and its argument checks."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from contextvars import ContextVar
from typing import Any, ClassVar, Protocol

import orjson
from pydantic import BaseModel, ValidationError

from picoclaw.errors import PicoclawError

log = logging.getLogger(__name__)

# The session whose turn is running (AgentLoop.handle sets it): tools that act for "this chat", such as
# cron, read it. A context variable, so each concurrent turn (its own asyncio task) sees its own.
current_session: ContextVar[str | None] = ContextVar("current_session", default=None)


# How every failed call's result starts (an unknown tool, bad arguments, a ToolError, a tool's bug): the model
# reads it as a failure, and so does the review of a finished turn (curation/lesson_drafting.py).
ERROR_PREFIX = "error: "


class ToolError(PicoclawError):
    """A tool could not do what was asked; the message goes back to the model as the tool result."""


class Tool(ABC):
    """A function the model may call. Subclasses set `name`, `description` and `Args`, and implement run."""

    name: ClassVar[str]
    description: ClassVar[str]
    Args: ClassVar[type[BaseModel]]

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """The OpenAI `tools` entry, generated from `Args`, without what tells the model nothing.

        Every request carries every schema, and a CPU model reads each token of them before it answers:
        titles, `additionalProperties`, lower bounds (the call is checked against all of them anyway, and
        the error says what was wrong) and empty defaults (`""`, `0`: "leave it out") are dropped.
        """
        parameters = cls.Args.model_json_schema()
        parameters.pop("title", None)
        parameters.pop("additionalProperties", None)
        for prop in parameters.get("properties", {}).values():
            for noise in ("title", "minLength", "minimum"):  # "not empty", "not negative": checked anyway
                prop.pop(noise, None)
            if prop.get("default", True) in ("", 0) and not isinstance(prop.get("default"), bool):
                del prop["default"]
            if "default" in prop and prop["default"] == prop.get("maximum"):  # "as many as allowed": the default
                del prop["default"], prop["maximum"]
        return {"type": "function", "function": {"name": cls.name, "description": cls.description,
                                                  "parameters": parameters}}

    @abstractmethod
    async def run(self, args: Any) -> str:
        """Do the work; raise ToolError with a clear message when it cannot be done."""


class Toolset(Protocol):
    """What an agent runs its model's calls through: a `ToolRegistry`, or a wrapper over one (tools/approval.py)."""

    tools: dict[str, Tool]

    def schemas(self) -> list[dict[str, Any]]:
        """Every tool's schema, in registration order (the same list each call)."""
        ...

    def problem(self, name: str, arguments: str) -> str | None:
        """Why the call cannot run as given (its error result), or None."""
        ...

    async def execute(self, name: str, arguments: str) -> str:
        """Run a tool call from the model; the text to send back as its result. Never raises."""
        ...


class ToolRegistry:
    """The tools of one agent; `execute` never raises, so a bad call never kills a turn."""

    def __init__(self, tools: list[Tool]):
        self.tools = {tool.name: tool for tool in tools}
        # Made once: pydantic's schema generation was a fifth of a Telegram turn's CPU (bench/telegram.py).
        self._schemas = [tool.schema() for tool in self.tools.values()]

    def schemas(self) -> list[dict[str, Any]]:
        """Every tool's schema, in registration order (the same list each call: do not change it)."""
        return self._schemas

    def problem(self, name: str, arguments: str) -> str | None:
        """Why the call cannot run as given (an unknown tool, arguments that are not valid), or None."""
        prepared = self._prepare(name, arguments)
        return prepared if isinstance(prepared, str) else None

    def _prepare(self, name: str, arguments: str) -> tuple[Tool, BaseModel] | str:
        """The tool and its checked arguments, or the error result saying why not."""
        tool = self.tools.get(name)
        if tool is None:
            return f"{ERROR_PREFIX}unknown tool {name!r}; available: {', '.join(self.tools)}"
        try:
            raw = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError as exc:
            return f"{ERROR_PREFIX}the arguments are not valid JSON ({exc.msg}); send a JSON object"
        if not isinstance(raw, dict):
            return f"{ERROR_PREFIX}the arguments must be a JSON object"
        try:
            return tool, tool.Args.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
            return f"{ERROR_PREFIX}invalid arguments for {name}: {problems}"

    async def execute(self, name: str, arguments: str) -> str:
        """Run a tool call from the model and return the text to send back as the tool result."""
        prepared = self._prepare(name, arguments)
        if isinstance(prepared, str):
            return prepared
        tool, args = prepared
        try:
            return await tool.run(args)
        except ToolError as exc:
            return f"{ERROR_PREFIX}{exc}"
        except Exception as exc:  # a tool bug must not end the turn; the model sees a short reason
            log.exception("tool %s failed", name)
            return f"{ERROR_PREFIX}{name} failed: {type(exc).__name__}: {exc}"
