"""The web console's chat shows the receipt of each memory write no command made: over the page's event
stream (the turn's own stream may be over when a receipt comes), once, as text, in English and Chinese; through
real HTTP and in a real browser, the model being the fake OpenAI server scripting memory_append."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from picoclaw.web.chat_page import channel
from tests.fakes import FakeOpenAIServer, Text, ToolCalls
from tests.fakes.console import Console, console_of, csrf_of, logged_in
from tests.homes import edit_config
from tests.test_memory_grounding import model
from tests.test_web_console import CHROMIUM, CHROMIUM_FLAGS

HOSTILE = "My nickname is <img src=x onerror=alert(1)>"
EVENT_DEADLINE = 120.0  # seconds: a generous bound, so a missing event fails the test instead of hanging it


@pytest.fixture
def chatting(home: Path, fake_openai: FakeOpenAIServer) -> Iterator[tuple[Console, FakeOpenAIServer]]:
    """The console over a home whose model is the fake server."""
    with edit_config(home) as config:
        config["providers"]["openai"] = {"api_key": "sk-test-0123456789abc", "api_base": fake_openai.base_url}
    with console_of(home) as console:
        yield console, fake_openai


def remembers(*facts: str) -> list[ToolCalls | Text]:
    """The model's turns: each saves `fact` with memory_append, then says so."""
    return [reply for fact in facts
            for reply in (ToolCalls([("memory_append", {"content": fact})]), Text("Noted."))]


def turn(client: httpx2.Client, token: str, text: str) -> list[dict[str, str]]:
    """One chat turn of web:console; its events (the turn's own stream, to its end)."""
    with client.stream("POST", "/chat/turn", json={"name": "console", "text": text},
                       headers={"X-CSRF-Token": token}) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line) for line in response.iter_lines() if line]


def next_event(lines: Iterator[str]) -> dict[str, Any]:
    """The next event of a page's event stream (keep-alive comments skipped), within EVENT_DEADLINE."""
    deadline = time.monotonic() + EVENT_DEADLINE
    for line in lines:
        if line.startswith("data: "):
            event: dict[str, Any] = json.loads(line[len("data: "):])
            return event
        if time.monotonic() > deadline:  # a keep-alive comes every 15 s, so this is looked at
            break
    raise AssertionError(f"no event on the page's stream within {EVENT_DEADLINE} s")


def test_each_receipt_comes_once_on_the_pages_event_stream_in_english_and_chinese(
        chatting: tuple[Console, FakeOpenAIServer]) -> None:
    console, fake = chatting
    fake.responder = model(remembers("I live in Hangzhou.", "我住在杭州", "My gym locker is number 305."), "NONE")
    client = logged_in(console)
    token = csrf_of(client.get("/memory").text)
    with client.stream("GET", "/chat/events", params={"name": "console"}) as stream:
        lines = stream.iter_lines()
        assert next(lines) == ": open"
        english = turn(client, token, "Remember: I live in Hangzhou.")
        assert (english[-1]["kind"], english[-1]["text"]) == ("done", "Noted.")
        assert next_event(lines) == {"kind": "notice", "text": "remembered: I live in Hangzhou."}
        chinese = turn(client, token, "记住：我住在杭州。")
        # The next event is the next write's: the first was shown once.
        assert next_event(lines) == {"kind": "notice", "text": "remembered: 我住在杭州"}
        turn(client, token, "thanks")  # a fact the user never gave: shown as the assistant's words
        assert next_event(lines) == {"kind": "notice", "text": "remembered (the assistant's words, not yours): "
                                                               "My gym locker is number 305."}
    # Not in the turns' own streams: the page's event stream is where a receipt is shown.
    assert not any("remembered" in event["text"] for event in english + chinese if event["kind"] != "tool")
    recent = turn(client, token, "/memory recent")[-1]["text"]
    assert re.search(r"MEMORY\.md  memory_append, session web:console: 我住在杭州", recent)


def test_a_receipt_with_no_page_open_is_not_shown_but_listed(chatting: tuple[Console, FakeOpenAIServer]) -> None:
    console, fake = chatting
    fake.responder = model(remembers("I live in Hangzhou."), "NONE")
    client = logged_in(console)
    token = csrf_of(client.get("/memory").text)
    assert turn(client, token, "Remember: I live in Hangzhou.")[-1] == {"kind": "done", "text": "Noted.",
                                                                      "html": "<p>Noted.</p>\n"}
    deadline = time.monotonic() + EVENT_DEADLINE
    while "I live in Hangzhou." not in (recent := turn(client, token, "/memory recent")[-1]["text"]):
        assert time.monotonic() < deadline, recent  # the receipt is logged in the background, after the reply
        time.sleep(0.2)
    # Listed before it is shown: let the receipt's showing (to no page) finish before a page opens.
    asyncio.run_coroutine_threadsafe(console.app.agent().wait_background(), console.loop).result(60)
    with client.stream("GET", "/chat/events", params={"name": "console"}) as stream:
        lines = stream.iter_lines()
        assert next(lines) == ": open"
        turn(client, token, "hello")  # nothing written: the receipt of the write before is not replayed
        asyncio.run_coroutine_threadsafe(channel(console.app_web).deliver("web:console", "end"),
                                         console.loop).result(60)
        assert next_event(lines) == {"kind": "delivered", "text": "end"}


@pytest.mark.parametrize("name", ["console", "周报"])
def test_a_console_that_stops_ends_the_event_stream_of_a_page_still_open(home: Path, fake_openai: FakeOpenAIServer,
                                                                        name: str) -> None:
    # Ended by the console, not cut off when its shutdown gives up waiting for the page (it waited 2 s, then
    # dropped the connection mid-stream).
    with edit_config(home) as config:
        config["providers"]["openai"] = {"api_key": "sk-test-0123456789abc", "api_base": fake_openai.base_url}
    with console_of(home) as console:
        client = logged_in(console)
        with client.stream("GET", "/chat/events", params={"name": name}) as stream:
            lines = stream.iter_lines()
            assert next(lines) == ": open"
            console.stop()
            assert list(lines) == [""]  # the rest of ": open\n\n", then the end: no error for a body cut short
    assert fake_openai.requests == []


@pytest.mark.slow
def test_in_a_browser_a_chat_turns_memory_append_shows_its_receipt_as_text(
        chatting: tuple[Console, FakeOpenAIServer]) -> None:
    if not CHROMIUM.exists():
        if os.environ.get("PICOCLAW_REQUIRE_CHROMIUM"):
            pytest.fail(f"{CHROMIUM} is missing (.ci/run installs Debian's chromium)")
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium")
    from playwright.sync_api import expect, sync_playwright

    console, fake = chatting
    fake.responder = model(remembers("I live in Hangzhou.", "我住在杭州", HOSTILE), "NONE")
    dialogs: list[str] = []
    requested: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(locale="en-US")
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            page.on("request", lambda request: requested.append(request.url))
            page.goto(console.gate.login_url(console.base))
            # The page follows its event stream once the stream's headers are in (the server follows first).
            with page.expect_response(lambda response: "/chat/events" in response.url, timeout=60_000):
                page.goto(f"{console.base}/chat")
            receipts = page.locator("#conversation p.receipt")
            answers = page.locator("article.said.assistant .markdown")
            shown: list[str] = []
            for number, (said, fact) in enumerate([("Remember: I live in Hangzhou.", "I live in Hangzhou."),
                                                   ("记住：我住在杭州。", "我住在杭州"), (HOSTILE, HOSTILE)]):
                page.fill("#message", said)
                page.press("#message", "Enter")
                expect(answers.nth(number)).to_have_text("Noted.", timeout=60_000)
                shown.append(f"✍ remembered: {fact}")
                expect(receipts).to_have_text(shown, timeout=60_000)  # each once, in order
            # A small note styled as the console's notices are (the stylesheet's .notice, no inline style).
            assert receipts.first.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(232, 245, 233)"
            assert receipts.first.get_attribute("style") is None
            assert page.locator("main img").count() == 0  # the hostile text is text, not markup
        finally:
            browser.close()
    assert dialogs == [] and not any(url.endswith("/x") for url in requested)
