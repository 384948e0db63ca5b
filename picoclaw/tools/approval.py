"""Ask first: a call of a tool that `tools.approval.ask_first` names runs only once the user said yes.

`ApprovingTools` wraps a toolset, as pydantic-ai's `approval_required` toolset does: the approval is a property of
how the tools are offered, not code inside any tool. Before a marked call runs, it is shown to the turn's
`Approver`, which the channel supplies (Telegram buttons, a y/N in the terminal, the console's buttons) through
`current_approver`; after a Deny, no answer in time, or where no one can be asked, nothing runs and the model
reads a one-line refusal that says which. A call that would fail anyway (unknown tool, bad arguments) is not
asked about: its error goes back at once.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import re
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import orjson

from picoclaw.config import ApprovalConfig
from picoclaw.redact import MASK, excerpt
from picoclaw.tools.base import Tool, Toolset, current_session

log = logging.getLogger(__name__)

ARGUMENT_CHARS = 200  # the arguments shown with a request: enough for a command line, short on a phone
# Seconds past a request's own timeout after which an approver that never answered counts as no answer: a channel
# that lost its way must not hold a turn for ever.
APPROVER_GRACE = 30.0
# An argument whose name says it holds a secret is never shown; nor is the value after such a word in a text
# ("--password hunter2", "TOKEN=abc", "Authorization: Bearer …").
SECRET_NAME = re.compile(r"(?i)pass(word|wd|phrase)?|secret|token|api[_-]?key|auth(orization)?|credential")
SECRET_IN_TEXT = re.compile(
    r"(?i)\b((?:[A-Z0-9_]*(?:pass(?:word|wd)?|secret|token|api[_-]?key|authorization|credential)[A-Z0-9_]*)"
    r"(?:\s*[=:]\s*|\s+)(?:bearer\s+)?)([^\s\"',;]+)")
SECRET_SHAPE = re.compile(r"\b(sk-[A-Za-z0-9_-]{12,}|gh[pousr]_[A-Za-z0-9]{20,}|\d{6,12}:[A-Za-z0-9_-]{30,})")


class Verdict(StrEnum):
    """What came of asking."""

    APPROVED = "approved"
    DENIED = "denied"
    TIMED_OUT = "timed out"  # no answer within the request's timeout
    UNASKED = "unasked"  # no one could be asked (a scheduled job, `chat -m`, piped input)
    NOT_SHOWN = "not shown"  # the question could not be shown (Telegram refused the message)


@dataclass(frozen=True)
class ApprovalRequest:
    """One call to approve, as the user sees it: the tool, its arguments on one short line (secrets masked),
    and how long the answer may take."""

    tool: str
    arguments: str
    timeout: float
    session: str | None = None  # the session whose turn asks

    def question(self) -> str:
        """`Run exec: ls -la?`, the line a terminal asks."""
        return f"Run {self.tool}: {self.arguments}?" if self.arguments else f"Run {self.tool}?"


class Approver(Protocol):
    """Asks the user who started the turn whether a call may run. Channels implement it without inheriting."""

    async def approve(self, request: ApprovalRequest) -> Verdict:
        """APPROVED or DENIED as the user answered, TIMED_OUT after `request.timeout` seconds without an answer,
        UNASKED where no one can answer."""
        ...


# The approver of the turn running (AgentLoop.handle sets it from the channel's TurnHooks); None: no one to ask.
current_approver: ContextVar[Approver | None] = ContextVar("current_approver", default=None)


def shown_arguments(arguments: str, secrets: Iterable[str] = ()) -> str:
    """A call's JSON arguments for people: a lone text argument as itself (`ls -la`), else `name=value, …`; on one
    line, secret-looking values masked, cut to ARGUMENT_CHARS."""
    try:
        raw: Any = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        raw = arguments
    if isinstance(raw, dict):
        shown = {key: MASK if SECRET_NAME.search(str(key)) else value for key, value in raw.items()}
        if len(shown) == 1 and isinstance(next(iter(shown.values())), str):
            text = str(next(iter(shown.values())))
        else:
            text = ", ".join(f"{key}={value if isinstance(value, str) else orjson.dumps(value).decode()}"
                             for key, value in shown.items())
    else:
        text = str(raw)
    text = SECRET_SHAPE.sub(MASK, SECRET_IN_TEXT.sub(lambda m: m.group(1) + MASK, text))
    return excerpt(text, ARGUMENT_CHARS, secrets)


def refusal(verdict: Verdict, tool: str, timeout: float) -> str:
    """What the model reads instead of a result when the call did not run."""
    if verdict is Verdict.DENIED:
        return (f"not run: the user pressed Deny on this {tool} call. Do not try it again unless they ask; tell "
                "them what you would have done instead.")
    if verdict is Verdict.TIMED_OUT:
        return f"not run: the user gave no answer within {timeout:g} s to the request to run this {tool} call."
    if verdict is Verdict.NOT_SHOWN:
        return f"not run: the request to approve this {tool} call could not be shown to the user."
    return (f"not run: {tool} runs only after the user approves it, and no one can approve it here (a scheduled "
            "job, or a chat that cannot ask).")


class ApprovingTools:
    """A toolset whose ask-first calls wait for the turn's approver; every other call goes straight through."""

    def __init__(self, inner: Toolset, settings: ApprovalConfig, *, secrets: Iterable[str] = ()):
        self.inner = inner
        self.settings = settings
        self.secrets = tuple(secrets)  # config's keys and tokens: never shown in a request
        self.tools: dict[str, Tool] = inner.tools

    def asks_first(self, name: str) -> bool:
        """Whether a call of `name` waits for the user's yes."""
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.settings.ask_first)

    def schemas(self) -> list[dict[str, Any]]:
        return self.inner.schemas()

    def problem(self, name: str, arguments: str) -> str | None:
        return self.inner.problem(name, arguments)

    async def execute(self, name: str, arguments: str) -> str:
        """Run the call, once approved when it asks first; a refusal's line instead when it did not run."""
        if not self.asks_first(name) or self.inner.problem(name, arguments) is not None:
            return await self.inner.execute(name, arguments)
        verdict = await self._ask(name, arguments)
        log.info("session %s: %s call %s", current_session.get(), name, verdict)
        if verdict is Verdict.APPROVED:
            return await self.inner.execute(name, arguments)
        return refusal(verdict, name, self.settings.timeout_seconds)

    async def _ask(self, name: str, arguments: str) -> Verdict:
        approver = current_approver.get()
        if approver is None:
            return Verdict.APPROVED if self.settings.unattended == "allow" else Verdict.UNASKED
        request = ApprovalRequest(name, shown_arguments(arguments, self.secrets), self.settings.timeout_seconds,
                                  current_session.get())
        try:
            verdict = await asyncio.wait_for(approver.approve(request), request.timeout + APPROVER_GRACE)
        except TimeoutError:
            log.warning("the approver of %s gave no verdict after %g s; taken as no answer", name,
                        request.timeout + APPROVER_GRACE)
            return Verdict.TIMED_OUT
        if verdict is Verdict.UNASKED and self.settings.unattended == "allow":
            return Verdict.APPROVED
        return verdict
