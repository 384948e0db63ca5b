"""The one rule for where an endpoint is: on this machine or its network ("local"), or on the internet.

Local: localhost, loopback, private, link-local and shared (100.64.0.0/10, Tailscale's) addresses, and names a
public DNS does not answer: single-label names ("gpu-box", from /etc/hosts or the router) and .local, .lan,
.internal, .home.arpa, .localhost, and Tailscale's MagicDNS .ts.net. A local endpoint is reached without the
environment's proxy (a proxy is for the internet) and, when it tells no context window, assumed small.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

# Names only this machine or its network resolve (mDNS, home routers, RFC 8375, cloud-internal DNS, tailnets).
LOCAL_SUFFIXES = (".localhost", ".local", ".lan", ".internal", ".home.arpa", ".ts.net")
# Carrier-grade NAT space, which Tailscale gives each machine of a tailnet (not "private" to ipaddress).
SHARED_NETWORK = ipaddress.ip_network("100.64.0.0/10")


def host_of(url: str) -> str:
    """The host of `url`, lower case, without a trailing dot ("" when it has none)."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:  # an unclosed "[" and the like: no host to speak of
        return ""
    return host.lower().rstrip(".")


def ip_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`host` as an IP address, or None when it is a name."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])  # an IPv6 zone ("fe80::1%eth0") is not the address
    except ValueError:
        return None


def is_local_host(url: str) -> bool:
    """Whether `url` points at this machine or its network (see the module docstring); False without a host."""
    host = host_of(url)
    if not host:
        return False
    if host == "localhost" or host.endswith(LOCAL_SUFFIXES):
        return True
    address = ip_address(host)
    if address is None:
        return "." not in host  # a single-label name: /etc/hosts or the local network's DNS
    if isinstance(address, ipaddress.IPv4Address) and address in SHARED_NETWORK:
        return True
    return address.is_loopback or address.is_private or address.is_link_local or address.is_unspecified


def is_internet_name(url: str) -> bool:
    """Whether `url`'s host is a DNS name on the internet: a dotted name that is not local, not an IP address."""
    host = host_of(url)
    return bool(host) and ip_address(host) is None and not is_local_host(url)
