"""`TelegramChannel`: the assistant as a Telegram bot (aiogram 3, long polling), its whole life cycle.

Each chat is a session (`telegram:<chat_id>`), and so is each topic of a forum supergroup
(`telegram:<chat_id>:t<topic_id>`, answered in that topic; the General topic is the chat's own session); one
session's messages are answered in order, different sessions at once. Only users in
`channels.telegram.allow_from` are served; a stranger is told their id once and nothing they wrote is kept.
With memory_scope "per_user" each user has a memory folder of their own.
A reply Telegram refuses to deliver (403: the user blocked the bot) is marked in the session as not delivered.

The routers, in the order aiogram tries them:
- "picoclaw", for messages addressed to the bot (`AddressedToBot`) by an allowed user (`AllowedUser`):
  - "commands": slash commands (`SlashCommand`), which the agent answers without the model;
  - "chat": any other message, a turn of the chat's session (`run_turn`, with "typing…" shown meanwhile, and the
    answer previewed as it is written unless `stream` is off: stream.py), its answer then sent whole;
- "strangers": messages addressed to the bot by anyone else, answered with their id (`not_authorised`).
Besides messages, the bot asks for `message_reaction` updates: an allowed user's 👍 ❤ 🔥 or 👎 on
one of its replies is recorded as feedback on that turn (memory/feedback.py); anyone else's is ignored.

A memory write made without a command from the user's own words (the memory flush, memory_append) is receipted
with a ✍ reaction on the user's message of that turn, even when the write comes from the turn's background work;
the assistant's own words and lessons, or a chat where reactions cannot be set, get the short line instead.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from contextvars import ContextVar
from dataclasses import replace

from aiogram import Bot, Dispatcher, Router
from aiogram.enums import ChatType
from aiogram.exceptions import (
    ClientDecodeError,
    TelegramAPIError,
    TelegramBadRequest,
    TelegramNotFound,
    TelegramUnauthorizedError,
)
from aiogram.types import Message, MessageReactionUpdated, ReactionTypeEmoji, Update, User
from aiogram.utils.chat_action import ChatActionSender

from picoclaw.agent import AgentLoop, ModelSlot
from picoclaw.channels.documents import KILOBYTE, document_turn, read_document, save_document
from picoclaw.channels.message_turn import Inbound, TurnHooks, run_turn
from picoclaw.channels.telegram.access import (
    AddressedToBot,
    AllowedUser,
    Refusal,
    not_authorised,
    screen,
    topic_of,
    without_mention,
)
from picoclaw.channels.telegram.bot import (
    ERROR_EXCERPT,
    ConflictWatch,
    Sleep,
    TokenRedactor,
    conflict_message,
    guarded_loggers,
    install_middlewares,
    page_excerpt,
    token_secrets,
)
from picoclaw.channels.telegram.buttons import Buttons, StoredAsks, TelegramApprover, TelegramChooser, Timer
from picoclaw.channels.telegram.command_menu import COMMANDS, SlashCommand
from picoclaw.channels.telegram.format import EMPTY_REPLY, MessagePart, telegram_parts
from picoclaw.channels.telegram.media import (
    Audio,
    Document,
    audio_of,
    document_bytes,
    document_of,
    echo_html,
    picture_bytes,
    picture_of,
    transcript_of,
)
from picoclaw.channels.telegram.stream import ReplyStream
from picoclaw.channels.telegram.webhook import ClaimLost, Webhook, from_inbox, inbox_turn
from picoclaw.channels.voice_notes import (
    IMAGE_NOT_KEPT,
    NO_VISION,
    NOT_LISTENING,
    MediaRefused,
    Transcriber,
    image_turn,
    spoken,
)
from picoclaw.config import TelegramConfig
from picoclaw.errors import PicoclawError
from picoclaw.jobs import Scheduler
from picoclaw.memory import LONG_TERM, FeedbackLedger, MemoryWrite, Reaction, verdict_of
from picoclaw.per_key import KeyedLocks, LruCache
from picoclaw.redact import excerpt
from picoclaw.session_key import TELEGRAM, SessionKey
from picoclaw.storage import LockWaitExpired, ReplyLog, SentReply, StorageError, StorageUnavailable

log = logging.getLogger(__name__)

# The agent of the shared memory (None) or of one user's memory (a user key): App.agent.
AgentFor = Callable[[str | None], AgentLoop]

APOLOGY = "Sorry, something went wrong on my side while answering. Please try again in a moment."
# A storage lock not free within storage.lock_wait_seconds: the server answers, but a holder is stuck.
MEMORY_BUSY = ("Sorry, my memory is held by another task for too long, so I could not answer this. "
               "Please try again in a moment.")
NOT_TEXT = "I can only read text messages, voice notes, photos and documents (text files and PDFs)."
# Strangers already told their id: enough to cover any real crowd of unknown users, and small (ints).
TOLD_SIZE = 10_000
TYPING_INTERVAL = 4.0  # Telegram shows "typing…" for about 5 s
# "typing…" starts once a turn has run this long: the Bot API asks for a chat action only when a reply takes
# noticeably long, and each one is a call against the bot's rate limit. A command, or a quick model, needs none.
TYPING_DELAY = 0.5
RECEIPT = "✍"  # the reaction on a user's message whose words were remembered (in Telegram's reaction list)
# Chats where a reaction could not be set (reactions turned off, an older server): receipts there are lines.
NO_REACTIONS_KEPT = 10_000
# Chats where a draft was refused (an older server): previews there edit a message instead.
NO_DRAFTS_KEPT = 10_000

# The user's message a turn answers, (chat id, message id): set for the turn, so its background work (a memory
# flush after the answer) still knows which message its receipt belongs to.
_turn_message: ContextVar[tuple[int, int] | None] = ContextVar("telegram_turn_message", default=None)


async def _claim_kept() -> bool:
    """Before a reply goes out: whether this worker still holds the update it answers (always, when polling)."""
    turn = inbox_turn.get()
    return turn is None or await turn.still_ours()


def _turn_storage(error: StorageUnavailable | None) -> None:
    """Tell the inbox worker whether this turn got its storage (what its /healthz says); nothing when polling."""
    turn = inbox_turn.get()
    if turn is not None:
        turn.storage(error)


def _model_slot() -> ModelSlot | None:
    """What each model call of the update being answered waits for: one of its worker's slots (webhook mode; None
    when polling)."""
    turn = inbox_turn.get()
    return None if turn is None else turn.model_slot


def _waiting_for_user() -> Callable[[], AbstractAsyncContextManager[object]]:
    """What a turn holds while it waits for its user's press: its worker's place given up meanwhile, for the press
    to be claimed (webhook mode; nothing when polling)."""
    turn = inbox_turn.get()
    return nullcontext if turn is None else turn.waiting_for_user


async def _record_reply_sent() -> None:
    """Tell the inbox the update being answered has had its reply (webhook mode; nothing when polling)."""
    turn = inbox_turn.get()
    if turn is not None:
        await turn.replied()


def chat_of(session_key: str) -> int | None:
    """The chat id of a Telegram session key (a per-user or a topic key's chat too); None for any other key."""
    try:
        return SessionKey.parse(session_key).chat_id
    except ValueError:
        return None


def topic_in(session_key: str) -> int | None:
    """The forum topic (message_thread_id) a Telegram session key names; None for a chat's own, or any other key."""
    try:
        return SessionKey.parse(session_key).topic_id
    except ValueError:
        return None


class TelegramChannel:
    """Serves the assistant to Telegram; `run()` polls until SIGINT/SIGTERM or `stop()`."""

    name = TELEGRAM

    def __init__(self, settings: TelegramConfig, bot: Bot, agent_for: AgentFor, *,
                 replies: Callable[[int], ReplyLog], transcriber: Transcriber | None = None,
                 typing_interval: float = TYPING_INTERVAL, typing_delay: float = TYPING_DELAY,
                 shutdown_timeout: float = 30.0,
                 sleep: Sleep = asyncio.sleep, approval_timer: Timer = asyncio.sleep, told_size: int = TOLD_SIZE):
        self.settings = settings
        self.bot = bot
        self.agent_for = agent_for
        self.transcriber = transcriber  # None: voice notes and audio are answered with how to turn it on
        self.allowed = AllowedUser(settings.allow_from)
        self.typing_interval = typing_interval
        self.typing_delay = typing_delay
        self.shutdown_timeout = shutdown_timeout
        # Every call this bot makes, polling included, waits out a 429 instead of failing.
        install_middlewares(bot, sleep)
        self.me: User | None = None
        # Approve / Deny and ask_user's options (buttons.py); `approval_timer` waits out an approval's timeout.
        self.approval_timer = approval_timer
        self.buttons = Buttons(bot, self.allowed, lambda message: self._in_chat_order(message, kept=True))
        self.dispatcher = self._dispatcher()
        # A memory write's receipt is a ✍ reaction on the user's message, or a short line. The answer
        # is previewed while written when `stream` is on (`_stream_for` adds on_text and on_tool per turn).
        self._hooks = TurnHooks(on_notice=self._notify, on_memory=self._remembered)
        # The agents this channel used, to wait for their background work at the end. Weak: the app keeps
        # a bounded number of them and drops idle ones, which need no waiting.
        self._agents_used: weakref.WeakSet[AgentLoop] = weakref.WeakSet()
        # One lock per session key while a turn holds or awaits it: an idle chat costs nothing.
        self._chat_locks: KeyedLocks[str] = KeyedLocks()
        self._told: LruCache[int, bool] = LruCache(told_size)  # strangers told their id (in memory only)
        self._in_flight: set[asyncio.Task[object]] = set()
        self._webhook: Webhook | None = None
        # The replies sent, by message, for reactions (storage/telegram_replies.py): opened for the bot's id.
        self._open_replies = replies
        self._replies: ReplyLog | None = None
        self._no_reactions: LruCache[int, bool] = LruCache(NO_REACTIONS_KEPT)
        self._no_drafts: LruCache[int, bool] = LruCache(NO_DRAFTS_KEPT)

    def _dispatcher(self) -> Dispatcher:
        """The routers of the module's docstring, in that order."""
        addressed = self.addressed = AddressedToBot(self.settings.group_trigger, lambda: self.me)
        served = Router(name="picoclaw")
        served.message.filter(addressed, self.allowed)
        commands = Router(name="commands")
        commands.message.register(self.on_command, SlashCommand(lambda: self.me))
        chat = Router(name="chat")
        chat.message.register(self.on_message)
        served.include_routers(commands, chat)
        strangers = Router(name="strangers")
        strangers.message.register(self.on_stranger, addressed)
        dispatcher = Dispatcher()
        dispatcher.include_routers(served, strangers, self.buttons.router())
        # Registered, so polling's getUpdates and the webhook's setWebhook ask for it (resolve_used_update_types):
        # Telegram sends no message_reaction unless asked.
        dispatcher.message_reaction.register(self.on_reaction)
        return dispatcher

    # -- life cycle ---------------------------------------------------------------------------------

    async def start(self, webhook: Webhook | None = None) -> User:
        """Check the token, open and set the `webhook` (or, to poll, drop any), register the command menu."""
        try:
            self.me = await self.bot.get_me()  # first: whether a group message mentions the bot needs its name
            await self._open_reply_log(self.me.id)
            if webhook is not None:
                # Listening before setWebhook: Telegram may post at once. OSError (the port) goes up as it is.
                await webhook.open(self.bot, self.dispatcher, self)
                assert webhook.inbox is not None
                self.buttons.asks = StoredAsks(webhook.inbox)  # a press may reach any worker: answered in the inbox
                await webhook.register(self.bot, self.dispatcher)
            else:
                await self.bot.delete_webhook(drop_pending_updates=False)  # long polling gets nothing while set
        except TelegramUnauthorizedError:
            raise PicoclawError("Telegram rejected the bot token (401 Unauthorized): it is wrong or was revoked; "
                                "check channels.telegram.token or TELEGRAM_BOT_TOKEN") from None
        except TelegramAPIError as exc:  # network errors included; they may quote the URL, token and all
            raise PicoclawError(f"cannot start the Telegram bot: {self._where()} answered "
                                f"{self._method_name(exc)} with: {self._excerpt(exc.message)}") from None
        except ClientDecodeError as exc:  # e.g. a reverse proxy's 502 page: aiogram's text is the whole page
            raise PicoclawError(f"cannot start the Telegram bot: {self._where()} gave a reply that is not a Bot "
                                f"API answer (a proxy's error page?): "
                                f"{page_excerpt(exc.data, self._secrets)}") from None
        try:
            await self.bot.set_my_commands(COMMANDS)
        except TelegramAPIError as exc:  # only the menu is missing; the commands still work when typed
            log.warning("telegram: could not register the command menu: %s", exc)
        log.info("telegram: serving as @%s (id %s), memory scope %s", self.me.username, self.me.id,
                 self.settings.memory_scope)
        return self.me

    async def _open_reply_log(self, bot_id: int) -> None:
        """The log of replies sent, where a reaction finds its turn; without it (logged) reactions are not counted."""
        if self._replies is not None:
            return
        try:
            self._replies = await asyncio.to_thread(self._open_replies, bot_id)
        except StorageError as exc:
            log.warning("telegram: %s; reactions on replies are not counted as feedback", exc)

    def _where(self) -> str:
        """The server start-up errors name, so a self-hosted Bot API's failure is not blamed on Telegram."""
        return self.settings.api_base or "api.telegram.org"

    @staticmethod
    def _method_name(exc: TelegramAPIError) -> str:
        """The Bot API method that failed (getMe or deleteWebhook): start-up makes more than one call."""
        return exc.method.__api_method__

    @property
    def _secrets(self) -> tuple[str, ...]:
        return token_secrets(self.bot.token)

    def _excerpt(self, text: str) -> str:
        """A server's error text on one line, capped, without the token."""
        return excerpt(text, ERROR_EXCERPT, self._secrets)

    async def run(self, *, scheduler: Scheduler | None = None, handle_signals: bool = True,
                  polling_timeout: int = 10, webhook: Webhook | None = None) -> None:
        """Poll (or, given a `webhook`, serve it) until stopped, then let in-flight turns finish (bounded) and
        close everything.

        A `scheduler` (reminders, recurring jobs, the heartbeat) runs beside polling once the bot has
        started, delivering through `deliver`; it stops with the bot, after the job under way. A 409
        Conflict (another poller of the token) stops polling too; `run` then raises PicoclawError saying so.
        """
        redactor = TokenRedactor(self.bot.token)
        guarded = guarded_loggers(log)
        for logger in guarded:
            logger.addFilter(redactor)
        watch = ConflictWatch(self.stop)
        self.bot.session.middleware(watch)  # for this run only: a bot may be run again
        try:
            self._webhook = webhook
            await self.start(webhook)
            # Everything loaded so far (modules, config, the model client) lives as long as the process:
            # frozen, it is left out of the garbage collector's full passes, which otherwise stop every
            # chat for ~250 ms each time (bench/telegram.py's open loop).
            gc.freeze()
            jobs = asyncio.create_task(scheduler.run()) if scheduler is not None else None
            try:
                if webhook is not None:
                    await webhook.serve(handle_signals=handle_signals, shutdown_timeout=self.shutdown_timeout)
                else:
                    await self.dispatcher.start_polling(self.bot, handle_signals=handle_signals,
                                                        close_bot_session=False, polling_timeout=polling_timeout)
            finally:
                gc.unfreeze()  # back to normal collection: the process may go on to do other things
                if scheduler is not None and jobs is not None:
                    await scheduler.stop(self.shutdown_timeout)
                    await asyncio.gather(jobs, return_exceptions=True)
                await self.finish()
            if watch.conflict is not None:
                raise PicoclawError(conflict_message(self._where(), watch.conflict, self.bot.token))
        finally:
            if webhook is not None:
                await webhook.close(self.shutdown_timeout)  # if start-up failed: nothing was answered yet
            self.bot.session.middleware.unregister(watch)
            for logger in guarded:
                logger.removeFilter(redactor)

    async def stop(self) -> None:
        """Stop polling or taking webhook updates (what SIGINT/SIGTERM do); `run()` then finishes the turns
        under way."""
        if self._webhook is not None:
            self._webhook.stop()
        else:
            await self.dispatcher.stop_polling()

    async def finish(self) -> None:
        """Wait for turns under way (at most `shutdown_timeout`) and background work, then close the bot."""
        await asyncio.sleep(0)  # updates handed out just before the stop reach their handler and count
        deadline = asyncio.get_running_loop().time() + self.shutdown_timeout
        if self._in_flight:
            log.info("telegram: waiting for %d turn(s) to finish", len(self._in_flight))
        # Loop, not one wait: an update handed out just before the stop may join the set after it began.
        while self._in_flight and (left := deadline - asyncio.get_running_loop().time()) > 0:
            await asyncio.wait(set(self._in_flight), timeout=left)
        if self._in_flight:
            log.warning("telegram: %d turn(s) still running after %.0f s; stopping anyway",
                        len(self._in_flight), self.shutdown_timeout)
        for agent in list(self._agents_used):
            await agent.wait_background()
        if self._replies is not None:
            self._replies.close()
            self._replies = None
        await self.bot.session.close()

    # -- messages -------------------------------------------------------------------------------------

    async def on_command(self, message: Message) -> None:
        """A slash command of an allowed user, answered in chat order; the session keeps no command reply."""
        await self._in_chat_order(message, kept=False)

    async def on_message(self, message: Message) -> None:
        """Any other message of an allowed user: a turn of the chat's session, answered in chat order."""
        await self._in_chat_order(message, kept=True)

    async def on_stranger(self, message: Message) -> None:
        """A message for the bot from someone not in allow_from: told their id once, nothing kept."""
        user = message.from_user
        assert user is not None  # AddressedToBot passes people's messages only
        await self.refuse(Refusal(message.chat.id, user.id, topic_of(message)))

    async def refuse(self, refusal: Refusal) -> None:
        """Tell a stranger their id, once (a webhook worker stores only this of their message)."""
        log.info("telegram: refused chat %s user %s (not in allow_from)", refusal.chat_id, refusal.user_id)
        if refusal.user_id in self._told:
            return
        if not await _claim_kept():
            raise ClaimLost
        self._told.put(refusal.user_id, True)
        await self._send(refusal.chat_id, not_authorised(refusal.user_id), topic=refusal.topic_id)
        await _record_reply_sent()

    def screen(self, update: Update) -> Update | Refusal | None:
        """What a webhook worker keeps of `update`, by the access policy of polling (access.screen)."""
        return screen(update, self.allowed, self.addressed)

    async def _in_chat_order(self, message: Message, *, kept: bool) -> None:
        user, chat = message.from_user, message.chat
        assert user is not None  # AddressedToBot passes people's messages only
        key = self._session_key(chat.id, chat.type, user.id, topic_of(message))
        task = asyncio.current_task()
        if task is not None:
            self._in_flight.add(task)
        try:
            # The lock is the first thing awaited (the filters before it never wait), so one chat's updates
            # queue in the order they came.
            async with self._chat_locks.hold(key):
                await self._answer(message, user, key, kept)
        finally:
            if task is not None:
                self._in_flight.discard(task)

    async def _answer(self, message: Message, user: User, key: str, kept: bool) -> None:
        chat_id, topic = message.chat.id, topic_of(message)
        _turn_message.set((chat_id, message.message_id))  # this update's own task (and what it spawns) only
        audio = audio_of(message)
        document = document_of(message)
        images: tuple[bytes, ...] = ()
        shown_first = False  # whether a line went out before the turn (the transcript heard, NO_VISION)
        if audio is not None:
            heard = await self._listen(message, user, audio)
            if heard is None:
                return
            text, shown_first = spoken(heard, self._caption(message)), True
        elif message.photo or (document is not None and document.image):
            seen = await self._look(message, user, key)
            if seen is None:
                return
            text, images = seen
            shown_first = not images  # a model that does not see: the user was told so
        elif document is not None:
            read = await self._read_document(message, user, key, document)
            if read is None:
                return
            text = read
        elif message.text is None:
            await self._say(chat_id, NOT_TEXT, topic)
            return
        else:
            text = without_mention(message.text, self.me)
        log.info("telegram: chat %s user %s: message of %d chars", chat_id, user.id, len(text))
        agent = self._loop_for(key)
        replied = message.reply_to_message
        inbound = Inbound(str(user.id), key, text, replied.message_id if replied is not None else None, images)
        stream = self._stream_for(message)
        try:
            await self._turn(message, user, key, kept, agent, inbound, shown_first, stream)
        finally:
            if stream is not None:
                await stream.close()  # after the final answer: a preview message is deleted

    async def _turn(self, message: Message, user: User, key: str, kept: bool, agent: AgentLoop, inbound: Inbound,
                    shown_first: bool, stream: ReplyStream | None) -> None:
        """Run the turn (previewed by `stream` when given) and send its reply whole, as `send_reply` does."""
        chat_id, topic = message.chat.id, topic_of(message)
        hooks = self._hooks if stream is None else replace(self._hooks, on_text=stream.on_text,
                                                             on_tool=stream.on_tool)
        # Asked of the user who sent the message, in its chat and topic (buttons.py).
        hooks = replace(hooks, approver=TelegramApprover(self.bot, chat_id, topic, user.id, self.buttons.asks,
                                                         self.approval_timer, _claim_kept, _waiting_for_user()),
                        chooser=TelegramChooser(self.bot, chat_id, topic, user.id), model_slot=_model_slot())
        stored = False  # whether the session keeps this reply: a model's answer, not a command's or an apology
        turn: int | None = None  # the stored id of the turn's user message, for feedback on the reply
        try:
            async with self._typing(chat_id, topic):
                answer = await run_turn(agent, inbound, hooks)
            if isinstance(answer.error, StorageUnavailable):
                raise answer.error  # the agent's apology for its memory: a storage failure like any other
            _turn_storage(None)
            reply, stored, turn = answer.text, kept and answer.error is None, answer.turn
        except LockWaitExpired as exc:
            # The server answers but a lock's holder is stuck: another attempt would wait as long, and the update
            # would go unanswered until the holder lets go. One line now, and the update counts as answered.
            _turn_storage(exc)
            log.warning("telegram: chat %s user %s: the turn could not get its storage: %s", chat_id, user.id, exc)
            reply = MEMORY_BUSY
        except StorageUnavailable as exc:
            _turn_storage(exc)
            if from_inbox() and not shown_first:
                # No apology: another attempt answers once the storage is back (a worker that could reach it
                # may even be answering already), and an apology would come before the answer. Once a line went
                # out before the turn, another attempt would send it (and transcribe) again: answered here.
                log.info("telegram: chat %s user %s: storage unreachable; the message goes back to the inbox "
                         "(%s)", chat_id, user.id, exc)
                raise
            log.warning("telegram: chat %s user %s: the turn failed: %s", chat_id, user.id, exc)
            reply = APOLOGY
        except Exception:
            log.exception("telegram: chat %s user %s: the turn failed", chat_id, user.id)
            reply = APOLOGY
        if stream is not None:
            await stream.stop()  # no preview after the final answer
        if not await _claim_kept():  # this worker was paused past its lease, and another answers the message
            if stored:
                await self._mark_undelivered(agent, key, reply, "not sent: another worker answered this message")
            raise ClaimLost
        sent, failure = await self._send_parts(chat_id, reply, topic=topic)
        await _record_reply_sent()  # first: from now on no worker answers the update again
        await self._note_reply(chat_id, sent, SentReply(key, turn))
        if failure is not None and stored:
            await self._mark_undelivered(agent, key, reply, failure)

    def _stream_for(self, message: Message) -> ReplyStream | None:
        """The preview of this turn's answer (stream.py): a draft in a private chat (unless drafts were refused
        there), else a message edited; None when `stream` is off. In webhook mode each preview first checks
        that this worker still holds the update (known without a round trip while its lease renewals are on
        time), so a worker that lost it shows nothing, as it sends no answer."""
        if not self.settings.stream:
            return None
        chat_id = message.chat.id
        drafts = message.chat.type == ChatType.PRIVATE and chat_id not in self._no_drafts
        return ReplyStream(self.bot, chat_id, topic=topic_of(message),
                           draft_id=message.message_id if drafts else None, interval=self.settings.stream_interval,
                           on_no_drafts=lambda: self._no_drafts.put(chat_id, True),
                           may_show=_claim_kept if from_inbox() else None)

    def _caption(self, message: Message) -> str | None:
        """The words sent with a photo, voice note or document, without the mention that addressed the bot."""
        return without_mention(message.caption, self.me) if message.caption else None

    def _typing(self, chat_id: int, topic: int | None) -> ChatActionSender:
        """"typing…" in the chat (and topic) while a `with` block runs past `typing_delay`, refreshed meanwhile."""
        return ChatActionSender.typing(chat_id, self.bot, topic, interval=self.typing_interval,
                                       initial_sleep=self.typing_delay)

    async def _say(self, chat_id: int, line: str, topic: int | None) -> None:
        """One line of the bot's own (no turn, nothing kept), sent only while this worker holds the update."""
        if not await _claim_kept():
            raise ClaimLost
        await self.send_reply(chat_id, line, topic=topic)
        await _record_reply_sent()

    async def _listen(self, message: Message, user: User, audio: Audio) -> str | None:
        """The words of the message's audio, shown back to the user first; None when it was answered with why
        it could not be heard instead (nothing sent to the model, nothing stored)."""
        chat_id, topic = message.chat.id, topic_of(message)
        if self.transcriber is None:
            log.info("telegram: chat %s user %s: a %s, and no transcription is configured", chat_id, user.id,
                     audio.kind)
            await self._say(chat_id, NOT_LISTENING, topic)
            return None
        try:
            async with self._typing(chat_id, topic):
                heard = await transcript_of(self.bot, audio, self.transcriber)
        except MediaRefused as exc:
            log.info("telegram: chat %s user %s: a %s not transcribed: %s", chat_id, user.id, audio.kind, exc)
            await self._say(chat_id, str(exc), topic)
            return None
        if not await _claim_kept():
            raise ClaimLost
        await self._send(chat_id, f"🎤 {heard}", html=echo_html(heard), topic=topic)
        return heard

    async def _look(self, message: Message, user: User, key: str) -> tuple[str, tuple[bytes, ...]] | None:
        """The turn's text and images for a photo (or an image sent as a file): fetched within
        media.image_megabytes, kept in the scope's media/ folder, and given to a model that sees; a model that
        does not gets the caption and a note, and the user hears so in one line. None when it was answered with
        why the image could not be taken instead (nothing sent to the model, nothing stored)."""
        chat_id, topic = message.chat.id, topic_of(message)
        agent = self._loop_for(key)
        max_bytes = agent.workspace.config.media.image_megabytes * 1_000_000
        try:
            picture = picture_of(message, max_bytes)
            assert picture is not None  # _answer asked for a photo or an image document
            async with self._typing(chat_id, topic):
                data = await picture_bytes(self.bot, picture, max_bytes)
                saved_as = await asyncio.to_thread(agent.workspace.media().save, data, picture.name)
        except MediaRefused as exc:
            log.info("telegram: chat %s user %s: an image not taken: %s", chat_id, user.id, exc)
            await self._say(chat_id, str(exc), topic)
            return None
        except OSError as exc:
            log.warning("telegram: chat %s user %s: an image could not be kept: %s", chat_id, user.id, exc)
            await self._say(chat_id, IMAGE_NOT_KEPT, topic)
            return None
        log.info("telegram: chat %s user %s: an image (%d bytes) saved as %s", chat_id, user.id, len(data), saved_as)
        if await agent.sees_images():
            return image_turn(saved_as, self._caption(message), seen=True), (data,)
        if not await _claim_kept():
            raise ClaimLost
        await self._send(chat_id, NO_VISION, topic=topic)
        return image_turn(saved_as, self._caption(message), seen=False), ()

    async def _read_document(self, message: Message, user: User, key: str, document: Document) -> str | None:
        """The turn's text for a document: fetched within media.document_kilobytes, read, kept in the
        scope's media/ folder; None when it was answered with why it could not be read instead (nothing fetched
        over the limit, nothing sent to the model, nothing stored or saved)."""
        chat_id, topic = message.chat.id, topic_of(message)
        workspace = self._loop_for(key).workspace
        settings = workspace.config.media
        max_bytes = settings.document_kilobytes * KILOBYTE
        try:
            async with self._typing(chat_id, topic):
                data = await document_bytes(self.bot, document, max_bytes)
                doc = await asyncio.to_thread(read_document, document.name, data, max_bytes=max_bytes)
                media = workspace.media()
                saved_as, text_saved_as = await asyncio.to_thread(save_document, media, doc, data,
                                                                  max_chars=settings.document_chars)
        except MediaRefused as exc:
            log.info("telegram: chat %s user %s: a document (%s) not read: %s", chat_id, user.id,
                     document.mime_type or "no type", exc)
            await self._say(chat_id, str(exc), topic)
            return None
        log.info("telegram: chat %s user %s: document %s (%d bytes) saved as %s", chat_id, user.id, doc.kind,
                 len(data), saved_as)
        return document_turn(doc, saved_as, self._caption(message), settings.document_chars,
                             text_saved_as=text_saved_as)

    async def _mark_undelivered(self, agent: AgentLoop, key: str, reply: str, reason: str) -> None:
        """Record that the reply of the session's newest turn did not reach the user, so that neither a later
        turn nor a summary takes it as read."""
        try:
            async with agent.hold(key):  # no turn of this session is built meanwhile
                session = await agent.session(key)
                stored = session.last_reply(reply)
                if stored is None:
                    log.warning("telegram: session %s: the undelivered reply is not in the session", key)
                    return
                await asyncio.to_thread(agent.sessions.mark_undelivered, session, stored.id, reason)
        except Exception:  # the bot serves on; the log says the session still counts the reply as read
            log.exception("telegram: session %s: could not mark a reply as not delivered", key)
            return
        log.info("telegram: session %s: message %d marked as not delivered", key, stored.id)

    def _session_key(self, chat_id: int, chat_type: str, user_id: int, topic: int | None = None) -> str:
        # A forum topic is a conversation of its own. Per-user memory in a group (a topic too): each member
        # keeps a history of their own, so no one's remembered facts reach the others through the shared
        # conversation.
        per_user = self.settings.memory_scope == "per_user" and chat_type != ChatType.PRIVATE
        return str(SessionKey.telegram(chat_id, user_id if per_user else None, topic_id=topic))

    def _loop_for(self, key: str) -> AgentLoop:
        # The app's agent of the key's memory scope, made once per scope and kept while in use.
        agent = self.agent_for(SessionKey.parse(key).scope(self.settings.memory_scope))
        self._agents_used.add(agent)
        return agent

    async def _notify(self, key: str, text: str) -> None:
        """A notice of work after a turn (a summary starting), as plain text; a failure is only logged."""
        chat_id = chat_of(key)
        if chat_id is not None:
            await self._send(chat_id, text, topic=topic_in(key))

    async def _remembered(self, key: str, write: MemoryWrite) -> None:
        """The receipt of a memory write made without a command: a ✍ reaction on the user's message of the turn
        it came from when the words were the user's; else (the assistant's words, a lesson, no message known, or
        a chat where reactions cannot be set) its one line, in the chat it came from."""
        chat_id, turn = chat_of(key), _turn_message.get()
        if (write.by_user and write.document == LONG_TERM and turn is not None and turn[0] == chat_id
                and await self._react(turn[0], turn[1], RECEIPT)):
            return
        await self._notify(key, write.notice)

    async def _react(self, chat_id: int, message_id: int, emoji: str) -> bool:
        """Set the bot's reaction on a message; False when it could not (the reason logged once per chat)."""
        if chat_id in self._no_reactions:
            return False
        try:
            await self.bot.set_message_reaction(chat_id, message_id, reaction=[ReactionTypeEmoji(emoji=emoji)])
            return True
        except (TelegramAPIError, ClientDecodeError) as exc:
            reason = exc.message if isinstance(exc, TelegramAPIError) else "not a Bot API answer"
            if isinstance(exc, TelegramBadRequest | TelegramNotFound):  # the chat refuses it: not tried again
                self._no_reactions.put(chat_id, True)
                log.warning("telegram: chat %s: cannot set a reaction (%s); memory receipts there are a line of "
                            "text instead", chat_id, self._excerpt(reason))
            else:
                log.warning("telegram: chat %s: a reaction failed (%s); this receipt is a line of text", chat_id,
                            self._excerpt(reason))
            return False

    # -- reactions ----------------------------------------------------------------------------------

    async def on_reaction(self, event: MessageReactionUpdated) -> None:
        """An allowed user's feedback emoji added on one of the bot's replies: recorded once, on that turn's
        session; a stranger's reaction, another emoji, or a reaction on a message that is not a known reply is
        ignored and nothing is kept."""
        user = event.user
        if user is None or user.is_bot or not self.allowed.allows(user):
            return
        found = await self._reply_of(event.chat.id, event.message_id)
        if found is None:
            return
        old = {r.emoji for r in event.old_reaction if isinstance(r, ReactionTypeEmoji)}
        added = [r.emoji for r in event.new_reaction if isinstance(r, ReactionTypeEmoji) and r.emoji not in old]
        judged = [(emoji, verdict) for emoji in added if (verdict := verdict_of(emoji)) is not None]
        if not judged:
            return
        agent = self._loop_for(found.session)
        ledger = FeedbackLedger(agent.workspace.memory_dir, storage=agent.workspace.storage)
        for emoji, verdict in judged:
            reaction = Reaction(event.date.isoformat(timespec="seconds"), found.session, event.chat.id,
                                event.message_id, user.id, emoji, verdict, found.turn)
            if not await asyncio.to_thread(ledger.record, reaction):
                continue
            log.info("telegram: chat %s user %s: %s feedback on reply %s", event.chat.id, user.id, verdict,
                     event.message_id)
            if found.turn is not None and await asyncio.to_thread(ledger.first_dislike, reaction):
                await agent.disliked(found.session, found.turn)  # a correction signal: a lesson, once

    async def _reply_of(self, chat_id: int, message_id: int) -> SentReply | None:
        """The turn whose reply message `message_id` is, or None (not a reply of this bot, or unknown)."""
        if self._replies is None:
            return None
        try:
            return await asyncio.to_thread(self._replies.find, chat_id, message_id)
        except StorageError as exc:
            log.warning("telegram: chat %s: a reaction is not counted: %s", chat_id, exc)
            return None

    # -- sending ------------------------------------------------------------------------------------

    async def deliver(self, session_key: str, markdown: str) -> None:
        """A scheduled job's text to the chat of `session_key` (a per-user key's chat too), into the forum topic
        it names if any; raises on failure, so the job's outcome says it was not delivered."""
        chat_id = chat_of(session_key)
        if chat_id is None:
            raise PicoclawError(f"{session_key} is not a Telegram session")
        await self.send_reply(chat_id, markdown, strict=True, topic=topic_in(session_key))

    async def send_reply(self, chat_id: int, markdown: str, *, strict: bool = False,
                         topic: int | None = None) -> str | None:
        """The model's Markdown as HTML messages of at most 4,096 characters each, in order (into a forum's
        `topic` when given).

        None when every part arrived, else what went wrong, for the session's record (one line, no token).
        """
        return (await self._send_parts(chat_id, markdown, strict=strict, topic=topic))[1]

    async def _send_parts(self, chat_id: int, markdown: str, *, strict: bool = False,
                          topic: int | None = None) -> tuple[list[int], str | None]:
        """What `send_reply` does, with the ids of the messages that arrived."""
        parts = telegram_parts(markdown) or [MessagePart(EMPTY_REPLY, EMPTY_REPLY)]
        sent: list[int] = []
        failure = None
        for part in parts:
            outcome = await self._send(chat_id, part.plain, html=part.html, strict=strict, topic=topic)
            if isinstance(outcome, Message):
                sent.append(outcome.message_id)
            elif failure is None:
                failure = outcome
        if failure is None:
            return sent, None
        if not sent:
            return sent, f"sending failed ({failure}); the user has not seen this reply"
        return sent, f"only {len(sent)} of {len(parts)} parts reached the user; sending the rest failed ({failure})"

    async def _send(self, chat_id: int, plain: str, *, html: str | None = None, strict: bool = False,
                    topic: int | None = None) -> Message | str:
        """`html` if given, else (or when Telegram refuses the HTML) `plain`, into the forum's `topic` when given;
        the message sent, else why not.

        A failure is logged, and raised again when `strict`.
        """
        try:
            if html is not None:
                try:
                    return await self.bot.send_message(chat_id, html, message_thread_id=topic, parse_mode="HTML")
                except TelegramBadRequest as exc:
                    if "parse entities" not in exc.message.lower():
                        raise
                    log.warning("telegram: chat %s: Telegram refused the HTML (%s); sent as plain text",
                                chat_id, exc.message)
            return await self.bot.send_message(chat_id, plain, message_thread_id=topic, parse_mode=None)
        except TelegramAPIError as exc:
            log.error("telegram: chat %s: could not send a reply: %s", chat_id, exc)
            if strict:
                raise
            return self._excerpt(exc.message)
        except ClientDecodeError as exc:  # a proxy's error page: logged short, and the bot serves on
            page = page_excerpt(exc.data, self._secrets)
            log.error("telegram: chat %s: could not send a reply: not a Bot API answer: %s", chat_id, page)
            if strict:
                raise
            return f"not a Bot API answer: {page}"

    async def _note_reply(self, chat_id: int, message_ids: list[int], reply: SentReply) -> None:
        """Remember the messages sent as the turn's reply, so a reaction on one is feedback on the turn; a
        failure is logged: the reply went out, only a reaction on it would not count."""
        if not message_ids or self._replies is None:
            return
        try:
            await asyncio.to_thread(self._remember_reply, self._replies, chat_id, message_ids, reply)
        except StorageError as exc:
            log.warning("telegram: chat %s: reply %s not noted for feedback: %s", chat_id,
                        ", ".join(map(str, message_ids)), exc)

    @staticmethod
    def _remember_reply(replies: ReplyLog, chat_id: int, message_ids: list[int], reply: SentReply) -> None:
        for message_id in message_ids:
            replies.remember(chat_id, message_id, reply)
