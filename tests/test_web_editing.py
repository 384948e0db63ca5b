"""Safe editing of MEMORY.md in the console: an entry is found by its fingerprint, so an edit elsewhere never
stales another open editor; a refused save keeps the typed text beside the entry as it is now; a delete is
confirmed first and can be undone from the backup it took. Over HTTP and in Chromium, English and Chinese."""

from __future__ import annotations

import html
import re
from pathlib import Path

import httpx2
import pytest

from tests.fakes.console import Console, csrf_of, logged_in

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]
EDITOR = re.compile(r'name="line" value="(\d+)">\s*<input type="hidden" name="version" value="([0-9a-f]+)">\s*'
                    r'<input type="hidden" name="original" value="([^"]*)">')


def editors(page: str) -> dict[str, dict[str, str]]:
    """Each entry's edit form on a memory page, by the first line of its text."""
    found = {}
    for line, version, original in EDITOR.findall(page):
        text = html.unescape(original)
        found[text.split("\n")[1]] = {"line": line, "version": version, "original": text}
    return found


def save(client: httpx2.Client, form: dict[str, str], token: str, content: str) -> httpx2.Response:
    return client.post("/memory/entries/edit", data={**form, "action": "save", "content": content,
                                                     "csrf_token": token})


def test_saving_one_entry_does_not_stale_another_and_only_a_real_conflict_is_refused(console: Console) -> None:
    store = console.app.workspace.store
    for fact in ("My bike is in the garage", "我的护照在书房的抽屉里", "The wifi password is on the fridge"):
        store.append_long_term(fact)
    client = logged_in(console)
    page = client.get("/memory").text
    token, forms = csrf_of(page), editors(page)
    # The first entry grows by two lines: every entry below it moves, and their open editors still save.
    grown = save(client, forms["My bike is in the garage"], token, "My bike is in the shed\nbehind the door\nlocked")
    assert grown.status_code == 303 and grown.headers["location"] == "/memory?notice=saved"
    assert save(client, forms["我的护照在书房的抽屉里"], token, "我的护照在卧室的保险箱里").status_code == 303
    store.append_long_term("Appended by a turn meanwhile")
    wifi = save(client, forms["The wifi password is on the fridge"], token, "The wifi password is 柠檬树")
    assert wifi.status_code == 303
    text = store.read_long_term()
    assert "behind the door\nlocked" in text and "我的护照在卧室的保险箱里" in text and "is 柠檬树" in text
    assert "Appended by a turn meanwhile" in text and "书房" not in text

    # The passport's entry changed since the page showed it: that save alone is refused, the typed text kept.
    before = store.long_term_path.read_bytes()
    stale = save(client, forms["我的护照在书房的抽屉里"], token, "我的护照在 <b>车里</b>")
    assert stale.status_code == 409 and store.long_term_path.read_bytes() == before
    assert "changed since this page showed it" in stale.text
    conflict = stale.text[stale.text.index('id="conflict"'):]
    assert "我的护照在 &lt;b&gt;车里&lt;/b&gt;</textarea>" in conflict  # the typed text, as text
    assert "<pre>我的护照在卧室的保险箱里</pre>" in conflict and "The entry as it is now" in conflict
    # Saving it again over the entry as it is now is a deliberate choice: the conflict's own form does that.
    again = editors(conflict)["我的护照在卧室的保险箱里"]
    assert save(client, again, token, "我的护照在车里").status_code == 303
    assert "我的护照在车里" in store.read_long_term()

    zh = client.post("/memory/entries/edit", headers={"Accept-Language": "zh-CN"},
                     data={**forms["我的护照在书房的抽屉里"], "action": "save", "content": "又一次旧的编辑",
                           "csrf_token": token})
    assert zh.status_code == 409 and "你的内容保留在下方" in zh.text and "又一次旧的编辑</textarea>" in zh.text
    assert "这条记忆现在的内容" in zh.text and "<pre>我的护照在车里</pre>" in zh.text


def test_an_entry_that_is_gone_offers_the_typed_text_as_a_new_entry(console: Console) -> None:
    store = console.app.workspace.store
    store.append_long_term("Dentist on Tuesday")
    client = logged_in(console)
    page = client.get("/memory").text
    token, form = csrf_of(page), editors(page)["Dentist on Tuesday"]
    store.rewrite_long_term(store.read_long_term().replace("## ", "## x").replace("Dentist on Tuesday", "gone"))
    before = store.long_term_path.read_bytes()
    refused = save(client, form, token, "Dentist on Wednesday 看牙")
    assert refused.status_code == 409 and store.long_term_path.read_bytes() == before
    assert "The entry is no longer in MEMORY.md." in refused.text
    assert 'action="/memory/entries"' in refused.text and "Dentist on Wednesday 看牙</textarea>" in refused.text


def test_a_delete_is_undone_from_its_backup_at_its_place(console: Console) -> None:
    store = console.app.workspace.store
    for fact in ("First fact", "我的自行车是蓝色的", "Third fact"):
        store.append_long_term(fact)
    client = logged_in(console)
    page = client.get("/memory").text
    token, form = csrf_of(page), editors(page)["我的自行车是蓝色的"]
    deleted = client.post("/memory/entries/edit", data={**form, "action": "delete", "csrf_token": token})
    assert deleted.status_code == 303 and "我的自行车是蓝色的" not in store.read_long_term()
    notice = client.get(deleted.headers["location"], headers={"Accept-Language": "zh-CN"}).text
    undo = re.search(r'<form method="post" action="/memory/entries/undo".*?</form>', notice, re.S)
    assert undo is not None and "撤销" in undo.group(0)
    fields = dict(re.findall(r'name="(backup|line|version)" value="([^"]*)"', undo.group(0)))
    store.append_long_term("Appended after the delete")

    # Bad undos: an unknown backup, no line, an entry the backup does not hold: one line each, nothing changed.
    before = store.long_term_path.read_bytes()
    unknown = client.post("/memory/entries/undo", data={**fields, "backup": "../config.json", "csrf_token": token})
    assert unknown.status_code == 404 and unknown.text == "No such backup; nothing was changed.\n"
    assert client.post("/memory/entries/undo", data={**fields, "line": "x", "csrf_token": token}).status_code == 400
    wrong = client.post("/memory/entries/undo", data={**fields, "line": "1", "csrf_token": token})
    assert wrong.status_code == 409 and "holds no such entry" in wrong.text
    assert store.long_term_path.read_bytes() == before

    undone = client.post("/memory/entries/undo", data={**fields, "csrf_token": token})
    assert undone.status_code == 303 and undone.headers["location"] == "/memory?notice=undone"
    text = store.read_long_term()
    assert text.index("First fact") < text.index("我的自行车是蓝色的") < text.index("Third fact")
    assert "Appended after the delete" in text
    twice = client.post("/memory/entries/undo", data={**fields, "csrf_token": token})
    assert twice.headers["location"] == "/memory?notice=already_there" and store.read_long_term() == text


def chromium_or_skip() -> None:
    import os

    if not CHROMIUM.exists():
        if os.environ.get("PICOCLAW_REQUIRE_CHROMIUM"):
            pytest.fail(f"{CHROMIUM} is missing (.ci/run installs Debian's chromium)")
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium")


@pytest.mark.slow
@pytest.mark.parametrize("locale", ["en", "zh-CN"])
def test_in_a_browser_two_open_editors_both_save_a_refused_save_keeps_its_text_and_delete_undoes(
        console: Console, locale: str) -> None:
    chromium_or_skip()
    from playwright.sync_api import sync_playwright

    store = console.app.workspace.store
    for fact in ("My corgi is called Doudou", "我每周五下午三点开预算评审会", "Project Falcon ships in December"):
        store.append_long_term(fact)
    zh = locale == "zh-CN"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(locale=locale)
            first, second = context.new_page(), context.new_page()
            first.goto(console.gate.login_url(console.base))
            second.goto(f"{console.base}/memory")

            def editor(page, text: str):  # type: ignore[no-untyped-def]
                entry = page.locator("article.entry", has=page.locator("pre", has_text=text))
                entry.locator("details.edit > summary").click()
                return entry

            corgi = editor(first, "Doudou")
            falcon = editor(second, "Falcon")  # open in the other tab before the corgi's entry grows
            corgi.locator("textarea").fill("My corgi is called Doudou\nHe loves the park\nand 骨头")
            corgi.locator("button[value=save]").click()
            assert ("已保存" if zh else "Saved") in first.locator(".notice").inner_text()
            falcon.locator("textarea").fill("Project Falcon ships on 2026-12-18")
            falcon.locator("button[value=save]").click()
            assert ("已保存" if zh else "Saved") in second.locator(".notice").inner_text()
            assert "ships on 2026-12-18" in store.read_long_term()

            # A tab still showing the old Falcon entry: its save is refused and the typed text stays.
            stale = context.new_page()
            stale.goto(f"{console.base}/memory")
            old = editor(stale, "Falcon")
            store.rewrite_long_term(store.read_long_term().replace("2026-12-18", "2027-01-05"))
            old.locator("textarea").fill("Falcon: 我的新说法")
            old.locator("button[value=save]").click()
            conflict = stale.locator("#conflict")
            assert conflict.locator("textarea").input_value() == "Falcon: 我的新说法"
            assert "2027-01-05" in conflict.locator("pre").inner_text()
            assert ("你的内容" if zh else "Your text") in conflict.inner_text()

            budget = editor(second, "预算评审会")
            budget.locator("details.confirm > summary").click()  # Delete asks first
            assert budget.locator("button[value=delete]").is_visible()
            budget.locator("button[value=delete]").click()
            assert "预算评审会" not in store.read_long_term()
            second.locator("#undo button").click()
            assert ("已撤销" if zh else "Undone") in second.locator(".notice").inner_text()
            assert second.locator("article.entry pre", has_text="预算评审会").count() == 1
        finally:
            browser.close()
    assert "我每周五下午三点开预算评审会" in store.read_long_term()
