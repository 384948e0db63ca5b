"""Ask first in the web console: an ask-first call shows in the chat with Approve and Deny;
Approve runs it, Deny does not, and a decision that is not the open question's own (another conversation's, a
second press, a made-up id) changes nothing."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from picoclaw.app import App
from tests.fakes import FakeOpenAIServer
from tests.fakes.console import Console, csrf_of, logged_in
from tests.homes import edit_config
from tests.test_web_console import CHROMIUM, CHROMIUM_FLAGS

NOTES = [("todo.md", "buy milk and eggs", "Done: todo.md is written."),
         ("待办.md", "买牛奶和鸡蛋", "好了，待办.md 已写好。")]


@pytest.fixture
def asking(home: Path, fake_openai: FakeOpenAIServer) -> Iterator[tuple[Console, FakeOpenAIServer]]:
    """The console over a home whose model is the fake server, and where write_file asks first."""
    with edit_config(home) as config:
        config["providers"]["openai"] = {"api_key": "sk-test-0123456789abc", "api_base": fake_openai.base_url}
        config["tools"]["approval"] = {"ask_first": ["write_file"], "timeout_seconds": 300}
    app = App.open(home)
    try:
        with Console(app) as console:
            yield console, fake_openai
    finally:
        app.close()


def decide(client: httpx2.Client, token: str, question: str, decision: str, name: str = "console") -> Any:
    return client.post("/chat/approve", data={"name": name, "id": question, "decision": decision,
                                              "csrf_token": token})


def turn_deciding(client: httpx2.Client, token: str, text: str, decision: str) -> list[dict[str, Any]]:
    """A chat turn whose ask-first question is answered with `decision` as soon as it shows."""
    events = []
    with client.stream("POST", "/chat/turn", json={"name": "console", "text": text},
                       headers={"X-CSRF-Token": token}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line:
                continue
            event = json.loads(line)
            events.append(event)
            if event["kind"] == "approval":
                assert decide(client, token, json.loads(event["text"])["id"], decision).json() == {"decided": True}
    return events


@pytest.mark.parametrize(("file", "content", "reply"), NOTES)
def test_approve_runs_the_call(asking: tuple[Console, FakeOpenAIServer], file: str, content: str,
                               reply: str) -> None:
    console, fake = asking
    client = logged_in(console)
    token = csrf_of(client.get("/memory").text)
    fake.reply_tool_calls([("write_file", {"path": file, "content": content})])
    fake.reply_text(reply)
    events = turn_deciding(client, token, f"write {file}: {content}", "approve")
    [asked] = [json.loads(e["text"]) for e in events if e["kind"] == "approval"]
    assert asked["tool"] == "write_file" and content in asked["arguments"]
    [done] = [json.loads(e["text"]) for e in events if e["kind"] == "approval_done"]
    assert done == {"id": asked["id"], "verdict": "approved"}
    assert (events[-1]["kind"], events[-1]["text"]) == ("done", reply)
    assert (console.app.workspace.root / file).read_text(encoding="utf-8") == content


@pytest.mark.parametrize(("file", "content", "reply"), NOTES)
def test_deny_runs_nothing_and_the_model_is_told(asking: tuple[Console, FakeOpenAIServer], file: str, content: str,
                                                 reply: str) -> None:
    console, fake = asking
    client = logged_in(console)
    token = csrf_of(client.get("/memory").text)
    fake.reply_tool_calls([("write_file", {"path": file, "content": content})])
    fake.reply_text(reply)
    events = turn_deciding(client, token, f"write {file}: {content}", "deny")
    assert [json.loads(e["text"])["verdict"] for e in events if e["kind"] == "approval_done"] == ["denied"]
    assert not (console.app.workspace.root / file).exists()
    told = [m for m in fake.chat_requests()[-1]["messages"] if m["role"] == "tool"]
    assert told and told[-1]["content"].startswith("not run")


def test_a_decision_that_is_not_the_open_questions_own_changes_nothing(
        asking: tuple[Console, FakeOpenAIServer]) -> None:
    console, fake = asking
    client = logged_in(console)
    token = csrf_of(client.get("/memory").text)
    fake.reply_tool_calls([("write_file", {"path": "x.md", "content": "x"})])
    fake.reply_text("ok")
    assert decide(client, token, "made-up", "approve").json() == {"decided": False}  # nothing is open
    events = []
    with client.stream("POST", "/chat/turn", json={"name": "console", "text": "write x.md"},
                       headers={"X-CSRF-Token": token}) as response:
        for line in response.iter_lines():
            if not line:
                continue
            event = json.loads(line)
            events.append(event)
            if event["kind"] != "approval":
                continue
            question = json.loads(event["text"])["id"]
            assert decide(client, token, question, "approve", name="other").json() == {"decided": False}
            assert client.post("/chat/approve", data={"name": "console", "id": question,
                                                      "decision": "approve"}).status_code == 403  # no CSRF token
            assert decide(client, token, question, "maybe").status_code == 400
            assert decide(client, token, question, "deny").json() == {"decided": True}
            assert decide(client, token, question, "approve").json() == {"decided": False}  # decided already
    assert [json.loads(e["text"])["verdict"] for e in events if e["kind"] == "approval_done"] == ["denied"]
    assert not (console.app.workspace.root / "x.md").exists()


@pytest.mark.slow
@pytest.mark.parametrize(("locale", "approve", "approved"), [("en-US", "Approve", "Approved"),
                                                              ("zh-CN", "批准", "已批准")])
def test_in_a_browser_the_call_waits_for_the_approve_button(asking: tuple[Console, FakeOpenAIServer], locale: str,
                                                            approve: str, approved: str) -> None:
    if not CHROMIUM.exists():
        if os.environ.get("PICOCLAW_REQUIRE_CHROMIUM"):
            pytest.fail(f"{CHROMIUM} is missing (.ci/run installs Debian's chromium)")
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium")
    from playwright.sync_api import expect, sync_playwright

    console, fake = asking
    fake.reply_tool_calls([("write_file", {"path": "plan.md", "content": "<b>周五</b> review"})])
    fake.reply_text("Written. / 写好了。")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(locale=locale)
            page.goto(console.gate.login_url(console.base))
            page.goto(f"{console.base}/chat")
            page.fill("#message", "write plan.md / 写 plan.md")
            page.press("#message", "Enter")
            card = page.locator("div.event.approval")
            expect(card).to_contain_text("write_file", timeout=60_000)
            assert card.locator("b").count() == 0  # the arguments as text, not markup
            assert not (console.app.workspace.root / "plan.md").exists()  # nothing runs before the press
            card.get_by_role("button", name=approve).click()
            expect(card.locator(".meta")).to_have_text(approved, timeout=60_000)
            expect(page.locator("article.said.assistant .markdown").last).to_have_text("Written. / 写好了。",
                                                                                 timeout=60_000)
            assert card.locator("button").count() == 0
        finally:
            browser.close()
    assert (console.app.workspace.root / "plan.md").read_text(encoding="utf-8") == "<b>周五</b> review"
