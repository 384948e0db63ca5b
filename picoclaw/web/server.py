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
    console.router.add_get("/why", conversations_page)
    console.router.add_get("/why/conversation", conversation_page)
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


@dataclass(frozen=True)
class TurnView:
    """A user turn of a conversation with its record of why, and the reply's token counts."""

    id: int
    text: str
    why: dict[str, Any] | None
    prompt_tokens: int | None
    cached_tokens: int | None


@dataclass(frozen=True)
class Bar:
    """One reply's bars in the prompt-cache chart (SVG units)."""

    x: float
    prompt_height: float
    cached_height: float
    label: str


CHART_WIDTH, CHART_HEIGHT = 600, 160
TURNS_PER_PAGE = 50


def _transcripts(app: App) -> dict[str, Path]:
    """The workspace's transcripts by their name under the sessions folder (archived ones as archive/…)."""
    sessions = app.workspace.sessions()
    folder = sessions.folder
    return {path.relative_to(folder).as_posix(): path for path in sessions.log.transcripts()}


def _session_key(name: str) -> str:
    from urllib.parse import unquote

    return unquote(name.rsplit("/", 1)[-1].removesuffix(".jsonl"))


async def conversations_page(request: web.Request) -> web.Response:
    """Every conversation of the workspace (REPL, Telegram, web), newest first."""
    app = request.app[APP_KEY]
    found = await asyncio.to_thread(_transcripts, app)
    sessions = app.workspace.sessions()
    rows = []
    for name, path in found.items():
        modified = await asyncio.to_thread(sessions.modified, path)
        rows.append((modified, name, _session_key(name), name.startswith("archive/")))
    rows.sort(reverse=True)
    return render(request, "conversations.html", rows=[(name, key, archived) for _, name, key, archived in rows])


async def conversation_page(request: web.Request) -> web.Response:
    """One conversation's user turns, newest first, each with what memory it carried and why."""
    app = request.app[APP_KEY]
    name = request.query.get("name", "")
    found = await asyncio.to_thread(_transcripts, app)
    if name not in found:  # only names the storage lists: no path from the request ever reaches the disk
        raise web.HTTPNotFound(text="No such conversation.\n")
    session = await asyncio.to_thread(app.workspace.sessions().read, found[name])
    turns = _turns(session.messages)
    pages = max(1, -(-len(turns) // TURNS_PER_PAGE))
    try:
        number = min(max(1, int(request.query.get("page", "1"))), pages)
    except ValueError:
        number = 1
    newest_first = turns[::-1]
    return render(request, "conversation.html", name=name, key=_session_key(name), turns=newest_first[
        (number - 1) * TURNS_PER_PAGE:number * TURNS_PER_PAGE], page=number, pages=pages, bars=_chart(turns),
        chart_width=CHART_WIDTH, chart_height=CHART_HEIGHT, messages=len(session.messages))


def _turns(messages: list[Any]) -> list[TurnView]:
    """User messages paired with the token counts of the last reply before the next user message."""
    turns: list[TurnView] = []
    for message in messages:
        role = message.message.get("role")
        if role == "user":
            turns.append(TurnView(message.id, str(message.message.get("content") or ""), _why(message.why), None,
                                  None))
        elif role == "assistant" and turns and message.prompt_tokens is not None:
            last = turns[-1]
            turns[-1] = TurnView(last.id, last.text, last.why, message.prompt_tokens, message.cached_tokens)
    return turns


def _why(raw: dict[str, Any] | None) -> dict[str, Any] | None:
    """A turn's record of why, with every field the page reads (a hand-edited transcript may lack some)."""
    if raw is None:
        return None
    items = []
    for item in raw.get("items") or []:
        if not isinstance(item, dict):
            continue
        lines = item.get("lines")
        score = item.get("score")
        items.append({"found_by": str(item.get("found_by", "")), "path": str(item.get("path", "")),
                      "score": float(score) if isinstance(score, int | float) else None,
                      "lines": lines if isinstance(lines, list) and len(lines) == 2 else ["?", "?"],
                      "text": str(item.get("text", ""))})
    policy = raw.get("policy")
    query = raw.get("query")
    return {"search": str(raw.get("search", "")), "query": query if isinstance(query, str) else None,
            "items": items, "policy": policy if isinstance(policy, dict) else {}}


def _chart(turns: list[TurnView]) -> list[Bar]:
    """Bars of prompt and cached tokens for the turns whose reply reported them (the newest 100)."""
    measured = [turn for turn in turns if turn.prompt_tokens is not None][-100:]
    top = max((turn.prompt_tokens or 0 for turn in measured), default=0) or 1
    step = CHART_WIDTH / max(len(measured), 1)
    return [Bar(round(n * step, 1), round((turn.prompt_tokens or 0) / top * (CHART_HEIGHT - 10), 1),
                round((turn.cached_tokens or 0) / top * (CHART_HEIGHT - 10), 1),
                f"#{turn.id}: {turn.prompt_tokens} / {turn.cached_tokens or 0}") for n, turn in enumerate(measured)]


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
