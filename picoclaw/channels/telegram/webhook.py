"""Webhook mode: Telegram POSTs each update to a worker, which stores it in the inbox before answering 200, and
every worker answers updates from the inbox (storage/inbox.py).

- `InboxRequestHandler`: aiogram's aiohttp webhook handler, storing instead of feeding. A request without the
  secret token (or with a wrong one) is refused and logged; a body that is not an update is refused; neither
  stores anything. An update already stored (Telegram's retry, a load balancer's duplicate) is a 200 too.
- `InboxWorker`: claims updates (the oldest open one of each chat, so one chat is answered in order and
  different chats at once, across all workers), renews the leases while the turns run, and hands each update
  to the dispatcher with `feed_raw_update`: the handlers are those of long polling.
- `Webhook`: the HTTP server (the webhook route and `/healthz`) and the worker, started and stopped together.

When a reply has been sent, the update is marked replied at once: an update taken over from a worker that
died is answered again only if that worker died between sending and marking (one Bot API round trip).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import signal
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import orjson
from aiogram import Bot, Dispatcher
from aiogram.types import Update
from aiogram.types.update import UpdateTypeLookupError
from aiogram.webhook.aiohttp_server import SimpleRequestHandler
from aiohttp import web
from pydantic import ValidationError

from picoclaw.config import WebhookConfig, listen_address
from picoclaw.storage import Inbox, InboxUpdate, Storage, StorageError

log = logging.getLogger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
HEALTH_PATH = "/healthz"
MAX_UPDATE_BYTES = 1 << 20  # far above any real update (a message is at most 4,096 characters)
MAX_ATTEMPTS = 5  # claims of one update before it is given up: an update that kills its worker every time
POLL_INTERVAL = 0.5  # seconds between looks at the inbox when nothing woke the worker (another worker stored)
PRUNE_EVERY = 3600.0  # seconds between deletions of old finished rows
STORE_GRACE = 5.0  # seconds the HTTP server waits for requests under way when the worker stops

# What the handler of the update being answered calls once its reply was sent (None: not from the inbox).
reply_sent: ContextVar[Callable[[], Awaitable[None]] | None] = ContextVar("reply_sent", default=None)


def webhook_secret(token: str) -> str:
    """The secret token of a bot whose config names none: derived from the bot token, so every worker of the bot
    expects the same one, and no one without the token can forge it."""
    return hmac.new(token.encode("utf-8"), b"picoclaw webhook secret", hashlib.sha256).hexdigest()


def chat_of_update(update: dict[str, Any]) -> str:
    """What orders an update: its chat's id; else its sender's (an inline query); else the update alone."""
    for value in update.values():
        if not isinstance(value, dict):
            continue
        inner = value.get("message")
        chat = value.get("chat") or (inner.get("chat") if isinstance(inner, dict) else None)
        if isinstance(chat, dict) and "id" in chat:
            return str(chat["id"])
        sender = value.get("from") or value.get("user")
        if isinstance(sender, dict) and "id" in sender:
            return f"user:{sender['id']}"
    return f"update:{update.get('update_id')}"


class InboxRequestHandler(SimpleRequestHandler):
    """aiogram's webhook handler for one bot, storing each update in the inbox before the 200."""

    def __init__(self, dispatcher: Dispatcher, bot: Bot, secret_token: str, inbox: Inbox,
                 stored: Callable[[], None]):
        super().__init__(dispatcher, bot, handle_in_background=False, secret_token=secret_token)
        self._secret = secret_token.encode("utf-8")
        self.inbox = inbox
        self.stored = stored

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
        try:
            body = await request.read()  # the application's client_max_size caps it
        except web.HTTPRequestEntityTooLarge:
            log.warning("telegram webhook: refused a request from %s: body over %d bytes", peer, MAX_UPDATE_BYTES)
            return web.Response(status=413, text="Payload Too Large")
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
        try:
            new = await asyncio.to_thread(self.inbox.store, update.update_id, chat_of_update(data),
                                          body.decode("utf-8"))
        except StorageError as exc:  # not stored: no 200, so Telegram (or the load balancer) tries again
            log.error("telegram webhook: update %d not stored: %s", update.update_id, exc)
            return web.Response(status=503, text="Service Unavailable: storage")
        if new:
            self.stored()
        else:
            log.info("telegram webhook: update %d was stored already (a retry)", update.update_id)
        return web.json_response({})

    async def close(self) -> None:
        """The channel closes the bot's session, after the turns under way: not this handler, at shutdown."""


class InboxWorker:
    """Answers the inbox's updates, up to `parallel` at once, until `stop()`."""

    def __init__(self, inbox: Inbox, feed: Callable[[dict[str, Any]], Awaitable[object]], *, worker: str,
                 lease: float, parallel: int, poll_interval: float = POLL_INTERVAL):
        self.inbox = inbox
        self.feed = feed
        self.worker = worker
        self.lease = lease
        self.parallel = parallel
        self.poll_interval = poll_interval
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._renewing: asyncio.Task[None] | None = None
        self._held: dict[asyncio.Task[None], int] = {}  # turn under way → its update

    def wake(self) -> None:
        """Look at the inbox now (an update was stored, or a chat's update finished)."""
        self._wake.set()

    async def run(self) -> None:
        """Claim and answer until `stop_claiming()`. The leases of what is under way are renewed meanwhile, and
        until `drain` has let every turn finish."""
        self._task = asyncio.current_task()
        if self._renewing is None:
            self._renewing = asyncio.create_task(self._renew_leases())
        pruned_at = -PRUNE_EVERY
        loop = asyncio.get_running_loop()
        while not self._stopping:
            if loop.time() - pruned_at >= PRUNE_EVERY:
                pruned_at = loop.time()
                await self._prune()
            self._wake.clear()
            if self._stopping:  # a stop that came during the prune: its wake-up was just cleared
                break
            if await self._claim_some():
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), self.poll_interval)
            except TimeoutError:
                pass

    async def _claim_some(self) -> bool:
        """Claim as many updates as there is room for; whether any was claimed."""
        free = self.parallel - len(self._held)
        if free <= 0:
            return False
        try:
            claimed = await asyncio.to_thread(self.inbox.claim, self.worker, self.lease, free)
        except StorageError as exc:
            log.error("telegram inbox: cannot claim updates: %s", exc)
            return False
        for update in claimed:
            if update.update_id in self._held.values():
                continue  # ours still: this worker was too slow to renew, and the claim renewed it
            task = asyncio.create_task(self._answer(update))
            self._held[task] = update.update_id
            task.add_done_callback(self._done)
        return bool(claimed)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._held.pop(task, None)
        self._wake.set()  # room for one more, and the chat's next update may now be claimed

    async def _answer(self, update: InboxUpdate) -> None:
        if update.replied:
            log.info("telegram inbox: update %d was answered by a worker that stopped before marking it done",
                     update.update_id)
        elif update.attempts > MAX_ATTEMPTS:
            log.error("telegram inbox: update %d given up after %d attempts (each worker answering it stopped)",
                      update.update_id, update.attempts - 1)
        else:
            if update.attempts > 1:
                log.warning("telegram inbox: update %d taken over from a worker that stopped (attempt %d)",
                            update.update_id, update.attempts)
            token = reply_sent.set(lambda: self._mark_replied(update.update_id))
            try:
                await self.feed(orjson.loads(update.body))
            except Exception:  # a bug in a handler: logged, and the update not fed again
                log.exception("telegram inbox: update %d failed", update.update_id)
            finally:
                reply_sent.reset(token)
        try:
            await asyncio.to_thread(self.inbox.finish, self.worker, update.update_id)
        except StorageError as exc:  # its lease runs out and another worker takes it: replied, so not re-answered
            log.error("telegram inbox: update %d not marked done: %s", update.update_id, exc)

    async def _mark_replied(self, update_id: int) -> None:
        try:
            await asyncio.to_thread(self.inbox.mark_replied, update_id)
        except StorageError as exc:
            log.error("telegram inbox: update %d: reply sent but not recorded: %s", update_id, exc)

    async def _renew_leases(self) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            held = list(self._held.values())
            if not held:
                continue
            try:
                kept = await asyncio.to_thread(self.inbox.renew, self.worker, held, self.lease)
            except StorageError as exc:
                log.error("telegram inbox: cannot renew the leases of %d update(s): %s", len(held), exc)
                continue
            lost = (set(held) - kept) & set(self._held.values())  # one finished meanwhile is not lost
            if lost:
                # Another worker answers them now: this one stops, so the user does not get two answers.
                log.warning("telegram inbox: lost the claim of update(s) %s (this worker was too slow to renew); "
                            "left to the worker that took them over", sorted(lost))
                for task, update_id in list(self._held.items()):
                    if update_id in lost:
                        task.cancel()

    async def _prune(self) -> None:
        try:
            pruned = await asyncio.to_thread(self.inbox.prune)
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
                await asyncio.to_thread(self.inbox.release, self.worker, list(unfinished.values()))
            except StorageError as exc:
                log.error("telegram inbox: claims not given back (they run out by themselves): %s", exc)


class Webhook:
    """One worker in webhook mode: the HTTP server Telegram (or a load balancer) posts to, and the inbox worker."""

    def __init__(self, settings: WebhookConfig, storage: Storage, *, worker: str, secret_token: str):
        self.settings = settings
        self.storage = storage
        self.worker = worker
        self.secret_token = secret_token
        self.host, self.port = listen_address(settings.listen)
        self._stopped = asyncio.Event()
        self.inbox: Inbox | None = None
        self._worker: InboxWorker | None = None
        self._runner: web.AppRunner | None = None

    async def register(self, bot: Bot, dispatcher: Dispatcher) -> None:
        """Point Telegram at the URL. setWebhook with the same settings is harmless, so every worker starting
        (several at once too) simply sets it."""
        await bot.set_webhook(self.settings.url, secret_token=self.secret_token, drop_pending_updates=False,
                              allowed_updates=dispatcher.resolve_used_update_types())
        log.info("telegram: webhook set to %s", self.settings.url)

    async def open(self, bot: Bot, dispatcher: Dispatcher) -> None:
        """Listen: from now on updates are stored (and answered once `serve` runs). Opened before setWebhook, so
        Telegram's first post finds the port open; OSError when it cannot be."""
        inbox = self.inbox = await asyncio.to_thread(self.storage.telegram_inbox, bot.id)
        self._worker = InboxWorker(inbox, lambda update: dispatcher.feed_raw_update(bot, update),
                                   worker=self.worker, lease=self.settings.lease_seconds,
                                   parallel=self.settings.max_parallel)
        app = web.Application(client_max_size=MAX_UPDATE_BYTES)
        InboxRequestHandler(dispatcher, bot, self.secret_token, inbox, self._worker.wake).register(
            app, path=self.settings.route())
        app.router.add_get(HEALTH_PATH, self._health)
        # A store takes milliseconds: a request still open this long after the stop gets no 200, so is retried.
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=STORE_GRACE)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port).start()
        except BaseException:
            await self.close(0)
            raise
        log.info("telegram: worker %s takes updates on %s:%d%s", self.worker, self.host, self.port,
                 self.settings.route())

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
        if self.inbox is not None:
            await asyncio.to_thread(self.inbox.close)

    def stop(self) -> None:
        """What SIGTERM does: stop taking updates; `serve` then lets the turns under way finish."""
        self._stopped.set()

    async def _health(self, request: web.Request) -> web.Response:
        try:
            await asyncio.to_thread(self.storage.ping)
        except StorageError as exc:
            return web.Response(status=503, text=f"storage unreachable: {exc}\n")
        return web.Response(text=f"ok {self.worker}\n")
