"""What the chat page shows of a conversation so far: the user's messages as text, the model's replies as rendered
Markdown (web/markdown.py), and each tool call as a card with its arguments and the start of its result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

from picoclaw.web.markdown import rendered

RESULT_EXCERPT = 1_500  # characters of a tool's result a card shows
ARGUMENTS_SHOWN = 1_500  # characters of a call's arguments


@dataclass
class Said:
    """One thing in the conversation: "user" (text), "assistant" (html) or "tool" (a call: name, arguments,
    result)."""

    role: str
    text: str = ""
    html: Markup = Markup("")
    arguments: str = ""
    result: str | None = None


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list (a message that carried an image)."""
    if isinstance(content, list):
        return "\n".join(str(part.get("text") or "") for part in content
                         if isinstance(part, dict) and part.get("type") == "text")
    return str(content or "")


def _excerpt(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " …"


def history(messages: list[dict[str, Any]], shown: int) -> list[Said]:
    """The last `shown` things said in `messages` (a transcript's message dicts, oldest first)."""
    said: list[Said] = []
    calls: dict[str, Said] = {}
    for message in messages:
        role = message.get("role")
        if role == "user" and (text := _text(message.get("content"))):
            said.append(Said("user", text=text))
        elif role == "assistant":
            for call in message.get("tool_calls") or []:
                if not isinstance(call, dict):
                    continue
                function = call.get("function")
                function = function if isinstance(function, dict) else {}
                made = Said("tool", text=str(function.get("name") or "?"),
                            arguments=_excerpt(str(function.get("arguments") or ""), ARGUMENTS_SHOWN))
                calls[str(call.get("id"))] = made
                said.append(made)
            if text := _text(message.get("content")):
                said.append(Said("assistant", text=text))
        elif role == "tool" and (card := calls.get(str(message.get("tool_call_id")))) is not None:
            card.result = _excerpt(_text(message.get("content")), RESULT_EXCERPT)
    kept = said[-shown:]
    for one in kept:  # rendered only when shown: a long conversation's older replies are never parsed
        if one.role == "assistant":
            one.html = rendered(one.text)
    return kept
