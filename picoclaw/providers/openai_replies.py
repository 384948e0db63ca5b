"""Reading an OpenAI-compatible server's replies: a whole completion, or a stream's chunks, into one ChatReply.

Servers differ (llama.cpp, Ollama, vLLM, DeepSeek …) and the `openai` client does not validate bodies, so
every shape is checked here rather than trusted; what cannot be read raises UnreadableReply, which the
provider turns into its "bad_response" error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from picoclaw.providers.base import ChatReply, ToolCall, Usage

__all__ = ["StreamState", "UnreadableReply", "added_usage", "assembled", "parse_completion", "take_chunk"]


class UnreadableReply(Exception):
    """A reply whose shape picoclaw cannot read; the message says what was wrong with it."""


@dataclass
class PartialCall:
    """A streamed tool call being put together from its deltas."""

    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class StreamState:
    """What one streamed reply has delivered so far; once text reached the caller it must not be re-sent."""

    delivered: bool = False
    answering: bool = False  # the server began its answer: a connection lost now was not a failure to connect
    content: list[str] | None = None  # None: no content delta at all (a tool-call-only turn)
    calls: dict[int, PartialCall] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: object = None
    timings: object = None
    chunks_with_choices: int = 0


def parse_completion(completion: object) -> ChatReply:
    """The ChatReply of a whole (not streamed) completion."""
    # The client does not validate bodies (non-strict mode) and returns plain text for non-JSON
    # replies, so the shape is checked here rather than trusted.
    choices = getattr(completion, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise UnreadableReply("no choices")
    choice = choices[0]
    message = getattr(choice, "message", None)
    if message is None:
        raise UnreadableReply("no message")
    content = getattr(message, "content", None)
    if content is not None and not isinstance(content, str):
        raise UnreadableReply("content is not text")
    calls = [_tool_call(call, i) for i, call in enumerate(getattr(message, "tool_calls", None) or [])]
    return ChatReply(content=content, tool_calls=calls,
                     usage=_usage(getattr(completion, "usage", None), getattr(completion, "timings", None)),
                     finish_reason=getattr(choice, "finish_reason", None))


def take_chunk(chunk: object, state: StreamState) -> str:
    """Fold one `chat.completion.chunk` into `state`; the content piece to hand over ("" for none)."""
    if getattr(chunk, "usage", None) is not None:  # the last chunk, with include_usage
        state.usage = getattr(chunk, "usage", None)
    if getattr(chunk, "timings", None) is not None:  # llama.cpp's server
        state.timings = getattr(chunk, "timings", None)
    choices = getattr(chunk, "choices", None)
    if choices is None:
        return ""
    if not isinstance(choices, list):
        raise UnreadableReply("stream chunk choices are not a list")
    piece = ""
    for choice in choices:
        if getattr(choice, "index", 0) not in (0, None):  # n > 1 is never asked for
            continue
        state.chunks_with_choices += 1
        delta = getattr(choice, "delta", None)
        content = getattr(delta, "content", None)
        if isinstance(content, str):
            state.content = [*(state.content or []), content]
            piece += content
        elif content is not None:
            raise UnreadableReply("content is not text")
        for position, call in enumerate(getattr(delta, "tool_calls", None) or []):
            _take_call_delta(call, position, state)
        finish_reason = getattr(choice, "finish_reason", None)
        if isinstance(finish_reason, str) and finish_reason:
            state.finish_reason = finish_reason
    return piece


def _take_call_delta(call: object, position: int, state: StreamState) -> None:
    # OpenAI: the first delta of a call carries index, id and name, later ones argument fragments
    # with the same index. Some servers leave out the index (one call per chunk) or repeat id and
    # name in every delta, so the index falls back to the position and repeats are not appended.
    index = getattr(call, "index", None)
    if not isinstance(index, int):
        index = position
    partial = state.calls.setdefault(index, PartialCall())
    call_id = getattr(call, "id", None)
    if isinstance(call_id, str) and call_id and not partial.id:
        partial.id = call_id
    function = getattr(call, "function", None)
    name = getattr(function, "name", None)
    if isinstance(name, str) and name and name != partial.name:
        partial.name += name
    arguments = getattr(function, "arguments", None)
    if isinstance(arguments, str):
        partial.arguments.append(arguments)
    elif arguments is not None:  # an object, as older Ollama sends in plain replies
        partial.arguments.append(json.dumps(arguments, ensure_ascii=False))


def assembled(state: StreamState) -> ChatReply:
    """The ChatReply for a finished stream, checked like a plain completion."""
    if not state.chunks_with_choices:
        raise UnreadableReply("no choices")
    calls = []
    for position, index in enumerate(sorted(state.calls)):
        partial = state.calls[index]
        if not partial.name:
            raise UnreadableReply("a tool call has no function name")
        calls.append(ToolCall(id=partial.id or f"call_{position}", name=partial.name,
                              arguments="".join(partial.arguments)))
    return ChatReply(content=None if state.content is None else "".join(state.content), tool_calls=calls,
                     usage=_usage(state.usage, state.timings), finish_reason=state.finish_reason)


def _tool_call(call: object, position: int) -> ToolCall:
    function = getattr(call, "function", None)
    name = getattr(function, "name", None)
    if not isinstance(name, str) or not name:
        raise UnreadableReply("a tool call has no function name")
    arguments = getattr(function, "arguments", None)
    if arguments is None:
        arguments = ""
    elif not isinstance(arguments, str):
        # Some servers (older Ollama) send an object; the loop expects the JSON text.
        arguments = json.dumps(arguments, ensure_ascii=False)
    call_id = getattr(call, "id", None)
    # The id must be present to pair the tool result with the call in the next request.
    return ToolCall(id=call_id if isinstance(call_id, str) and call_id else f"call_{position}",
                    name=name, arguments=arguments)


def _number(container: object, key: str) -> object:
    """`container.key` or `container[key]`: extra fields of the client's models may be plain dicts."""
    if isinstance(container, Mapping):
        return container.get(key)
    return getattr(container, key, None)


def _usage(usage: object, timings: object = None) -> Usage | None:
    """Token counts from a completion's `usage` (and llama.cpp's `timings`); None when incomplete.

    The cached part of the prompt comes from `prompt_tokens_details.cached_tokens` (OpenAI, vLLM),
    `prompt_cache_hit_tokens` (DeepSeek) or `timings.cache_n` (llama.cpp's server), whichever is there.
    """
    prompt, produced = _number(usage, "prompt_tokens"), _number(usage, "completion_tokens")
    if not isinstance(prompt, int) or not isinstance(produced, int):
        return None
    for cached in (_number(_number(usage, "prompt_tokens_details"), "cached_tokens"),
                   _number(usage, "prompt_cache_hit_tokens"), _number(timings, "cache_n")):
        if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0:
            return Usage(prompt, produced, cached)
    return Usage(prompt, produced)


def added_usage(total: Usage, more: Usage) -> Usage:
    """Running totals; the cached count stays None until some reply reported one."""
    cached = total.cached_tokens if more.cached_tokens is None else (total.cached_tokens or 0) + more.cached_tokens
    return Usage(total.prompt_tokens + more.prompt_tokens, total.completion_tokens + more.completion_tokens, cached)
