"""What a finished turn taught, read from the turn as it was stored: pure functions, no I/O, no model.

A turn may teach a lesson (curation/lesson_drafting.py drafts it) for one of three reasons, checked in this order, the
first that holds naming the turn's trigger:

- "correction": the user's message corrects the assistant ("no, …", "that's wrong", "I told you …", "not X,
  Y", "不对，…", "不是…", "我说过…", "错了"), and the session holds an earlier reply for it to correct;
- "recovery": a tool call failed and a later one worked: a later call of the same tool, or the very next call;
- "workflow": three tool calls or more, every call of the last tool step worked, and the turn ended with the
  model's answer (`workflow_of`: its tools, which curation/skill_drafting.py counts towards a skill draft).

A turn that called tools and had every one of them fail teaches nothing (nothing worked, so there is nothing
to repeat), nor does small talk. A tool result is a failure when it starts with the registry's ERROR_PREFIX
(an unknown tool, bad arguments, a ToolError: MCP tools' errors included), when exec reports a non-zero exit
code or a timeout, or web_fetch an HTTP status of 400 or more.

The detection is cheap and leans towards seeing a lesson: the drafting call is the filter (the model may
answer NONE), and the daily cap bounds what that costs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from picoclaw.providers.base import Message
from picoclaw.tools import ERROR_PREFIX
from picoclaw.transcripts import Session

Trigger = Literal["correction", "recovery", "workflow", "disliked"]
DISLIKED: Trigger = "disliked"  # a 👎 on the turn's reply (channels/telegram): never found in the turn itself

MIN_WORKFLOW_CALLS = 3
# Loading a skill is how a known workflow starts, not a step of it: left out of a workflow's tools, so running
# an accepted skill counts towards the workflow it came from, not towards a new one.
NOT_A_STEP = frozenset({"skill"})
CORRECTION_CHARS = 300  # a correction says so near the start; a long message is read this far

_EXEC_FAILED = re.compile(r"\A(?:exit code (?!0\b)-?\d+|timed out after)")
_FETCH_STATUS = re.compile(r"^Status: (\d{3})\b", re.MULTILINE)

# The words a correction opens with, before what the user wants: "No —", "Wrong,", "不对，" (the one list the
# detection below and `standing_instruction` share).
_EN_NO = "no|nope|nah"
_EN_WRONG = "wrong|incorrect|not quite|not really|not exactly"
_ZH_WRONG = "你错了|搞错了|弄错了|说错了|不对|不是|错了"
# English. At the start: "no, …" (not "no thanks", "no problem" …), "wrong", "not quite", "not Paris, Lyon".
_EN_START = re.compile(
    r"^[\s\"'“‘(*_]*(?:"
    rf"(?:{_EN_NO})\b(?![\s,.!]*(?:thanks|thank|problem|worries|need|rush|hurry|idea|clue)\b)[\s,.!;:—–-]+\w"
    rf"|(?:{_EN_WRONG})\b"
    r"|not\s+(?!bad\b|sure\b|now\b|yet\b|today\b|much\b|really\b)[^,.;!?\n]{1,40},\s*(?:but\s+)?\w"
    r"|i meant\b"
    r")", re.IGNORECASE)
# English, anywhere in the opening of the message.
_EN_ANY = re.compile(
    r"\b(?:"
    r"(?:that|this|it)(?:'s|’s| is)\s+(?:wrong|incorrect|not (?:right|correct|true|what i))"
    r"|i (?:already |just )?(?:told|asked) you\b"
    r"|(?:as|like) i (?:said|told you|mentioned|asked)\b"
    r"|i (?:said|asked for|meant)\b[^.?!\n]{0,60}\bnot\b"
    r"|not what i (?:asked|said|meant|wanted)\b"
    r"|i never (?:said|asked)\b"
    r"|you(?:'re|’re| are) wrong\b"
    r"|you (?:got|have) it wrong\b"
    r"|you misunderstood\b"
    r"|you (?:made|have made) a mistake\b"
    r")", re.IGNORECASE)
# Chinese. At the start: 不对 / 不是 / 错了 / 不， …; anywhere: 我说过, 我告诉过你, 我说的是, 你搞错了, 不是…而是….
_ZH_START = re.compile(rf"^[\s\"'“‘「(*_]*(?:{_ZH_WRONG}|不[，,。！!])")
_ZH_ANY = re.compile(
    r"我(?:已经|刚才|刚刚|之前|早就|明明)?(?:说过|讲过|告诉过你)"
    r"|我说的是|我的意思是"
    r"|不是[^，,。！!？?\n]{1,20}[，,]\s*(?:而)?是"
    r"|你(?:又)?(?:搞|弄|说|记|理解)?错了"
    r"|不对[，,。！!]")


@dataclass(frozen=True)
class ToolStep:
    """One tool call of a turn and its result; `round` numbers the model's tool steps (calls made together)."""

    round: int
    name: str
    arguments: str
    result: str
    failed: bool


@dataclass(frozen=True)
class FinishedTurn:
    """A turn as it was stored, what the review after the reply reads.

    `user_id` is the stored id of the turn's user message, which names the turn (a turn is reviewed once);
    `answered` says the model ended it with an answer (not the tool-step limit); `earlier_reply` is the last
    assistant reply the session held before this turn, the one a correction would correct.
    """

    key: str
    user_id: int
    messages: tuple[Message, ...]
    answered: bool
    earlier_reply: str | None

    @classmethod
    def of(cls, session: Session, count: int, answered: bool) -> FinishedTurn:
        """The turn made of the `count` newest messages of `session`, just appended."""
        return cls._made(session, len(session.messages) - count, len(session.messages), answered)

    @classmethod
    def at(cls, session: Session, user_id: int) -> FinishedTurn | None:
        """The turn of `session` that began with the user message stored as `user_id` (up to the next user
        message), or None when the session no longer holds it."""
        messages = session.messages
        start = next((i for i, m in enumerate(messages) if m.id == user_id and m.message.get("role") == "user"), None)
        if start is None:
            return None
        end = start + 1
        while end < len(messages) and messages[end].message.get("role") != "user":
            end += 1
        last = messages[end - 1].message
        answered = last.get("role") == "assistant" and not last.get("tool_calls") and bool(
            str(last.get("content") or "").strip())
        return cls._made(session, start, end, answered)

    @classmethod
    def _made(cls, session: Session, start: int, end: int, answered: bool) -> FinishedTurn:
        stored = session.messages[start:end]
        earlier = None
        for message in reversed(session.messages[:start]):
            content = message.message.get("content")
            if message.message.get("role") == "assistant" and isinstance(content, str) and content.strip():
                earlier = content
                break
        return cls(session.key, stored[0].id, tuple(m.message for m in stored), answered, earlier)

    @property
    def user_text(self) -> str:
        content = self.messages[0].get("content") if self.messages else None
        return content if isinstance(content, str) else ""

    def steps(self) -> list[ToolStep]:
        """The turn's tool calls with their results, in order."""
        return tool_steps(list(self.messages))


def result_failed(name: str, result: str) -> bool:
    """Whether a tool's result reports a failure (see the module docstring)."""
    if result.startswith(ERROR_PREFIX):
        return True
    if name == "exec" and _EXEC_FAILED.match(result):
        return True
    if name == "web_fetch":
        status = _FETCH_STATUS.search(result[:500])
        return status is not None and int(status.group(1)) >= 400
    return False


def tool_steps(messages: list[Message]) -> list[ToolStep]:
    """Every tool call of `messages` paired with its result (a call without one counts as failed)."""
    results = {str(m.get("tool_call_id")): str(m.get("content") or "") for m in messages if m.get("role") == "tool"}
    steps: list[ToolStep] = []
    rounds = 0
    for message in messages:
        calls = (message.get("tool_calls") or []) if message.get("role") == "assistant" else []
        if not calls:
            continue
        rounds += 1
        for call in calls:
            function = call.get("function") or {}
            name = str(function.get("name") or "")
            result = results.get(str(call.get("id")))
            failed = result is None or result_failed(name, result)
            steps.append(ToolStep(rounds, name, str(function.get("arguments") or ""), result or "", failed))
    return steps


def is_correction(text: str) -> bool:
    """Whether a user's message corrects what the assistant said or did (English or Chinese)."""
    opening = text.strip()[:CORRECTION_CHARS]
    return any(pattern.search(opening) for pattern in (_EN_START, _EN_ANY, _ZH_START, _ZH_ANY))


def recovered(steps: list[ToolStep]) -> bool:
    """A call failed and a later one worked: the same tool later, or the very next call."""
    for index, step in enumerate(steps):
        if not step.failed:
            continue
        later = steps[index + 1:]
        if later and (not later[0].failed or any(s.name == step.name and not s.failed for s in later)):
            return True
    return False


def workflow_of(turn: FinishedTurn) -> tuple[str, ...] | None:
    """The tools of a multi-step workflow that worked (in the order each first worked), or None: at least
    MIN_WORKFLOW_CALLS calls, every call of the last tool step worked, and the turn ended with an answer."""
    steps = turn.steps()
    if not turn.answered or len(steps) < MIN_WORKFLOW_CALLS:
        return None
    last_round = steps[-1].round
    if any(step.failed for step in steps if step.round == last_round):
        return None
    tools: list[str] = []
    for step in steps:
        if not step.failed and step.name not in NOT_A_STEP and step.name not in tools:
            tools.append(step.name)
    return tuple(tools) or None


def trigger_of(turn: FinishedTurn) -> Trigger | None:
    """Why `turn` may teach a lesson, or None (see the module docstring for the order)."""
    steps = turn.steps()
    if steps and all(step.failed for step in steps):
        return None  # nothing worked: nothing to repeat, and a guess at why would be a guess
    if turn.earlier_reply is not None and is_correction(turn.user_text):
        return "correction"
    if recovered(steps):
        return "recovery"
    if workflow_of(turn) is not None:
        return "workflow"
    return None


_OPENING = re.compile(rf"^(?:(?:{_EN_NO}|{_EN_WRONG})\b[\s,.!;:—–-]*"
                      rf"|(?:{_ZH_WRONG}|不(?=[，,。！!]))[\s，,。！!：:—-]*)+", re.IGNORECASE)
_SENTENCE = re.compile(r"[^.!?。！？\n]+[.!?。！？]?")
# A request for every future answer ("from now on …", "always answer …", "以后都…"), not a statement about the
# user ("I always take the bus", "我一直住在上海", "never mind").
_STANDING_REQUEST = re.compile(
    r"\b(?:from now on|from here on|going forward|in (?:the )?future|next time|every time"
    r"|(?:always|never) (?:answer|reply|respond|use|write|give|say|speak|call|check|put|show))\b"
    r"|以后|今后|从现在起|从现在开始|下次|每次都|一律|总是用|不要再|别再", re.IGNORECASE)


def standing_instruction(text: str) -> str | None:
    """The first sentence of a correction that asks for every future answer, without the "No —" before it
    ("answer me in Chinese from now on."); None when there is none. Such a sentence is the lesson itself."""
    for match in _SENTENCE.finditer(text.strip()[:CORRECTION_CHARS]):
        sentence = _OPENING.sub("", match.group().strip()).strip()
        if _STANDING_REQUEST.search(sentence) and len(sentence) >= 6:
            return sentence
    return None
