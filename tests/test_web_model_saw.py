"""What the model saw, on the why page: the window's split adds up to the prompt the provider counted (within the
counters' difference), a block already in the conversation is named as such (not "no memory"), scores are shown
relative to the turn's best with the raw one on hover, the exact request sits behind a toggle with its secrets
masked, and a turn recorded by an older picoclaw says what it lacks. English and Chinese; in Chromium too."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from picoclaw.app import App
from tests.fakes import FakeOpenAIServer
from tests.fakes.console import Console, logged_in
from tests.homes import edit_config
from tests.test_web_editing import CHROMIUM, CHROMIUM_FLAGS, chromium_or_skip

KEY = "sk-test-0123456789abcdef"


@pytest.fixture
def windowed(home: Path) -> Iterator[tuple[Console, FakeOpenAIServer]]:
    """The console over a model served "locally" with a 16k window it reports (llama.cpp's /props): the fake
    counts each prompt as it refuses by, and reports that count as the prompt's tokens."""
    with FakeOpenAIServer(kind="llama.cpp", window=16_384) as fake:
        with edit_config(home) as config:
            config["providers"]["openai"] = {"api_key": KEY, "api_base": fake.base_url}
        app = App.open(home)
        try:
            with Console(app) as console:
                yield console, fake
        finally:
            app.close()


def ask(client: httpx2.Client, text: str, name: str = "console") -> None:
    page = client.get("/chat").text
    token = re.search(r'<meta name="csrf-token" content="([^"]+)">', page)
    assert token is not None
    with client.stream("POST", "/chat/turn", json={"name": name, "text": text},
                       headers={"X-CSRF-Token": token.group(1)}) as response:
        assert response.status_code == 200, response.read()
        events = [json.loads(line) for line in response.iter_lines() if line]
    assert events[-1]["kind"] == "done", events


def turn_of(page: str, said: str) -> str:
    """The part of a why page about the turn whose message is `said`."""
    start = page.index(f'<pre class="said">{said}</pre>')
    end = page.find('<article class="turn"', start)
    return page[start:end if end > 0 else len(page)]


def test_the_split_adds_up_to_the_prompt_and_a_block_already_in_the_conversation_is_named(
        windowed: tuple[Console, FakeOpenAIServer]) -> None:
    console, fake = windowed
    store = console.app.workspace.store
    store.append_long_term("My corgi is called Doudou and loves the park")
    store.append_long_term("我的柯基叫豆豆，最喜欢去公园")
    store.append_long_term(f"The staging API key is {KEY}, kept for the deploy")
    client = logged_in(console)
    fake.reply_text("Doudou, and he loves the park.")
    ask(client, "What is my corgi called?")
    fake.reply_text("还是豆豆。")
    ask(client, "我的柯基叫什么？corgi Doudou, staging API key")

    page = client.get("/why/conversation", params={"name": "web%3Aconsole.jsonl"}).text
    first = turn_of(page, "What is my corgi called?")
    second = turn_of(page, "我的柯基叫什么？corgi Doudou, staging API key")
    for turn in (first, second):
        estimate = int(re.search(r"prompt, as counted here: ([\d,]+)", turn).group(1).replace(",", ""))
        counted = int(re.search(r"as the provider counted it: ([\d,]+)", turn).group(1).replace(",", ""))
        assert abs(estimate - counted) <= 0.1 * counted, (estimate, counted)  # two counters, the same request
        parts = dict(re.findall(r'<tr class="part" data-part="(\w+)">.*?data-tokens="(\d+)"', turn))
        assert {"system", "tools", "memory", "history", "user", "reply"} <= set(parts)
        assert sum(int(v) for k, v in parts.items() if k != "reply") == estimate
        assert "16,384 tokens" in turn and 'class="part-memory"' in turn
    # The first turn carried the corgi's entry; scores relative to the turn's best, the raw one on hover.
    assert re.search(r'<tr class="carried"><td>search</td><td title="raw score \d+\.\d{4}">1\.000</td>', first)
    assert "My corgi is called Doudou" in first
    # The second found it again: already in the conversation, said so, not "No memory was injected".
    assert re.search(r'<tr class="left-out" data-reason="in_conversation">.*?left out: already in the '
                     r'conversation.*?My corgi is called Doudou', second, re.S)
    assert "No memory was injected." not in second
    # The exact request of the newest turn, behind a toggle, the key masked; an older turn's is not kept.
    request = re.search(r'<pre class="request">(.*?)</pre>', second, re.S)
    assert request is not None and "我的柯基叫什么？corgi Doudou, staging API key" in request.group(1)
    assert KEY not in request.group(1) and "The staging API key is ***" in request.group(1)
    assert "Not kept: this console keeps" in first

    zh = client.get("/why/conversation", params={"name": "web%3Aconsole.jsonl"},
                    headers={"Accept-Language": "zh-CN"}).text
    assert "模型看到了什么" in zh and "略去：对话中已有" in zh and "完整请求（已隐去密钥）" in zh
    assert "记忆块" in zh and "服务商计数" in zh


def test_a_turn_recorded_by_an_older_version_says_what_it_lacks(console: Console) -> None:
    folder = console.app.workspace.sessions().folder
    folder.mkdir(parents=True, exist_ok=True)
    why = {"search": "keywords (BM25 over the memory files)", "policy": {"retrieve_limit": 10},
           "items": [{"key": "k", "found_by": "search", "score": 2.5, "path": "memory/MEMORY.md", "lines": [5, 6],
                      "text": "## 2026-11-26\nMy corgi is called Doudou"}]}
    records = [{"type": "message", "id": 1, "time": "2026-11-26T10:00:00+00:00",
                "message": {"role": "user", "content": "What is my corgi called?"}, "why": why},
               {"type": "message", "id": 2, "time": "2026-11-26T10:00:01+00:00",
                "message": {"role": "assistant", "content": "Doudou"}, "prompt_tokens": 900}]
    (folder / "cli%3Aold.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    client = logged_in(console)
    page = client.get("/why/conversation", params={"name": "cli%3Aold.jsonl"}).text
    assert "it kept no split of the window" in page and "its blocks have no token counts" in page
    assert "it did not keep the blocks it left out" in page and '<rect class="part-' not in page
    assert '<td title="raw score 2.5000">1.000</td>' in page  # its one block is its best
    zh = client.get("/why/conversation", params={"name": "cli%3Aold.jsonl"}, headers={"Accept-Language": "zh"}).text
    assert "没有保存窗口的划分" in zh and "没有保存被略去的记忆块" in zh


@pytest.mark.slow
def test_in_a_browser_the_window_bar_and_the_request_toggle(windowed: tuple[Console, FakeOpenAIServer]) -> None:
    chromium_or_skip()
    from playwright.sync_api import sync_playwright

    console, fake = windowed
    console.app.workspace.store.append_long_term("我每周五下午三点和王芳开预算评审会")
    fake.reply_text("每周五下午三点。")
    ask(logged_in(console), "预算评审会是哪天？")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(locale="zh-CN", viewport={"width": 390, "height": 844})
            page.goto(console.gate.login_url(console.base))
            page.goto(f"{console.base}/why/conversation?name=web%253Aconsole.jsonl")
            turn = page.locator("article.turn").first
            assert turn.locator("figure.window rect.part-memory").count() == 1
            assert "记忆块" in turn.locator("table.parts").inner_text()
            request = turn.locator("details.request")
            assert not request.locator("pre").is_visible()
            request.locator("summary").click()
            assert "预算评审会是哪天？" in request.locator("pre").inner_text()
            assert page.evaluate("document.documentElement.scrollWidth") <= 390  # no sideways scroll on a phone
        finally:
            browser.close()
