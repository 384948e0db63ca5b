"""The console's aiohttp application: its routes, over the same App the CLI opens, and `serve`.

Each page has its module (memory_page, why_page, policy_page); every change goes through the layers the CLI
uses (MemoryStore, PolicyManager …): the console adds no second way to write a file.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from picoclaw.web import chat_page, jobs_page, login_link, memory_page, policy_page, stats_page, status_page, why_page
from picoclaw.web.file_cache import FileCache
from picoclaw.web.labels import LANG_COOKIE, LANGUAGES
from picoclaw.web.render import APP_KEY, HERE, TEMPLATES_KEY, render, see_other, storage_errors, templates
from picoclaw.web.request_log import ServerLog
from picoclaw.web.security import COOKIE, GATE_KEY, LOGIN_PATH, Gate, middleware
from picoclaw.web.token_file import remove_token, write_token

if TYPE_CHECKING:
    from picoclaw.app import App

log = logging.getLogger(__name__)


def make_console(app: App, gate: Gate) -> web.Application:
    """The console for `app`, behind `gate`."""
    console = web.Application(middlewares=[middleware(gate, _login_page), storage_errors],
                              client_max_size=1024 * 1024)
    console[APP_KEY] = app
    console[GATE_KEY] = gate
    console[TEMPLATES_KEY] = templates(app.workspace.tz)
    console[chat_page.CHANNEL_KEY] = []
    console[status_page.MCP_KEY] = []
    console[jobs_page.SCHEDULERS_KEY] = []
    console[memory_page.ENTRIES_KEY] = FileCache(1)
    console[why_page.TURNS_KEY] = FileCache(8)
    console[chat_page.HISTORY_KEY] = FileCache(8)
    console[stats_page.STATS_KEY] = FileCache(1)
    console.router.add_get("/", _home)
    console.router.add_get(LOGIN_PATH, _unreachable)  # answered by the gate
    console.router.add_post(login_link.NEW_LINK_PATH, login_link.new_link)
    console.router.add_get("/chat", chat_page.chat_page)
    console.router.add_post("/chat/turn", chat_page.chat_turn)
    console.router.add_post("/chat/stop", chat_page.chat_stop)
    console.router.add_post("/chat/archive", chat_page.chat_archive)
    console.router.add_post("/chat/approve", chat_page.chat_approve)
    console.router.add_get("/chat/events", chat_page.chat_events)
    console.router.add_get("/memory", memory_page.memory_page)
    console.router.add_post("/memory/entries", memory_page.add_entry)
    console.router.add_post("/memory/entries/edit", memory_page.edit_entry)
    console.router.add_post("/memory/entries/undo", memory_page.undo_delete)
    console.router.add_get("/memory/backups", memory_page.backups_page)
    console.router.add_get("/memory/stats", stats_page.stats_page)
    console.router.add_get("/memory/notes", memory_page.notes_page)
    console.router.add_get("/memory/lessons", memory_page.lessons_page)
    console.router.add_post("/memory/backups/restore", memory_page.restore_backup)
    console.router.add_get("/why", why_page.conversations_page)
    console.router.add_get("/why/conversation", why_page.conversation_page)
    console.router.add_get("/policy", policy_page.policy_page)
    console.router.add_post("/policy/set", policy_page.set_value)
    console.router.add_post("/policy/rollback", policy_page.rollback)
    console.router.add_get("/jobs", jobs_page.jobs_page)
    console.router.add_post("/jobs", jobs_page.add_job)
    console.router.add_post("/jobs/remove", jobs_page.remove_job)
    console.router.add_post("/jobs/edit", jobs_page.edit_job)
    console.router.add_post("/jobs/switch", jobs_page.switch_job)
    console.router.add_post("/jobs/run", jobs_page.run_job)
    console.router.add_get("/status", status_page.status_page)
    console.router.add_post("/status/drafts", status_page.decide_draft)
    console.router.add_post("/language", set_language)
    console.router.add_static("/static/", HERE / "static", append_version=True)
    console.on_shutdown.append(_end_conversations)
    return console


async def _end_conversations(console: web.Application) -> None:
    # Whoever runs the console (`serve` stops them itself first): pages following a conversation hold a request
    # open, and shutting down would wait out the runner's shutdown_timeout, then cut them off. Stopped here,
    # their streams end whole, at once.
    for conversations in console[chat_page.CHANNEL_KEY]:
        await conversations.stop()


def _login_page(request: web.Request, why: str) -> web.Response:
    return render(request, "login.html", status=401, why=why)


async def _home(request: web.Request) -> web.Response:
    return see_other("/memory")


async def _unreachable(request: web.Request) -> web.Response:
    raise web.HTTPNotFound()


async def set_language(request: web.Request) -> web.Response:
    """Remember the language the page's switch asked for, and go back to that page."""
    form = await request.post()
    lang = str(form.get("lang", ""))
    response = see_other(_back_to(str(form.get("back", ""))))
    if lang in LANGUAGES:
        response.set_cookie(LANG_COOKIE, lang, httponly=True, samesite="Strict", path="/")
    return response


def _back_to(path: str) -> str:
    """`path` when it is one of this console's own addresses ("/jobs?x=1"), else the memory page: a form's field
    never sends the browser to another site ("//evil.example", "https://…", "/\\evil")."""
    from urllib.parse import urlsplit

    parts = urlsplit(path)
    if len(path) > 2000:
        return "/memory"
    if (not path.startswith("/") or path.startswith("//") or "\\" in path or parts.scheme or parts.netloc
            or any(ord(char) < 32 for char in path)):
        return "/memory"
    return path


def make_runner(console: web.Application) -> web.AppRunner:
    """The runner `serve` (and the tests) start `console` with: a request that is not HTTP is one log line."""
    # A page following a conversation holds a request open: shutting down does not wait long for it.
    return web.AppRunner(console, access_log=None, shutdown_timeout=2.0, logger=ServerLog())


async def serve(app: App, host: str, port: int, token_file: Path, *,
                announce: Callable[[str, Path], object] = print) -> None:
    """Run the console until cancelled. Once it listens, its script token goes into `token_file` (removed when
    it stops) and `announce` gets a one-time login link and that file. The `web:` conversations' reminders run
    beside it, as the terminal's run beside `picoclaw chat`."""
    from picoclaw.errors import PicoclawError

    app.use_threads()  # the pages' storage calls on the app's sized executor, as a bot's turns
    gate = Gate.for_address(host, port)
    console = make_console(app, gate)
    runner = make_runner(console)
    await runner.setup()
    reminders: asyncio.Task[int] | None = None
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        # Only now: a second console that could not listen on this port must not replace the first one's token.
        write_token(token_file, gate.script_token)
        try:
            # As chat and the bot do: the agent's tools include the configured servers', shown on the status page.
            console[status_page.MCP_KEY].append(await app.start_mcp())
            conversations = chat_page.channel(console)
            scheduler = app.scheduler(conversations)
            console[jobs_page.SCHEDULERS_KEY].append(scheduler)  # "run now" wakes it
            reminders = asyncio.create_task(conversations.run(scheduler=scheduler))
        except (PicoclawError, web.HTTPException) as exc:  # no model configured yet: every page but the chat works
            log.warning("the console's chat is unavailable: %s", str(getattr(exc, "text", None) or exc).strip())
        announce(gate.login_url(), token_file)
        await asyncio.Event().wait()
    finally:
        remove_token(token_file, gate.script_token)
        if reminders is not None:
            await chat_page.channel(console).stop()
            await reminders
        await runner.cleanup()
        await app.aclose()


__all__ = ["COOKIE", "Gate", "make_console", "make_runner", "serve"]
