"""The jobs page: edit, switch off and on, run now (through the job store, as the CLI's jobs are kept); times in
the configured zone named as IANA names it; the language switch stays on its page; and no page scrolls sideways
at phone width. English and Chinese; in Chromium too."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta

import httpx2
import pytest

from picoclaw import clock
from picoclaw.app import App
from tests.fakes.console import Console, csrf_of, logged_in
from tests.test_web_editing import CHROMIUM, CHROMIUM_FLAGS, chromium_or_skip


def add(client: httpx2.Client, token: str, **form: str) -> str:
    added = client.post("/jobs", data={"action": "message", "csrf_token": token, **form})
    assert added.status_code == 303, added.text
    return client.get("/jobs").text


class Inbox:
    """A channel that keeps what the scheduler delivers to web: sessions."""

    name = "web"

    def __init__(self) -> None:
        self.delivered: list[tuple[str, str]] = []

    async def deliver(self, session_key: str, markdown: str) -> None:
        self.delivered.append((session_key, markdown))


def test_a_job_is_edited_switched_off_and_on_and_run_now(console: Console) -> None:
    app = console.app
    jobs = app.jobs()
    client = logged_in(console)
    token = csrf_of(client.get("/jobs").text)
    page = add(client, token, kind="cron", when="0 9 * * 1", session="web:console", text="周一早上九点开周会")
    job = jobs.load()[0]
    assert "Times are in <strong>Asia/Shanghai</strong>" in page and "CST" not in page
    next_run = f"{job.next_run.astimezone(jobs.tz):%Y-%m-%d %H:%M}"
    assert f'<td data-label="next run">{next_run}</td>' in page and "09:00" in next_run
    assert not re.search(r"\d\d:\d\d:\d\d", page)  # no seconds, no microseconds

    # Edit: a new schedule and text; refused edits write nothing.
    edited = client.post("/jobs/edit", data={"id": job.id, "kind": "every", "when": "3600", "action": "agent",
                                             "session": "web:console", "text": "Check the deploy 检查部署",
                                             "csrf_token": token})
    assert edited.status_code == 303 and edited.headers["location"] == "/jobs?notice=job_edited"
    after = jobs.get(job.id)
    assert after is not None and after.schedule.every == 3600 and after.action == "agent"
    assert after.text == "Check the deploy 检查部署" and after.created_at == job.created_at
    before = jobs.load()
    for form, status in (({"kind": "cron", "when": "61 * * * *"}, 400), ({"kind": "every", "when": "often"}, 400),
                         ({"session": "nowhere:1"}, 400), ({"text": "   "}, 400), ({"id": "nope"}, 404)):
        refused = client.post("/jobs/edit", data={"id": job.id, "kind": "every", "when": "3600", "action": "agent",
                                                  "session": "web:console", "text": "x", **form,
                                                  "csrf_token": token})
        assert refused.status_code == status and "Refused, nothing was changed" in refused.text, form
    assert jobs.load() == before

    off = client.post("/jobs/switch", data={"id": job.id, "enabled": "0", "csrf_token": token})
    assert off.headers["location"] == "/jobs?notice=job_disabled" and not jobs.get(job.id).enabled
    zh = client.get("/jobs", headers={"Accept-Language": "zh-CN"}).text
    assert "已停用" in zh and "启用" in zh and "立即运行" not in zh and "时间均为" in zh
    refused = client.post("/jobs/run", data={"id": job.id, "csrf_token": token})
    assert refused.status_code == 400 and "switch it on first" in refused.text
    on = client.post("/jobs/switch", data={"id": job.id, "enabled": "1", "csrf_token": token})
    assert on.headers["location"] == "/jobs?notice=job_enabled" and jobs.get(job.id).enabled

    # Run now: due at once; this process's scheduler for web: sessions runs it, and the schedule goes on.
    jobs.edit(job.id, after.schedule, "message", "Stand-up 站会", "web:console")
    now = client.post("/jobs/run", data={"id": job.id, "csrf_token": token})
    assert now.headers["location"] == "/jobs?notice=job_due"
    assert jobs.get(job.id).next_run <= clock.now()
    inbox = Inbox()
    ran = asyncio.run(app.scheduler(inbox).run_due())  # type: ignore[arg-type]
    assert [r.job_id for r in ran] == [job.id] and inbox.delivered == [("web:console", "Stand-up 站会")]
    assert jobs.get(job.id).next_run > clock.now() + timedelta(minutes=59)
    assert client.post("/jobs/run", data={"id": "nope", "csrf_token": token}).status_code == 404
    assert client.post("/jobs/switch", data={"id": "nope", "enabled": "1", "csrf_token": token}).status_code == 404


def test_a_switched_off_job_is_kept_however_long_ago_it_last_ran(console: Console) -> None:
    jobs = console.app.jobs()
    client = logged_in(console)
    token = csrf_of(client.get("/jobs").text)
    add(client, token, kind="every", when="600", session="web:console", text="water the plants")
    job = jobs.load()[0]
    long_ago = clock.now() - timedelta(days=30)
    jobs.update(job.id, lambda stored: setattr(stored, "last_run", long_ago) is None)
    jobs.set_enabled(job.id, False)
    add(client, token, kind="in", when="2 hours", session="web:console", text="another job")  # a change of the file
    assert [j.text for j in jobs.load()] == ["water the plants", "another job"]
    jobs.set_enabled(job.id, True)  # its missed runs are not made up: the next one is from now
    assert jobs.get(job.id).next_run > clock.now()


def test_the_language_switch_returns_to_the_page_it_was_pressed_on(console: Console) -> None:
    client = logged_in(console)
    token = csrf_of(client.get("/jobs").text)
    back = client.post("/language", data={"lang": "zh", "back": "/memory/notes?day=20261126", "csrf_token": token})
    assert back.status_code == 303 and back.headers["location"] == "/memory/notes?day=20261126"
    for foreign in ("//evil.example/x", "https://evil.example/", "/\\evil.example", "jobs", "/x\r\nSet-Cookie: a"):
        away = client.post("/language", data={"lang": "en", "back": foreign, "csrf_token": token})
        assert away.headers["location"] == "/memory", foreign
    page = client.get("/policy?x=1").text
    assert '<input type="hidden" name="back" value="/policy?x=1">' in page


@pytest.mark.slow
def test_in_a_browser_jobs_are_edited_switched_and_run_and_no_page_scrolls_sideways_on_a_phone(
        console: Console) -> None:
    chromium_or_skip()
    from playwright.sync_api import sync_playwright

    app: App = console.app
    jobs = app.jobs()
    app.workspace.store.append_long_term("A very long entry " + "长长的记忆" * 80)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(locale="zh-CN", viewport={"width": 390, "height": 844})
            page.goto(console.gate.login_url(console.base))
            page.goto(f"{console.base}/jobs")
            form = page.locator("#add-job")
            assert form.get_by_label("时间类型").count() == 1 and form.get_by_label("目标会话").count() == 1
            form.get_by_label("时间类型").select_option("cron")
            form.locator("input[name=when]").fill("0 9 * * 1")
            form.get_by_label("目标会话").fill("web:console")
            form.get_by_label("内容").fill("周一早上九点开周会")
            form.locator("button").click()
            assert "任务已添加" in page.locator(".notice").inner_text()
            job = jobs.load()[0]
            actions = page.locator("tr.job-actions").first
            actions.locator("details.edit > summary").click()
            actions.get_by_label("内容").fill("周一早上九点半开周会")
            actions.locator("input[name=when]").fill("30 9 * * 1")
            actions.locator("details.edit button").click()
            assert "任务已保存" in page.locator(".notice").inner_text()
            assert jobs.get(job.id).schedule.cron == "30 9 * * 1"
            page.locator("tr.job-actions button.switch").first.click()
            assert "任务已停用" in page.locator(".notice").inner_text() and not jobs.get(job.id).enabled
            page.locator("tr.job-actions button.switch").first.click()
            page.locator("tr.job-actions button.run").first.click()
            assert "任务现在到期" in page.locator(".notice").inner_text()
            assert jobs.get(job.id).next_run <= clock.now()

            page.locator("nav form button").click()  # the language switch: English, on the same page
            assert page.url == f"{console.base}/jobs?notice=job_due" and "Reminders" in page.locator("h1").inner_text()

            for lang in ("en", "zh-CN"):
                phone = browser.new_page(locale=lang, viewport={"width": 390, "height": 844})
                phone.context.add_cookies(page.context.cookies())
                for path in ("/memory", "/memory?q=memory", "/memory/backups", "/memory/stats", "/memory/notes",
                             "/memory/lessons", "/why", "/policy", "/jobs", "/status", "/chat"):
                    phone.goto(console.base + path)
                    width = phone.evaluate("document.documentElement.scrollWidth")
                    assert width <= 390, (lang, path, width)
                phone.close()
        finally:
            browser.close()
