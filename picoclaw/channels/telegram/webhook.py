"""Webhook mode: Telegram POSTs each update to a worker, which stores it in the inbox before answering 200, and
every worker answers updates from the inbox (storage/inbox.py).

- `InboxRequestHandler`: aiogram's aiohttp webhook handler, storing instead of feeding. At the door: a request
  without the secret token (or with a wrong one) is refused and logged; so is a body that does not arrive
  within BODY_TIMEOUT seconds, one that is not an update, or one whose ids do not fit 64 bits. Then the
  channel's access policy (`Gate.screen`) decides what is kept: an allowed user's update as sent, a stranger's
  message to the bot as a refusal (two ids, nothing they wrote), the rest nothing. An update already stored
  (Telegram's retry, a load balancer's duplicate) is a 200 too; while the storage is down, every post is a
  503 at once, which Telegram retries.
- `InboxWorker`: claims updates (the oldest open one of each chat, so one chat is answered in order and
  different chats at once, across all workers), renews the leases while the turns run, and hands each update
  to the dispatcher: the handlers are those of long polling. `max_parallel` bounds the model calls under way
  (agent/model_slots.py); a quarter more turns are held (`turns_held`), so while some read their session, run
  a tool, write their transcript or send their reply, the others' calls keep the model's slots full. It looks
  at the inbox when woken (another worker's NOTIFY, its own stores, a turn ending, the next lease running out)
  and otherwise only every FALLBACK_POLL seconds: an idle worker costs the database nothing.
- `Webhook`: the HTTP server (the webhook route and `/healthz`), the worker and the `StorageWatch`, started
  and stopped together.

When a reply has been sent, the update is marked replied at once (again once the storage is back, if it is
down): an update taken over from a worker that died is answered again only if that worker died between sending
and marking (one Bot API round trip). A turn that fails because the storage is unreachable sends nothing, no
apology either: its claim goes back to the inbox, and the update is answered once the storage is back. One whose
lock wait ran out (LockWaitExpired: the server answers, a lock's holder is stuck) is answered with one line by
the channel; either way /healthz answers 503 until a turn gets its storage again.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar

import orjson
from aiogram import Bot, Dispatcher
from aiogram.types import Message, Update
from aiogram.types.update import UpdateTypeLookupError
from aiogram.webhook.aiohttp_server import SimpleRequestHandler
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError
from pydantic import ValidationError

from picoclaw.channels.telegram.access import Refusal
from picoclaw.channels.telegram.buttons import press_order
from picoclaw.channels.telegram.storage_watch import StorageWatch
from picoclaw.channels.telegram.waits import first_of
from picoclaw.config import WebhookConfig, listen_address, turns_held
from picoclaw.storage import Inbox, InboxUpdate, Storage, StorageError, StorageUnavailable

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
HEALTH_PATH = "/healthz"
MAX_UPDATE_BYTES = 1 << 20  # far above any real update (a message is at most 4,096 characters)
# Telegram sends an update whole at once; a body still dripping in after this long only holds a connection.
BODY_TIMEOUT = 10.0
# Seconds a connection may stay open without a request (one whose headers never end included): aiohttp's own
# default is an hour.
IDLE_TIMEOUT = 30.0
# Seconds the rest of a refused body is still read after the answer (so the client sees it, not a reset):
# aiohttp's default of 10 would keep a dripping connection that much longer.
LINGER = 1.0
MAX_ID = 2**63 - 1  # update_id is a PostgreSQL bigint; chat and user ids are 64-bit in the Bot API too
MAX_ATTEMPTS = 5  # claims of one update before it is given up: an update that kills its worker every time
FALLBACK_POLL = 15.0  # seconds between looks at the inbox when nothing woke the worker (NOTIFY wakes it at once)
LEASE_SLACK = 0.1  # seconds after a lease's end before looking: it has surely run out on the database's clock
RETRY_PAUSE = 1.0  # seconds before a failed inbox call is tried again (the storage answering)
WRITE_TRIES = 5  # tries of an inbox write (a reply recorded, an update finished) while the storage answers
PRUNE_EVERY = 3600.0  # seconds between deletions of old finished rows
STORE_GRACE = 5.0  # seconds the HTTP server waits for requests under way when the worker stops
# Threads of the inbox's own: the door and the claims never queue behind turns waiting for the database.
INBOX_THREADS = 4
# The key of a stranger's stored update: {"update_id": …, "refusal": {"chat_id", "user_id"[, "topic_id"]}}.
REFUSAL = "refusal"


@dataclass(frozen=True)
class InboxTurn:
    """The update being answered, as its handler sees it when it came from the inbox (webhook mode)."""

    still_ours: Callable[[], Awaitable[bool]]  # before a reply goes out: whether the claim is still this worker's
    replied: Callable[[], Awaitable[None]]  # once it went out: recorded, so no worker answers it again
    # Whether the turn got its storage: None when it did, else why not (a lock past its bound, the server gone).
    # What /healthz says of this worker's turns.
    storage: Callable[[StorageUnavailable | None], None] = lambda error: None
    # Held around each of the turn's model calls: one of the worker's max_parallel slots.
    model_slot: Callable[[], AbstractAsyncContextManager[object]] = nullcontext
    # Held while the turn waits for its user (an approval's press): it takes no turn's place meanwhile, so the
    # worker can still claim the press, another update in the inbox.
    waiting_for_user: Callable[[], AbstractAsyncContextManager[object]] = nullcontext


class ClaimLost(Exception):
    """Raised by a handler whose claim another worker took over (this one was paused past its lease): it sends
    nothing, as the other answers."""


# The update being answered from the inbox (None: polling, or nothing from the inbox).
inbox_turn: ContextVar[InboxTurn | None] = ContextVar("inbox_turn", default=None)


def from_inbox() -> bool:
    """Whether the update being handled came from the inbox (webhook mode), where a turn can be given back."""
    return inbox_turn.get() is not None


def webhook_secret(token: str) -> str:
    """The secret token of a bot whose config names none: derived from the bot token, so every worker of the bot
    expects the same one, and no one without the token can forge it."""
    return hmac.new(token.encode("utf-8"), b"picoclaw webhook secret", hashlib.sha256).hexdigest()


def chat_of_update(update: dict[str, Any]) -> str:
    """What orders an update: its chat's id (an approval's press apart from the chat's messages: buttons.py); else
    its sender's (an inline query); else the update alone."""
    for kind, value in update.items():
        if not isinstance(value, dict):
            continue
        inner = value.get("message")
        chat = value.get("chat") or (inner.get("chat") if isinstance(inner, dict) else None)
        if isinstance(chat, dict) and "id" in chat:
            return press_order(str(chat["id"]), value.get("data")) if kind == "callback_query" else str(chat["id"])
        sender = value.get("from") or value.get("user")
        if isinstance(sender, dict) and "id" in sender:
            return f"user:{sender['id']}"
    return f"update:{update.get('update_id')}"


def ids_out_of_range(update: Update) -> str | None:
    """Which id of `update` cannot be kept (update_id is a positive bigint; chat and user ids 64-bit), or None."""
    if not 0 <= update.update_id <= MAX_ID:
        return f"update_id {update.update_id}"
    event = update.event
    if isinstance(event, Message):
        if not -MAX_ID - 1 <= event.chat.id <= MAX_ID:
            return f"chat id {event.chat.id}"
        if event.from_user is not None and not -MAX_ID - 1 <= event.from_user.id <= MAX_ID:
            return f"user id {event.from_user.id}"
    return None


class Gate(Protocol):
    """The channel's access policy, applied at the door, before anything of an update is stored."""

    def screen(self, update: Update) -> Update | Refusal | None:
        """The update to keep, a refusal to keep instead, or None: nothing (access.screen)."""
        ...

    async def refuse(self, refusal: Refusal) -> None:
        """Answer a stranger's stored refusal (and record that the reply was sent)."""
        ...


class OneLine(logging.Filter):
    """aiohttp's server logs every malformed request with a traceback (a port scanner's garbage, a client
    that hung up): one line each, at warning, is all they are worth."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info is not None and record.exc_info[1] is not None:
            reason = " ".join(str(record.exc_info[1]).split())[:200] or type(record.exc_info[1]).__name__
            record.msg, record.args = f"telegram webhook: {record.getMessage()}: not HTTP, or cut off ({reason})", ()
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


# The HTTP server's own log (a malformed request): one line each, through OneLine.
http_log = logging.getLogger(f"{__name__}.http")
http_log.addFilter(OneLine())


class Offload:
    """Blocking inbox calls on threads of the inbox's own."""

    def __init__(self, threads: int = INBOX_THREADS):
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="inbox")

    async def __call__(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, functools.partial(call, *args, **kwargs))

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)


class InboxRequestHandler(SimpleRequestHandler):
    """aiogram's webhook handler for one bot, storing what the gate keeps of each update before the 200."""

    def __init__(self, dispatcher: Dispatcher, bot: Bot, secret_token: str, inbox: Inbox, *, gate: Gate,
                 watch: StorageWatch, stored: Callable[[], None], offload: Offload, body_timeout: float = BODY_TIMEOUT):
        super().__init__(dispatcher, bot, handle_in_background=False, secret_token=secret_token)
        self._secret = secret_token.encode("utf-8")
        self.inbox = inbox
        self.gate = gate
        self.watch = watch
        self.stored = stored
        self.offload = offload
        self.body_timeout = body_timeout

    def verify_secret(self, telegram_secret_token: str, bot: Bot) -> bool:
        # As bytes: a header that is not ASCII is a wrong token, not a TypeError (compare_digest refuses such str).
        return hmac.compare_digest(telegram_secret_token.encode("utf-8", "surrogateescape"),
                                   self._secret)

    async def handle(self, request: web.Request) -> web.Response:
        peer = request.remote or "?"
        if not self.verify_secret(request.headers.get(SECRET_HEADER, ""), self.bot):
            why = "without the secret token" if SECRET_HEADER not in request.headers else "with a wrong secret token"
            log.warning("telegram webhook: refused a request from %s %s", peer, why)
            return web.Response(status=401, text="Unauthorized")
        if not self.watch.up:  # refused at once, and not logged: the watch said once that the storage is down
            return web.Response(status=503, text="Service Unavailable: storage")
        body = await self._read_body(request, peer)
        if isinstance(body, web.Response):
            return body
        try:
            data = orjson.loads(body)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            update = Update.model_validate(data, context={"bot": self.bot})
            update.event_type  # noqa: B018 - an update carries one event (a message …); else the dispatcher fails
        except (ValueError, ValidationError, UpdateTypeLookupError) as exc:
            reason = " ".join(str(exc).split())[:200]
            log.warning("telegram webhook: refused a request from %s: not a Telegram update (%s)", peer, reason)
            return web.Response(status=400, text="Bad Request: not a Telegram update")
        too_big = ids_out_of_range(update)
        if too_big is not None:  # a bigint would refuse it with a 503, and Telegram would retry it for ever
            log.warning("telegram webhook: refused a request from %s: %s is out of range", peer, too_big[:60])
            return web.Response(status=400, text="Bad Request: an id is out of range")
        kept = self.gate.screen(update)
        if kept is None:
            return web.json_response({})  # nothing will answer it: nothing of it is stored
        if isinstance(kept, Refusal):
            where = {"chat_id": kept.chat_id, "user_id": kept.user_id}
            if kept.topic_id is not None:  # a forum topic: the refusal goes there (older rows have none)
                where["topic_id"] = kept.topic_id
            text = orjson.dumps({"update_id": update.update_id, REFUSAL: where}).decode()
        else:
            text = body.decode("utf-8")
        return await self._store(update.update_id, chat_of_update(data), text)

    async def _read_body(self, request: web.Request, peer: str) -> bytes | web.Response:
        """The whole body, or the refusal when it is too big, too slow, or cut off."""
        try:
            return await asyncio.wait_for(request.read(), self.body_timeout)  # client_max_size caps its length
        except web.HTTPRequestEntityTooLarge:
            log.warning("telegram webhook: refused a request from %s: body over %d bytes", peer, MAX_UPDATE_BYTES)
            return web.Response(status=413, text="Payload Too Large")
        except TimeoutError:
            log.warning("telegram webhook: refused a request from %s: its body did not arrive within %g s", peer,
                        self.body_timeout)
            response = web.Response(status=408, text="Request Timeout")
            response.force_close()
            return response
        except (ConnectionError, RequestPayloadError) as exc:
            log.warning("telegram webhook: a request from %s ended before its body did (%s)", peer,
                        str(exc) or type(exc).__name__)
            response = web.Response(status=400, text="Bad Request: incomplete body")
            response.force_close()
            return response

    async def _store(self, update_id: int, chat: str, text: str) -> web.Response:
        try:
            new = await self.offload(self.inbox.store, update_id, chat, text)
        except StorageError as exc:  # not stored: no 200, so Telegram (or the load balancer) tries again
            if isinstance(exc, StorageUnavailable):
                self.watch.failed(exc)
                log.info("telegram webhook: update %d not stored (Telegram retries it): %s", update_id, exc)
            else:
                log.error("telegram webhook: update %d not stored: %s", update_id, exc)
            return web.Response(status=503, text="Service Unavailable: storage")
        if new:
            self.stored()
        else:
            log.info("telegram webhook: update %d was stored already (a retry)", update_id)
        return web.json_response({})

    async def close(self) -> None:
        """The channel closes the bot's session, after the turns under way: not this handler, at shutdown."""


class InboxWorker:
    """Answers the inbox's updates, until `stop()`: `turns_held(parallel)` at once, with at most `parallel` model
    calls under way. One whose reply went out no longer counts, though at most `parallel` more are held; one
    whose turn waits for its user's press counts in neither (the press is another update to claim)."""

    def __init__(self, inbox: Inbox, feed: Callable[[dict[str, Any]], Awaitable[object]], *, worker: str,
                 lease: float, parallel: int, watch: StorageWatch, offload: Offload | None = None,
                 fallback_poll: float = FALLBACK_POLL):
        self.inbox = inbox
        self.feed = feed
        self.worker = worker
        self.lease = lease
        self.parallel = parallel
        self.turns = turns_held(parallel)
        self._slots = asyncio.Semaphore(parallel)  # the model calls under way
        self.watch = watch
        self.offload = offload or Offload(2)
        self.fallback_poll = fallback_poll
        self._wake = asyncio.Event()
        self._renew_now = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._renewing: asyncio.Task[None] | None = None
        self._held: dict[asyncio.Task[None], int] = {}  # turn under way → its update
        self._renewed: dict[int, float] = {}  # update held → when its lease was last taken or renewed (loop time)
        # Updates being finished or given back: a renewal that no longer finds them has not lost them.
        self._letting_go: set[int] = set()
        # Updates whose reply went out: what their turns have left (recording it, a preview deleted, the inbox's
        # finish) takes no turn's place, though the worker holds at most `parallel` updates beyond its turns.
        self._answered: set[int] = set()
        # Updates whose turns wait for their user's press: they take no place at all (see `InboxTurn`).
        self._with_user: set[int] = set()

    def wake(self) -> None:
        """Look at the inbox now (an update was stored, or a chat's update finished)."""
        self._wake.set()

    def storage_back(self) -> None:
        """The storage is reachable again: renew the leases held and look at the inbox, at once."""
        self._renew_now.set()
        self._wake.set()

    async def run(self) -> None:
        """Claim and answer until `stop_claiming()`. The leases of what is under way are renewed meanwhile, and
        until `drain` has let every turn finish."""
        self._task = asyncio.current_task()
        if self._renewing is None:
            self._renewing = asyncio.create_task(self._renew_leases())
        listening = asyncio.create_task(self.inbox.listen(self.wake))
        try:
            await self._claim_until_stopped()
        finally:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)

    async def _claim_until_stopped(self) -> None:
        pruned_at = -PRUNE_EVERY
        loop = asyncio.get_running_loop()
        while not self._stopping:
            self._wake.clear()  # before looking: what is stored from now on wakes the wait below
            if not self.watch.up:  # nothing can be claimed: wait for the storage's return (or a stop)
                await first_of(self._wake.wait(), self.watch.wait_up())
                continue
            if loop.time() - pruned_at >= PRUNE_EVERY:
                pruned_at = loop.time()
                await self._prune()
            if self._stopping:
                break
            pause = await self._claim_some()
            if pause is None:
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), pause)
            except TimeoutError:
                pass

    async def _claim_some(self) -> float | None:
        """Claim as many updates as there is room for: None when any was, else how long to wait at most."""
        waiting = len(self._with_user - self._answered)
        answering = len(self._held) - len(self._answered) - waiting
        # See `_answered` and `_with_user`.
        free = min(self.turns - answering, self.turns + self.parallel - (len(self._held) - waiting))
        if free <= 0:
            return self.fallback_poll  # a turn ending wakes the worker
        ends = None
        try:
            claimed = await self.offload(self.inbox.claim, self.worker, self.lease, free)
            if not claimed and not self._held:  # busy, a turn ending wakes it soon enough: one call less a turn
                ends = await self.offload(self.inbox.next_lease_end, self.lease)
        except StorageUnavailable as exc:
            self.watch.failed(exc)  # an outage stops the claims until it ends; a passing failure, for a second
            return RETRY_PAUSE
        except StorageError as exc:
            log.error("telegram inbox: cannot claim updates: %s", exc)
            return RETRY_PAUSE * 5
        for update in claimed:
            if update.update_id in self._held.values():
                continue  # ours still: this worker was too slow to renew, and the claim renewed it
            self._renewed[update.update_id] = asyncio.get_running_loop().time()
            task = asyncio.create_task(self._answer(update))
            self._held[task] = update.update_id
            task.add_done_callback(self._done)
        if claimed:
            return None
        return self.fallback_poll if ends is None else min(self.fallback_poll, ends + LEASE_SLACK)

    def _done(self, task: asyncio.Task[None]) -> None:
        update_id = self._held.pop(task, None)
        if update_id is not None and update_id not in self._held.values():
            self._renewed.pop(update_id, None)
            self._letting_go.discard(update_id)
            self._answered.discard(update_id)
        self._wake.set()  # room for one more, and the chat's next update may now be claimed

    async def _answer(self, update: InboxUpdate) -> None:
        if update.replied:
            log.info("telegram inbox: update %d was answered by a worker that stopped before marking it done",
                     update.update_id)
        elif update.attempts > MAX_ATTEMPTS:
            log.error("telegram inbox: update %d given up after %d attempts (each stopped, or could not reach "
                      "the storage)", update.update_id, update.attempts - 1)
        else:
            if update.attempts > 1:
                log.info("telegram inbox: update %d: attempt %d (the one before stopped, or could not reach the "
                         "storage)", update.update_id, update.attempts)
            token = inbox_turn.set(InboxTurn(lambda: self._still_ours(update.update_id),
                                             lambda: self._record_reply(update.update_id), self.watch.turn,
                                             lambda: self._slots,
                                             lambda: self._waiting_for_user(update.update_id)))
            try:
                await self.feed(orjson.loads(update.body))
            except ClaimLost:
                log.info("telegram inbox: update %d: another worker took it over; nothing sent from here",
                         update.update_id)
                return
            except StorageUnavailable as exc:
                # Nothing was sent (the channel sends no apology then): answered once the storage is back.
                self.watch.failed(exc)
                self.watch.turn(exc)
                log.info("telegram inbox: update %d: its turn could not reach the storage; given back",
                         update.update_id)
                self._letting_go.add(update.update_id)
                error = await self._write(self.inbox.release, self.worker, [update.update_id], attempted=True)
                if error is not None:
                    log.info("telegram inbox: update %d not given back (its claim runs out by itself): %s",
                             update.update_id, error)
                return
            except Exception:  # a bug in a handler: logged, and the update not fed again
                log.exception("telegram inbox: update %d failed", update.update_id)
            finally:
                inbox_turn.reset(token)
        self._letting_go.add(update.update_id)
        error = await self._write(self.inbox.finish, self.worker, update.update_id)
        if error is not None:  # its lease runs out and another worker takes it: replied, so not re-answered
            log.error("telegram inbox: update %d not marked done: %s", update.update_id, error)

    @asynccontextmanager
    async def _waiting_for_user(self, update_id: int) -> AsyncIterator[None]:
        self._with_user.add(update_id)
        self._wake.set()  # its place is free: the press it waits for may be claimed
        try:
            yield
        finally:
            self._with_user.discard(update_id)

    async def _still_ours(self, update_id: int) -> bool:
        """Whether this worker still holds the update's claim, asked before a reply goes out. Known without asking
        while its renewals are on time; after a pause (a stopped process, a stalled machine) the database is
        asked, so a worker whose claim was taken over meanwhile does not answer a second time."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._renewed.get(update_id, 0.0) < self.lease / 2:
            return True
        try:
            held = await self.offload(self.inbox.renew, self.worker, [update_id], self.lease)
        except StorageError as exc:  # no one can take it over while the storage is down: the reply goes out
            if isinstance(exc, StorageUnavailable):
                self.watch.failed(exc)
            return True
        if update_id in held:
            self._renewed[update_id] = loop.time()
        return update_id in held

    async def _record_reply(self, update_id: int) -> None:
        if update_id in self._renewed:  # still held: its place goes to the next update at once
            self._answered.add(update_id)
            self._wake.set()
        error = await self._write(self.inbox.mark_replied, update_id)
        if error is not None:
            log.error("telegram inbox: update %d: reply sent but not recorded: %s", update_id, error)

    async def _write(self, call: Callable[P, None], *args: P.args, **kwargs: P.kwargs) -> StorageError | None:
        """An inbox write of the update under way; tried again once the storage is back while it is down (the
        claim stays this worker's meanwhile), up to WRITE_TRIES times in all. None once done, else the error."""
        for tries in range(1, WRITE_TRIES + 1):
            try:
                await self.offload(call, *args, **kwargs)
                return None
            except StorageError as exc:
                if isinstance(exc, StorageUnavailable):
                    self.watch.failed(exc)
                if tries == WRITE_TRIES:
                    return exc
            await asyncio.sleep(RETRY_PAUSE)
            await self.watch.wait_up()
        raise AssertionError("unreachable")

    async def _renew_leases(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._renew_now.wait(), self.lease / 3)
            except TimeoutError:
                pass
            self._renew_now.clear()
            await self.watch.wait_up()  # nothing can be renewed meanwhile; at once when the storage is back
            held = list(self._held.values())
            if not held:
                continue
            asked = asyncio.get_running_loop().time()
            try:
                kept = await self.offload(self.inbox.renew, self.worker, held, self.lease)
            except StorageError as exc:
                if isinstance(exc, StorageUnavailable):
                    self.watch.failed(exc)
                else:
                    log.error("telegram inbox: cannot renew the leases of %d update(s): %s", len(held), exc)
                continue
            for update_id in kept & set(self._renewed):
                self._renewed[update_id] = asked
            # One finished or given back meanwhile is not lost, though its task may not have ended yet.
            lost = (set(held) - kept - self._letting_go) & set(self._held.values())
            if lost:
                # Another worker answers them now: this one stops, so the user does not get two answers.
                log.warning("telegram inbox: lost the claim of update(s) %s (this worker was too slow to renew); "
                            "left to the worker that took them over", sorted(lost))
                for task, update_id in list(self._held.items()):
                    if update_id in lost:
                        task.cancel()

    async def _prune(self) -> None:
        try:
            pruned = await self.offload(self.inbox.prune)
        except StorageError as exc:
            log.warning("telegram inbox: old rows not pruned: %s", exc)
            return
        if pruned:
            log.info("telegram inbox: pruned %d old finished update(s)", pruned)

    def stop_claiming(self) -> None:
        """Claim nothing more (what is under way goes on, its leases renewed)."""
        self._stopping = True
        self._wake.set()

    async def drain(self, timeout: float) -> None:
        """After `stop_claiming`: let the turns under way finish (at most `timeout` seconds, then they are
        cancelled) and give back the claims of the cancelled ones, for another worker to take at once."""
        self.stop_claiming()
        try:
            await self._finish_turns(timeout)
        finally:  # even when the drain itself is cancelled: no lease is renewed for a worker that has stopped
            if self._renewing is not None:
                self._renewing.cancel()
                await asyncio.gather(self._renewing, return_exceptions=True)

    async def _finish_turns(self, timeout: float) -> None:
        if self._task is not None and self._task is not asyncio.current_task():
            await asyncio.gather(self._task, return_exceptions=True)  # a claim under way lands in _held first
        if self._held:
            log.info("telegram inbox: waiting for %d turn(s) to finish", len(self._held))
            await asyncio.wait(set(self._held), timeout=timeout)
        unfinished = dict(self._held)
        for task in unfinished:
            task.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)
        if unfinished:
            log.warning("telegram inbox: %d turn(s) still ran after %.0f s; given back to the inbox",
                        len(unfinished), timeout)
            try:
                await self.offload(self.inbox.release, self.worker, list(unfinished.values()))
            except StorageError as exc:
                log.error("telegram inbox: claims not given back (they run out by themselves): %s", exc)


class Webhook:
    """One worker in webhook mode: the HTTP server Telegram (or a load balancer) posts to, and the inbox worker."""

    def __init__(self, settings: WebhookConfig, storage: Storage, *, worker: str, secret_token: str,
                 body_timeout: float = BODY_TIMEOUT, idle_timeout: float = IDLE_TIMEOUT,
                 fallback_poll: float = FALLBACK_POLL):
        self.settings = settings
        self.storage = storage
        self.worker = worker
        self.secret_token = secret_token
        self.body_timeout, self.idle_timeout, self.fallback_poll = body_timeout, idle_timeout, fallback_poll
        self.host, self.port = listen_address(settings.listen)
        self._stopped = asyncio.Event()
        self.inbox: Inbox | None = None
        self.watch: StorageWatch | None = None
        self._worker: InboxWorker | None = None
        self._runner: web.AppRunner | None = None
        self._offload: Offload | None = None

    async def register(self, bot: Bot, dispatcher: Dispatcher) -> None:
        """Point Telegram at the URL. setWebhook with the same settings is harmless, so every worker starting
        (several at once too) simply sets it."""
        await bot.set_webhook(self.settings.url, secret_token=self.secret_token, drop_pending_updates=False,
                              allowed_updates=dispatcher.resolve_used_update_types())
        log.info("telegram: webhook set to %s", self.settings.url)

    async def open(self, bot: Bot, dispatcher: Dispatcher, gate: Gate) -> None:
        """Listen: from now on updates are stored (and answered once `serve` runs), what `gate` keeps of them.
        Opened before setWebhook, so Telegram's first post finds the port open; OSError when it cannot be."""
        offload = self._offload = Offload()
        inbox = self.inbox = await offload(self.storage.telegram_inbox, bot.id)
        self.watch = StorageWatch(self.storage.ping, on_back=self._storage_back)
        self._worker = InboxWorker(inbox, _feeder(bot, dispatcher, gate), worker=self.worker,
                                   lease=self.settings.lease_seconds, parallel=self.settings.max_parallel,
                                   watch=self.watch, offload=offload, fallback_poll=self.fallback_poll)
        app = web.Application(client_max_size=MAX_UPDATE_BYTES)
        InboxRequestHandler(dispatcher, bot, self.secret_token, inbox, gate=gate, watch=self.watch,
                            stored=self._worker.wake, offload=offload,
                            body_timeout=self.body_timeout).register(app, path=self.settings.route())
        app.router.add_get(HEALTH_PATH, self._health)
        # A store takes milliseconds: a request still open this long after the stop gets no 200, so is retried.
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=STORE_GRACE,
                                     keepalive_timeout=self.idle_timeout, lingering_time=LINGER, logger=http_log)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port).start()
        except BaseException:
            await self.close(0)
            raise
        log.info("telegram: worker %s takes updates on %s:%d%s", self.worker, self.host, self.port,
                 self.settings.route())

    def _storage_back(self) -> None:
        if self._worker is not None:
            self._worker.storage_back()

    async def serve(self, *, handle_signals: bool, shutdown_timeout: float) -> None:
        """Answer updates until SIGTERM/SIGINT (with `handle_signals`) or `stop()`; then `close`."""
        assert self._worker is not None, "Webhook.open first"
        loop = asyncio.get_running_loop()
        if handle_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self._stopped.set)
        working = asyncio.create_task(self._worker.run())
        stopped = asyncio.create_task(self._stopped.wait())
        try:
            await asyncio.wait({working, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if working.done():
                working.result()  # the worker failed: raised here
        finally:
            stopped.cancel()
            try:
                await self.close(shutdown_timeout)
            finally:  # only now: a second SIGTERM while turns finish must not kill the process half-way
                if handle_signals:
                    for signum in (signal.SIGTERM, signal.SIGINT):
                        loop.remove_signal_handler(signum)

    async def close(self, shutdown_timeout: float) -> None:
        """Stop taking updates (the port closes: a load balancer sends the next ones elsewhere), let the turns
        under way finish (at most `shutdown_timeout` seconds) and give back the rest. Idempotent."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        log.info("telegram: worker %s stopping: no new updates taken", self.worker)
        if self._worker is not None:
            self._worker.stop_claiming()
        await runner.cleanup()  # the port closes (after the stores under way): the load balancer moves on
        if self._worker is not None:
            await self._worker.drain(shutdown_timeout)
        if self.watch is not None:
            await self.watch.close()
        if self.inbox is not None:
            await asyncio.to_thread(self.inbox.close)
        if self._offload is not None:
            self._offload.close()

    def stop(self) -> None:
        """What SIGTERM does: stop taking updates; `serve` then lets the turns under way finish."""
        self._stopped.set()

    async def _health(self, request: web.Request) -> web.Response:
        """200 while the storage answers and this worker's turns get it; 503 within about a second when it does
        not answer (at once during an outage), so the load balancer sends posts to a worker that can store them,
        and 503 from a turn that could not get its storage (a lock past its bound) until one gets it again."""
        assert self.watch is not None, "Webhook.open first"
        error = await self.watch.check()
        if error is not None:
            return web.Response(status=503, text=f"storage unreachable: {error}\n")
        if self.watch.turn_error is not None:
            return web.Response(status=503, text=f"turns cannot get storage: {self.watch.turn_error}\n")
        return web.Response(text=f"ok {self.worker}\n")


def _feeder(bot: Bot, dispatcher: Dispatcher, gate: Gate) -> Callable[[dict[str, Any]], Awaitable[object]]:
    """How a stored update is answered: a stranger's refusal by the gate, any other by the dispatcher."""
    async def feed(update: dict[str, Any]) -> object:
        refusal = update.get(REFUSAL)
        if isinstance(refusal, dict):
            topic = refusal.get("topic_id")
            await gate.refuse(Refusal(int(refusal["chat_id"]), int(refusal["user_id"]),
                                      None if topic is None else int(topic)))
            return None
        # feed_update, not feed_raw_update: that one logs a traceback of its own for every exception, and the
        # inbox worker handles them (a turn given back for want of the storage is no error).
        return await dispatcher.feed_update(bot, Update.model_validate(update, context={"bot": bot}))
    return feed
