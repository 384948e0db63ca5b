"""Keeps the tests off the network: connects and name lookups that would leave the machine fail at once.

`install()` wraps the stdlib socket layer that every client library ends in (httpx, aiohttp, requests
via urllib3, asyncio's own connections):

* `socket.socket.connect` and `connect_ex` raise `NetworkAccessBlocked` for any address that is not
  loopback (127.0.0.0/8, ::1, "localhost") and not an AF_UNIX path. `socket.create_connection` and
  SSL sockets connect through `socket.socket.connect`, so they are covered too.
* `socket.getaddrinfo`, `gethostbyname` and `gethostbyname_ex` raise `NameLookupBlocked` (a subclass
  of both `NetworkAccessBlocked` and `socket.gaierror`) for any host name other than "localhost", so a
  lookup never waits for a DNS server. IP literals need no lookup and pass; connecting to them is what
  is checked.

The errors are OSErrors, like a machine without network: code written to survive being offline (the
tiktoken fallback in picoclaw/tokens.py) still does, and the message names the address that was tried,
e.g. "test tried to reach the network: ('93.184.216.34', 443)".
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from typing import Any

__all__ = ["NameLookupBlocked", "NetworkAccessBlocked", "install", "installed", "is_local_address", "is_loopback_host",
           "uninstall"]


class NetworkAccessBlocked(OSError):
    """A test tried to connect to (or look up) something that is not this machine."""


class NameLookupBlocked(NetworkAccessBlocked, socket.gaierror):
    """A test tried to resolve a host name other than localhost (it would ask a DNS server)."""


LOCAL_NAMES = frozenset({"localhost", "localhost.", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_AF_UNIX = getattr(socket, "AF_UNIX", None)

# name -> (owner, original attribute or None when it was inherited), filled while installed.
_saved: dict[str, tuple[Any, Any]] = {}


def _host_text(host: Any) -> str | None:
    if isinstance(host, bytes):
        try:
            return host.decode("ascii")
        except UnicodeDecodeError:
            return None
    return host if isinstance(host, str) else None


def is_loopback_host(host: Any) -> bool:
    """True for "localhost" and for IP literals in 127.0.0.0/8 or ::1 (also written IPv4-mapped)."""
    text = _host_text(host)
    if text is None:
        return False
    if text.lower() in LOCAL_NAMES:
        return True
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def is_local_address(family: int, address: Any) -> bool:
    """True when connecting a socket of `family` to `address` stays on this machine."""
    if _AF_UNIX is not None and family == _AF_UNIX:
        return True  # a filesystem path or an abstract socket name
    if family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple) and address:
        return is_loopback_host(address[0])
    return False


def _message(address: Any) -> str:
    return f"test tried to reach the network: {address!r}"


def _guard_connect(original: Any) -> Any:
    @functools.wraps(original)
    def connect(self: socket.socket, address: Any, /) -> Any:
        if not is_local_address(self.family, address):
            raise NetworkAccessBlocked(_message(address))
        return original(self, address)

    return connect


def _guard_lookup(original: Any, *, takes_port: bool) -> Any:
    @functools.wraps(original)
    def lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None and not is_loopback_host(host) and not _is_ip_literal(_host_text(host)):
            name = _host_text(host) or host
            port = args[0] if args else kwargs.get("port")
            raise NameLookupBlocked(_message((name, port) if takes_port else name))
        return original(host, *args, **kwargs)

    return lookup


def _is_ip_literal(text: str | None) -> bool:
    if text is None:
        return False
    if text == "":
        return True  # getaddrinfo("") is the wildcard address, as for binding
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def installed() -> bool:
    return bool(_saved)


def install() -> None:
    """Put the guard in place (idempotent)."""
    if _saved:
        return
    for name in ("connect", "connect_ex"):
        _saved[name] = (socket.socket, socket.socket.__dict__.get(name))
        setattr(socket.socket, name, _guard_connect(getattr(socket.socket, name)))
    for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex"):
        _saved[name] = (socket, getattr(socket, name))
        setattr(socket, name, _guard_lookup(getattr(socket, name), takes_port=name == "getaddrinfo"))


def uninstall() -> None:
    """Restore the stdlib functions exactly as they were."""
    for name, (owner, original) in _saved.items():
        if original is None:
            delattr(owner, name)  # it was inherited from _socket.socket
        else:
            setattr(owner, name, original)
    _saved.clear()
