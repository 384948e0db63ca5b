"""A real chat in the console: the model's Markdown rendered on the server, live when its turn
ends and after a reload, raw HTML in it escaped; links open apart; tool calls as cards; the same labels live and
after a reload, in English and Chinese."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.fakes import FakeOpenAIServer
from tests.fakes.console import Console, csrf_of, logged_in
from tests.test_web_console import CHROMIUM, CHROMIUM_FLAGS, chat_events, chatting  # noqa: F401  (a fixture)

ANSWER = ("**Doudou** is a corgi.\n\n- loves the park\n- 喜欢公园\n\n```\n<i>not markup</i>\n```\n\n"
          "See [the vet](https://vet.example/a).\n\n<script>window.pwned = 1</script><b>bold?</b>")


def assert_rendered(html: str) -> None:
    assert "<strong>Doudou</strong>" in html and "<li>喜欢公园</li>" in html
    assert "<pre><code>&lt;i&gt;not markup&lt;/i&gt;\n</code></pre>" in html
    assert '<a href="https://vet.example/a" rel="noopener noreferrer" target="_blank">the vet</a>' in html
    assert "&lt;script&gt;window.pwned = 1&lt;/script&gt;&lt;b&gt;bold?&lt;/b&gt;" in html
    assert "<script>" not in html and "<b>" not in html


def test_the_answer_is_rendered_markdown_live_and_after_a_reload_and_its_html_is_escaped(
        chatting: tuple[Console, FakeOpenAIServer]) -> None:  # noqa: F811  (the fixture imported)
    console, fake = chatting
    client = logged_in(console)
    token = csrf_of(client.get("/chat").text)
    fake.reply_tool_calls([("memory_search", {"query": "柯基 corgi"})])
    fake.reply_text(ANSWER)
    events = chat_events(client, token, "Tell me about Doudou")
    assert events[-1]["kind"] == "done" and events[-1]["text"] == ANSWER  # the text stays as the model wrote it
    assert_rendered(events[-1]["html"])
    assert all("html" not in event for event in events[:-1])  # the pieces stream in as plain text
    page = client.get("/chat")
    assert page.headers["content-security-policy"].startswith("default-src 'self'; script-src 'self'")
    assert_rendered(page.text)
    card = re.search(r'<details class="event tool"><summary>🔧 memory_search</summary>(.*?)</details>', page.text,
                     re.S)
    assert card is not None and "柯基 corgi" in card.group(1) and "result (its start)" in card.group(1)
    assert '<p class="meta">You</p>' in page.text and 'data-you="You" data-assistant="picoclaw"' in page.text
    chinese = client.get("/chat", headers={"Accept-Language": "zh-CN"}).text
    assert '<p class="meta">你</p>' in chinese and 'data-you="你"' in chinese and "参数" in chinese
    fake.reply_text("好的：**豆豆**")
    assert chat_events(client, token, "再说一遍")[-1]["html"] == "<p>好的：<strong>豆豆</strong></p>\n"
    assert "<p>好的：<strong>豆豆</strong></p>" in client.get("/chat").text  # the kept page saw the new turn


@pytest.mark.slow
def test_in_a_browser_the_answer_is_rendered_its_script_inert_and_the_labels_match_a_reload(
        chatting: tuple[Console, FakeOpenAIServer]) -> None:  # noqa: F811  (the fixture imported)
    if not CHROMIUM.exists():
        if os.environ.get("PICOCLAW_REQUIRE_CHROMIUM"):
            pytest.fail(f"{CHROMIUM} is missing (.ci/run installs Debian's chromium)")
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium")
    from playwright.sync_api import expect, sync_playwright

    console, fake = chatting
    fake.reply_tool_calls([("memory_search", {"query": "柯基"})])
    fake.reply_text(ANSWER, chunk_delay=0.02)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            for locale, you in (("en-US", "You"), ("zh-CN", "你")):
                page = browser.new_page(locale=locale)
                page.goto(console.gate.login_url(console.base))
                page.goto(f"{console.base}/chat?name=browser-{locale}")
                if locale == "zh-CN":
                    fake.reply_text("**豆豆**是一只柯基。<b>不是标记</b>")
                page.fill("#message", "Doudou?")
                page.press("#message", "Enter")
                answer = page.locator("article.said.assistant .markdown strong").last
                expect(answer).to_have_text("Doudou" if locale == "en-US" else "豆豆", timeout=60_000)
                live = page.locator("section#conversation").inner_html()
                labels = page.locator("article.said p.meta").all_inner_texts()
                assert labels == [you, "picoclaw"]
                assert page.locator(".markdown b, .markdown script").count() == 0
                assert page.evaluate("window.pwned") is None
                if locale == "en-US":
                    assert page.locator(".markdown li").count() == 2
                    assert page.locator(".markdown pre code").inner_text().strip() == "<i>not markup</i>"
                    assert page.locator(".markdown a").get_attribute("rel") == "noopener noreferrer"
                    assert page.locator("details.event.tool summary").inner_text() == "🔧 memory_search"
                page.reload()
                assert page.locator("article.said p.meta").all_inner_texts() == labels
                assert page.locator(".markdown").last.inner_html() in live  # the same HTML, live and reloaded
                if locale == "zh-CN":  # switch to the other conversation, then start a new one
                    page.click("nav.conversations a[href='/chat?name=browser-en-US']")
                    expect(page.locator(".markdown strong").first).to_have_text("Doudou")
                    assert page.locator("nav.conversations [aria-current=page]").inner_text() == "browser-en-US"
                    page.fill("nav.conversations input[name=name]", "新的")
                    page.click("nav.conversations .new-conversation button")
                    expect(page.locator("h1 small")).to_have_text("web:新的")
                    assert page.locator("article.said").count() == 0
                page.close()
        finally:
            browser.close()


def write_transcript(console: Console, file: str, said: list[str]) -> None:
    folder = console.app.workspace.sessions().folder
    folder.mkdir(parents=True, exist_ok=True)
    records = [{"type": "message", "id": n, "time": f"2026-11-26T10:00:0{n}+00:00",
                "message": {"role": "user" if n % 2 else "assistant", "content": text}}
               for n, text in enumerate(said, 1)]
    (folder / file).write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def test_conversations_are_listed_switched_started_and_archived_in_english_and_chinese(
        chatting: tuple[Console, FakeOpenAIServer]) -> None:  # noqa: F811  (the fixture imported)
    console, fake = chatting
    write_transcript(console, "telegram%3A42.jsonl", ["Capital of Australia?", "Canberra."])
    write_transcript(console, "cli%3Ahome.jsonl", ["澳大利亚的首都？", "堪培拉。"])
    client = logged_in(console)
    token = csrf_of(client.get("/chat").text)
    fake.reply_text("Pack light.")
    chat_events(client, token, "Trip to Lisbon?", name="trip")
    fake.reply_text("带把伞。")
    chat_events(client, token, "去杭州要带什么？", name="旅行")
    trip = client.get("/chat", params={"name": "trip"}).text
    assert "Trip to Lisbon?" in trip and "去杭州要带什么？" not in trip
    assert '<a href="/chat?name=trip" aria-current="page">trip</a>' in trip
    assert '<a href="/chat?name=%E6%97%85%E8%A1%8C">旅行</a>' in trip
    for listed in ("telegram%253A42.jsonl\">telegram:42</a> <small>(read-only here)",
                   "cli%253Ahome.jsonl\">cli:home</a> <small>(read-only here)"):
        assert f'<a href="/why/conversation?name={listed}' in trip
    chinese = client.get("/chat", params={"name": "旅行"}, headers={"Accept-Language": "zh-CN"}).text
    assert "去杭州要带什么？" in chinese and "Trip to Lisbon?" not in chinese
    assert "此处只读" in chinese and "新对话" in chinese and "归档并重新开始" in chinese
    fresh = client.get("/chat", params={"name": "fresh"}).text  # a new one is listed before its first message
    assert '<a href="/chat?name=fresh" aria-current="page">fresh</a>' in fresh
    refused = client.get("/chat", params={"name": "two words"})
    assert refused.status_code == 400 and refused.text.count("\n") == 1
    assert client.post("/chat/archive", data={"name": "trip"}).status_code == 403  # no CSRF token
    archived = client.post("/chat/archive", data={"name": "trip", "csrf_token": token})
    assert archived.status_code == 303 and archived.headers["location"] == "/chat?name=trip"
    after = client.get("/chat", params={"name": "trip"}).text
    assert "Trip to Lisbon?" not in after and "去杭州要带什么？" not in after
    assert "Trip to Lisbon?" in client.get("/why/conversation", params={"name": archived_name(console)}).text
    assert "去杭州要带什么？" in client.get("/chat", params={"name": "旅行"}).text  # the other one untouched
    bad = client.post("/chat/archive", data={"name": "a/b", "csrf_token": token})
    assert bad.status_code == 400 and bad.text.count("\n") == 1


def archived_name(console: Console) -> str:
    folder = console.app.workspace.sessions().folder
    [path] = [path for path in (folder / "archive").iterdir() if "trip" in path.name]
    return path.relative_to(folder).as_posix()


def test_archiving_while_a_turn_runs_is_refused_in_one_line_and_archives_nothing(
        chatting: tuple[Console, FakeOpenAIServer]) -> None:  # noqa: F811  (the fixture imported)
    import threading

    from tests.fakes.openai_server import Text

    console, fake = chatting
    client = logged_in(console)
    token = csrf_of(client.get("/chat").text)
    release = threading.Event()
    fake.enqueue(Text("a slow answer", until=release))
    streaming = threading.Thread(target=lambda: chat_events(client, token, "take your time"))
    streaming.start()
    try:
        for _ in range(600):  # until the model has the request (bounded: 60 s)
            if fake.chat_requests():
                break
            threading.Event().wait(0.1)
        refused = client.post("/chat/archive", data={"name": "console", "csrf_token": token})
    finally:
        release.set()
        streaming.join(60)
    assert refused.status_code == 409 and refused.text.count("\n") == 1 and "still running" in refused.text
    assert not (console.app.workspace.sessions().folder / "archive").exists()
    assert "take your time" in client.get("/chat").text
