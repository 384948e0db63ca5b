"""The console's gate: who may ask, from which Host, and with which proof for a change.

A browser gets in through the one-time login link `picoclaw web` prints (as Jupyter's): the token is
exchanged for a session cookie (HttpOnly, SameSite=Strict) and taken out of the address bar by a redirect.
Scripts may send the token as `Authorization: Bearer …` instead; it is never accepted in any other URL.
Every response carries a Content-Security-Policy without inline script, so an entry that smuggled markup
past the templates' escaping still could not run.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

log = logging.getLogger(__name__)

COOKIE = "picoclaw_console"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OPEN_PREFIXES = ("/static/",)  # stylesheets and scripts hold no data: the login page needs them too

HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

CSRF_KEY: web.RequestKey[str] = web.RequestKey("picoclaw_csrf", str)  # the session's CSRF token, for the pages
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LoginPage = Callable[[web.Request, str], web.StreamResponse]  # (request, why: "" or "link_refused")


@dataclass
class Gate:
    """The login token, the sessions it opened, and the Host names this console answers to."""

    hosts: frozenset[str]
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    link_used: bool = False
    sessions: dict[str, str] = field(default_factory=dict)  # session id → its CSRF token
    # Browsers keep cookies by host, not port: two consoles on one machine need two names.
    cookie: str = COOKIE

    @classmethod
    def for_address(cls, host: str, port: int) -> Gate:
        """A gate answering to `host:port` as a browser writes it ([…] around an IPv6 address); on loopback to
        every loopback name, on a wildcard address (0.0.0.0, ::) to this machine's names and addresses."""
        names = {host}
        if host in ("127.0.0.1", "localhost", "::1"):
            names |= {"127.0.0.1", "localhost", "::1"}
        elif host in ("0.0.0.0", "::", ""):
            names = _machine_names()
        shown = {f"[{name}]" if ":" in name else name for name in names}
        return cls(frozenset(f"{name}:{port}" for name in shown), cookie=f"{COOKIE}_{port}")

    def login_url(self, base: str) -> str:
        return f"{base}/login?token={self.token}"

    def open_session(self) -> tuple[str, str]:
        """A new (session id, CSRF token)."""
        session, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        self.sessions[session] = csrf
        return session, csrf

    def csrf_of(self, request: web.Request) -> str | None:
        """The CSRF token of the request's session; None without a valid session cookie."""
        session = request.cookies.get(self.cookie)
        return self.sessions.get(session) if session else None

    def bearer(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        return header.startswith("Bearer ") and _same(header[7:], self.token)


def _same(given: str, expected: str) -> bool:
    """A constant-time comparison that any header text can go through (a stray byte is just "not the same")."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode("utf-8", "surrogateescape"))


def _machine_names() -> set[str]:
    """The names and addresses a browser may use for this machine (a wildcard listen's Host check)."""
    import socket

    names = {"127.0.0.1", "localhost", "::1", socket.gethostname(), socket.getfqdn()}
    try:
        names |= set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return names


def secured(response: web.StreamResponse) -> web.StreamResponse:
    """`response` with the console's security headers (a stream calls this before it starts)."""
    response.headers.update(HEADERS)
    return response


def middleware(gate: Gate, login_page: LoginPage) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The aiohttp middleware that applies `gate` to every request."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await _checked(gate, login_page, request, handler)
        except web.HTTPException as exc:  # a refusal raised by a handler (400, 404, 413, 503 …) or the router
            response = web.Response(status=exc.status, text=exc.text, content_type="text/plain")
        except UnicodeDecodeError:  # a form whose bytes are not UTF-8
            response = web.Response(status=400, text="The form's text is not UTF-8; nothing was changed.\n")
        if not response.prepared:  # a stream sent its headers when it began: `secured` gave it these
            secured(response)
        return response

    return guard


async def _checked(gate: Gate, login_page: LoginPage, request: web.Request, handler: Handler) -> web.StreamResponse:
    # DNS rebinding: a page elsewhere that points its own name at 127.0.0.1 still sends its own Host.
    if request.host not in gate.hosts:
        log.warning("console: refused a request for Host %r", request.host[:100])
        return web.Response(status=421, text="This console does not answer to that host name.\n")
    if request.path.startswith(OPEN_PREFIXES):
        return await handler(request)
    if request.path == "/login":
        return _log_in(gate, login_page, request)
    csrf = gate.csrf_of(request)
    if csrf is None and not gate.bearer(request):
        return login_page(request, "")
    request[CSRF_KEY] = csrf or ""
    if request.method not in SAFE_METHODS and csrf is not None:
        # A cookie rides along with any request the browser sends; only our pages know the session's token.
        given = request.headers.get(CSRF_HEADER)
        if given is None and request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
            given = str((await request.post()).get(CSRF_FIELD, ""))
        if not given or not _same(given, csrf):
            return web.Response(status=403, text="Refused: this change did not come from a console page (no CSRF "
                                                 "token). Reload the page and try again.\n")
    return await handler(request)


def _log_in(gate: Gate, login_page: LoginPage, request: web.Request) -> web.StreamResponse:
    if request.method != "GET":  # a link preview's HEAD must not use up the one-time link
        return login_page(request, "")
    given = request.query.get("token", "")
    if gate.link_used or not given or not _same(given, gate.token):
        return login_page(request, "link_refused")
    gate.link_used = True  # one-time: a link left in a shell history or a screenshot opens nothing later
    session, _ = gate.open_session()
    # A redirect takes the token out of the address bar and the history.
    response = web.Response(status=303, headers={"Location": "/"})
    response.set_cookie(gate.cookie, session, httponly=True, samesite="Strict", path="/")
    return response

