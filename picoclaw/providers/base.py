"""What the agent loop sees of a model: replies, tool calls, usage, and errors sorted by kind."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

log = logging.getLogger(__name__)

Message = dict[str, Any]  # one OpenAI chat message: {"role": ..., "content": ..., ...}

# Receives the reply text piece by piece while the model is still writing, so a user on a slow (local)
# model sees the answer grow instead of waiting for all of it.
TextSink = Callable[[str], Awaitable[None]]

# "empty_answer": the model answered nothing (agent/empty_reply.py); a caller for whom silence is an answer (the
# heartbeat) tells it apart by this kind. "over_budget": the day's budget (config.json `budget`) leaves no room for
# the call, which was not made (agent/allowance.py); background work waits for the next day.
ErrorKind = Literal["context_too_long", "auth", "rate_limit", "unavailable", "bad_response", "empty_answer",
                    "over_budget"]

# "none": the tools are offered (so the prompt is the conversation's, byte for byte) but none may be called.
ToolChoice = Literal["auto", "none"]


@dataclass(frozen=True)
class ToolCall:
    """A call the model asked for; `arguments` is the raw JSON text (it may be malformed)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Usage:
    """Token counts the provider reported for one call.

    `cached_tokens` is the part of the prompt the server took from its prompt cache (cheaper, and on a
    local server much faster); None when the provider does not say, which is not the same as 0.
    """

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None


@dataclass(frozen=True)
class ChatReply:
    """One model answer: text, tool calls, or both."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage | None = None
    finish_reason: str | None = None

    def as_message(self) -> Message:
        """The assistant message to put back into the history.

        A turn without text gets `content: ""`, never null: llama.cpp's server answers HTTP 500 to an
        assistant message with a null content (with or without `tool_calls`), and OpenAI accepts "".
        """
        content = "" if self.content is None else self.content
        message: Message = {"role": "assistant", "content": content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return message


class ProviderError(Exception):
    """A failed model call, with a kind the loop can act on and a one-line message for the user.

    `window`: for "context_too_long", the context window the server's answer named (llama.cpp's n_ctx), if any."""

    def __init__(self, kind: ErrorKind, message: str, *, window: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.window = window


# Where a context window's size came from: config.json, the server's own report, an overflow answer that named
# it, or the fallback when nothing said.
WindowSource = Literal["config", "server", "overflow", "default"]


@dataclass(frozen=True)
class ContextWindow:
    """How many tokens one request (prompt and reply) may hold, and where that number came from."""

    tokens: int
    source: WindowSource
    detail: str = ""  # for /context: which endpoint said it, or why the default applies


class ContextWindows(Protocol):
    """The model's context window as this process knows it: asked of the server once, corrected by overflows."""

    async def current(self) -> ContextWindow:
        """The window to budget the next request against (the first call may ask the server)."""
        ...

    def learn(self, tokens: int) -> ContextWindow:
        """An overflow answer named the window: use it from now on; the window now in force."""
        ...


class FixedWindow:
    """A window that is what it was given and learns only from overflows: tests, and a number with no server."""

    def __init__(self, window: ContextWindow):
        self._window = window

    async def current(self) -> ContextWindow:
        return self._window

    def learn(self, tokens: int) -> ContextWindow:
        if tokens < self._window.tokens:
            self._window = ContextWindow(tokens, "overflow", "the server's answer to an over-long request")
        return self._window


# The first line of every background request sent after the conversation (`PromptPrefix.then`): it is sent as a user
# message, and the model must not take it for the user's next one.
BETWEEN_TURNS = "(This message is picoclaw's, not the user's: a task between turns. The user will not see your answer.)"


@dataclass(frozen=True)
class PromptPrefix:
    """A conversation's last request as it was sent (its messages, with the reply appended, and its tool schemas):
    what a single-slot local server holds in its prompt cache after the turn.

    A background call between turns asks `then(...)`: the same messages and tools, its own instruction as a final
    user message, so the server reads only that instruction when the prefix is still cached (and the next turn
    finds the conversation there too). A turn whose reply came empty was last asked again without tools: the server
    last read that retry, not the prefix, so the first background call after it reads the conversation once more.
    """

    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] = ()

    def then(self, instruction: str) -> list[Message]:
        """The prefix's messages followed by `instruction` as a user message (after the BETWEEN_TURNS line)."""
        return [*self.messages, {"role": "user", "content": f"{BETWEEN_TURNS}\n{instruction}"}]


@dataclass(frozen=True)
class Continuation:
    """Where a background job (summary, flush, lesson, reflection) is asked after the conversation's last request:
    `prefix` that request, `part` which of its messages the job is about (said for the model), `earlier` the
    transcript of that part's messages the request did not carry, `summary_shown` whether the session's summary
    is in it (the `<summary>` block at the start of its first user message)."""

    prefix: PromptPrefix
    part: str
    earlier: str = ""
    summary_shown: bool = False


# The start of a reply that is a tool call written as text (tools/text_tool_calls.py reads them in full; this
# layer only needs to know that the answer is no job's answer): `<tool_call>`, `functions.NAME`, a call object.
_CALL_TEXT = re.compile(r"\A(?:```[a-z]*\s*)?(?:<response>\s*)?(?:<tool_call>|<tools>|functions\.[\w-]+"
                        r"|\{+\s*\"name\"\s*:)", re.IGNORECASE)
_CALL_SYNTAX = re.compile(r"\A(?:```[a-z]*\s*)?([A-Za-z_][\w-]*)\s*\(")


def tool_names(schemas: Sequence[dict[str, Any]]) -> set[str]:
    """The names of the tools in OpenAI tool schemas."""
    return {str(schema.get("function", {}).get("name")) for schema in schemas}


def is_call_not_answer(reply: ChatReply, offered: set[str]) -> bool:
    """Whether a background call's `reply` is no answer to its job: empty, a tool call, or a call written as text
    (`<tool_call>`, `functions.NAME`, a `{"name": …}` object, or `NAME(` of a tool in `offered`)."""
    content = (reply.content or "").strip()
    if reply.tool_calls or not content or _CALL_TEXT.match(content):
        return True
    syntax = _CALL_SYNTAX.match(content)
    return syntax is not None and syntax.group(1) in offered


async def ask_between_turns(provider: ChatProvider, own: list[Message], after: Continuation | None,
                            instruction: Callable[[Continuation], str], *,
                            max_tokens: int | None = None) -> ChatReply:
    """A background job's answer: asked after the conversation's last request when `after` is given (its tools
    offered, tool_choice "none", `instruction(after)` at the end), else in `own`, its request of its own.

    The continued shape falls back to `own` (without tools, one log line) when it fails: the request no longer
    fits the window; the server refuses it (HTTP 4xx: some refuse tool_choice "none", and the provider then
    stops sending it); or the reply is empty or a tool call (tool_choice "none" is ignored by llama-cpp-python's
    stock chat format and by Ollama, and a small model answers a fact with memory_append)."""
    if after is not None:
        prefix = after.prefix
        try:
            reply = await provider.chat(prefix.then(instruction(after)), list(prefix.tools) or None,
                                        max_tokens=max_tokens, tool_choice="none")
        except ProviderError as exc:
            if exc.kind not in ("context_too_long", "bad_response"):
                raise
            log.info("a background call after the conversation failed (%s); asking it in its own prompt", exc)
        else:
            if not is_call_not_answer(reply, tool_names(prefix.tools)):
                return reply
            log.info("a background call after the conversation was answered with %s; asking it in its own prompt",
                     "a tool call" if reply.tool_calls or (reply.content or "").strip() else "nothing")
    return await provider.chat(own, None, max_tokens=max_tokens)


class ChatProvider(Protocol):
    """Anything that can answer a chat: the OpenAI-compatible provider, or a test double."""

    name: str  # the providers entry it was made from, for /status and messages
    model: str
    text_tool_calls: str  # "auto": a tool call the model writes as text is still run; "off": only tool_calls

    async def chat(self, messages: list[Message], tools: list[dict[str, Any]] | None = None,
                   *, max_tokens: int | None = None, on_text: TextSink | None = None,
                   tool_choice: ToolChoice = "auto") -> ChatReply:
        """One answer. With `on_text`, the text is also handed over piece by piece as it arrives (each
        piece once; the pieces join to `content`), and the same ChatReply is returned at the end.
        `tool_choice` "none": `tools` are offered but may not be called (a background call's)."""
        ...

    async def sees_images(self) -> bool:
        """Whether the model can be sent images (a user message's `image_url` parts)."""
        ...


class WrappedProvider:
    """A ChatProvider that hands each call to `inner`, doing something around it (a subclass's `chat`): the name,
    the model and whether tool calls written as text are run are `inner`'s."""

    def __init__(self, inner: ChatProvider):
        self.inner = inner
        self.name = inner.name
        self.model = inner.model
        self.text_tool_calls = inner.text_tool_calls

    async def sees_images(self) -> bool:
        return await self.inner.sees_images()


class EmbeddingClient(Protocol):
    """Anything that turns texts into vectors through an `/embeddings` endpoint (the index's remote embedder)."""

    async def embed(self, texts: list[str], model: str, dimensions: int | None = None) -> list[list[float]]: ...

    async def aclose(self) -> None: ...
