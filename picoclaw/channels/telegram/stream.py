"""`ReplyStream`: the answer shown while the model writes it, a preview only.

Fed by the turn's `on_text` and `on_tool` hooks (which only record and never wait, so the turn never waits for
Telegram), a task of its own shows the text so far, as plain text, at most once every `interval` seconds and
not before `interval` has passed since the first piece (an answer that comes within it is simply sent whole):
- in a private chat as a draft (`sendMessageDraft`, Bot API 9.x), which the final message replaces;
- elsewhere, or once a draft was refused (a group, an older server), by sending one message and editing it;
  `close` deletes that message once the final answer went out.
A tool call under way shows as a status line ("· running memory_search…") after the text, until text resumes.

A preview over 4,096 characters shows its last ones. A 429 is not waited out by the call (the request middleware
lets these through, `waits_out_429`): the stream sends nothing until `retry_after` is over, then the text so far,
so nothing is lost and the turn never waits. Any other failure ends the preview for the turn (logged once at
info). The final answer never depends on it: the channel sends it whole as always, after `stop`. Given
`may_show` (a webhook worker: whether it still holds the update), each preview asks it first, and a worker that
lost the update shows nothing more, as it sends no answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiogram import Bot
from aiogram.exceptions import ClientDecodeError, TelegramAPIError, TelegramRetryAfter

from picoclaw.channels.telegram.bot import waits_out_429

log = logging.getLogger(__name__)

PREVIEW_CHARS = 4096  # a Telegram message's limit
ELLIPSIS = "…"
STOP_WAIT = 5.0  # seconds a preview call under way may take to finish before the final answer goes out
MAX_RETRY_AFTER = 60.0  # seconds: a longer flood wait only pauses the preview this long at a time


def preview_of(text: str, status: str = "") -> str:
    """What a preview shows: the text so far (its end, if too long) and the status line of a tool under way."""
    shown = text.strip()
    if status:
        shown = f"{shown}\n\n{status}" if shown else status
    if len(shown) > PREVIEW_CHARS:
        shown = ELLIPSIS + shown[-(PREVIEW_CHARS - len(ELLIPSIS)):]
    return shown


def tool_status(name: str) -> str:
    return f"· running {name}…"


class ReplyStream:
    """The preview of one turn's answer in one chat (see the module's docstring)."""

    def __init__(self, bot: Bot, chat_id: int, *, topic: int | None, draft_id: int | None, interval: float,
                 on_no_drafts: Callable[[], None] | None = None,
                 may_show: Callable[[], Awaitable[bool]] | None = None):
        self.bot = bot
        self.chat_id = chat_id
        self.topic = topic
        self.draft_id = draft_id  # None: edit a message instead (a group, or drafts refused in this chat)
        self.interval = interval
        self.on_no_drafts = on_no_drafts
        self.may_show = may_show
        self.message_id: int | None = None  # the message edited as the preview, once sent
        self._pieces: list[str] = []
        self._status = ""
        self._shown = ""
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._next = 0.0  # loop time before which nothing is sent
        self._sending = False
        self._stopped = False

    # -- the turn's hooks: record, never wait -----------------------------------------------------------

    async def on_text(self, piece: str) -> None:
        self._pieces.append(piece)
        self._status = ""
        self._poke()

    async def on_tool(self, name: str, arguments: str) -> None:
        self._status = tool_status(name)
        self._poke()

    def _poke(self) -> None:
        if self._stopped:
            return
        if self._task is None:
            self._next = asyncio.get_running_loop().time() + self.interval
            self._task = asyncio.create_task(self._run())
        self._changed.set()

    # -- the end of the turn ------------------------------------------------------------------------------

    async def stop(self) -> None:
        """No more previews: the one under way (if any) may finish, within STOP_WAIT; then the final answer may
        go out without a preview coming after it."""
        self._stopped = True
        task = self._task
        if task is None or task.done():
            return
        if self._sending:
            self._changed.set()
            await asyncio.wait({task}, timeout=STOP_WAIT)
        if not task.done():
            task.cancel()
            await asyncio.wait({task})

    async def close(self) -> None:
        """`stop`, then delete the message used as the preview, if one was sent (the final answer is sent whole
        on its own); a failure is logged."""
        await self.stop()
        if self.message_id is None:
            return
        message_id, self.message_id = self.message_id, None
        try:
            await self.bot.delete_message(self.chat_id, message_id)
        except (TelegramAPIError, ClientDecodeError) as exc:
            log.info("telegram: chat %s: could not delete the preview message %s: %s", self.chat_id, message_id, exc)

    # -- the previews ---------------------------------------------------------------------------------------

    async def _run(self) -> None:
        waits_out_429.set(False)  # this task's calls only: a 429 pauses the preview instead
        loop = asyncio.get_running_loop()
        try:
            while not self._stopped:
                await self._changed.wait()
                if self._stopped:
                    return
                wait = self._next - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                    if self._stopped:
                        return
                self._changed.clear()
                preview = preview_of("".join(self._pieces), self._status)
                if not preview or preview == self._shown:
                    continue
                if self.may_show is not None and not await self.may_show():
                    log.info("telegram: chat %s: another worker took the update over; no more previews", self.chat_id)
                    return
                self._sending = True
                try:
                    await self._show(preview)
                except TelegramRetryAfter as exc:
                    wait = min(float(exc.retry_after), MAX_RETRY_AFTER)
                    log.info("telegram: chat %s: preview rate limited (429); next in %s s", self.chat_id, wait)
                    self._next = loop.time() + wait
                    self._changed.set()  # the text so far goes out after the wait
                    continue
                except (TelegramAPIError, ClientDecodeError) as exc:
                    if self.draft_id is None:
                        log.info("telegram: chat %s: preview by editing failed (%s); the answer comes whole",
                                 self.chat_id, exc)
                        return
                    log.info("telegram: chat %s: drafts refused (%s); previews edit a message instead",
                             self.chat_id, exc)
                    self.draft_id = None
                    if self.on_no_drafts is not None:
                        self.on_no_drafts()
                    self._changed.set()
                    continue
                finally:
                    self._sending = False
                self._shown = preview
                self._next = loop.time() + self.interval
        except asyncio.CancelledError:
            raise
        except Exception:  # a preview must never end the turn: logged, and the answer comes whole
            log.exception("telegram: chat %s: the preview failed", self.chat_id)

    async def _show(self, preview: str) -> None:
        if self.draft_id is not None:
            await self.bot.send_message_draft(self.chat_id, self.draft_id, text=preview,
                                              message_thread_id=self.topic, parse_mode=None)
        elif self.message_id is None:
            sent = await self.bot.send_message(self.chat_id, preview, message_thread_id=self.topic, parse_mode=None,
                                               disable_notification=True)
            self.message_id = sent.message_id
        else:
            await self.bot.edit_message_text(text=preview, chat_id=self.chat_id, message_id=self.message_id,
                                             parse_mode=None)
