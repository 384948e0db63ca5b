"""Inline buttons: Approve / Deny before an ask-first tool call, and ask_user's options.

- Approvals: `TelegramApprover` (one per turn) sends the call (tool, short arguments) with Approve / Deny to the
  chat, into the turn's topic, and waits for the press of the user who started the turn, at most the timeout
  (`timer`, asyncio.sleep unless a test freezes it); then it edits the message to say what came of it, buttons
  gone. Only that user's press counts: another's, a stale one (decided, timed out) or forged `callback_data` is
  answered with a short line (answerCallbackQuery) and changes nothing. Waiting blocks only that turn.
- Where the question waits (`Asks`): in this process when polling (`LocalAsks`); in the inbox when webhook workers
  answer (`StoredAsks`): the press is an update like any other, and whichever worker takes it records the answer
  there, where the worker whose turn waits reads it (woken at once when it took the press itself, else it looks
  every ASK_POLL seconds). So a press never waits behind the turn it answers, its update is ordered apart from the
  chat's messages (`press_order`, used by the webhook's door).
- Choices: `TelegramChooser` shows ask_user's question with one button per option. A press by the user asked
  becomes that user's next message in the same session and topic (ordered with the chat's messages); the
  option's text is read from the pressed message's own keyboard, so forged data cannot put words in their mouth.
"""

from __future__ import annotations

import asyncio
import html
import logging
import secrets
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Protocol

from aiogram import Bot, Router
from aiogram.exceptions import ClientDecodeError, TelegramAPIError
from aiogram.filters.callback_data import CallbackData
from aiogram.types import CallbackQuery, InlineKeyboardButton, InlineKeyboardMarkup, Message
from aiogram.utils.keyboard import InlineKeyboardBuilder

from picoclaw.agent import ApprovalRequest, Verdict
from picoclaw.channels.telegram.access import AllowedUser
from picoclaw.channels.telegram.waits import first_of
from picoclaw.storage import ASK_NOT_YOURS, ASK_STALE, ASK_TAKEN, Inbox

log = logging.getLogger(__name__)

Timer = Callable[[float], Awaitable[None]]  # waits the given seconds (asyncio.sleep)

APPROVAL_PREFIX = "ok"
CHOICE_PREFIX = "pick"
YES, NO = "yes", "no"
ASK_POLL = 1.0  # seconds between looks at the inbox for a press another worker took
LONG_OPTION = 16  # options longer than this get a row each; shorter ones share rows of two

# What a press is told (answerCallbackQuery: a short line over the chat).
APPROVED = "Approved"
DENIED = "Denied"
NOT_YOURS = "Only the person who asked can answer this."
STALE = "This question is no longer open."
NOT_VALID = "This button is not valid."


class ApprovalPress(CallbackData, prefix=APPROVAL_PREFIX):
    """Approve (`yes`) or Deny on the question `token` (random, so no one can guess an open one)."""

    token: str
    yes: bool


class ChoicePress(CallbackData, prefix=CHOICE_PREFIX):
    """ask_user's option `option` (its index), for `user` only."""

    user: int
    option: int


def press_order(chat: str, data: object) -> str:
    """What orders a callback query's update in the inbox: an approval's press apart from its chat's messages (a
    turn of the chat waits for it), any other (a choice: the user's next message) with them."""
    return f"press:{chat}" if isinstance(data, str) and data.startswith(f"{APPROVAL_PREFIX}:") else chat


# -- where a question waits -----------------------------------------------------------------------------


class Asks(Protocol):
    """The open questions (approvals) of the bot."""

    async def open(self, token: str, user_id: int) -> None:
        """`token` now waits for `user_id`'s answer."""
        ...

    async def answer(self, token: str, user_id: int, answer: str) -> str:
        """ASK_TAKEN, ASK_NOT_YOURS or ASK_STALE (storage/inbox.py)."""
        ...

    async def wait(self, token: str, timeout: float, timer: Timer) -> str | None:
        """The answer, or None when `timer(timeout)` ran out first (the question is closed then)."""
        ...


class LocalAsks:
    """Questions kept in this process (long polling: every press comes here)."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[int, asyncio.Future[str]]] = {}

    async def open(self, token: str, user_id: int) -> None:
        self._open[token] = (user_id, asyncio.get_running_loop().create_future())

    async def answer(self, token: str, user_id: int, answer: str) -> str:
        entry = self._open.get(token)
        if entry is None or entry[1].done():
            return ASK_STALE
        if entry[0] != user_id:
            return ASK_NOT_YOURS
        entry[1].set_result(answer)
        return ASK_TAKEN

    async def wait(self, token: str, timeout: float, timer: Timer) -> str | None:
        answered = self._open[token][1]
        try:
            await first_of(asyncio.shield(answered), timer(timeout))
            return answered.result() if answered.done() else None
        finally:
            self._open.pop(token, None)  # a press from now on is stale


class StoredAsks:
    """Questions kept in the inbox (webhook workers: any of them may take the press)."""

    def __init__(self, inbox: Inbox, poll: float = ASK_POLL):
        self.inbox = inbox
        self.poll = poll
        self._waiting: dict[str, asyncio.Event] = {}  # questions this worker's turns wait on: set when it took one

    async def open(self, token: str, user_id: int) -> None:
        await asyncio.to_thread(self.inbox.open_ask, token, user_id)
        self._waiting[token] = asyncio.Event()

    async def answer(self, token: str, user_id: int, answer: str) -> str:
        outcome = await asyncio.to_thread(self.inbox.answer_ask, token, user_id, answer)
        if outcome == ASK_TAKEN and token in self._waiting:
            self._waiting[token].set()
        return outcome

    async def wait(self, token: str, timeout: float, timer: Timer) -> str | None:
        woken = self._waiting[token]
        ran_out = asyncio.ensure_future(timer(timeout))
        try:
            while not ran_out.done():
                answer = await asyncio.to_thread(self.inbox.ask_answer, token)
                if answer:
                    return answer
                woken.clear()
                await first_of(woken.wait(), asyncio.sleep(self.poll), asyncio.shield(ran_out))
            return await asyncio.to_thread(self.inbox.close_ask, token)  # an answer may have come just before
        finally:
            ran_out.cancel()
            self._waiting.pop(token, None)


# -- approvals ---------------------------------------------------------------------------------------------


def approval_text(request: ApprovalRequest) -> str:
    """The question, as HTML: the tool, its arguments, and how long it waits."""
    return (f"🔐 Run <b>{html.escape(request.tool)}</b>?\n<code>{html.escape(request.arguments)}</code>\n"
            f"<i>Nothing runs until you press Approve (no answer within {request.timeout:g} s: not run).</i>")


def outcome_text(request: ApprovalRequest, verdict: Verdict) -> str:
    """The question once decided, as HTML: what came of it, the buttons gone."""
    call = f"<b>{html.escape(request.tool)}</b> <code>{html.escape(request.arguments)}</code>"
    if verdict is Verdict.APPROVED:
        return f"✅ Approved: {call}"
    if verdict is Verdict.DENIED:
        return f"✖ Denied, not run: {call}"
    return f"⌛ No answer within {request.timeout:g} s, not run: {call}"


class TelegramApprover:
    """The Approve / Deny question of one turn, to the user who started it, in the turn's chat and topic."""

    def __init__(self, bot: Bot, chat_id: int, topic: int | None, user_id: int, asks: Asks, timer: Timer,
                 may_send: Callable[[], Awaitable[bool]],
                 waiting: Callable[[], AbstractAsyncContextManager[object]] = nullcontext):
        self.bot = bot
        self.chat_id = chat_id
        self.topic = topic
        self.user_id = user_id
        self.asks = asks
        self.timer = timer
        self.may_send = may_send  # webhook mode: whether this worker still holds the update (else it shows nothing)
        self.waiting = waiting  # held while the press is waited for (webhook mode: the turn takes no place then)

    async def approve(self, request: ApprovalRequest) -> Verdict:
        token = secrets.token_hex(8)
        await self.asks.open(token, self.user_id)
        keyboard = InlineKeyboardMarkup(inline_keyboard=[[
            InlineKeyboardButton(text="✅ Approve", callback_data=ApprovalPress(token=token, yes=True).pack()),
            InlineKeyboardButton(text="✖ Deny", callback_data=ApprovalPress(token=token, yes=False).pack())]])
        try:
            if not await self.may_send():
                raise ShownElsewhere
            sent = await self.bot.send_message(self.chat_id, approval_text(request), parse_mode="HTML",
                                               message_thread_id=self.topic, reply_markup=keyboard)
        except (TelegramAPIError, ClientDecodeError, ShownElsewhere) as exc:
            log.warning("telegram: chat %s: the approval of %s could not be shown (%s); not run", self.chat_id,
                        request.tool, type(exc).__name__)
            await self.asks.wait(token, 0, _no_wait)  # closed: a press from now on is stale
            return Verdict.NOT_SHOWN
        async with self.waiting():
            answer = await self.asks.wait(token, request.timeout, self.timer)
        verdict = {YES: Verdict.APPROVED, NO: Verdict.DENIED}.get(answer or "", Verdict.TIMED_OUT)
        log.info("telegram: chat %s user %s: %s call %s", self.chat_id, self.user_id, request.tool, verdict)
        try:  # the buttons go, the outcome stays in view
            await self.bot.edit_message_text(outcome_text(request, verdict), chat_id=self.chat_id,
                                             message_id=sent.message_id, parse_mode="HTML")
        except (TelegramAPIError, ClientDecodeError) as exc:
            log.warning("telegram: chat %s: the approval's outcome could not be shown: %s", self.chat_id, exc)
        return verdict


class ShownElsewhere(Exception):
    """This worker lost the update its turn answers: another worker shows the question."""


async def _no_wait(_seconds: float) -> None:
    return None


# -- choices -----------------------------------------------------------------------------------------------


class TelegramChooser:
    """ask_user's question with a button per option, for the user who started the turn."""

    def __init__(self, bot: Bot, chat_id: int, topic: int | None, user_id: int):
        self.bot = bot
        self.chat_id = chat_id
        self.topic = topic
        self.user_id = user_id

    async def offer(self, question: str, options: list[str]) -> bool:
        builder = InlineKeyboardBuilder()
        for index, option in enumerate(options):
            builder.button(text=option, callback_data=ChoicePress(user=self.user_id, option=index))
        builder.adjust(1 if any(len(option) > LONG_OPTION for option in options) else 2)
        try:
            await self.bot.send_message(self.chat_id, question, message_thread_id=self.topic, parse_mode=None,
                                        reply_markup=builder.as_markup())
        except (TelegramAPIError, ClientDecodeError) as exc:
            log.warning("telegram: chat %s: ask_user's options could not be shown: %s", self.chat_id, exc)
            return False
        return True


def pressed_option(query: CallbackQuery) -> str | None:
    """The text of the button pressed, read from the message's own keyboard; None when no button there carries the
    press's data (forged, or the message is gone)."""
    message = query.message
    if not isinstance(message, Message) or message.reply_markup is None:
        return None
    for row in message.reply_markup.inline_keyboard:
        for button in row:
            if button.callback_data == query.data:
                return button.text
    return None


# -- the presses -------------------------------------------------------------------------------------------


class Buttons:
    """The callback-query router: approval presses answer their question, choice presses become messages
    (`on_choice`, the channel's way in for a message), anything else is answered as not valid."""

    def __init__(self, bot: Bot, allowed: AllowedUser, on_choice: Callable[[Message], Awaitable[None]]):
        self.bot = bot
        self.allowed = allowed
        self.on_choice = on_choice
        self.asks: Asks = LocalAsks()  # the inbox's (`StoredAsks`) once webhook workers answer

    def router(self) -> Router:
        router = Router(name="buttons")
        router.callback_query.register(self.on_approval, ApprovalPress.filter())
        router.callback_query.register(self.on_choice_press, ChoicePress.filter())
        router.callback_query.register(self.on_other)
        return router

    async def on_approval(self, query: CallbackQuery, callback_data: ApprovalPress) -> None:
        """Approve or Deny: counts once, and only for the user asked."""
        outcome = await self.asks.answer(callback_data.token, query.from_user.id, YES if callback_data.yes else NO)
        if outcome != ASK_TAKEN:
            log.info("telegram: user %s pressed an approval's button: %s; ignored", query.from_user.id, outcome)
        said = {ASK_TAKEN: APPROVED if callback_data.yes else DENIED, ASK_NOT_YOURS: NOT_YOURS}.get(outcome, STALE)
        await _tell(query, said)

    async def on_choice_press(self, query: CallbackQuery, callback_data: ChoicePress) -> None:
        """An option of ask_user: the asked user's next message, once; the buttons go."""
        user = query.from_user
        option = pressed_option(query)
        if option is None:
            await _tell(query, NOT_VALID)
            return
        if user.id != callback_data.user or not self.allowed.allows(user):
            await _tell(query, NOT_YOURS)
            return
        message = query.message
        assert isinstance(message, Message)  # pressed_option found its keyboard
        try:  # one pick: the buttons go first, so a second press finds nothing to take
            await self.bot.edit_message_text(f"{message.text or ''}\n→ {option}", chat_id=message.chat.id,
                                             message_id=message.message_id, parse_mode=None)
        except TelegramAPIError as exc:  # "message is not modified": it was picked already
            log.info("telegram: chat %s: a choice pressed again (%s); ignored", message.chat.id, exc.message)
            await _tell(query, STALE)
            return
        await _tell(query, None)
        log.info("telegram: chat %s user %s: picked option %d", message.chat.id, user.id, callback_data.option)
        await self.on_choice(message.model_copy(update={"text": option, "from_user": user, "reply_markup": None,
                                                        "reply_to_message": None, "entities": None}))

    async def on_other(self, query: CallbackQuery) -> None:
        """Data that is none of ours (forged, or from an older version): answered, nothing else."""
        log.info("telegram: user %s pressed a button with data that is not ours; ignored", query.from_user.id)
        await _tell(query, NOT_VALID)


async def _tell(query: CallbackQuery, text: str | None) -> None:
    """answerCallbackQuery (the client's spinner stops); a failure is only logged."""
    try:
        await query.answer(text)
    except (TelegramAPIError, ClientDecodeError) as exc:
        log.info("telegram: a button press could not be answered: %s", exc)
