"""The console's two secrets: a login link opens the console once and then nothing, in any form (as a Bearer
token too); scripts use the script token from a file only the user can read; `picoclaw web --new-link` gets a
new link from the running console without a restart."""

from __future__ import annotations

import re
import signal
import stat
from pathlib import Path

import httpx2
import pytest

from tests.fakes.console import Console, csrf_of, free_port, logged_in, login_link_of, picoclaw_web, stopped


def anonymous(console: Console) -> httpx2.Client:
    return httpx2.Client(base_url=console.base, follow_redirects=False, timeout=60)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_used_link_opens_nothing_again_not_even_as_a_bearer_token(console: Console) -> None:
    store = console.app.workspace.store
    store.append_long_term("My locker code is 4711; 我的储物柜密码是 4711")
    link = console.gate.login_url(console.base)
    token = link.split("token=", 1)[1]
    assert anonymous(console).get(link).status_code == 303  # used once, by a browser
    before = store.long_term_path.read_bytes()
    client = anonymous(console)
    page = client.get("/memory", headers=bearer(token))
    assert page.status_code == 401 and "4711" not in page.text
    for content in ("forged entry", "伪造的条目"):  # a change without a CSRF token, as a script's would be
        refused = client.post("/memory/entries", data={"content": content}, headers=bearer(token))
        assert refused.status_code == 401
    assert client.get(link).status_code == 401
    assert store.long_term_path.read_bytes() == before


def test_an_unused_link_sent_as_a_bearer_token_is_refused_and_used_up(
        console: Console, caplog: pytest.LogCaptureFixture) -> None:
    link = console.gate.login_url()
    client = anonymous(console)
    assert client.get("/memory", headers=bearer(link.split("token=", 1)[1])).status_code == 401
    again = client.get(link)  # a link seen anywhere but /login has leaked: it opens nothing from then on
    assert again.status_code == 401 and "already used" in again.text
    assert "sent as a Bearer token" in caplog.text and link.split("token=", 1)[1] not in caplog.text


def test_a_new_link_ends_the_one_before(console: Console) -> None:
    first, second = console.gate.login_url(), console.gate.login_url()
    assert anonymous(console).get(first).status_code == 401
    assert anonymous(console).get(second).status_code == 303


def test_the_script_token_reads_and_changes_but_never_in_a_url(console: Console) -> None:
    store = console.app.workspace.store
    script = anonymous(console)
    script.headers.update(bearer(console.gate.script_token))
    added = script.post("/memory/entries", data={"content": "我的护照在书房的抽屉里"})  # no CSRF: not a browser
    assert added.status_code == 303 and "我的护照在书房的抽屉里" in script.get("/memory").text
    assert "我的护照在书房的抽屉里" in store.read_long_term()
    in_url = anonymous(console).get(f"/login?token={console.gate.script_token}")
    assert in_url.status_code == 401 and "set-cookie" not in in_url.headers


def test_a_new_link_is_made_for_the_script_token_only(console: Console) -> None:
    made = anonymous(console).post("/login/new", headers=bearer(console.gate.script_token))
    assert made.status_code == 200 and made.headers["cache-control"] == "no-store"
    link = made.json()["link"]
    assert link.startswith(f"{console.base}/login?token=")
    assert anonymous(console).get(link).status_code == 303
    assert anonymous(console).get(link).status_code == 401  # one-time, as the first one
    browser = logged_in(console)  # a browser's session may not mint links, even with its CSRF token
    token = csrf_of(browser.get("/memory").text)
    assert browser.post("/login/new", headers={"X-CSRF-Token": token}).status_code == 403
    assert anonymous(console).post("/login/new").status_code == 401
    stale = console.gate.login_url().split("token=", 1)[1]
    assert anonymous(console).post("/login/new", headers=bearer(stale)).status_code == 401


@pytest.mark.slow
def test_picoclaw_web_writes_its_script_token_for_the_user_only_and_new_link_works_without_a_restart(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from picoclaw.cli import main

    port = free_port()
    token_file = home / f"console-127.0.0.1-{port}.token"
    process = picoclaw_web(home, "--port", str(port))
    try:
        first = login_link_of(process)
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        script_token = token_file.read_text(encoding="utf-8").strip()
        assert len(script_token) >= 40 and script_token not in first
        # A second console on the same port cannot listen, and leaves the first one's token alone.
        second = picoclaw_web(home, "--port", str(port))
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2 and "cannot listen on 127.0.0.1" in err and err.count("\n") == 1, err
        assert token_file.read_text(encoding="utf-8").strip() == script_token

        capsys.readouterr()
        assert main(["web", "--new-link", "--port", str(port)]) == 0
        out, err = capsys.readouterr()
        link = out.strip()
        assert re.fullmatch(rf"http://127\.0\.0\.1:{port}/login\?token=[\w-]+", link) and err == ""
        with httpx2.Client(follow_redirects=False, timeout=60) as client:
            assert client.get(first).status_code == 401  # never used, but a newer link replaced it
            assert client.get(link).status_code == 303
            assert client.get(link).status_code == 401
            memory = client.get(f"http://127.0.0.1:{port}/memory", headers=bearer(script_token))
            assert memory.status_code == 200
    finally:
        out, err = stopped(process)
    assert process.returncode == 0, err
    assert script_token not in out + err  # the script token is never printed nor logged
    assert not token_file.exists()
    assert main(["web", "--new-link", "--port", str(port)]) == 1  # no console there any more
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and "no console token file" in err and "picoclaw web" in err


@pytest.mark.slow
@pytest.mark.parametrize("token_name", [None, "控制台.token"])
def test_sigterm_stops_picoclaw_web_as_ctrl_c_does(home: Path, token_name: str | None) -> None:
    # What a service manager (systemd, docker stop) sends: before, the console died on it with its token file left
    # behind and its app (MCP servers, reminders) never closed.
    port = free_port()
    token_file = home / (token_name or f"console-127.0.0.1-{port}.token")
    extra = ["--token-file", str(token_file)] if token_name else []
    process = picoclaw_web(home, "--port", str(port), *extra)
    try:
        login_link_of(process)
        assert token_file.is_file()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0 and "Traceback" not in err, err
    assert not token_file.exists()


def test_the_console_serves_where_its_loop_takes_no_signals() -> None:
    # Not the main thread (or Windows): SIGTERM cannot be heard there, and the console serves as it did before.
    import asyncio
    import threading

    from picoclaw.cli.web import until_sigterm

    served: list[str] = []

    async def serve() -> None:
        served.append("控制台 served")

    failed: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(until_sigterm(serve()))
        except BaseException as exc:  # noqa: BLE001 - the test reports whatever came out
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert (served, failed) == (["控制台 served"], [])


def test_new_link_names_what_is_wrong_in_one_line(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from picoclaw.cli import main

    port = free_port()  # nothing listens there
    token_file = home / "elsewhere.token"
    token_file.write_text("some-token\n", encoding="utf-8")
    assert main(["web", "--new-link", "--port", str(port), "--token-file", str(token_file)]) == 1
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and f"no console answers at http://127.0.0.1:{port}/login/new" in err
    assert "some-token" not in err
