"""The web console over real HTTP: the login link, the Host check, CSRF, escaping, and the memory page.

The console runs on its own thread and event loop (as the fake services do) over an App opened from a
temporary home; requests go through a real HTTP client, redirects not followed, so each step is seen.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from picoclaw.app import App
from picoclaw.memory.feedback import FeedbackLedger, Reaction
from picoclaw.web import Gate
from picoclaw.web.security import COOKIE
from tests.fakes import FakeOpenAIServer
from tests.fakes.console import Console, csrf_of, free_port, logged_in
from tests.homes import edit_config

XSS = '<img src=x onerror=alert(1)> <a href="javascript:alert(2)">click</a>'


def test_nothing_without_logging_in_and_the_link_works_once(console: Console) -> None:
    console.app.workspace.store.append_long_term("My locker code is 4711")
    anonymous = httpx2.Client(base_url=console.base, follow_redirects=False, timeout=60)
    page = anonymous.get("/memory")
    assert page.status_code == 401 and "4711" not in page.text and "picoclaw web" in page.text
    assert anonymous.get("/memory", headers={"Authorization": "Bearer wrong"}).status_code == 401

    client = httpx2.Client(base_url=console.base, follow_redirects=False, timeout=60)
    link = console.gate.login_url()
    login = client.get(link)
    assert login.status_code == 303 and login.headers["location"] == "/"  # the token leaves the address bar
    cookie = login.headers["set-cookie"]
    assert f"{COOKIE}_{console.base.rsplit(':', 1)[1]}=" in cookie and "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert "4711" in client.get("/memory").text
    again = anonymous.get(link)  # one-time: a second use opens nothing
    assert again.status_code == 401 and "already used" in again.text and COOKIE not in again.headers.get(
        "set-cookie", "")
    # A script sends the script token as a header (never in a URL).
    bearer = anonymous.get("/memory", headers={"Authorization": f"Bearer {console.gate.script_token}"})
    assert bearer.status_code == 200 and "4711" in bearer.text


def test_a_wrong_host_is_refused(console: Console) -> None:
    client = logged_in(console)
    response = client.get("/memory", headers={"Host": "attacker.example:80"})
    assert response.status_code == 421 and "4711" not in response.text


def test_a_change_without_the_csrf_token_is_refused_and_changes_nothing(console: Console) -> None:
    client = logged_in(console)
    store = console.app.workspace.store
    before = store.long_term_path.read_bytes()
    refused = client.post("/memory/entries", data={"content": "forged entry"})
    assert refused.status_code == 403 and store.long_term_path.read_bytes() == before
    wrong = client.post("/memory/entries", data={"content": "forged entry", "csrf_token": "guess"})
    assert wrong.status_code == 403 and store.long_term_path.read_bytes() == before
    token = csrf_of(client.get("/memory").text)
    added = client.post("/memory/entries", data={"content": "我把自行车放在车库里", "csrf_token": token})
    assert added.status_code == 303 and added.headers["location"] == "/memory?notice=added"
    assert "我把自行车放在车库里" in store.read_long_term()
    assert "Added to MEMORY.md." in client.get(added.headers["location"]).text


def test_memory_markup_is_shown_as_text_under_a_strict_policy(console: Console) -> None:
    console.app.workspace.store.append_long_term(XSS)
    client = logged_in(console)
    response = client.get("/memory")
    assert "<img src=x" not in response.text and 'href="javascript:' not in response.text
    assert "&lt;img src=x onerror=alert(1)&gt;" in response.text
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert response.headers["x-frame-options"] == "DENY" and response.headers["referrer-policy"] == "no-referrer"


def test_search_shows_what_a_turn_would_find_with_scores_in_english_and_chinese(console: Console) -> None:
    store = console.app.workspace.store
    store.append_long_term("My corgi Doudou loves the park")
    store.append_long_term("周五下午三点和王芳开预算评审会")
    client = logged_in(console)
    english = client.get("/memory", params={"q": "corgi park"}).text
    assert re.search(r"score \d\.\d{3} · memory/MEMORY\.md:\d+", english) and "Doudou" in english
    chinese = client.get("/memory", params={"q": "王芳 预算"}, headers={"Accept-Language": "zh-CN,zh;q=0.9"}).text
    assert "得分" in chinese and "王芳开预算评审会" in chinese and "长期记忆" in chinese
    assert "Nothing in memory matches." in client.get("/memory", params={"q": "zebra quantum"}).text


def test_the_language_switch_sticks(console: Console) -> None:
    client = logged_in(console)
    token = csrf_of(client.get("/memory").text)
    switched = client.post("/language", data={"lang": "zh", "csrf_token": token})
    assert switched.status_code == 303
    assert "长期记忆" in client.get("/memory", headers={"Accept-Language": "en"}).text


def test_the_memory_page_is_paged_and_bad_input_is_one_clear_answer(console: Console) -> None:
    store = console.app.workspace.store
    text = store.read_long_term() + "".join(f"\n## 2024-05-01\nfact number {n}\n" for n in range(120))
    store.long_term_path.write_text(text, encoding="utf-8")
    client = logged_in(console)
    first = client.get("/memory").text
    assert "fact number 119" in first and "fact number 60" not in first and "page 1 of 3" in first
    assert '<a href="/memory?page=2">Older</a>' in first and ">Newer</a>" not in first
    assert "fact number 0</pre>" in client.get("/memory", params={"page": "3"}).text
    assert "page 3 of 3" in client.get("/memory", params={"page": "99"}).text
    assert "page 1 of 3" in client.get("/memory", params={"page": "abc"}).text
    token = csrf_of(first)
    before = store.long_term_path.read_bytes()
    empty = client.post("/memory/entries", data={"content": "   ", "csrf_token": token})
    assert empty.headers["location"] == "/memory?notice=empty_entry" and store.long_term_path.read_bytes() == before
    huge = client.post("/memory/entries", data={"content": "x" * 20_001, "csrf_token": token})
    assert huge.status_code == 413 and store.long_term_path.read_bytes() == before


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]  # the machine's network is closed: no background calls


@pytest.mark.slow
def test_in_a_browser_log_in_markup_stays_text_memory_is_written_and_the_policy_set_and_rolled_back(
        console: Console, capsys: pytest.CaptureFixture[str]) -> None:
    import os

    if not CHROMIUM.exists():
        if os.environ.get("PICOCLAW_REQUIRE_CHROMIUM"):
            pytest.fail(f"{CHROMIUM} is missing (.ci/run installs Debian's chromium)")
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    from picoclaw.memory.policy import ValueChange

    store = console.app.workspace.store
    store.append_long_term(XSS)
    dialogs: list[str] = []
    requested: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(locale="zh-CN")
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            page.on("request", lambda request: requested.append(request.url))
            page.goto(console.gate.login_url(console.base))
            assert page.url == f"{console.base}/memory"  # the token is out of the address bar
            assert "长期记忆" in page.locator("h1").inner_text()  # the browser's language: Chinese
            assert page.locator("article.entry > pre", has_text="<img src=x onerror=alert(1)>").count() == 1
            assert page.locator("main img").count() == 0 and page.locator("a[href^='javascript:']").count() == 0
            page.fill("#content", "我的护照在书房的抽屉里")
            page.click("form.add button")
            assert "已写入 MEMORY.md。" in page.locator(".notice").inner_text()
            backups = len(store.backups())
            newest = page.locator("article.entry").first
            newest.locator("details.edit > summary").click()
            newest.locator("textarea").fill("我的护照在卧室的保险箱里")
            newest.locator("button[value=save]").click()
            assert "已保存" in page.locator(".notice").inner_text()
            assert len(store.backups()) == backups + 1
            page.click("a[href='/policy']")
            page.select_option("#policy-key", "recent_days")
            page.fill("#set-policy input[name=value]", "5")
            page.click("#set-policy button")
            assert "已设置" in page.locator(".notice").inner_text()
            page.click("ol.timeline li.change >> nth=0 >> button")
            assert "已回滚" in page.locator(".notice").inner_text()
            page.click("a[href='/jobs']")
            page.select_option("#add-job select[name=kind]", "in")
            page.fill("#add-job input[name=when]", "2 hours")
            page.fill("#add-job input[name=session]", "telegram:42")
            page.fill("#add-job textarea[name=text]", "该去遛狗了")
            page.click("#add-job button")
            assert "任务已添加" in page.locator(".notice").inner_text()
        finally:
            browser.close()
    assert "我的护照在卧室的保险箱里" in store.read_long_term() and "书房" not in store.read_long_term()
    from picoclaw.cli import main

    assert main(["memory", "search", "护照 保险箱"]) == 0 and "我的护照在卧室的保险箱里" in capsys.readouterr().out
    assert [job.text for job in console.app.jobs().load()] == ["该去遛狗了"]
    history = console.app.workspace.policy.history()
    assert [change.effective["recent_days"] for change in history] == [ValueChange(3, 5), ValueChange(5, 3)]
    assert dialogs == [] and not any(url.endswith("/x") for url in requested)


def test_why_this_answer_lists_the_injected_blocks_with_scores_and_the_replys_tokens(
        home: Path, fake_openai: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    from picoclaw.cli import main

    with edit_config(home) as config:
        config["providers"]["openai"] = {"api_key": "sk-test-0123456789abc", "api_base": fake_openai.base_url}
    assert main(["memory", "append", "My corgi is called Doudou and loves the park"]) == 0
    assert main(["memory", "append", "我的柯基叫豆豆，最喜欢去公园"]) == 0
    fake_openai.reply_text("Doudou, and the park.", usage={"prompt_tokens": 900, "completion_tokens": 5},
                           cached_tokens=640)
    fake_openai.reply_text("豆豆喜欢公园。", usage={"prompt_tokens": 950, "completion_tokens": 5}, cached_tokens=900)
    assert main(["chat", "--session", "cli:why", "-m", "What is my corgi called?"]) == 0
    assert main(["chat", "--session", "cli:why", "-m", "我的柯基叫什么？"]) == 0
    capsys.readouterr()

    app = App.open(home)
    try:
        with Console(app) as console:
            client = logged_in(console)
            listing = client.get("/why").text
            link = re.search(r'href="(/why/conversation\?name=[^"]+)"', listing)
            assert link is not None and "cli:why" in listing
            page = client.get(link.group(1).replace("&amp;", "&")).text
            english, chinese = page.index("What is my corgi called?"), page.index("我的柯基叫什么？")
            assert chinese < english  # newest first
            turn = page[english:]
            assert re.search(r'<td>search</td><td title="raw score [\d.]+">\d\.\d{3}</td>\s*'
                             r'<td>memory/MEMORY\.md:\d+-\d+</td>', turn)
            assert "Doudou" in turn and "keywords (BM25 over the memory files)" in turn
            assert "900 prompt tokens, 640 served from the provider&#39;s cache" in page
            assert "<code>retrieve_limit</code> = 10" in page
            assert page.count('<rect class="cached"') == 2  # the chart: a bar pair for each of the two replies
            zh = client.get(link.group(1).replace("&amp;", "&"), headers={"Accept-Language": "zh-CN"}).text
            assert "为什么这样回答" in zh and "950 提示词 token" in zh and "豆豆" in zh
            for name in ("../../config.json", "cli%3Anone.jsonl", ""):
                missing = client.get("/why/conversation", params={"name": name})
                assert missing.status_code == 404 and "sk-test" not in missing.text
    finally:
        app.close()


def test_a_hand_edited_record_of_why_still_renders(console: Console) -> None:
    folder = console.app.workspace.sessions().folder
    folder.mkdir(parents=True, exist_ok=True)
    records = [{"type": "message", "id": 1, "time": "2026-11-26T10:00:00+00:00",
                "message": {"role": "user", "content": "odd <b>turn</b>"},
                "why": {"search": 7, "items": ["junk", {"score": "high", "lines": "1-2", "text": "<script>x</script>"}],
                        "policy": "none"}},
               {"type": "message", "id": 2, "time": "2026-11-26T10:00:01+00:00",
                "message": {"role": "assistant", "content": "ok"}, "prompt_tokens": 10}]
    (folder / "cli%3Aodd.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    client = logged_in(console)
    page = client.get("/why/conversation", params={"name": "cli%3Aodd.jsonl"})
    assert page.status_code == 200
    assert "odd &lt;b&gt;turn&lt;/b&gt;" in page.text and "&lt;script&gt;x&lt;/script&gt;" in page.text
    assert "<script>" not in page.text and "<td>–</td>" in page.text  # no score: a dash


def test_the_policy_page_sets_a_value_and_rolls_it_back_from_the_timeline(console: Console) -> None:
    policy = console.app.workspace.policy
    client = logged_in(console)
    page = client.get("/policy").text
    assert re.search(r"<code>retrieve_limit</code></td><td>10</td><td>config.json</td>\s*<td>1–50</td>", page)
    token = csrf_of(page)
    assert client.post("/policy/set", data={"key": "retrieve_limit", "value": "7"}).status_code == 403
    for value in ("99", "many"):  # out of bounds, not a number: refused, nothing written
        refused = client.post("/policy/set", data={"key": "retrieve_limit", "value": value, "csrf_token": token})
        assert refused.status_code == 400 and "Refused, nothing was changed" in refused.text
    assert client.post("/policy/set", data={"key": "no_such_key", "value": "1", "csrf_token": token}
                       ).status_code == 400
    assert not policy.overrides_path.exists() and policy.history() == []

    done = client.post("/policy/set", data={"key": "retrieve_limit", "value": "7", "reason": "fewer, better blocks",
                                            "csrf_token": token})
    assert done.status_code == 303 and policy.current().retrieve_limit == 7
    page = client.get("/policy").text
    assert "<code>retrieve_limit</code></td><td>7</td><td>override</td>" in page
    assert "<code>retrieve_limit</code> 10 → 7" in page and "fewer, better blocks" in page
    snapshot = re.search(r'name="snapshot" value="([^"]+)"', page)
    assert snapshot is not None
    back = client.post("/policy/rollback", data={"snapshot": snapshot.group(1), "csrf_token": token})
    assert back.status_code == 303 and policy.current().retrieve_limit == 10
    history = [json.loads(line) for line in policy.history_path.read_text(encoding="utf-8").splitlines()]
    assert [entry["source"] for entry in history] == ["web", "web"]
    assert history[0]["effective"] == {"retrieve_limit": {"old": 10, "new": 7}}
    assert history[1]["effective"] == {"retrieve_limit": {"old": 7, "new": 10}}
    zh = client.get("/policy", headers={"Accept-Language": "zh-CN"}).text
    assert "记忆策略" in zh and "恢复到这次修改之前的策略" in zh


def test_an_entry_is_edited_and_deleted_with_a_backup_and_a_stale_edit_is_refused(
        console: Console, capsys: pytest.CaptureFixture[str]) -> None:
    from picoclaw.cli import main

    store = console.app.workspace.store
    store.append_long_term("My bike is in the garage")
    store.append_long_term("我的自行车是蓝色的")
    client = logged_in(console)
    page = client.get("/memory").text
    token = csrf_of(page)
    forms = re.findall(r'name="line" value="(\d+)">\s*<input type="hidden" name="version" value="([0-9a-f]+)">\s*'
                       r'<input type="hidden" name="original" value="[^"]*">\s*<textarea[^>]*>([^<]*)</textarea>', page)
    (zh_line, zh_version, zh_text), (en_line, en_version, _) = forms[0], forms[1]  # newest first
    assert zh_text == "我的自行车是蓝色的"
    backups = len(store.backups())
    saved = client.post("/memory/entries/edit", data={"line": en_line, "version": en_version, "action": "save",
                                                      "content": "My bike is in the shed now", "csrf_token": token})
    assert saved.status_code == 303 and saved.headers["location"] == "/memory?notice=saved"
    assert len(store.backups()) == backups + 1
    assert main(["memory", "search", "bike shed"]) == 0 and "in the shed now" in capsys.readouterr().out

    before = store.long_term_path.read_bytes()
    stale = client.post("/memory/entries/edit", data={"line": en_line, "version": en_version, "action": "save",
                                                      "content": "an edit from an old page", "csrf_token": token})
    assert stale.status_code == 409 and "changed since this page showed it" in stale.text
    assert store.long_term_path.read_bytes() == before  # nothing lost, nothing written
    unknown = client.post("/memory/entries/edit", data={"line": zh_line, "version": "0" * 16, "action": "delete",
                                                        "csrf_token": token})
    assert unknown.status_code == 409 and store.long_term_path.read_bytes() == before
    assert client.post("/memory/entries/edit", data={"line": "x", "csrf_token": token}).status_code == 400

    deleted = client.post("/memory/entries/edit", data={"line": zh_line, "version": zh_version, "action": "delete",
                                                        "csrf_token": token})
    assert deleted.status_code == 303 and "我的自行车是蓝色的" not in store.read_long_term()
    assert "我的自行车是蓝色的" in store.backups()[-1].read_text(encoding="utf-8")


def test_backups_are_listed_diffed_and_restored(console: Console) -> None:
    store = console.app.workspace.store
    store.append_long_term("Wifi password is 柠檬树")
    store.rewrite_long_term(store.read_long_term().replace("柠檬树", "橘子树"))
    client = logged_in(console)
    listing = client.get("/memory/backups").text
    name = re.search(r'href="/memory/backups\?name=([^"]+)"', listing)
    assert name is not None
    diff = client.get("/memory/backups", params={"name": name.group(1)}).text
    assert '<span class="del">-Wifi password is 柠檬树</span>' in diff
    assert '<span class="add">+Wifi password is 橘子树</span>' in diff
    assert client.get("/memory/backups", params={"name": "../config.json"}).status_code == 404
    token = csrf_of(diff)
    assert client.post("/memory/backups/restore", data={"name": "nope.md", "csrf_token": token}).status_code == 404
    restored = client.post("/memory/backups/restore", data={"name": name.group(1), "csrf_token": token})
    assert restored.status_code == 303 and "柠檬树" in store.read_long_term()


def test_a_reminder_added_in_the_console_is_listed_by_cron_and_removed(
        console: Console, capsys: pytest.CaptureFixture[str]) -> None:
    from picoclaw.cli import main

    client = logged_in(console)
    token = csrf_of(client.get("/jobs").text)
    for form, why in (({"kind": "in", "when": "soon", "session": "telegram:42", "text": "x"}, "soon"),
                      ({"kind": "every", "when": "ten", "session": "telegram:42", "text": "x"}, "seconds"),
                      ({"kind": "in", "when": "20 minutes", "session": "nowhere:1", "text": "x"}, "nowhere"),
                      ({"kind": "cron", "when": "61 * * * *", "session": "telegram:42", "text": "x"}, "61")):
        refused = client.post("/jobs", data={**form, "csrf_token": token})
        assert refused.status_code == 400 and "Refused, nothing was changed" in refused.text, why
    assert console.app.jobs().load() == []
    added = client.post("/jobs", data={"kind": "cron", "when": "0 9 * * 1", "action": "message",
                                       "session": "telegram:42", "text": "周一早上九点开周会", "csrf_token": token})
    assert added.status_code == 303
    assert main(["cron", "list"]) == 0
    listed = capsys.readouterr().out
    assert "cron 0 9 * * 1" in listed and "周一早上九点开周会" in listed and "telegram:42" in listed
    page = client.get("/jobs", headers={"Accept-Language": "zh-CN"}).text
    job_id = re.search(r'name="id" value="([^"]+)"', page)
    assert job_id is not None and "提醒与定时任务" in page and "尚未运行" in page
    assert client.post("/jobs/remove", data={"id": "nope", "csrf_token": token}).status_code == 404
    assert client.post("/jobs/remove", data={"id": job_id.group(1), "csrf_token": token}).status_code == 303
    assert console.app.jobs().load() == []


def test_status_masks_every_secret_and_skill_drafts_are_accepted_or_rejected(home: Path) -> None:
    from picoclaw.tools import SkillDrafts

    with edit_config(home) as config:
        config["providers"]["openai"]["api_key"] = "sk-secret-0123456789"
        config["tools"] = {"mcp": {"servers": {
            "files": {"command": ["npx", "-y", "server-files"], "env": {"FILES_TOKEN": "tok-secret-42"}},
            "remote": {"url": "https://mcp.example/x", "headers": {"Authorization": "Bearer hdr-secret-7"}}}}}
    app = App.open(home)
    skills = app.workspace.layout.skills_dir
    drafts = SkillDrafts(skills)
    for name in ("packing-list", "tea-timer"):
        drafts.write(name, f"---\nname: {name}\ndescription: 整理 {name} 的步骤\n---\nSteps.\n")
    (skills / "broken").mkdir()
    (skills / "broken" / "SKILL.md").write_text("no front matter here\n", encoding="utf-8")
    try:
        with Console(app) as console:
            client = logged_in(console)
            page = client.get("/status").text
            for secret in ("sk-secret", "tok-secret", "hdr-secret"):
                assert secret not in page
            assert "FILES_TOKEN=••••••" in page and "Authorization: ••••••" in page and "npx -y server-files" in page
            assert "packing-list" in page and "broken" in page and "failed" in page
            token = csrf_of(page)
            accepted = client.post("/status/drafts", data={"name": "packing-list", "decision": "accept",
                                                           "csrf_token": token})
            assert accepted.status_code == 303 and (skills / "packing-list" / "SKILL.md").is_file()
            rejected = client.post("/status/drafts", data={"name": "tea-timer", "decision": "reject",
                                                           "csrf_token": token})
            assert rejected.status_code == 303 and [draft.name for draft in drafts.list()] == []
            unknown = client.post("/status/drafts", data={"name": "../../etc", "decision": "reject",
                                                          "csrf_token": token})
            assert unknown.status_code == 400 and "Refused" in unknown.text
            assert "技能草稿" in client.get("/status", headers={"Accept-Language": "zh"}).text
    finally:
        app.close()


@pytest.fixture
def chatting(home: Path, fake_openai: FakeOpenAIServer) -> Iterator[tuple[Console, FakeOpenAIServer]]:
    """The console over a home whose model is the fake server."""
    with edit_config(home) as config:
        config["providers"]["openai"] = {"api_key": "sk-test-0123456789abc", "api_base": fake_openai.base_url}
    app = App.open(home)
    try:
        with Console(app) as console:
            yield console, fake_openai
    finally:
        app.close()


def chat_events(client: httpx2.Client, token: str, text: str, name: str = "console") -> list[dict[str, str]]:
    with client.stream("POST", "/chat/turn", json={"name": name, "text": text},
                       headers={"X-CSRF-Token": token}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-security-policy"].startswith("default-src 'self'")
        return [json.loads(line) for line in response.iter_lines() if line]


def test_a_chat_turn_streams_its_answer_and_tool_calls_and_is_kept_as_a_web_session(
        chatting: tuple[Console, FakeOpenAIServer]) -> None:
    console, fake = chatting
    console.app.workspace.store.append_long_term("My corgi is called Doudou")
    client = logged_in(console)
    page = client.get("/chat").text
    token = re.search(r'<meta name="csrf-token" content="([^"]+)">', page)
    assert token is not None and '<script src="/static/chat.js" defer></script>' in page
    fake.reply_tool_calls([("memory_search", {"query": "corgi"})])
    fake.reply_text("Your corgi is called Doudou, and he loves the park.")
    events = chat_events(client, token.group(1), "What is my corgi called?")
    kinds = [event["kind"] for event in events]
    assert kinds[0] == "tool" and events[0]["text"].startswith("memory_search ")
    assert kinds.count("text") > 3 and kinds[-1] == "done"  # streamed in pieces, then the whole answer
    assert "".join(e["text"] for e in events if e["kind"] == "text") == events[-1]["text"]
    fake.reply_text("豆豆是一只柯基。")
    chinese = chat_events(client, token.group(1), "豆豆是什么狗？")
    assert chinese[-1] == {"kind": "done", "text": "豆豆是一只柯基。", "html": "<p>豆豆是一只柯基。</p>\n"}
    transcript = console.app.workspace.sessions().folder / "web%3Aconsole.jsonl"
    lines = [json.loads(line) for line in transcript.read_text(encoding="utf-8").splitlines()]
    said = [line["message"]["content"] for line in lines if line["message"].get("role") == "user"]
    assert said == ["What is my corgi called?", "豆豆是什么狗？"]
    reopened = client.get("/chat").text
    assert "豆豆是一只柯基。" in reopened and "What is my corgi called?" in reopened
    help_text = chat_events(client, token.group(1), "/help")[-1]
    assert help_text["kind"] == "done" and "/new" in help_text["text"]  # slash commands are the agent's own


def test_chat_refuses_bad_input_and_a_post_without_csrf(chatting: tuple[Console, FakeOpenAIServer]) -> None:
    console, fake = chatting
    client = logged_in(console)
    token = csrf_of(client.get("/memory").text)
    assert client.post("/chat/turn", json={"name": "console", "text": "hi"}).status_code == 403
    assert client.post("/chat/turn", json={"name": "two words", "text": "hi"},
                       headers={"X-CSRF-Token": token}).status_code == 400
    assert client.post("/chat/turn", json={"name": "console", "text": "  "},
                       headers={"X-CSRF-Token": token}).status_code == 400
    assert client.post("/chat/turn", content=b"not json", headers={"X-CSRF-Token": token}).status_code == 400
    assert client.post("/chat/turn", json={"name": "console", "text": "x" * 20_001},
                       headers={"X-CSRF-Token": token}).status_code == 413
    assert fake.chat_requests() == []  # nothing reached the model


def test_stop_cancels_a_running_turn(chatting: tuple[Console, FakeOpenAIServer]) -> None:
    from tests.fakes.openai_server import Text

    console, fake = chatting
    client = logged_in(console)
    token = csrf_of(client.get("/memory").text)
    release = threading.Event()
    fake.enqueue(Text("a very slow answer", until=release))
    found: list[list[dict[str, str]]] = []
    streaming = threading.Thread(target=lambda: found.append(chat_events(client, token, "take your time")))
    streaming.start()
    try:
        for _ in range(600):  # until the model has the request (bounded: 60 s)
            if fake.chat_requests():
                break
            threading.Event().wait(0.1)
        stopped = client.post("/chat/stop", data={"name": "console", "csrf_token": token})
        assert stopped.json() == {"stopped": True}
        streaming.join(60)
    finally:
        release.set()
    assert found and found[0][-1] == {"kind": "stopped", "text": ""}
    assert client.post("/chat/stop", data={"name": "console", "csrf_token": token}).json() == {"stopped": False}


def test_a_reminder_for_a_web_session_appears_while_its_page_is_open(
        chatting: tuple[Console, FakeOpenAIServer]) -> None:
    from picoclaw.channels import NotOpen
    from picoclaw.web.chat_page import channel

    console, _ = chatting
    client = logged_in(console)
    client.get("/chat")
    conversations = channel(console.app_web)

    def deliver(text: str) -> None:
        asyncio.run_coroutine_threadsafe(conversations.deliver("web:console", text), console.loop).result(60)

    with pytest.raises(NotOpen):
        deliver("nobody is looking")
    with client.stream("GET", "/chat/events", params={"name": "console"}) as events:
        lines = events.iter_lines()
        assert next(lines) == ": open"
        deliver("该去遛狗了 — time to walk the dog")
        data = next(line for line in lines if line.startswith("data: "))
    assert json.loads(data[6:]) == {"kind": "delivered", "text": "该去遛狗了 — time to walk the dog"}
    with client.stream("GET", "/chat/events", params={"name": "console"}) as events:
        lines = events.iter_lines()
        assert next(lines) == ": open"
        asyncio.run_coroutine_threadsafe(conversations.stop(), console.loop).result(60)
        assert [line for line in lines if line] == []  # the stream ends when the console stops
    with pytest.raises(NotOpen):
        deliver("after the page's stream ended")


@pytest.mark.slow
def test_in_a_browser_a_chat_answer_streams_in_and_why_this_answer_shows_its_memory(
        chatting: tuple[Console, FakeOpenAIServer]) -> None:
    import os

    if not CHROMIUM.exists():
        if os.environ.get("PICOCLAW_REQUIRE_CHROMIUM"):
            pytest.fail(f"{CHROMIUM} is missing (.ci/run installs Debian's chromium)")
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium")
    from playwright.sync_api import expect, sync_playwright

    console, fake = chatting
    console.app.workspace.store.append_long_term("我的柯基叫豆豆，最喜欢去公园")
    fake.reply_tool_calls([("memory_search", {"query": "柯基"})])
    fake.reply_text("<b>豆豆</b> loves the park.", chunk_delay=0.05)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(locale="en-US")
            page.goto(console.gate.login_url(console.base))
            page.goto(f"{console.base}/chat")
            page.fill("#message", "我的柯基叫什么？")
            page.press("#message", "Enter")
            answer = page.locator("article.said.assistant .markdown").last
            expect(answer).to_have_text("<b>豆豆</b> loves the park.", timeout=60_000)  # as text, not markup
            assert page.locator("article.said.assistant b").count() == 0
            assert "memory_search" in page.locator("details.event.tool summary").first.inner_text()
            page.click("main a[href^='/why/conversation']")
            assert re.search(r"search\s+\d\.\d{3}\s+memory/MEMORY\.md", page.locator("table.blocks").first.inner_text())
            assert "我的柯基叫豆豆" in page.locator("table.blocks").first.inner_text()
        finally:
            browser.close()


def test_memory_stats_show_the_numbers_and_charts(chatting: tuple[Console, FakeOpenAIServer]) -> None:
    console, fake = chatting
    store = console.app.workspace.store
    store.append_long_term("My corgi is called Doudou")
    store.rewrite_long_term(store.read_long_term() + "\n## 2024-05-02\n周五开预算评审会\n")  # a backup: two sizes
    client = logged_in(console)
    token = csrf_of(client.get("/memory").text)
    fake.reply_text("Doudou.", usage={"prompt_tokens": 800, "completion_tokens": 2}, cached_tokens=600)
    fake.reply_text("周五。", usage={"prompt_tokens": 1000, "completion_tokens": 2}, cached_tokens=800)
    chat_events(client, token, "What is my corgi called?")
    chat_events(client, token, "预算评审会是哪天？")
    store.append_long_term("I'm allergic to peanuts")  # after the turns: no prompt carried it
    memory = client.get("/memory").text
    assert re.search(r"## \d{4}-\d\d-\d\d · injected 1× \(\d{4}-\d\d-\d\d\)</p>\s*<pre>My corgi", memory)
    assert re.search(r"never injected</p>\s*<pre>I&#39;m allergic to peanuts", memory)
    page = client.get("/memory/stats").text
    assert re.search(r"<td>MEMORY\.md</td><td>1</td><td>3</td>", page)
    assert page.count('<polyline class="line" points="') == 2  # size over time, retrieval per turn
    assert "2 turns · p50" in page and "77.8% · 1400 / 1800 tokens, 2 replies" in page
    assert "记忆统计" in client.get("/memory/stats", headers={"Accept-Language": "zh-CN"}).text


def test_daily_notes_by_day_and_lessons_are_shown_as_text(console: Console) -> None:
    from datetime import datetime
    from zoneinfo import ZoneInfo

    store = console.app.workspace.store
    shanghai = ZoneInfo("Asia/Shanghai")
    store.append_note("Dentist at 10, 看牙医 <script>x</script>", at=datetime(2024, 5, 2, 9, 30, tzinfo=shanghai))
    store.append_note("Called mum, 给妈妈打电话", at=datetime(2024, 5, 3, 20, 0, tzinfo=shanghai))
    store.append_learning("Always answer in Chinese when the user writes Chinese; 用户写中文时用中文回答", "test")
    client = logged_in(console)
    newest = client.get("/memory/notes").text
    assert "给妈妈打电话" in newest and "2024-05-02" in newest  # the newest day open, every day listed
    older = client.get("/memory/notes", params={"day": "20240502"}).text
    assert "看牙医 &lt;script&gt;x&lt;/script&gt;" in older and "<script>x" not in older
    assert client.get("/memory/notes", params={"day": "../../config"}).status_code == 404
    lessons = client.get("/memory/lessons").text
    assert "用户写中文时用中文回答" in lessons and "standing: in every prompt" in lessons


def test_without_a_model_the_chat_says_so_in_one_line_and_the_other_pages_work(console: Console) -> None:
    client = logged_in(console)
    token = csrf_of(client.get("/chat").text)
    turn = client.post("/chat/turn", json={"name": "console", "text": "hi"}, headers={"X-CSRF-Token": token})
    assert turn.status_code == 503 and "the chat needs a model" in turn.text and "Traceback" not in turn.text
    assert client.get("/chat/events", params={"name": "console"}).status_code == 503
    assert client.get("/memory").status_code == 200


def test_a_compression_links_to_its_before_and_after_with_the_fact_checks_verdict(console: Console) -> None:
    from picoclaw.memory import COMPRESSION, record_outcome

    store = console.app.workspace.store
    store.append_long_term("Project Falcon ships on 2026-12-15")
    store.append_long_term("Project Falcon's launch moved to 2026-12-18")
    before = store.read_long_term()
    compressed = before.split("## ")[0] + "## 2026-11-26\nProject Falcon ships on 2026-12-18 (moved from 12-15)\n"
    store.rewrite_long_term(compressed)  # as the compressor does: a backup of the file first
    record_outcome(store.documents, store.memory_dir, COMPRESSION, "compressed",
                   "2 entries into 1; every fact kept (fact check passed)")
    client = logged_in(console)
    page = client.get("/memory/stats").text
    assert "compressed · 2 entries into 1; every fact kept (fact check passed)" in page
    link = re.search(r'<a href="(/memory/backups\?name=[^"]+)">before → after</a>', page)
    assert link is not None
    diff = client.get(link.group(1).replace("&amp;", "&")).text
    assert '<span class="del">-Project Falcon ships on 2026-12-15</span>' in diff
    assert '<span class="add">+Project Falcon ships on 2026-12-18 (moved from 12-15)</span>' in diff


def test_the_console_works_the_same_on_postgresql(home: Path, postgres_dsn: str, fake_openai: FakeOpenAIServer,
                                                  tmp_path: Path) -> None:
    from picoclaw.storage import export_workspace

    with edit_config(home) as config:
        config["storage"] = {"backend": "postgres", "postgres": {"dsn": postgres_dsn, "pool_size": 4}}
        config["providers"]["openai"] = {"api_key": "sk-test-0123456789abc", "api_base": fake_openai.base_url}
    app = App.open(home)
    try:
        with Console(app) as console:
            client = logged_in(console)
            token = csrf_of(client.get("/memory").text)
            added = client.post("/memory/entries", data={"content": "我的柯基叫豆豆 (Doudou)", "csrf_token": token})
            assert added.status_code == 303
            fake_openai.reply_text("豆豆。")
            assert chat_events(client, token, "我的狗叫什么？")[-1] == {"kind": "done", "text": "豆豆。",
                                                                        "html": "<p>豆豆。</p>\n"}
            assert "web:console" in client.get("/why").text
            assert client.post("/policy/set", data={"key": "recent_days", "value": "5", "csrf_token": token}
                               ).status_code == 303
            assert client.post("/jobs", data={"kind": "in", "when": "2 hours", "session": "web:console",
                                              "text": "遛狗", "csrf_token": token}).status_code == 303
            export_workspace(app.storage, tmp_path / "export")
    finally:
        app.close()
    exported = tmp_path / "export"
    assert "我的柯基叫豆豆 (Doudou)" in (exported / "memory" / "MEMORY.md").read_text(encoding="utf-8")
    assert "我的狗叫什么？" in (exported / "sessions" / "web%3Aconsole.jsonl").read_text(encoding="utf-8")
    assert "遛狗" in (exported / "cron" / "jobs.json").read_text(encoding="utf-8")
    assert json.loads((exported / "memory" / "policy_overrides.json").read_text(encoding="utf-8")) == {
        "recent_days": 5}


@pytest.mark.slow
def test_the_status_page_shows_the_state_and_tools_of_the_mcp_servers_started_for_the_chat(home: Path) -> None:
    import sys

    from picoclaw.web.status_page import MCP_KEY

    script = Path(__file__).parent / "fakes" / "mcp_server.py"
    with edit_config(home) as config:
        config["tools"] = {"mcp": {"servers": {"helper": {"command": [sys.executable, str(script)],
                                                          "env": {"HELPER_TOKEN": "tok-secret-1"}, "tools": ["echo"]}}}}
    app = App.open(home)
    try:
        with Console(app) as console:
            client = logged_in(console)
            assert "ready" not in client.get("/status").text  # nothing started: the configuration only
            servers = asyncio.run_coroutine_threadsafe(app.start_mcp(), console.loop).result(120)
            console.app_web[MCP_KEY].append(servers)  # as `serve` does for the chat's agent
            page = client.get("/status").text
            assert re.search(r"ready, 1 tool: mcp__helper__echo|ready, 1 tool: echo", page), page
            assert "tok-secret" not in page and "HELPER_TOKEN=••••••" in page
            # stopped on the loop that started them, as `serve` does when it ends
            asyncio.run_coroutine_threadsafe(app.aclose(), console.loop).result(120)
    finally:
        app.close()


def test_a_superseded_entry_links_to_the_entry_that_updates_it(console: Console) -> None:
    store = console.app.workspace.store
    store.append_long_term("My office is on the 3rd floor of building A")
    store.append_long_term("My office moved to the 5th floor of building A")  # marks the first superseded
    assert "> superseded by the" in store.read_long_term()
    client = logged_in(console)
    page = client.get("/memory").text
    link = re.search(r'<a href="(/memory\?page=1#line-(\d+))">superseded</a>[^<]*</p>\s*<pre>My office is on the 3rd',
                     page)
    assert link is not None
    assert re.search(rf'id="line-{link.group(2)}">\s*<p class="meta">[^<]*</p>\s*<pre>My office moved to the 5th',
                     page)


def test_lessons_show_how_often_a_prompt_carried_them(chatting: tuple[Console, FakeOpenAIServer]) -> None:
    console, fake = chatting
    store = console.app.workspace.store
    store.append_learning("When the user asks about the corgi, call him Doudou 豆豆", "test")
    store.append_learning("Weekly reports go out on Mondays", "test")
    client = logged_in(console)
    token = csrf_of(client.get("/memory").text)
    fake.reply_text("Doudou is fine.")
    chat_events(client, token, "How is the corgi doing?")
    page = client.get("/memory/lessons").text
    assert re.search(r"injected 1× \(\d{4}-\d\d-\d\d\)</p><pre>When the user asks about the corgi", page)
    assert re.search(r"never injected</p><pre>Weekly reports go out on Mondays", page)


def test_refusals_carry_the_security_headers_and_odd_bytes_are_one_clear_answer(console: Console) -> None:
    client = logged_in(console)
    token = csrf_of(client.get("/memory").text)
    for response in (client.get("/nowhere"), client.get("/why/conversation", params={"name": "nope"}),
                     client.post("/memory/entries", data={"content": "x" * 20_001, "csrf_token": token})):
        assert response.status_code in (404, 413)
        assert response.headers["content-security-policy"].startswith("default-src 'self'")
        assert response.headers["x-content-type-options"] == "nosniff"
    anonymous = httpx2.Client(base_url=console.base, follow_redirects=False, timeout=60)
    assert anonymous.get("/memory", headers={"Authorization": b"Bearer t\xc3\xa9st"}).status_code == 401
    store = console.app.workspace.store
    before = store.long_term_path.read_bytes()
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    assert client.post("/memory/entries", content=b"content=x", headers={**form, "X-CSRF-Token": b"t\xc3\xa9st"}
                       ).status_code == 403
    not_utf8 = client.post("/memory/entries", content=b"content=\xff\xfe", headers={**form, "X-CSRF-Token": token})
    assert not_utf8.status_code == 400 and "not UTF-8" in not_utf8.text
    assert store.long_term_path.read_bytes() == before


def test_a_link_preview_does_not_use_up_the_login_link(console: Console) -> None:
    preview = httpx2.Client(base_url=console.base, follow_redirects=False, timeout=60)
    link = console.gate.login_url()
    assert preview.head(link).status_code == 401 and console.gate.link_token is not None
    client = httpx2.Client(base_url=console.base, follow_redirects=False, timeout=60)
    assert client.get(link).status_code == 303  # the link still works once


def test_the_host_check_knows_ipv6_and_wildcard_listens() -> None:
    assert Gate.for_address("fd00::5", 8080).hosts == {"[fd00::5]:8080"}
    assert "[::1]:18790" in Gate.for_address("127.0.0.1", 18790).hosts
    wildcard = Gate.for_address("0.0.0.0", 18790).hosts
    assert "127.0.0.1:18790" in wildcard and "0.0.0.0:18790" not in wildcard
    linked = Gate.for_address("0.0.0.0", 18790).login_url().split("/login", 1)[0]  # a name the browser may use
    assert linked.removeprefix("http://") in wildcard
    assert Gate.for_address("127.0.0.1", 1).cookie != Gate.for_address("127.0.0.1", 2).cookie


def test_secrets_in_urls_and_command_lines_are_masked() -> None:
    from picoclaw.web.status_page import MASK, _masked_command, _masked_url

    assert _masked_url("https://u:pw@mcp.example:8443/x?api_key=abc") == (
        f"https://{MASK}@mcp.example:8443/x?api_key={MASK}")
    assert _masked_command(["srv", "--token", "abc", "--api-key=xyz", "--port", "80"]) == [
        "srv", "--token", MASK, f"--api-key={MASK}", "--port", "80"]


def test_serve_without_a_model_still_prints_its_login_link_and_serves(home: Path) -> None:
    import contextlib
    import stat

    from picoclaw.web import serve

    port = free_port()
    app = App.open(home)
    token_file = home / f"console-{port}.token"
    links: list[str] = []

    async def run() -> tuple[int, int, int]:
        announced = asyncio.Event()
        task = asyncio.create_task(serve(app, "127.0.0.1", port, token_file, announce=lambda url, path: (
            links.append(url), announced.set())))
        await asyncio.wait_for(announced.wait(), 60)
        mode = stat.S_IMODE(token_file.stat().st_mode)
        async with httpx2.AsyncClient(follow_redirects=False, timeout=60) as client:
            login = (await client.get(links[0])).status_code
            script = (await client.get(f"http://127.0.0.1:{port}/memory", headers={
                "Authorization": f"Bearer {token_file.read_text(encoding='utf-8').strip()}"})).status_code
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return login, script, mode

    try:
        assert asyncio.run(run()) == (303, 200, 0o600)  # the link, then the script token; the file is the user's
    finally:
        app.close()
    assert links[0].startswith(f"http://127.0.0.1:{port}/login?token=")
    assert not token_file.exists()  # a console that stopped leaves no token behind


def test_why_this_answer_shows_the_feedback_on_each_reply(console: Console) -> None:
    folder = console.app.workspace.sessions().folder
    folder.mkdir(parents=True, exist_ok=True)
    key = "telegram:42"
    records = [{"type": "message", "id": n, "time": f"2026-11-26T10:00:0{n}+00:00",
                "message": {"role": "user" if n % 2 else "assistant", "content": text}}
               for n, text in enumerate(["Capital of Australia?", "Sydney.", "澳大利亚的首都？", "堪培拉。"], 1)]
    (folder / "telegram%3A42.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    ledger = FeedbackLedger(console.app.workspace.memory_dir, storage=console.app.workspace.storage)
    for user, emoji, verdict, turn in [(42, "👍", "positive", 1), (42, "👎", "negative", 1), (7, "🔥", "positive", 3)]:
        assert ledger.record(Reaction("2026-11-26T10:01:00+00:00", key, 42, 100 + turn, user, emoji, verdict, turn))
    client = logged_in(console)
    page = client.get("/why/conversation", params={"name": "telegram%3A42.jsonl"}).text
    english, chinese = page.index("Capital of Australia?"), page.index("澳大利亚的首都？")
    assert "Feedback on the reply: 🔥" in page[chinese:english]
    assert "Feedback on the reply: 👎" in page[english:]  # the user's newest verdict, not both
    assert "👍" not in page
    zh = client.get("/why/conversation", params={"name": "telegram%3A42.jsonl"},
                    headers={"Accept-Language": "zh-CN"}).text
    assert "对回复的反馈: 👎" in zh


def test_the_stats_page_charts_the_model_tokens_of_each_day(chatting: tuple[Console, FakeOpenAIServer]) -> None:
    console, fake = chatting
    client = logged_in(console)
    token = csrf_of(client.get("/memory").text)
    fake.reply_text("Doudou.", usage={"prompt_tokens": 1200, "completion_tokens": 30})
    fake.reply_text("豆豆。", usage={"prompt_tokens": 1300, "completion_tokens": 20})
    assert chat_events(client, token, "What is my corgi called?")[-1]["kind"] == "done"
    assert chat_events(client, token, "我的柯基叫什么？")[-1]["kind"] == "done"
    page = client.get("/memory/stats").text
    assert "Model tokens per day (last 30 days)" in page
    assert page.count('<rect class="chat"') == 30  # a bar for each of the last 30 days
    today = re.findall(r"<title>(\d{4}-\d\d-\d\d): 0 background, 2,550 chat</title>", page)
    assert len(today) == 1 and "spent today: background 0 of 200,000 tokens (0%), chat 2,550 tokens" in page
    assert "max 2,550 tokens" in page
    assert "每天的模型 tokens（最近 30 天）" in client.get("/memory/stats", headers={"Accept-Language": "zh-CN"}).text
    spend = console.app.workspace.memory_dir / ".spend.json"
    spend.write_bytes(b"{not json")
    damaged = client.get("/memory/stats")
    assert damaged.status_code == 200 and f"{spend} is not valid JSON" in damaged.text
    assert '<rect class="chat"' not in damaged.text
