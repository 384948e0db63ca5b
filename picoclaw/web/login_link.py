"""A new login link for a running console, no restart: `POST /login/new` with the script token, from this
machine only, answers a fresh one-time link (every earlier link opens nothing from then on). `ask_for_link` is
the other side of it, what `picoclaw web --new-link` runs."""

from __future__ import annotations

import ipaddress
import logging

from aiohttp import web

from picoclaw.errors import PicoclawError
from picoclaw.web.security import GATE_KEY, SCRIPT_KEY

log = logging.getLogger(__name__)

NEW_LINK_PATH = "/login/new"
WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}  # a wildcard listen is reached on loopback


class LinkError(PicoclawError):
    """No new link: no console answered, or it refused; one line saying which."""


async def new_link(request: web.Request) -> web.Response:
    """{"link": a new login link}, for the script token from this machine; 403 otherwise."""
    if not request.get(SCRIPT_KEY):  # a browser's session may not mint links: they are handed out by the owner
        raise web.HTTPForbidden(text="A new login link needs the script token as Authorization: Bearer (run "
                                     "`picoclaw web --new-link`).\n")
    if not _from_this_machine(request):
        raise web.HTTPForbidden(text="A new login link is made only for a request from this machine.\n")
    link = request.app[GATE_KEY].login_url()
    log.info("console: a new login link was made; earlier ones open nothing now")  # never the link itself
    return web.json_response({"link": link})


def _from_this_machine(request: web.Request) -> bool:
    """Whether the peer is this machine: a loopback address, or the very address it connected to."""
    transport = request.transport
    local = transport.get_extra_info("sockname") if transport is not None else None
    try:
        peer = ipaddress.ip_address(request.remote or "")
    except ValueError:
        return False
    if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
        peer = peer.ipv4_mapped
    return peer.is_loopback or (local is not None and str(peer) == str(local[0]))


def ask_for_link(host: str, port: int, token: str) -> str:
    """A new login link from the console listening on `host:port`; LinkError in one line when there is none."""
    import httpx2

    shown = WILDCARDS.get(host, host)
    url = f"http://{f'[{shown}]' if ':' in shown else shown}:{port}{NEW_LINK_PATH}"
    try:
        # trust_env off: a proxy from the environment must never carry the script token elsewhere
        with httpx2.Client(trust_env=False, timeout=30) as client:
            response = client.post(url, headers={"Authorization": f"Bearer {token}"})
    except httpx2.HTTPError as exc:
        raise LinkError(f"no console answers at {url} ({exc}): is `picoclaw web` running there?") from None
    if response.status_code == 401:
        raise LinkError(f"the console at {url} does not know the token in the token file (is it another "
                        "console's file, or one from before a restart?)")
    if response.status_code != 200:
        said = response.text.strip().split("\n", 1)[0][:200] or response.reason_phrase
        raise LinkError(f"the console at {url} refused ({response.status_code}): {said}")
    try:
        link = response.json()["link"]
    except (ValueError, KeyError, TypeError):
        raise LinkError(f"the console at {url} answered something else than a link") from None
    if not isinstance(link, str):
        raise LinkError(f"the console at {url} answered something else than a link")
    return link
