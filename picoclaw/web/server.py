"""The console's aiohttp application: its routes and pages, over the same App the CLI opens.

Pages are rendered on the server from Jinja2 templates with autoescaping on, so whatever memory, sessions
or a model wrote is shown as text. Every change goes through the store (MemoryStore.append_long_term …),
as the CLI's do: the console adds no second way to write a file.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
from aiohttp import web

from picoclaw.web.labels import LABELS, LANG_COOKIE, LANGUAGES, language_of
from picoclaw.web.security import COOKIE, CSRF_FIELD, CSRF_KEY, Gate, middleware

if TYPE_CHECKING:
    from picoclaw.app import App

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
PAGE_SIZE = 50  # entries a memory page shows: a 10,000-entry MEMORY.md stays quick to render
APP_KEY: web.AppKey[App] = web.AppKey("picoclaw_app")
GATE_KEY: web.AppKey[Gate] = web.AppKey("picoclaw_gate")
TEMPLATES_KEY: web.AppKey[jinja2.Environment] = web.AppKey("picoclaw_templates")
MAX_ENTRY = 20_000  # characters of one entry added from the console


@dataclass(frozen=True)
class MemoryEntryView:
    """An entry of MEMORY.md as the memory page shows it."""

    heading: str
    text: str
    line: int
    superseded: bool


def make_console(app: App, gate: Gate) -> web.Application:
    """The console for `app`, behind `gate`."""
    templates = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                                   undefined=jinja2.StrictUndefined)
    console = web.Application(middlewares=[middleware(gate, _login_page)], client_max_size=1024 * 1024)
    console[APP_KEY] = app
    console[GATE_KEY] = gate
    console[TEMPLATES_KEY] = templates
    console.router.add_get("/", _home)
    console.router.add_get("/login", _unreachable)  # answered by the gate
    console.router.add_get("/memory", memory_page)
    console.router.add_post("/memory/entries", add_entry)
    console.router.add_post("/language", set_language)
    console.router.add_static("/static/", HERE / "static", append_version=True)
    return console


def render(request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
    """`template` rendered in the request's language, with the session's CSRF token for its forms."""
    lang = language_of(request.cookies.get(LANG_COOKIE), request.headers.get("Accept-Language", ""))
    page = request.app[TEMPLATES_KEY].get_template(template).render(
        t=LABELS[lang], lang=lang, csrf=request.get(CSRF_KEY, ""), csrf_field=CSRF_FIELD, **context)
    return web.Response(status=status, text=page, content_type="text/html", charset="utf-8")


def _login_page(request: web.Request, why: str) -> web.Response:
    return render(request, "login.html", status=401, why=why)


async def _home(request: web.Request) -> web.Response:
    return web.Response(status=303, headers={"Location": "/memory"})


async def _unreachable(request: web.Request) -> web.Response:
    raise web.HTTPNotFound()


def _entries(text: str) -> list[MemoryEntryView]:
    from picoclaw.memory import is_superseded, long_term_entries

    return [MemoryEntryView(entry.heading, entry.text.split("\n", 1)[1].rstrip("\n") if "\n" in entry.text else "",
                            entry.line, is_superseded(entry.text)) for entry in long_term_entries(text)]


async def memory_page(request: web.Request) -> web.Response:
    """MEMORY.md's entries, newest first, a page at a time; with `q`, what a turn's search finds for it."""
    app = request.app[APP_KEY]
    store = app.workspace.store
    query = request.query.get("q", "").strip()[:500]
    hits: list[Any] = []
    if query:
        searcher = app.workspace.searcher
        limit = app.workspace.policy.current().retrieve_limit
        hits = await asyncio.to_thread(searcher.search, query, limit, include_notes=True)
    text = await asyncio.to_thread(store.read_long_term)
    entries = _entries(text)[::-1]
    pages = max(1, -(-len(entries) // PAGE_SIZE))
    try:
        number = min(max(1, int(request.query.get("page", "1"))), pages)
    except ValueError:
        number = 1
    shown = entries[(number - 1) * PAGE_SIZE:number * PAGE_SIZE]
    root = app.workspace.root
    results = [(hit.score, hit.block.path.relative_to(root).as_posix(), hit.block.start_line, hit.block.text)
               for hit in hits]
    return render(request, "memory.html", entries=shown, total=len(entries), page=number, pages=pages,
                  query=query, results=results, notice=request.query.get("notice", ""))


async def add_entry(request: web.Request) -> web.Response:
    """Append the form's text to MEMORY.md through the store (its lock, its backup rules)."""
    form = await request.post()
    content = str(form.get("content", "")).strip()
    if not content:
        return _back("empty_entry")
    if len(content) > MAX_ENTRY:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_ENTRY, actual_size=len(content))
    store = request.app[APP_KEY].workspace.store
    entry = await asyncio.to_thread(store.append_long_term, content)
    return _back("added" if entry.new else "already_there")


def _back(notice: str) -> web.Response:
    return web.Response(status=303, headers={"Location": f"/memory?notice={notice}"})


async def set_language(request: web.Request) -> web.Response:
    """Remember the language the page's switch asked for."""
    form = await request.post()
    lang = str(form.get("lang", ""))
    response = web.Response(status=303, headers={"Location": "/memory"})
    if lang in LANGUAGES:
        response.set_cookie(LANG_COOKIE, lang, httponly=True, samesite="Strict", path="/")
    return response


async def serve(app: App, host: str, port: int, *, announce: Any = print) -> None:
    """Run the console until cancelled, announcing its one-time login link once it listens."""
    gate = Gate.for_address(host, port)
    runner = web.AppRunner(make_console(app, gate), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        shown = f"[{host}]" if ":" in host else host
        announce(gate.login_url(f"http://{shown}:{port}"))
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


__all__ = ["COOKIE", "Gate", "make_console", "serve"]
