"""Tool calls that a small local model wrote as plain text instead of structured `tool_calls`.

A model served without a tool-call parser (llama.cpp's stock server with Qwen2.5-Coder, see
shared/real-model/text_tool_calls.json) answers with its call in `content`. `find_text_tool_call` recognises
such a call so the caller can execute it like a structured one. It is pure (no I/O) and conservative: a normal
answer that merely contains JSON stays text.

Rules:
1. Forms recognised, each only at the very start of the reply (after whitespace, or after a lead-in, rule 3):
   - a fenced code block, ```json or a bare ```, whose whole body is one call object;
   - one call object inside `<tool_call>…</tool_call>` or `<tools>…</tools>`, nothing else inside the tags;
   - any one of these forms inside `<response>…</response>`, nothing else inside the tags (a small model that
     wraps every reply in the tags a template showed it wraps its calls too);
   - `functions.NAME`, an optional colon, then a JSON object of arguments (on the same line or the next
     non-blank one); with nothing else on that line and no object next, the call has no arguments (rule 5);
   - a reply that is nothing but one call object (no lead-in, nothing after it);
   - one call object, then a closing ``` (a fenced call whose opening fence the model left out: seen from
     Qwen2.5-Coder-1.5B, a call followed by that fence and prose about it), what follows dropped (rule 4);
   - one call object, then `<tool_response>`: the model went on to invent the tool's result (seen from
     Qwen2.5-Coder-1.5B, `{"name": "memory_search", …}` then a made-up result and an answer built on it); the
     call is run, the invented rest dropped (rule 4);
   - a reply that is nothing but one call object inside one extra pair of braces, `{{"name": …, "arguments":
     {…}}}` (a template's doubled braces copied literally: seen from Qwen2.5-Coder-1.5B).
   A call object is a JSON object with exactly the keys `name` (a string) and `arguments` (an object, or a
   JSON string holding an object). `parameters` is not a synonym: the corpus never uses it. Other forms seen
   in the corpus stay text: Python call syntax such as `memory_search(query='…', limit=1)`.
2. The call must name a tool in `offered` exactly, and its arguments must pass that tool's
   `Args.model_validate`; otherwise the reply stays text (None), untouched.
3. Lead-in: one line of text before the call is accepted only if it is a single line of at most 200
   characters holding none of the characters ``` ` { } < > ```, and the call is the last thing in the
   reply (only whitespace after it). The line is returned as `before`. A call after more prose than that,
   or a lead-in line with text after the call (prose explaining a call), stays text.
4. One call per reply. Without a lead-in, everything after the first call is dropped: a second call,
   invented tool results, invented answers. The caller executes the call and the model writes the real
   answer on its next step (and may repeat a dropped second call then).
5. `functions.NAME` with no arguments becomes a call with `{}` only if the tool's Args validate with no
   arguments; otherwise the reply stays text.
6. Never raises (non-string content, broken or deeply nested JSON, NaN, lone surrogates all give None),
   and reads only the first 20,000 characters: a call must lie within them, and the forms that must end
   the reply (a lead-in, a bare object) need the whole reply to lie within them.
7. `TextToolCall.arguments` is `json.dumps(arguments, ensure_ascii=False)` of the dict that was validated
   (not the model's dump), so the tool registry validates the same thing again.
8. A plain answer in `<response>…</response>` (no call inside) is text; `without_response_wrapper` drops the tags
   before it is shown or stored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from picoclaw.tools.base import Toolset

MAX_CHARS = 20_000  # only this much of a reply is looked at
MAX_LEAD_IN_CHARS = 200
_LEAD_IN_FORBIDDEN = frozenset("`{}<>")
_FENCE = re.compile(r"```[ \t]*(?:json)?[ \t]*\r?\n", re.IGNORECASE)
_FUNCTIONS = re.compile(r"functions\.([A-Za-z0-9_\-]+)")
_TAGS = ("tool_call", "tools")
_WRAPPER = "response"  # tags around a whole reply: a call in any form may be inside
RESPONSE_OPEN = f"<{_WRAPPER}>"
RESPONSE_CLOSE = f"</{_WRAPPER}>"
_CALL_KEYS = frozenset({"name", "arguments"})
_INVENTED_RESULT = "<tool_response>"  # the tag Qwen's template puts around a real tool result


def without_response_wrapper(text: str) -> str:
    """A plain answer without the `<response>…</response>` a small model wraps every reply in (the tags a template
    showed it): the opening tag at its start and the closing one at its end dropped, the rest stripped; a text
    that does not begin with the tag unchanged."""
    start = text.lstrip()
    if not start.startswith(RESPONSE_OPEN):
        return text
    inner = start[len(RESPONSE_OPEN):].rstrip()
    if inner.endswith(RESPONSE_CLOSE):
        inner = inner[:-len(RESPONSE_CLOSE)]
    return inner.strip()


@dataclass(frozen=True)
class TextToolCall:
    """A tool call found in a reply's text."""

    name: str
    arguments: str  # JSON text of the arguments object, as a structured call would carry it
    before: str  # the lead-in line the model wrote before the call (stripped), usually ""


@dataclass(frozen=True)
class _Found:
    name: str
    arguments: dict[str, Any]
    end: int  # index just after the call in the text it was found in
    whole_reply_only: bool = False  # a bare object counts only when it is the whole reply


def offered_tools(registry: Toolset) -> dict[str, type[BaseModel]]:
    """The `offered` mapping for a request that offers every tool of `registry`."""
    return {name: tool.Args for name, tool in registry.tools.items()}


def find_text_tool_call(content: str | None, offered: Mapping[str, type[BaseModel]]) -> TextToolCall | None:
    """The tool call written as text in `content`, if it is one; None leaves the reply as text."""
    try:
        return _find(content, offered)
    except Exception:  # a safety net: a reply we cannot read stays text
        return None


def _find(content: object, offered: Mapping[str, type[BaseModel]]) -> TextToolCall | None:
    if not isinstance(content, str) or not offered:
        return None
    complete = len(content) <= MAX_CHARS
    text = content[:MAX_CHARS].lstrip()
    before = ""
    found = _parse_at_start(text)
    if found is None:
        lead, newline, rest = text.partition("\n")
        lead = lead.strip()
        if not newline or not _is_lead_in(lead):
            return None
        text = rest.lstrip()
        found = _parse_at_start(text)
        if found is None or not complete or text[found.end:].strip():
            return None
        before = lead
    if found.whole_reply_only and (before or not complete or text[found.end:].strip()):
        return None
    model = offered.get(found.name)
    if model is None:
        return None
    try:
        model.model_validate(found.arguments)
        arguments = json.dumps(found.arguments, ensure_ascii=False, allow_nan=False)
        arguments.encode("utf-8")  # a lone surrogate from a \ud800 escape could not be sent on
    except Exception:
        return None
    return TextToolCall(name=found.name, arguments=arguments, before=before)


def _is_lead_in(line: str) -> bool:
    return 0 < len(line) <= MAX_LEAD_IN_CHARS and not _LEAD_IN_FORBIDDEN.intersection(line)


def _parse_at_start(text: str) -> _Found | None:
    """A call in one of the recognised forms at index 0 of `text`, before any check of name or arguments."""
    if text.startswith("```"):
        return _fenced(text)
    if text.startswith("<"):
        return _tagged(text)
    if text.startswith("functions."):
        return _functions(text)
    if text.startswith("{") and text.startswith("{", _skip_space(text, 1)):  # no JSON object starts so
        return _doubled_braces(text)
    if text.startswith("{"):
        decoded = _decode_object(text, 0)
        if decoded is None:
            return None
        call = _call_object(decoded[0])
        if call is None:
            return None
        after = _skip_space(text, decoded[1])
        if text.startswith("```", after):  # its opening fence left out: the fenced form, what follows dropped
            return _Found(call[0], call[1], after + 3)
        if text.startswith(_INVENTED_RESULT, after):  # the call, then a result the model made up: dropped
            return _Found(call[0], call[1], after)
        return _Found(call[0], call[1], decoded[1], whole_reply_only=True)
    return None


def _doubled_braces(text: str) -> _Found | None:
    """A call object wrapped in one more `{` … `}`; like a bare object, it must be the whole reply."""
    found = _object_then(text, 1, "}")
    return None if found is None else _Found(found.name, found.arguments, found.end, whole_reply_only=True)


def _fenced(text: str) -> _Found | None:
    opener = _FENCE.match(text)
    if opener is None:
        return None
    return _object_then(text, opener.end(), "```")


def _tagged(text: str) -> _Found | None:
    for tag in _TAGS:
        opener = f"<{tag}>"
        if text.startswith(opener):
            return _object_then(text, len(opener), f"</{tag}>")
    opener = f"<{_WRAPPER}>"
    if text.startswith(opener) and not text.startswith(opener, _skip_space(text, len(opener))):
        return _wrapped(text, len(opener), f"</{_WRAPPER}>")
    return None


def _wrapped(text: str, start: int, closer: str) -> _Found | None:
    """A call in any recognised form from `start` (after whitespace), then only whitespace before `closer`."""
    inside = _skip_space(text, start)
    found = _parse_at_start(text[inside:])
    if found is None:
        return None
    end = _skip_space(text, inside + found.end)
    if not text.startswith(closer, end):
        return None
    # The tags end the call: a bare object inside them need not be the whole reply.
    return _Found(found.name, found.arguments, end + len(closer))


def _object_then(text: str, start: int, closer: str) -> _Found | None:
    """One call object from `start` (after whitespace), then only whitespace before `closer`."""
    decoded = _decode_object(text, _skip_space(text, start))
    if decoded is None:
        return None
    value, end = decoded
    end = _skip_space(text, end)
    if not text.startswith(closer, end):
        return None
    call = _call_object(value)
    return None if call is None else _Found(call[0], call[1], end + len(closer))


def _functions(text: str) -> _Found | None:
    match = _FUNCTIONS.match(text)
    if match is None:
        return None
    position = match.end()
    if text.startswith(":", position):
        position += 1
    while position < len(text) and text[position] in " \t":
        position += 1
    if position < len(text) and text[position] not in "\r\n{":
        return None  # something else follows on the line: `functions.x(...)`, `functions.x: some words`
    line_end = position
    position = _skip_space(text, position)
    if not text.startswith("{", position):
        return _Found(match.group(1), {}, line_end)
    decoded = _decode_object(text, position)
    if decoded is None:
        return None
    return _Found(match.group(1), decoded[0], decoded[1])


def _call_object(value: object) -> tuple[str, dict[str, Any]] | None:
    """(name, arguments) of a `{"name": ..., "arguments": ...}` object, or None."""
    if not isinstance(value, dict) or set(value) != _CALL_KEYS:
        return None
    name, arguments = value["name"], value["arguments"]
    if not isinstance(name, str) or not name:
        return None
    if isinstance(arguments, str):
        inner = arguments.strip()
        decoded = _decode_object(inner, 0)
        if decoded is None or decoded[1] != len(inner):
            return None
        arguments = decoded[0]
    if not isinstance(arguments, dict):
        return None
    return name, arguments


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity: the registry's orjson refuses them


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _decode_object(text: str, start: int) -> tuple[Any, int] | None:
    """The JSON object starting exactly at `start` and the index after it, or None."""
    if not text.startswith("{", start):
        return None
    try:
        return _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError):
        return None


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position
