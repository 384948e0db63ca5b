"""The console's Attach: one file with a chat message, as a multipart form to /chat/turn; it
becomes the turn as with `chat --attach` (a document read, an image to a model that sees, audio transcribed), what
it shows first comes as "attached" events; a body over the media limits is 413 with one log line, a file that
cannot be taken 422, a form without the CSRF token 403, and in each case nothing reaches the model."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from picoclaw.channels import NO_VISION, NOT_LISTENING, SPOKEN_MARK
from tests.fakes import FakeOpenAIServer
from tests.fakes.console import Console, console_of, csrf_of, logged_in
from tests.homes import edit_config
from tests.test_attachments import OGG, PNG, ZH
from tests.test_web_console import CHROMIUM, CHROMIUM_FLAGS


@pytest.fixture
def console(home: Path, fake_openai: FakeOpenAIServer) -> Iterator[Console]:
    """The console over a home whose model (which does not see) and transcriber are the fake server, taking
    images up to 1 MB and documents up to 64 KB, and audio up to 2 MB."""
    with edit_config(home) as config:
        config["providers"]["openai"] = {"api_key": "sk-test-0123456789abc", "api_base": fake_openai.base_url,
                                         "max_retries": 0}
        config["agents"]["defaults"]["vision"] = False
        config["media"] = {"image_megabytes": 1, "document_kilobytes": 64}
        config["transcription"] = {"provider": "openai", "model": "whisper-1", "max_megabytes": 2}
    with console_of(home) as running:
        yield running


def upload(client: httpx2.Client, token: str | None, name: str, data: bytes, text: str = "") -> httpx2.Response:
    headers = {"X-CSRF-Token": token} if token else {}
    return client.post("/chat/turn", data={"name": "console", "text": text}, files={"file": (name, data)},
                       headers=headers)


def events(response: httpx2.Response) -> list[dict[str, str]]:
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines() if line]


def last_user(fake: FakeOpenAIServer) -> Any:
    return [m for m in fake.chat_requests()[-1]["messages"] if m["role"] == "user"][-1]["content"]


def media_files(console: Console) -> list[Path]:
    folder = console.app.workspace.media().folder
    return [path for path in folder.rglob("*") if path.is_file()] if folder.is_dir() else []


def test_a_document_an_image_and_audio_go_with_their_messages(console: Console, fake_openai: FakeOpenAIServer) -> None:
    client = logged_in(console)
    page = client.get("/chat").text
    assert 'type="file" id="attachment"' in page and "📎 Attach" in page
    assert "📎 附件" in client.get("/chat", headers={"Accept-Language": "zh"}).text
    token = csrf_of(client.get("/memory").text)

    fake_openai.reply_text("发布改到了周五。")
    answered = events(upload(client, token, "会议.txt", ZH.encode("gbk"), "发布是哪天？"))
    assert (answered[-1]["kind"], answered[-1]["text"]) == ("done", "发布改到了周五。")
    sent = last_user(fake_openai)
    assert "[document: 会议.txt, saved as media/" in sent and "安娜负责预算" in sent and sent.endswith("发布是哪天？")

    fake_openai.reply_text("I cannot see it, sorry.")
    blind = events(upload(client, token, "C:\\photos\\sign.png", PNG, "What does this sign say?"))
    assert blind[0] == {"kind": "attached", "text": NO_VISION} and blind[-1]["kind"] == "done"
    assert re.search(r"What does this sign say\?\n\[image: media/\d{6}/[0-9a-f]{12}-sign\.png\] \(this model cannot",
                     last_user(fake_openai))

    fake_openai.reply_transcript("Buy oat milk on the way home")
    fake_openai.reply_text("Noted: oat milk.")
    heard = events(upload(client, token, "voice", OGG))  # no text: the file is the message
    assert heard[0] == {"kind": "attached", "text": "🎤 Buy oat milk on the way home"}
    assert (heard[-1]["kind"], heard[-1]["text"]) == ("done", "Noted: oat milk.")
    assert last_user(fake_openai).endswith(f"\n{SPOKEN_MARK} Buy oat milk on the way home")
    assert fake_openai.transcription_requests()[0]["filename"] == "voice.ogg"
    transcript = console.app.workspace.sessions().folder / "web%3Aconsole.jsonl"
    users = [json.loads(line)["message"] for line in transcript.read_text(encoding="utf-8").splitlines()]
    assert len([m for m in users if m.get("role") == "user"]) == 3


def test_a_body_over_the_limits_is_413_with_one_log_line_and_nothing_is_sent(
        console: Console, fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    client = logged_in(console)
    token = csrf_of(client.get("/memory").text)
    caplog.set_level(logging.INFO)
    too_big = upload(client, token, "huge.png", PNG + bytes(2_200_000))
    assert too_big.status_code == 413 and too_big.text.startswith("That file is larger than the 2.0 MB I take")
    refused = [r.getMessage() for r in caplog.records if "refused POST /chat/turn (413)" in r.getMessage()]
    assert len(refused) == 1

    def chunks() -> Iterator[bytes]:  # no Content-Length: found over while it is read
        boundary = b"--xyz\r\n"
        yield boundary + b'Content-Disposition: form-data; name="file"; filename="big.txt"\r\n\r\n'
        for _ in range(40):
            yield b"a" * 65_536
        yield b"\r\n--xyz--\r\n"
    streamed = client.post("/chat/turn", content=chunks(),
                           headers={"X-CSRF-Token": token, "Content-Type": "multipart/form-data; boundary=xyz"})
    assert streamed.status_code == 413
    over_image = upload(client, token, "big.png", PNG + bytes(1_100_000))  # within the body's bound, over the image's
    assert over_image.status_code == 422 and over_image.text == (
        "That image is 1.1 MB; I take up to 1 MB (media.image_megabytes).\n")
    assert fake_openai.chat_requests() == [] and media_files(console) == []


def test_an_upload_without_the_csrf_token_or_a_file_it_cannot_take_changes_nothing(
        console: Console, fake_openai: FakeOpenAIServer) -> None:
    client = logged_in(console)
    token = csrf_of(client.get("/memory").text)
    assert upload(client, None, "notes.txt", b"hello").status_code == 403
    form_token = client.post("/chat/turn", data={"name": "console", "text": "hi", "csrf_token": token},
                             files={"file": ("notes.txt", b"hello")})
    assert form_token.status_code == 403  # a file goes with the header only, as every script-sent change
    archive = upload(client, token, "app.zip", b"PK\x03\x04" + bytes(100), "what is in it?")
    assert archive.status_code == 422 and "it is a zip archive" in archive.text
    nothing = client.post("/chat/turn", data={"name": "console", "text": "  "}, files={"file": ("", b"")},
                          headers={"X-CSRF-Token": token})
    assert nothing.status_code == 400  # no file chosen and no text: an empty message
    assert fake_openai.chat_requests() == [] and media_files(console) == []
    assert fake_openai.transcription_requests() == []


def test_audio_without_a_transcriber_is_one_line(home: Path, fake_openai: FakeOpenAIServer) -> None:
    with edit_config(home) as config:
        config["providers"]["openai"] = {"api_key": "sk-test-0123456789abc", "api_base": fake_openai.base_url}
    with console_of(home) as console:
        client = logged_in(console)
        token = csrf_of(client.get("/memory").text)
        refused = upload(client, token, "voice.ogg", OGG, "听一下")
        assert refused.status_code == 422 and refused.text == NOT_LISTENING + "\n"
    assert fake_openai.chat_requests() == []


@pytest.mark.slow
def test_in_a_browser_attach_sends_the_file_and_shows_the_note(console: Console, fake_openai: FakeOpenAIServer,
                                                               tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        if os.environ.get("PICOCLAW_REQUIRE_CHROMIUM"):
            pytest.fail(f"{CHROMIUM} is missing (.ci/run installs Debian's chromium)")
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium")
    from playwright.sync_api import expect, sync_playwright

    (tmp_path / "sign.png").write_bytes(PNG)
    fake_openai.reply_text("I cannot see it, sorry.")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(locale="zh-CN")
            page.goto(console.gate.login_url(console.base))
            with page.expect_response(lambda response: "/chat/events" in response.url, timeout=60_000):
                page.goto(f"{console.base}/chat")
            page.set_input_files("#attachment", str(tmp_path / "sign.png"))
            page.fill("#message", "这个牌子上写的是什么？")
            page.press("#message", "Enter")
            expect(page.locator("article.said.assistant .markdown")).to_have_text("I cannot see it, sorry.",
                                                                                   timeout=60_000)
            expect(page.locator("article.said.user pre")).to_have_text("这个牌子上写的是什么？\n📎 sign.png")
            expect(page.locator("#conversation p.attached")).to_have_text([NO_VISION])
            assert page.locator("#attachment").input_value() == ""  # the file went with this message only
        finally:
            browser.close()
    assert "这个牌子上写的是什么？\n[image: media/" in last_user(fake_openai)
