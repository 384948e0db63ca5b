"""The network guard conftest.py installs: leaving the machine fails at once, loopback still works."""

from __future__ import annotations

import _socket
import asyncio
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import network_guard
from tests.fakes.network_guard import NameLookupBlocked, NetworkAccessBlocked

PRIVATE = ("10.255.255.1", 9)  # unroutable: without the guard a connect would hang until its timeout
PUBLIC = ("93.184.216.34", 443)
# Seconds: a real attempt at PRIVATE takes the whole socket timeout (30 s), a refusal by the guard next to
# nothing; the bound is far from both, so a busy machine's slowness cannot fail it.
IMMEDIATELY = 5.0


def caught(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """`exc` or the first exception of `kind` in its cause / context chain."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP socket listening on 127.0.0.1 that echoes one message per connection, on a thread."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.05)  # accept() wakes up to see the test is over
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                conn.sendall(b"echo: " + conn.recv(100))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server
    done.set()
    thread.join(5)
    server.close()


def test_the_guard_is_installed_for_the_whole_run() -> None:
    assert network_guard.installed()
    assert socket.socket.connect is not _socket.socket.connect
    assert socket.getaddrinfo.__wrapped__ is not None  # type: ignore[attr-defined]


# -- leaving the machine ---------------------------------------------------------------------------


@pytest.mark.parametrize(("address", "message"), [
    (PRIVATE, "test tried to reach the network: ('10.255.255.1', 9)"),
    (PUBLIC, "test tried to reach the network: ('93.184.216.34', 443)"),
], ids=["private", "public"])
def test_connect_outside_fails_at_once_naming_the_address(address: tuple[str, int], message: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)  # what a real attempt at PRIVATE would wait
        started = time.monotonic()
        with pytest.raises(NetworkAccessBlocked) as error:
            sock.connect(address)
        assert time.monotonic() - started < IMMEDIATELY
    assert str(error.value) == message


def test_connect_ex_and_create_connection_fail_too() -> None:
    with (socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock,
          pytest.raises(NetworkAccessBlocked, match=r"\('93\.184\.216\.34', 443\)")):
        sock.connect_ex(PUBLIC)
    started = time.monotonic()
    with pytest.raises(NetworkAccessBlocked, match=r"\('10\.255\.255\.1', 9\)"):
        socket.create_connection(PRIVATE, timeout=30)
    assert time.monotonic() - started < IMMEDIATELY
    with (socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock,
          pytest.raises(NetworkAccessBlocked, match="2001:db8::1")):
        sock.connect(("2001:db8::1", 443, 0, 0))


def test_a_host_name_in_connect_is_refused_without_a_lookup() -> None:
    with (socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock,
          pytest.raises(NetworkAccessBlocked, match=r"\('example\.com', 80\)")):
        sock.connect(("example.com", 80))


@pytest.mark.parametrize("lookup", [
    lambda: socket.getaddrinfo("example.com", 443),
    lambda: socket.getaddrinfo(host="example.com", port=443, type=socket.SOCK_STREAM),
    lambda: socket.gethostbyname("example.com"),
    lambda: socket.gethostbyname_ex("example.com"),
], ids=["getaddrinfo", "getaddrinfo by keyword", "gethostbyname", "gethostbyname_ex"])
def test_looking_up_another_host_fails_at_once(lookup: Callable[[], Any]) -> None:
    started = time.monotonic()
    with pytest.raises(NameLookupBlocked, match="test tried to reach the network: .*example.com") as error:
        lookup()
    assert time.monotonic() - started < IMMEDIATELY
    # The same error as a connect, and what resolvers raise when there is no DNS, so offline-tolerant
    # code (the tiktoken fallback) handles it like a machine without network.
    assert isinstance(error.value, NetworkAccessBlocked) and isinstance(error.value, socket.gaierror)


def test_getaddrinfo_names_host_and_port() -> None:
    with pytest.raises(NameLookupBlocked) as error:
        socket.getaddrinfo("example.com", 443)
    assert str(error.value) == "test tried to reach the network: ('example.com', 443)"


def test_client_libraries_are_stopped_too() -> None:
    # urllib (a name lookup first).
    with pytest.raises(urllib.error.URLError) as error:
        urllib.request.urlopen("http://example.com/", timeout=30)
    assert isinstance(error.value.reason, NameLookupBlocked)

    # asyncio's own connect path (non-blocking sockets, as httpx/anyio and aiohttp use).
    async def open_public() -> None:
        await asyncio.wait_for(asyncio.open_connection(*PUBLIC), timeout=30)

    started = time.monotonic()
    with pytest.raises(OSError) as async_error:
        asyncio.run(open_public())
    assert time.monotonic() - started < IMMEDIATELY
    assert caught(async_error.value, NetworkAccessBlocked) is not None, repr(async_error.value)


def test_tiktoken_finds_an_empty_cache_and_cannot_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tiktoken

    # A folder of its own: the run-wide one (conftest.py) holds picoclaw's marker once any test has counted tokens.
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    assert list(cache.iterdir()) == []
    started = time.monotonic()
    with pytest.raises(Exception) as error:
        tiktoken.get_encoding("o200k_base")
    assert time.monotonic() - started < IMMEDIATELY
    assert caught(error.value, NameLookupBlocked) is not None, repr(error.value)
    assert list(cache.iterdir()) == []


# -- staying on the machine ------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_loopback_connections_still_work(listener: socket.socket, host: str) -> None:
    port = listener.getsockname()[1]
    with socket.create_connection((host, port), timeout=5) as conn:
        conn.sendall(b"hi")
        assert conn.recv(100) == b"echo: hi"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        assert sock.connect_ex(("127.0.0.1", port)) == 0
        sock.sendall(b"again")
        assert sock.recv(100) == b"echo: again"


def test_loopback_lookups_and_a_closed_local_port_behave_as_usual(listener: socket.socket) -> None:
    assert any(info[4][0] in ("127.0.0.1", "::1") for info in socket.getaddrinfo("localhost", 80))
    assert socket.getaddrinfo("10.255.255.1", 9)  # an IP literal needs no lookup; connecting is checked
    assert socket.gethostbyname("127.0.0.1") == "127.0.0.1"
    with socket.socket() as probe:  # a port that was free a moment ago and has no listener now
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", closed)) != 0  # refused, as without the guard


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 on this machine")
def test_ipv6_loopback_still_works() -> None:
    try:
        server = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        server.bind(("::1", 0))
    except OSError:
        pytest.skip("::1 is not configured on this machine")
    with server:
        server.listen()
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(("::1", server.getsockname()[1]))


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no AF_UNIX sockets here")
def test_unix_sockets_still_work(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(path)
            conn, _ = server.accept()
            with conn:
                client.sendall(b"ok")
                assert conn.recv(10) == b"ok"


def test_uninstall_restores_the_stdlib() -> None:
    try:
        network_guard.uninstall()
        assert not network_guard.installed()
        assert socket.socket.connect is _socket.socket.connect
        assert socket.socket.connect_ex is _socket.socket.connect_ex
        assert not hasattr(socket.getaddrinfo, "__wrapped__")
    finally:
        network_guard.install()
    assert network_guard.installed()
    with socket.socket() as sock, pytest.raises(NetworkAccessBlocked):
        sock.connect(PRIVATE)
