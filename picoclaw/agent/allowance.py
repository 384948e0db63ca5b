"""The day's budget (config.json `budget`): every model call is claimed here before it is made and settled after.

`MeteredProvider` wraps the provider once per purpose ("chat", "summary", "heartbeat" …): its `chat` asks the
`Allowance` for room (the estimate: the prompt's tokens and the reply's max_tokens), makes the call, then settles the
hold with the usage the provider reported (a stream's too; an estimate when none came). A call under no cap is only
recorded after it ends. Everything but "chat" is background work: no person's message asked for it.

At a cap the call is not made: OverBudget (a ProviderError of kind "over_budget") says why in one line, in the
language of the request's text. The first background call refused each day also tells the owner (`owner`, set by
the front end: the heartbeat's chat or the terminal), once across every process (the ledger keeps the mark). A
ledger that cannot be updated refuses capped calls (the cap is hard); a damaged one counts its day as spent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import date, tzinfo
from typing import Any

from picoclaw import clock
from picoclaw.agent.budget import json_tokens, message_tokens
from picoclaw.cjk import letters
from picoclaw.config import BudgetConfig, ModelPrice
from picoclaw.errors import ConfigError
from picoclaw.memory import Day, Hold, SpendLedger, Spent, Workspace
from picoclaw.providers.base import (
    ChatProvider,
    ChatReply,
    Message,
    ProviderError,
    TextSink,
    ToolChoice,
    Usage,
    WrappedProvider,
)
from picoclaw.storage import StorageError
from picoclaw.tokens import count_tokens

log = logging.getLogger(__name__)

CHAT = "chat"
HEARTBEAT = "heartbeat"
AGENT_JOB = "agent_job"
SUMMARY = "summary"
FLUSH = "flush"
COMPRESSION = "compression"
REFLECTION = "reflection"
QUERY_REWRITE = "query_rewrite"
LESSON = "lesson"
EVAL = "eval"  # `memory eval --generate` and `--answers`: asked for by the user, but no conversation's turn
# In the order reports list them.
PURPOSES = (CHAT, HEARTBEAT, AGENT_JOB, SUMMARY, FLUSH, COMPRESSION, REFLECTION, QUERY_REWRITE, LESSON, EVAL)
TURN_PURPOSES = (CHAT, HEARTBEAT, AGENT_JOB)  # turns of a conversation; the rest are calls beside one

OwnerNotice = Callable[[str], Awaitable[None]]

# How long the count of a call under no cap may wait, so that the calls of that time share one ledger write (a bot
# at Telegram's rate makes dozens a second). `drain` writes what waits at once; the ledger is soft state anyway.
SETTLE_AFTER_SECONDS = 1.0

_LATIN_WORD = re.compile(r"[A-Za-z]{2,}")


def is_background(purpose: str) -> bool:
    """Whether a call of `purpose` is background work (no person's message asked for it)."""
    return purpose != CHAT


def is_chat(purpose: str) -> bool:
    return purpose == CHAT


def price_of(prices: dict[str, ModelPrice], model: str) -> ModelPrice | None:
    """The price of `model`: its own entry, else the longest entry its name starts with (a dated version of a
    model, "gpt-4o-mini-2024-07-18", costs what "gpt-4o-mini" does); None when there is none."""
    if model in prices:
        return prices[model]
    found = [name for name in prices if name and model.startswith(name)]
    return prices[max(found, key=len)] if found else None


def micro_usd(price: ModelPrice, prompt: int, cached: int, completion: int) -> int:
    """The cost in millionths of a dollar (prices are dollars per million tokens: millionths per token)."""
    cached_price = price.input if price.cached_input is None else price.cached_input
    return round((prompt - cached) * price.input + cached * cached_price + completion * price.output)


def chinese(text: str) -> bool:
    """Whether `text` reads as Chinese more than English (more CJK letters than Latin words)."""
    return len(letters(text)) > len(_LATIN_WORD.findall(text))


_CONTEXT_BLOCK = re.compile(r"<context>.*?</context>", re.DOTALL)


def request_text(messages: Sequence[Message], *, last_only: bool = False) -> str:
    """The text of a request's non-system messages, or of its last one, without the memory blocks they carry (for
    the language its refusal is written in)."""
    parts = []
    for message in messages[-1:] if last_only else messages:
        if message.get("role") == "system":
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return _CONTEXT_BLOCK.sub("", "\n".join(parts))


# -- what is said at a cap ------------------------------------------------------------------------------------------


def _usd(micro: int) -> str:
    return f"${micro / 1_000_000:,.2f}"


def cap_notice(cap: str, limit: str, *, zh: bool, damaged: bool = False) -> str:
    """The owner's notice, once a day, that background work waits: which cap (its config key) and how to raise it."""
    if damaged:
        if zh:
            return ("用量账本 memory/.spend.json 已损坏，所以今天的后台预算按已用完计算："
                    "摘要、记忆整理、压缩和心跳等到明天再做，聊天照常。明天会从新的账本开始计数。")
        return ("The spend ledger memory/.spend.json was damaged, so today's background budget counts as spent: "
                "summaries, memory flushes, compression and the heartbeat wait until tomorrow; chat goes on. "
                "Counting starts afresh tomorrow.")
    if zh:
        return (f"今天的后台预算已用完（budget.{cap}：{limit}）：摘要、记忆整理、压缩和心跳等到明天再做，聊天照常，"
                f"推迟的记忆整理明天会补上。要提高上限，请修改 config.json 里的 budget.{cap}。")
    return (f"Today's background budget is spent (budget.{cap}: {limit}): summaries, memory flushes, compression and "
            f"the heartbeat wait until tomorrow; chat goes on, and deferred flushes run then. To allow more, raise "
            f"budget.{cap} in config.json.")


def refusal(purpose: str, cap: str, limit: str, *, zh: bool, damaged: bool = False) -> str:
    """The one line a call refused at a cap is answered with (a chat turn's reply, a scheduled task's outcome)."""
    if damaged:
        return ("用量账本已损坏，今天的预算按已用完计算（明天重新计数）。" if zh else
                "The spend ledger was damaged, so today's budget counts as spent (counting starts afresh tomorrow).")
    if purpose == CHAT:
        if zh:
            return (f"今天的聊天预算已用完（budget.{cap}：{limit}）。"
                    f"明天可以继续，或在 config.json 里调高 budget.{cap}。")
        return (f"Today's chat budget is spent (budget.{cap}: {limit}); I can answer again tomorrow, or raise "
                f"budget.{cap} in config.json.")
    if zh:
        return f"今天的后台预算已用完（budget.{cap}：{limit}），这项{_PURPOSE_ZH.get(purpose, purpose)}没有执行。"
    return f"Today's background budget is spent (budget.{cap}: {limit}); this {purpose.replace('_', ' ')} was not run."


_PURPOSE_ZH = {HEARTBEAT: "心跳", AGENT_JOB: "定时任务", SUMMARY: "摘要", FLUSH: "记忆整理", COMPRESSION: "压缩",
               REFLECTION: "反思", QUERY_REWRITE: "查询改写", LESSON: "经验总结", EVAL: "记忆评测"}


class OverBudget(ProviderError):
    """A call the day's budget has no room for; it was not made."""

    def __init__(self, message: str):
        super().__init__("over_budget", message)


# -- the allowance --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """A claimed call: its day (the claim's, even when it ends after midnight), purpose, model and prompt estimate;
    `hold` names its hold in the ledger (None: no cap applied, nothing held)."""

    day: date
    purpose: str
    model: str
    prompt: int
    hold: str | None = None


@dataclass(frozen=True)
class _Count:
    day: date
    purpose: str
    spent: Spent


class _Waiting:
    """The counts of one event loop waiting for their shared ledger write, and the task that writes them."""

    def __init__(self) -> None:
        self.counts: list[_Count] = []
        self.hurry = asyncio.Event()  # set by `drain`: write now, do not wait
        self.writer: asyncio.Task[None] | None = None


@dataclass(frozen=True)
class _Decision:
    granted: bool
    cap: str = ""
    limit: str = ""
    damaged: bool = False
    tell_owner: bool = False


class Allowance:
    """The workspace's daily caps over its spend ledger; shared by every agent of a process (app.py makes one)."""

    def __init__(self, budget: BudgetConfig, ledger: SpendLedger, tz: tzinfo, *, owner: OwnerNotice | None = None,
                 settle_after: float = SETTLE_AFTER_SECONDS):
        self.budget = budget
        self.ledger = ledger
        self.tz = tz
        self.owner = owner  # where the day's notice goes; None: this process tells no one (logged only)
        self._unpriced: set[str] = set()  # models whose unknown cost was reported
        self.settle_after = settle_after  # seconds an uncapped call's count waits to share a ledger write
        # per event loop: the counts `settle_later` took and has not written yet
        self._waiting: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Waiting] = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, workspace: Workspace) -> Allowance:
        """The allowance of `workspace`'s config, its ledger in the shared memory folder."""
        return cls(workspace.config.budget, SpendLedger(workspace.layout.shared_memory_dir, storage=workspace.storage),
                   workspace.tz)

    def today(self) -> date:
        return clock.now(self.tz).date()

    def capped(self, purpose: str) -> bool:
        if is_background(purpose):
            return self.budget.background_tokens_per_day > 0 or self.budget.usd_per_day > 0
        return self.budget.chat_tokens_per_day > 0

    def price(self, model: str) -> ModelPrice | None:
        """The model's price; a model missing from a non-empty `budget.prices` is reported once ("cost unknown")."""
        price = price_of(self.budget.prices, model)
        if price is None and (self.budget.prices or self.budget.usd_per_day > 0) and model not in self._unpriced:
            self._unpriced.add(model)
            log.warning("budget: model %r has no price in budget.prices: its cost is unknown (its tokens are still "
                        "counted%s)", model, ", and budget.usd_per_day cannot count it" if self.budget.usd_per_day
                        else "")
        return price

    # -- claims ----------------------------------------------------------------------------------------------------

    async def claim(self, purpose: str, model: str, prompt: int, max_tokens: int, *, zh: bool = False) -> Held:
        """Room for a call of `purpose` whose prompt is about `prompt` tokens and whose reply may be `max_tokens`:
        held in the ledger when a cap applies; OverBudget (nothing held, no call to be made) when there is none."""
        day = self.today()
        if not self.capped(purpose):
            return Held(day, purpose, model, prompt)
        price = self.price(model)
        estimate = prompt + max_tokens
        cost = micro_usd(price, prompt, 0, max_tokens) if price is not None else 0
        hold = uuid.uuid4().hex[:16]
        tell = self.owner is not None

        def decide(today: Day) -> _Decision:
            decision = self._decide(today, purpose, estimate, cost, tell)
            if decision.granted:
                today.held[hold] = Hold(purpose, estimate, cost)
            elif decision.tell_owner:
                today.noticed = True
            return decision

        try:
            decision = await asyncio.to_thread(self.ledger.change, day, decide)
        except (OSError, StorageError) as exc:
            log.warning("budget: the spend ledger cannot be updated (%s); the %s call is not made", exc, purpose)
            raise OverBudget(f"the spend ledger cannot be updated ({exc}); the call was not made") from None
        if decision.granted:
            return Held(day, purpose, model, prompt, hold)
        line = refusal(purpose, decision.cap, decision.limit, zh=zh, damaged=decision.damaged)
        log.info("budget: %s call not made: %s", purpose, line)
        if decision.tell_owner and self.owner is not None:
            try:
                await self.owner(cap_notice(decision.cap, decision.limit, zh=zh, damaged=decision.damaged))
            except Exception as exc:  # the notice is a courtesy: its failure must not become the call's
                log.warning("budget: the owner's notice did not arrive: %s", exc)
        raise OverBudget(line)

    def _decide(self, today: Day, purpose: str, estimate: int, cost: int, tell: bool) -> _Decision:
        budget = self.budget
        if is_chat(purpose):
            cap = budget.chat_tokens_per_day
            if today.damaged:
                return _Decision(False, "chat_tokens_per_day", f"{cap:,} tokens", damaged=True)
            if today.tokens(is_chat) + estimate > cap:
                return _Decision(False, "chat_tokens_per_day", f"{cap:,} tokens")
            return _Decision(True)
        first = tell and not today.noticed
        if today.damaged:
            return _Decision(False, "background_tokens_per_day", "", damaged=True, tell_owner=first)
        tokens = budget.background_tokens_per_day
        if tokens and today.tokens(is_background) + estimate > tokens:
            return _Decision(False, "background_tokens_per_day", f"{tokens:,} tokens", tell_owner=first)
        usd = round(budget.usd_per_day * 1_000_000)
        if usd and today.micro_usd(is_background) + cost > usd:
            return _Decision(False, "usd_per_day", _usd(usd), tell_owner=first)
        return _Decision(True)

    async def settle(self, held: Held, usage: Usage | None, produced: int) -> None:
        """Count what the call used: the provider's report, else the prompt's estimate and `produced` (the reply's
        tokens as counted here); its hold, if any, goes. A ledger that cannot be updated is logged, not raised."""
        spent = self._spent(held, usage, produced)

        def count(day: Day) -> None:
            if held.hold is not None:
                day.held.pop(held.hold, None)
            day.add(held.purpose, spent)

        await self._change(held.day, count, f"the {held.purpose} call's tokens are not counted")

    def _spent(self, held: Held, usage: Usage | None, produced: int) -> Spent:
        if usage is not None:
            spent = Spent(1, usage.prompt_tokens, min(usage.cached_tokens or 0, usage.prompt_tokens),
                          usage.completion_tokens)
        else:
            spent = Spent(1, held.prompt, 0, produced, estimated=1)
        price = self.price(held.model)
        return (replace(spent, unpriced=1) if price is None else
                replace(spent, micro_usd=micro_usd(price, spent.prompt, spent.cached, spent.completion)))

    def settle_later(self, held: Held, usage: Usage | None, produced: int) -> None:
        """`settle` for a call no cap held room for, off the caller's path: nothing waits on its count, so it
        waits (up to `settle_after` seconds) to share one ledger write with the calls of that time. `drain` writes
        it at once."""
        assert held.hold is None, "a held call is settled at once: its hold counts against a cap"
        loop = asyncio.get_running_loop()
        waiting = self._waiting.get(loop)
        if waiting is None:
            waiting = self._waiting[loop] = _Waiting()
        waiting.counts.append(_Count(held.day, held.purpose, self._spent(held, usage, produced)))
        if waiting.writer is None:
            waiting.writer = loop.create_task(self._write_waiting(waiting))

    async def _write_waiting(self, waiting: _Waiting) -> None:
        try:
            while waiting.counts:
                if not waiting.hurry.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(waiting.hurry.wait(), self.settle_after)
                counts, waiting.counts = waiting.counts, []
                for day in sorted({count.day for count in counts}):
                    of_day = [count for count in counts if count.day == day]

                    def add(today: Day, of_day: list[_Count] = of_day) -> None:
                        for count in of_day:
                            today.add(count.purpose, count.spent)

                    await self._change(day, add, f"{len(of_day)} calls' tokens are not counted")
        finally:
            waiting.writer = None

    async def drain(self) -> None:
        """Write every count `settle_later` took on this event loop and has not written yet; return when they are
        in the ledger."""
        waiting = self._waiting.get(asyncio.get_running_loop())
        if waiting is None:
            return
        waiting.hurry.set()
        try:
            while waiting.writer is not None:
                await asyncio.wait([waiting.writer])  # not cancelled with the caller; its own errors are logged
        finally:
            waiting.hurry.clear()

    async def release(self, held: Held) -> None:
        """The call failed or was cancelled: its hold goes, nothing is counted."""
        if held.hold is None:
            return
        hold = held.hold
        await self._change(held.day, lambda day: day.held.pop(hold, None), "a failed call's hold stays counted")

    async def _change(self, day: date, edit: Callable[[Day], Any], lost: str) -> None:
        try:
            await asyncio.to_thread(self.ledger.change, day, edit)
        except (OSError, StorageError) as exc:
            log.warning("budget: the spend ledger cannot be updated (%s); %s", exc, lost)

    # -- looking ---------------------------------------------------------------------------------------------------

    async def background_open(self) -> bool:
        """Whether background work may start now: no background cap is reached (a look, not a claim: each call
        still claims its room). A damaged or unreachable ledger: no."""
        if not self.capped(SUMMARY):
            return True
        try:
            days = await asyncio.to_thread(self.ledger.read)
        except (ConfigError, OSError, StorageError):
            return False
        today = days.get(self.today().isoformat())
        if today is None:
            return True
        if today.damaged:
            return False
        tokens, usd = self.budget.background_tokens_per_day, round(self.budget.usd_per_day * 1_000_000)
        return not ((tokens and today.tokens(is_background) >= tokens)
                    or (usd and today.micro_usd(is_background) >= usd))

    async def status_line(self) -> str:
        """/status's line: today's tokens, background and chat, against their caps, and the cost when known."""
        await self.drain()  # this process's latest calls count too
        try:
            days = await asyncio.to_thread(self.ledger.read)
        except ConfigError as exc:
            return f"spent today: unknown ({exc}; today counts as spent)"
        except (OSError, StorageError) as exc:
            return f"spent today: unknown (the spend ledger cannot be read: {exc})"
        return spend_line(days.get(self.today().isoformat()) or Day(), self.budget)


def spend_line(today: Day, budget: BudgetConfig) -> str:
    """One line: today's background and chat tokens (with their caps and how full they are), and the cost."""
    if today.damaged:
        return "spent today: the spend ledger was damaged today, so today's budget counts as spent"

    def part(name: str, used: int, cap: int) -> str:
        return f"{name} {used:,} of {cap:,} tokens ({used * 100 // cap}%)" if cap else f"{name} {used:,} tokens"

    background, chat = today.total(is_background), today.total(is_chat)
    line = (f"spent today: {part('background', today.tokens(is_background), budget.background_tokens_per_day)}, "
            f"{part('chat', today.tokens(is_chat), budget.chat_tokens_per_day)}")
    if budget.prices:
        cost = background.micro_usd + chat.micro_usd
        line += f", {_usd(cost)}" + (f" of {_usd(round(budget.usd_per_day * 1_000_000))} background"
                                     if budget.usd_per_day else "")
        if background.unpriced + chat.unpriced:
            line += " (some calls' cost unknown)"
    return line


# -- the wrapper ----------------------------------------------------------------------------------------------------


class MeteredProvider(WrappedProvider):
    """`inner`, with every call of `purpose` claimed from `allowance` before it is made and settled after."""

    def __init__(self, inner: ChatProvider, allowance: Allowance, purpose: str, default_max_tokens: int):
        super().__init__(inner)
        self.allowance = allowance
        self.purpose = purpose
        self.default_max_tokens = default_max_tokens  # what the provider sends when no max_tokens is given

    async def chat(self, messages: list[Message], tools: list[dict[str, Any]] | None = None,
                   *, max_tokens: int | None = None, on_text: TextSink | None = None,
                   tool_choice: ToolChoice = "auto") -> ChatReply:
        capped = self.allowance.capped(self.purpose)
        # The prompt's estimate and its language matter to a cap, or when the server reports no usage: counted
        # only then (a 200-message history is thousands of token counts).
        prompt = _prompt_tokens(messages, tools) if capped else 0
        reply_room = self.default_max_tokens if max_tokens is None else max_tokens
        zh = capped and chinese(request_text(messages, last_only=self.purpose == CHAT))
        held = await self.allowance.claim(self.purpose, self.model, prompt, reply_room, zh=zh)
        try:
            reply = await self.inner.chat(messages, tools, max_tokens=max_tokens, on_text=on_text,
                                          tool_choice=tool_choice)
        except BaseException:
            await asyncio.shield(self.allowance.release(held))
            raise
        produced = count_tokens(reply.content or "") + sum(count_tokens(c.name + c.arguments) for c in reply.tool_calls)
        if reply.usage is None and not capped:
            held = replace(held, prompt=_prompt_tokens(messages, tools))
        if held.hold is None:
            self.allowance.settle_later(held, reply.usage, produced)
        else:
            await asyncio.shield(self.allowance.settle(held, reply.usage, produced))
        return reply


def _prompt_tokens(messages: list[Message], tools: list[dict[str, Any]] | None) -> int:
    return sum(message_tokens(m) for m in messages) + (json_tokens(tools) if tools else 0)
