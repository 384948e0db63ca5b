"""Never an empty reply: what a turn does when the model answers nothing, or repeats its last tool call.

Seen from Qwen2.5-Coder-1.5B on llama.cpp's server (shared/real-model/flush_poisoning.json): a whole answer of one
end-of-text token, twice right after the model had called memory_search twice with the same arguments, once with
the answer in the injected memory. Stored, each empty reply went back to the model in every later request.

Rules (pure functions here; the loop makes the calls):
1. A step needs another try when its reply has no tool call and no text but white space (`is_empty`, after an
   echo of the <context> block is removed: agent/context_echo.py), or when its tool calls repeat those of the
   step before it in this turn, name for name and argument for argument (`repeats_last_call`). A repeated call
   is never run: its results are already in view, and a small model that repeats a call loops on it. A call
   whose result was an error (tools' ERROR_PREFIX: a web_fetch that timed out) is no repeat: trying it again is
   what the model should do, and it runs (bounded, as every step, by max_tool_iterations). So does an answer
   that repeats the previous turn's answer word for word to a different message, with no tool result in between
   (`repeats_last_answer`): a small model echoing its own history (Qwen2.5-Coder-1.5B answered "I've saved your
   message to today's daily note." to eight different questions in a row). It gets the plain try only (rule 2),
   whose answer is taken even if it is the same (then it was meant), and the repeat itself when that try is empty.
   While it streams, such an answer is held back until it differs from the previous one (agent/streaming.py).
2. The tries (`retry_requests`), each without tools: first the turn as it stands, with what its tools returned
   written out after the user's message, so the model answers from them (`with_results_in_view`; the prompt cache
   keeps the part before that message only where the chat template ignores the tools); then plainly,
   the system prompt and the user's message alone (`plain_request`). A try answers when it has text and no tool
   call (`is_answer`): a call written in a try offered no tools is no answer either.
3. Both tries empty: `EmptyAnswer`, a ProviderError, so the turn fails as a failed model call does: nothing empty
   is stored (what tools ran stays on record, with a note), the user is told in one line, `chat -m` exits 1.
4. A caller to whom an empty answer is an answer (the heartbeat, told to stay quiet when nothing is due) asks
   for no tries (`AgentLoop.handle(ask_again=False)`): an empty reply is `EmptyAnswer(asked_again=False)` at once,
   and the turn's reply is "", quiet, with that error (kind "empty_answer"). A repeated call is still asked again:
   the model meant to say something.
"""

from __future__ import annotations

import json
import re
from typing import Any

from picoclaw.memory import user_texts
from picoclaw.providers.base import ChatReply, Message, ProviderError
from picoclaw.tools import ERROR_PREFIX
from picoclaw.transcripts import summary_of, with_summary

# How the results of the turn's tool calls follow the user's message in the first try: picoclaw's words, framed
# like the <context> block (data, not the user's), with the one instruction a small model needs.
RESULTS_OPEN = "<tool_results>"
RESULTS_CLOSE = "</tool_results>"
RESULTS_FRAME = ("(picoclaw: the tools called for the message above returned this. Tools are not available now: "
                 "answer the message from these results.)")
RESULT_CHARS = 4000  # of one tool result in that block: a whole file read would crowd out the question
# The block's closing tag inside a result (a fetched page, a file), in any spelling: written as text, it cannot end
# the block early and make what follows it read as picoclaw's words.
_CLOSE_INSIDE = re.compile(r"<\s*/\s*tool_results\s*>", re.IGNORECASE)


class EmptyAnswer(ProviderError):
    """The model answered nothing; `asked_again`: also when asked twice more without tools (rule 2), or, for a
    caller to whom an empty answer is an answer (the heartbeat: nothing to report), not asked again."""

    def __init__(self, *, asked_again: bool = True) -> None:
        # Worded for a chat and a scheduled task alike: the apology reaches both.
        super().__init__("empty_answer", "the model returned no answer, also when asked twice more without tools"
                         if asked_again else "the model returned no answer")
        self.asked_again = asked_again


def is_empty(reply: ChatReply) -> bool:
    """No tool call and no text but white space."""
    return not reply.tool_calls and not (reply.content or "").strip()


def is_answer(reply: ChatReply) -> bool:
    """A try's reply that is an answer: some text, and no tool call (none was offered)."""
    return not reply.tool_calls and bool((reply.content or "").strip())


def repeats_last_call(messages: list[Message], reply: ChatReply) -> bool:
    """Whether `reply`'s tool calls are the same as those of the turn's step before it (the newest assistant
    message after the turn's user message), none of whose results was an error."""
    if not reply.tool_calls:
        return False
    start = _turn_start(messages)
    at = next((i for i in range(len(messages) - 1, start, -1) if messages[i].get("role") == "assistant"), None)
    if at is None or not messages[at].get("tool_calls"):
        return False
    previous = messages[at]
    ids = {str(call.get("id")) for call in previous["tool_calls"]}
    if any(str(m.get("content") or "").startswith(ERROR_PREFIX) for m in messages[at + 1:]
           if m.get("role") == "tool" and str(m.get("tool_call_id")) in ids):
        return False
    before = [(_function(call)["name"], _function(call)["arguments"]) for call in previous["tool_calls"]]
    now = [(call.name, call.arguments) for call in reply.tool_calls]
    return [(name, _same_json(arguments)) for name, arguments in before] == [
        (name, _same_json(arguments)) for name, arguments in now]


# Shorter answers may well be the same twice ("You're welcome!", "好的。"): only a longer one is taken for an echo.
MIN_REPEAT_CHARS = 20


def previous_answer(messages: list[Message]) -> str | None:
    """The answer that ended the turn before this one, if that turn ended in one."""
    start = _turn_start(messages)
    for message in reversed(messages[:start]):
        if message.get("role") == "user":
            return None
        if message.get("role") == "assistant" and not message.get("tool_calls"):
            return str(message.get("content") or "") or None
    return None


def repeats_last_answer(messages: list[Message], reply: ChatReply) -> bool:
    """Whether `reply` is the previous turn's answer again, word for word, to a message that is not the
    previous message again (rule 1)."""
    previous = previous_answer(messages)
    start = _turn_start(messages)
    if reply.tool_calls or previous is None or any(m.get("role") == "tool" for m in messages[start + 1:]):
        return False  # an answer from this turn's tool results is no echo of history
    answer = same_words(reply.content or "")
    if len(answer) < MIN_REPEAT_CHARS or answer != same_words(previous):
        return False
    before = next((i for i in range(start - 1, -1, -1) if messages[i].get("role") == "user"), None)
    if before is None:
        return True
    now, then = user_texts([messages[start], messages[before]])
    return same_words(now) != same_words(then)


def same_words(text: str) -> str:
    """`text` with its white space collapsed and its case folded: how two answers are compared."""
    return " ".join(text.split()).casefold()


def retry_requests(messages: list[Message]) -> list[list[Message]]:
    """The two tries after an empty reply or a repeated call, in order (rule 2); send each without tools."""
    return [with_results_in_view(messages), plain_request(messages)]


def with_results_in_view(messages: list[Message]) -> list[Message]:
    """The turn's request up to its user message, that message followed by what the turn's tools returned.

    Everything before the user's message is sent as it was, so a local server's prompt cache still serves it
    where the chat template ignores the tools; a template that writes the tool schemas into the prompt (Qwen's,
    at its start) makes a request without them a new prefix, read afresh.
    """
    start = _turn_start(messages)
    results = _results(messages[start + 1:])
    if not results:
        return messages[:start + 1]
    user = messages[start]
    text = str(user.get("content") or "")
    block = "\n".join([RESULTS_OPEN, *results, RESULTS_CLOSE, RESULTS_FRAME])
    return [*messages[:start], {**user, "content": f"{text}\n\n{block}"}]


def plain_request(messages: list[Message]) -> list[Message]:
    """The system prompt and the turn's user message (with its data block) alone: no history, no tool results;
    the session's summary, which opens the request's first user message, goes with it."""
    start = _turn_start(messages)
    system = [messages[0]] if messages and messages[0].get("role") == "system" and start > 0 else []
    message = messages[start]
    first = next((m for m in messages if m.get("role") == "user"), message)
    if first is not message and (summary := summary_of(first)) is not None:
        message = with_summary(message, summary)
    return [*system, message]


def _turn_start(messages: list[Message]) -> int:
    """The index of the turn's user message: the newest one (tool results are not user messages)."""
    # From the end: it is near it, and a turn of a long session checks this after each step.
    return next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "user"), 0)


def _results(steps: list[Message]) -> list[str]:
    """Each tool call of the turn with what it returned, as lines for the results block."""
    calls: dict[str, tuple[str, str]] = {}
    lines: list[str] = []
    for message in steps:
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                calls[str(call.get("id"))] = (_function(call)["name"], _function(call)["arguments"])
        elif message.get("role") == "tool":
            name, arguments = calls.get(str(message.get("tool_call_id")), ("a tool", ""))
            result = str(message.get("content") or "")
            if len(result) > RESULT_CHARS:
                result = result[:RESULT_CHARS] + " […]"
            lines.append(_CLOSE_INSIDE.sub("&lt;/tool_results&gt;", f"{name} {arguments}:\n{result}".strip()))
    return lines


def _function(call: dict[str, Any]) -> dict[str, str]:
    function = call.get("function") or {}
    return {"name": str(function.get("name") or ""), "arguments": str(function.get("arguments") or "")}


def _same_json(arguments: str) -> str:
    """Arguments in one spelling (keys sorted, no spacing), so `{"a": 1}` and `{"a":1}` are the same call."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except (ValueError, RecursionError):
        return arguments.strip()
