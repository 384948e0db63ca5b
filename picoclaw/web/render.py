"""Rendering a console page: the request's language, its session's CSRF token, autoescaped templates."""

from __future__ import annotations

import os
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
from aiohttp import web

from picoclaw.web.labels import LABELS, LANG_COOKIE, language_of
from picoclaw.web.request_log import REASON_KEY
from picoclaw.web.security import CSRF_FIELD, CSRF_KEY

if TYPE_CHECKING:
    from picoclaw.app import App

HERE = Path(__file__).parent
APP_KEY: web.AppKey[App] = web.AppKey("picoclaw_app")
TEMPLATES_KEY: web.AppKey[jinja2.Environment] = web.AppKey("picoclaw_templates")


def templates(tz: tzinfo = UTC) -> jinja2.Environment:
    """The console's templates; autoescaping on, so whatever memory or a model wrote is shown as text. The
    `when` filter shows a stored time in `tz` (the configured zone), to the minute."""
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                                     undefined=jinja2.StrictUndefined)
    environment.filters["when"] = lambda value: local_time(value, tz)
    return environment


def local_time(value: object, tz: tzinfo) -> str:
    """An ISO time as stored ("2026-11-26T02:00:00.123456+00:00") in `tz` to the minute ("2026-11-26 10:00");
    a date, or text that is no time, as it is."""
    text = "" if value is None else str(value)
    if len(text) <= 10:
        return text
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return text
    if moment.tzinfo is not None:
        moment = moment.astimezone(tz)
    return f"{moment:%Y-%m-%d %H:%M}"


@web.middleware
async def storage_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """A storage that cannot do what a page or form asked (unreachable, a lock not free in time) is a one-line 503,
    the server's folders left out, never a 500 with a traceback in the log."""
    from picoclaw.storage import StorageError

    try:
        return await handler(request)
    except StorageError as exc:
        raise web.HTTPServiceUnavailable(text=f"{in_workspace(request, str(exc))}\n") from None


def language(request: web.Request) -> str:
    """The request's language: its cookie's, else the browser's."""
    return language_of(request.cookies.get(LANG_COOKIE), request.headers.get("Accept-Language", ""))


def render(request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
    """`template` rendered in the request's language, with the session's CSRF token for its forms. A refusal's
    `error` names files by their place in the workspace: the page never shows where the workspace is."""
    if context.get("error"):
        context["error"] = in_workspace(request, str(context["error"]))
        if status >= 400:
            request[REASON_KEY] = context["error"]  # the log line says why too
    lang = language(request)
    page = request.app[TEMPLATES_KEY].get_template(template).render(
        t=LABELS[lang], lang=lang, csrf=request.get(CSRF_KEY, ""), csrf_field=CSRF_FIELD,
        back=request.path_qs if request.method == "GET" else "", **context)
    return web.Response(status=status, text=page, content_type="text/html", charset="utf-8")


def in_workspace(request: web.Request, text: str) -> str:
    """`text` with every path inside the workspace written relative to it (memory/MEMORY.md), and the home
    folder as ~: a browser, maybe on another machine, has no business knowing the server's folders."""
    app = request.app[APP_KEY]
    for folder, shown in ((app.workspace.root, ""), (app.home, "~/")):
        text = text.replace(f"{folder}{os.sep}", shown)
    # The folders themselves, named without a path after them ("the memory documents of /data/ws: …").
    for folder, shown in ((app.workspace.root, "the workspace folder"), (app.home, "~")):
        text = text.replace(str(folder), shown)
    return text


def see_other(location: str) -> web.Response:
    """Where a form's change sends the browser next (so a reload does not post it again)."""
    return web.Response(status=303, headers={"Location": location})


def page_number(request: web.Request, pages: int) -> int:
    """The `page` query value held to 1..pages (1 when it is not a number)."""
    try:
        return min(max(1, int(request.query.get("page", "1"))), pages)
    except ValueError:
        return 1
