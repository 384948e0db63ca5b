"""Bad requests to the console: each is one clear answer, writes nothing, and is one log line, never a
traceback (in the test's log and in the terminal of a real `picoclaw web`)."""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote_from_bytes

import httpx2
import pytest

from picoclaw.app import App
from tests.fakes import FakeOpenAIServer
from tests.fakes.console import Console, csrf_of, logged_in, login_link_of, picoclaw_web, stopped
from tests.homes import edit_config

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def chatting(home: Path, fake_openai: FakeOpenAIServer) -> Iterator[tuple[Console, FakeOpenAIServer]]:
    with edit_config(home) as config:
        config["providers"]["openai"] = {"api_key": "sk-test-0123456789abc", "api_base": fake_openai.base_url}
    app = App.open(home)
    try:
        with Console(app) as running:
            yield running, fake_openai
    finally:
        app.close()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """What the terminal of `picoclaw web` shows by default: WARNING and above."""
    return [record for record in caplog.records if record.levelno >= logging.WARNING]


def one_line_logged(caplog: pytest.LogCaptureFixture, *expected: str) -> None:
    """The request just sent was logged in exactly one line, with no traceback, saying `expected`."""
    shown = warnings_of(caplog)
    assert len(shown) == 1, [record.getMessage() for record in shown]
    assert shown[0].exc_info is None and "\n" not in shown[0].getMessage()
    for words in expected:
        assert words in shown[0].getMessage(), shown[0].getMessage()


@pytest.mark.parametrize(("text", "encoding"), [("café au lait on Fridays", "latin-1"),
                                                ("我的自行车在车库里", "gbk")])
def test_a_form_that_is_not_utf8_is_refused_and_writes_nothing(
        console: Console, caplog: pytest.LogCaptureFixture, text: str, encoding: str) -> None:
    store = console.app.workspace.store
    before = store.long_term_path.read_bytes()
    client = logged_in(console)
    token = csrf_of(client.get("/memory").text)
    escaped = quote_from_bytes(text.encode(encoding))  # what a page in that encoding would send
    for script in (False, True):  # a browser's session, then a script
        headers = {"Authorization": f"Bearer {console.gate.script_token}"} if script else {}
        body = f"content={escaped}" + ("" if script else f"&csrf_token={token}")
        caplog.clear()
        refused = client.post("/memory/entries", content=body.encode("ascii"), headers={**FORM, **headers})
        assert refused.status_code == 400 and refused.text == "The form's text is not UTF-8; nothing was changed.\n"
        one_line_logged(caplog, "POST /memory/entries (400)", "not UTF-8")
    assert store.long_term_path.read_bytes() == before and "\ufffd" not in store.read_long_term()
    zh = "我的自行车在车库里" if encoding == "gbk" else text  # the same text as UTF-8 is taken
    added = client.post("/memory/entries", content=f"content={quote_from_bytes(zh.encode())}&csrf_token={token}",
                        headers=FORM)
    assert added.status_code == 303 and zh in store.read_long_term()


@pytest.mark.parametrize("body", [{"name": "console", "text": None}, {"name": "console", "text": 42},
                                  {"name": "console", "text": ["你好"]}, {"name": "console", "text": {"x": 1}},
                                  {"name": None, "text": "hi"}, {"name": 7, "text": "你好"}, {"name": "console"},
                                  ["console", "hi"], "hi"])
def test_a_chat_turn_whose_name_or_text_is_not_a_string_is_refused_before_the_model(
        chatting: tuple[Console, FakeOpenAIServer], caplog: pytest.LogCaptureFixture, body: object) -> None:
    console, fake = chatting
    client = logged_in(console)
    token = csrf_of(client.get("/chat").text)
    caplog.clear()
    refused = client.post("/chat/turn", json=body, headers={"X-CSRF-Token": token})
    assert refused.status_code == 400 and "expected a JSON object" in refused.text
    one_line_logged(caplog, "POST /chat/turn (400)", "expected a JSON object")
    assert fake.chat_requests() == []  # nothing reached the model
    assert not (console.app.workspace.sessions().folder / "web%3Aconsole.jsonl").exists()


def test_a_refused_edit_names_memory_md_by_its_place_in_the_workspace_in_english_and_chinese(
        console: Console, caplog: pytest.LogCaptureFixture) -> None:
    store = console.app.workspace.store
    store.append_long_term("我的自行车是蓝色的")
    client = logged_in(console)
    page = client.get("/memory").text
    token = csrf_of(page)
    line, version = re.findall(r'name="line" value="(\d+)">\s*<input type="hidden" name="version" value="([0-9a-f]+)"',
                               page)[0]
    store.append_long_term("我的自行车现在是红色的")  # another process moved the file on
    store.rewrite_long_term(store.read_long_term().replace("蓝色", "绿色"))
    before = store.long_term_path.read_bytes()
    root, home = str(console.app.workspace.root), str(console.app.home)
    for language, said in (("en", f"the entry at line {line} of memory/MEMORY.md changed since this page showed it"),
                           ("zh-CN", f"memory/MEMORY.md 第 {line} 行的条目在此页面显示后已被修改")):
        caplog.clear()
        stale = client.post("/memory/entries/edit", data={"line": line, "version": version, "action": "save",
                                                          "content": "我的自行车是黄色的", "csrf_token": token},
                            headers={"Accept-Language": language})
        assert stale.status_code == 409 and root not in stale.text and home not in stale.text
        assert said in stale.text
        one_line_logged(caplog, "POST /memory/entries/edit (409)", "memory/MEMORY.md")
        assert root not in caplog.text
    assert store.long_term_path.read_bytes() == before


def raw(console: Console, request: bytes) -> bytes:
    """Send `request` as it is; the whole answer (the console closes the connection after a bad one)."""
    host, port = console.base.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


def test_every_bad_request_is_one_log_line_and_never_a_traceback(
        console: Console, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    store = console.app.workspace.store
    store.append_long_term("Wifi password is 柠檬树")
    before = store.long_term_path.read_bytes()
    client = logged_in(console)
    token = csrf_of(client.get("/memory").text)
    host = console.base.removeprefix("http://")
    csrf = {"X-CSRF-Token": token}
    multipart = {"Content-Type": "multipart/form-data; boundary=b", **csrf}
    sent: list[tuple[Callable[[], int], int, str]] = [
        (lambda: client.post("/memory/entries", content=b"content=x", headers={
            "Content-Type": "application/x-www-form-urlencoded; charset=no-such-charset", **csrf}).status_code,
         400, "not UTF-8"),
        (lambda: client.post("/memory/entries", content=b"x", headers={"Content-Type": "multipart/form-data", **csrf}
                             ).status_code, 415, "urlencoded"),
        (lambda: client.post("/memory/entries", content=b'--b\r\nContent-Disposition: form-data\r\n\r\nx\r\n--b--\r\n',
                             headers=multipart).status_code, 415, "urlencoded"),
        (lambda: client.post("/memory/entries", data={"content": "forged"}).status_code, 403, "CSRF"),
        (lambda: client.post("/memory/entries", data={"content": "x" * 1_100_000, "csrf_token": token}).status_code,
         413, "POST /memory/entries"),
        (lambda: client.post("/policy/set", data={"key": "retrieve_limit", "value": "99", "csrf_token": token}
                             ).status_code, 400, "retrieve_limit"),
        (lambda: client.post("/jobs", data={"kind": "in", "when": "soon", "session": "telegram:42", "text": "x",
                                            "csrf_token": token}).status_code, 400, "soon"),
        (lambda: client.get("/memory", headers={"Host": "attacker.example"}).status_code, 421, "attacker.example"),
        (lambda: client.get("/chat", params={"name": "two words"}).status_code, 400, "not a session key"),
        (lambda: client.get("/login/new").status_code, 405, "GET /login/new"),
        (lambda: httpx2.get(f"{console.base}/login?token=guessed", timeout=60).status_code, 401, "login link"),
        (lambda: httpx2.get(f"{console.base}/memory", headers={"Authorization": "Bearer guessed"}, timeout=60
                            ).status_code, 401, "Bearer"),
        (lambda: int(raw(console, b"GET / HTTP/1.1\r\nHost: %s\r\nContent-Length: x\r\n\r\n" % host.encode())[9:12]),
         400, "not valid HTTP"),
        (lambda: int(raw(console, b"GET /memory HTTP/1.1\r\nHost: %s\r\nX-Bad: a\x01b\r\n\r\n" % host.encode())[9:12]),
         400, "not valid HTTP"),
    ]
    for send, status, said in sent:
        caplog.clear()
        assert send() == status, said
        one_line_logged(caplog, said)
        logged = " ".join(record.getMessage() for record in caplog.records if record.name.startswith(("picoclaw",
                                                                                                     "aiohttp")))
        assert "guessed" not in logged and console.gate.script_token not in logged  # no token, not even a wrong one
    assert store.long_term_path.read_bytes() == before


@pytest.mark.slow
def test_the_terminal_of_picoclaw_web_shows_one_line_a_bad_request(home: Path) -> None:
    process = picoclaw_web(home, "--port", str(_free_port()))
    try:
        link = login_link_of(process)
        base = link.split("/login", 1)[0]
        with httpx2.Client(base_url=base, follow_redirects=False, timeout=60) as client:
            assert client.get(link).status_code == 303
            token = csrf_of(client.get("/memory").text)
            for content in (b"content=%CE%D2%B5%C4", b"content=caf%E9"):
                assert client.post("/memory/entries", content=content + f"&csrf_token={token}".encode(),
                                   headers=FORM).status_code == 400
            assert client.post("/chat/turn", json={"name": "console", "text": None},
                               headers={"X-CSRF-Token": token}).status_code == 400
            assert client.post("/memory/entries", content=b"content=x", headers={
                "Content-Type": "application/x-www-form-urlencoded; charset=nope", "X-CSRF-Token": token}
                               ).status_code == 400
    finally:
        _, err = stopped(process)
    assert "Traceback" not in err, err
    refusals = [line for line in err.splitlines() if "refused" in line]
    assert len(refusals) == 4, err
    assert all("chat is unavailable" in line for line in err.splitlines() if line not in refusals), err  # no model
    assert all(line.startswith("picoclaw: WARNING: console: refused POST ") for line in refusals), err


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
