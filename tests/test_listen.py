"""`--listen` reads alike in `picoclaw web` and `picoclaw telegram`: HOST:PORT and [IPv6]:PORT (and, for the
console, a bare HOST with --port); a bad value is one line naming the forms expected."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx2
import pytest

from tests.fakes.console import free_port, login_link_of, picoclaw_web, stopped


@pytest.mark.parametrize(("listen", "port", "expected"), [
    ("127.0.0.1:18999", None, ("127.0.0.1", 18999)),
    ("[::1]:18999", None, ("::1", 18999)),
    ("localhost:18999", 18999, ("localhost", 18999)),  # the same port twice is no conflict
    ("0.0.0.0", 8080, ("0.0.0.0", 8080)),  # a bare host, with --port, as before
    ("127.0.0.1", None, ("127.0.0.1", 18790)),
    ("::1", None, ("::1", 18790)),
    ("[::1]", 8080, ("::1", 8080)),
])
def test_the_console_reads_host_port_and_a_bare_host(listen: str, port: int | None, expected: tuple[str, int]) -> None:
    from picoclaw.cli.web import console_address

    assert console_address(listen, port) == expected


@pytest.mark.parametrize(("arguments", "said"), [
    (["--listen", "127.0.0.1:18999:18790"], "is not HOST, HOST:PORT or [IPv6]:PORT"),
    (["--listen", "127.0.0.1:99999"], "is not HOST, HOST:PORT or [IPv6]:PORT"),
    (["--listen", "[nope]:80"], "is not HOST, HOST:PORT or [IPv6]:PORT"),
    (["--listen", "bad host"], "is not HOST, HOST:PORT or [IPv6]:PORT"),
    (["--listen", "127.0.0.1:8080", "--port", "9090"], "says port 8080 and --port 9090: give the port once"),
    (["--port", "0"], "is not a TCP port"),
])
def test_a_bad_console_address_is_one_line(home: Path, capsys: pytest.CaptureFixture[str], arguments: list[str],
                                           said: str) -> None:
    from picoclaw.cli import main

    assert main(["web", *arguments]) == 2
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("picoclaw: error: ") and said in err, err


@pytest.mark.slow
@pytest.mark.parametrize("family", ["127.0.0.1:{port}", "[::1]:{port}"])
def test_picoclaw_web_listens_on_host_port(home: Path, family: str) -> None:
    v6 = family.startswith("[")
    port = free_port(socket.AF_INET6, "::1") if v6 else free_port()
    process = picoclaw_web(home, "--listen", family.format(port=port))
    try:
        link = login_link_of(process)
        assert link.startswith(f"http://{'[::1]' if v6 else '127.0.0.1'}:{port}/login?token=")
        with httpx2.Client(follow_redirects=False, timeout=60) as client:
            assert client.get(link).status_code == 303
    finally:
        _, err = stopped(process)
    assert process.returncode == 0 and "Traceback" not in err, err


@pytest.mark.parametrize(("listen", "expected"), [("[::1]:8443", ("::1", 8443)),
                                                  ("127.0.0.1:8443", ("127.0.0.1", 8443)),
                                                  ("0.0.0.0:80", ("0.0.0.0", 80))])
def test_the_telegram_webhook_takes_host_port_and_ipv6(listen: str, expected: tuple[str, int]) -> None:
    from picoclaw.cli import build_parser
    from picoclaw.cli.telegram import webhook_settings
    from picoclaw.config import TelegramConfig, listen_address

    args = build_parser("telegram").parse_args(["telegram", "--webhook", "https://bot.example.com/tg", "--listen",
                                                listen])
    hook = webhook_settings(TelegramConfig(enabled=True), args).webhook
    assert hook.listen == listen and listen_address(hook.listen) == expected


@pytest.mark.parametrize("listen", ["8443", "::1:8443", "[::1]", "host:port", "127.0.0.1:70000"])
def test_a_bad_telegram_listen_is_one_line(home: Path, capsys: pytest.CaptureFixture[str], listen: str) -> None:
    from picoclaw.cli import main

    assert main(["telegram", "--webhook", "https://bot.example.com/tg", "--listen", listen]) == 2
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and "must be host:port such as 0.0.0.0:8080 or [::]:8080" in err, err


@pytest.mark.slow
def test_two_consoles_on_one_port_but_two_hosts_keep_a_token_file_each(home: Path) -> None:
    port = free_port()
    four = picoclaw_web(home, "--listen", f"127.0.0.1:{port}")
    try:
        login_link_of(four)
        six = picoclaw_web(home, "--listen", f"[::1]:{port}")
        try:
            login_link_of(six)
            files = sorted(home.glob("console-*.token"))
            assert [path.name for path in files] == [f"console-127.0.0.1-{port}.token", f"console-__1-{port}.token"]
            assert len({path.read_text(encoding="utf-8") for path in files}) == 2  # neither overwrote the other's
        finally:
            stopped(six)
    finally:
        stopped(four)
    assert not any(home.glob("console-*.token"))  # each removed its own
