#!/usr/bin/env python3
"""Screenshots of every console page, desktop and phone width, for docs/console.md (bench/screenshots/*.png).

A temporary home with a few memories, notes, a lesson, a policy change, a reminder and a conversation whose
turns kept their record of why (English and Chinese), served on 127.0.0.1 and shot with Debian's Chromium
through Playwright. Run again after a page changes, so the docs show what the console looks like now:

    python bench/screenshots.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import orjson

REPO = Path(__file__).resolve().parents[1]
for folder in (REPO, REPO / "bench"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from picoclaw.app import App  # noqa: E402
from picoclaw.onboard import onboard  # noqa: E402
from tests.fakes.console import Console  # noqa: E402

OUT = REPO / "bench" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]
SIZES = {"desktop": (1280, 860), "phone": (390, 844)}
PAGES = {"chat": "/chat", "why": "/why/conversation?name=web%253Aconsole.jsonl", "memory": "/memory?q=corgi%20park",
         "stats": "/memory/stats", "policy": "/policy", "jobs": "/jobs", "status": "/status"}


def demo(app: App) -> None:
    """A workspace that has been used for a while."""
    store = app.workspace.store
    for fact in ("My corgi is called Doudou and loves the park", "我每周五下午三点和王芳开预算评审会",
                 "I'm allergic to peanuts", "我住在杭州西湖附近", "Project Falcon ships on 2026-12-15"):
        store.append_long_term(fact)
    store.rewrite_long_term(store.read_long_term().replace("2026-12-15", "2026-12-18"))
    shanghai = ZoneInfo("Asia/Shanghai")
    store.append_note("Dentist at 10, 看牙医", at=datetime(2026, 11, 25, 9, 30, tzinfo=shanghai))
    store.append_learning("Always answer in Chinese when the user writes Chinese", "session web:console")
    app.workspace.policy.set({"retrieve_limit": 8}, source="web", reason="fewer, better blocks")
    app.jobs().add(_schedule(app), "message", "周会 9:00", "web:console", created_by="web")
    records = []
    turns = [("What is my dog called?", "Your corgi is called Doudou, and he loves the park.", 0.914,
              "## 2026-11-26\nMy corgi is called Doudou and loves the park"),
             ("预算评审会是哪天？", "每周五下午三点，和王芳一起。", 0.873,
              "## 2026-11-26\n我每周五下午三点和王芳开预算评审会")]
    for n, (question, answer, score, block) in enumerate(turns):
        why = {"search": "keywords (BM25 over the memory files), re-ranked by standing",
               "items": [{"key": f"k{n}", "found_by": "search", "score": score, "path": "memory/MEMORY.md",
                          "lines": [5 + 3 * n, 6 + 3 * n], "text": block, "tokens": 18}],
               "left_out": [{"key": "k9", "found_by": "search", "score": score * 0.6, "path": "memory/MEMORY.md",
                             "lines": [8, 9], "text": "## 2026-11-26\nI'm allergic to peanuts", "tokens": 12,
                             "reason": "in_conversation" if n else "over_budget"}],
               "policy": {"retrieve_limit": 8, "memory_token_budget": 2000},
               "context": {"window": 8192, "source": "server", "detail": "", "tools_short": False,
                           "memory_dropped": 0, "history_set_aside": 0, "history_room": 3000,
                           "parts": {"system": 640, "lessons": 24, "skills": 90, "tools": 830, "memory": 60,
                                     "history": 420 + 150 * n, "user": 12, "reply": 4096}}}
        records.append({"type": "message", "id": 2 * n + 1, "time": "2026-11-26T10:00:00+00:00",
                        "message": {"role": "user", "content": question}, "why": why})
        records.append({"type": "message", "id": 2 * n + 2, "time": "2026-11-26T10:00:05+00:00",
                        "message": {"role": "assistant", "content": answer},
                        "prompt_tokens": 2100 + 150 * n, "cached_tokens": 1900 + 150 * n * 2})
    folder = app.workspace.sessions().folder
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "web%3Aconsole.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))


def _schedule(app: App) -> object:
    from picoclaw.jobs import make_schedule

    return make_schedule(cron="0 9 * * 1", tz=app.jobs().tz)


def main() -> int:
    from playwright.sync_api import sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="picoclaw-shots-") as tmp:
        home = Path(tmp) / "home"
        os.environ["PICOCLAW_HOME"] = str(home)
        onboard(home)
        config = orjson.loads((home / "config.json").read_bytes())
        config["providers"]["openai"]["api_key"] = "sk-demo-placeholder"  # the chat page needs a model configured
        config["timezone"] = "Asia/Shanghai"  # times as a user there sees them, the zone named
        (home / "config.json").write_bytes(orjson.dumps(config))
        app = App.open(home)
        demo(app)
        console = Console(app).__enter__()
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            first = browser.new_context()
            first.new_page().goto(console.gate.login_url(console.base))  # the link works once: keep its cookie
            cookies = first.cookies()
            first.close()
            for size, (width, height) in SIZES.items():
                for lang in ("en", "zh-CN"):
                    context = browser.new_context(viewport={"width": width, "height": height}, locale=lang)
                    context.add_cookies(cookies)
                    page = context.new_page()
                    for name, path in PAGES.items():
                        if lang != "en" and name not in ("chat", "memory", "why", "jobs"):
                            continue  # in Chinese two pages show the labels well enough
                        page.goto(console.base + path)
                        suffix = "" if lang == "en" else "-zh"
                        page.screenshot(path=str(OUT / f"{name}-{size}{suffix}.png"))
                    context.close()
            browser.close()
        app.close()
    print(f"screenshots in {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
