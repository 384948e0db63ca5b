"""The console's gate: who may ask, from which Host, and with which proof for a change.

Two secrets, for two kinds of client. A browser gets in through a one-time login link (as Jupyter's): its
token is exchanged for a session cookie (HttpOnly, SameSite=Strict) and taken out of the address bar by a
redirect, and from then on opens nothing, in any form; `picoclaw web --new-link` asks the running console for
another. Scripts send the script token (kept in a file only the user can read, see token_file.py) as
`Authorization: Bearer …`; it is never accepted in a URL. Every response carries a Content-Security-Policy
without inline script, so an entry that smuggled markup past the templates' escaping still could not run.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from picoclaw.web.forms import check_form
from picoclaw.web.request_log import REASON_KEY, log_refusal

log = logging.getLogger(__name__)

COOKIE = "picoclaw_console"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OPEN_PREFIXES = ("/static/",)  # stylesheets and scripts hold no data: the login page needs them too
LOGIN_PATH = "/login"

HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

CSRF_KEY: web.RequestKey[str] = web.RequestKey("picoclaw_csrf", str)  # the session's CSRF token, for the pages
SCRIPT_KEY: web.RequestKey[bool] = web.RequestKey("picoclaw_script", bool)  # came with the script token
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LoginPage = Callable[[web.Request, str], web.StreamResponse]  # (request, why: "" or "link_refused")


def _new_token() -> str:
    return secrets.token_urlsafe(32)


@dataclass
class Gate:
    """The script token, the one login link that may still be used, the sessions links opened, and the Host
    names this console answers to."""

    hosts: frozenset[str]
    script_token: str = field(default_factory=_new_token)
    link_token: str | None = None  # None: no link opens anything (used, or none made yet)
    sessions: dict[str, str] = field(default_factory=dict)  # session id → its CSRF token
    # Browsers keep cookies by host, not port: two consoles on one machine need two names.
    cookie: str = COOKIE
    base: str = ""  # the console's origin as its links show it, http://host:port

    @classmethod
    def for_address(cls, host: str, port: int) -> Gate:
        """A gate answering to `host:port` as a browser writes it ([…] around an IPv6 address); on loopback to
        every loopback name, on a wildcard address (0.0.0.0, ::) to this machine's names and addresses."""
        names, linked = {host}, host
        if host in ("127.0.0.1", "localhost", "::1"):
            names |= {"127.0.0.1", "localhost", "::1"}
        elif host in ("0.0.0.0", "::", ""):
            # No browser may ask for 0.0.0.0 (it is no one's name): links name the machine instead.
            names, linked = _machine_names(), socket.gethostname()
        shown = {_bracketed(name) for name in names}
        return cls(frozenset(f"{name}:{port}" for name in shown), cookie=f"{COOKIE}_{port}",
                   base=f"http://{_bracketed(linked)}:{port}")

    def login_url(self, base: str | None = None) -> str:
        """A new one-time login link (at `base`, else the console's own origin): every earlier link opens
        nothing from now on."""
        self.link_token = _new_token()
        return f"{base if base is not None else self.base}{LOGIN_PATH}?token={self.link_token}"

    def use_link(self, given: str) -> bool:
        """Whether `given` is the link's token, which it uses up."""
        if self.link_token is None or not given or not _same(given, self.link_token):
            return False
        self.link_token = None  # one-time: a link left in a shell history or a screenshot opens nothing later
        return True

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
        """Whether the request carries the script token. The link's token sent this way is refused and used
        up: a link is for a browser, once, and one seen anywhere else has leaked."""
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            return False
        given = header[7:]
        if _same(given, self.script_token):
            return True
        if self.use_link(given):
            log.warning("console: the login link's token was sent as a Bearer token; that link opens nothing "
                        "now (scripts use the token file)")
        request[REASON_KEY] = "a Bearer token that is not the script token"
        return False


GATE_KEY: web.AppKey[Gate] = web.AppKey("picoclaw_gate", Gate)


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _same(given: str, expected: str) -> bool:
    """A constant-time comparison that any header text can go through (a stray byte is just "not the same")."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode("utf-8", "surrogateescape"))


def _machine_names() -> set[str]:
    """The names and addresses a browser may use for this machine (a wildcard listen's Host check)."""
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
    """The aiohttp middleware that applies `gate` to every request, and logs each refusal in one line."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await _checked(gate, login_page, request, handler)
        except web.HTTPException as exc:  # a refusal raised by a handler (400, 404, 413, 503 …) or the router
            response = web.Response(status=exc.status, text=exc.text, content_type="text/plain")
        log_refusal(request, response)
        if not response.prepared:  # a stream sent its headers when it began: `secured` gave it these
            secured(response)
        return response

    return guard


async def _checked(gate: Gate, login_page: LoginPage, request: web.Request, handler: Handler) -> web.StreamResponse:
    # DNS rebinding: a page elsewhere that points its own name at 127.0.0.1 still sends its own Host.
    if request.host not in gate.hosts:
        request[REASON_KEY] = f"a request for Host {request.host[:100]!r}"
        return web.Response(status=421, text="This console does not answer to that host name.\n")
    if request.path.startswith(OPEN_PREFIXES):
        return await handler(request)
    if request.path == LOGIN_PATH:
        return _log_in(gate, login_page, request)
    csrf = gate.csrf_of(request)
    script = csrf is None and gate.bearer(request)
    if csrf is None and not script:
        return login_page(request, "")
    request[CSRF_KEY] = csrf or ""
    request[SCRIPT_KEY] = script
    if request.method not in SAFE_METHODS:
        await check_form(request)  # before anything reads it: a form that is not UTF-8 changes nothing
    if request.method not in SAFE_METHODS and csrf is not None:
        # A cookie rides along with any request the browser sends; only our pages know the session's token.
        given = request.headers.get(CSRF_HEADER)
        if given is None and request.content_type in ("", "application/x-www-form-urlencoded"):
            given = str((await request.post()).get(CSRF_FIELD, ""))
        if not given or not _same(given, csrf):
            return web.Response(status=403, text="Refused: this change did not come from a console page (no CSRF "
                                                 "token). Reload the page and try again.\n")
    return await handler(request)


def _log_in(gate: Gate, login_page: LoginPage, request: web.Request) -> web.StreamResponse:
    if request.method != "GET":  # a link preview's HEAD must not use up the one-time link
        return login_page(request, "")
    if not gate.use_link(request.query.get("token", "")):
        request[REASON_KEY] = "a login link that is wrong or was already used"
        return login_page(request, "link_refused")
    session, _ = gate.open_session()
    # A redirect takes the token out of the address bar and the history.
    response = web.Response(status=303, headers={"Location": "/"})
    response.set_cookie(gate.cookie, session, httponly=True, samesite="Strict", path="/")
    return response
