"""Documents on Telegram: a text file or a PDF from an allowed user is fetched through the fake
Bot API (getFile, then the file), read, kept in the workspace's media/ folder with its bytes as sent, and answered
as a turn whose text names the file and where it was saved; every way it can fail is one line to the user with
nothing fetched over the limit, nothing sent to the model, nothing stored and nothing saved; a stranger's file is
never fetched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from picoclaw.app import App
from picoclaw.channels import ACCEPTED
from picoclaw.channels.telegram import TelegramChannel, not_authorised
from picoclaw.memory.workspace import Workspace
from tests.agent_helpers import session_records
from tests.fakes import FakeOpenAIServer
from tests.fakes.telegram_server import FakeTelegramServer
from tests.homes import edit_config
from tests.test_documents import ZH_CODES, make_pdf, text_page
from tests.test_telegram import OWNER, STRANGER, configure, refused_with_nothing_kept, replied, serve, until
from tests.test_telegram_media import turns

KEY = f"telegram:{OWNER}"
EN = "Shopping list\n- eggs\n- flour\n- milk\n"
ZH = "购物清单\n- 鸡蛋\n- 面粉\n- 牛奶\n"


def reading(home: Path, telegram: FakeTelegramServer, model: FakeOpenAIServer, **media: Any) -> Workspace:
    """config.json pointed at both fakes, with `media` settings (document_kilobytes, document_chars)."""
    configure(home, telegram, model)
    with edit_config(home) as config:
        config["media"] = media
    return App.open(home).workspace


def saved(workspace: Workspace) -> dict[str, bytes]:
    """What the scope's media/ folder holds: each file's path as the file tools name it, and its bytes."""
    media = workspace.media()
    if not media.folder.is_dir():
        return {}
    return {path.relative_to(media.root).as_posix(): path.read_bytes()
            for path in sorted(media.folder.rglob("*")) if path.is_file()}


def users(workspace: Workspace) -> list[str]:
    return [r["message"]["content"] for r in session_records(workspace, KEY)
            if r["type"] == "message" and r["message"]["role"] == "user"]


@pytest.mark.parametrize(("name", "text", "mime", "caption"), [
    ("list.txt", EN, "text/plain", "What am I missing for pancakes?"),
    ("清单.md", ZH, "text/markdown", "做煎饼还缺什么？"),
    ("notes", EN + ZH, None, None),  # no extension, no type: text by its bytes
], ids=["english txt", "chinese md", "no name or type"])
def test_a_text_document_is_saved_and_answered_as_a_turn(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, name: str, text: str,
        mime: str | None, caption: str | None) -> None:
    workspace = reading(home, fake_telegram, fake_openai)
    fake_openai.reply_text("Butter. / 黄油。")
    data = text.encode("utf-8")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_document(OWNER, OWNER, data, file_name=name, mime_type=mime, caption=caption)
        await until(fake_telegram, replied(fake_telegram, OWNER))
    serve(workspace, fake_telegram, fake_openai, body)

    [(saved_as, kept)] = saved(workspace).items()
    assert kept == data and saved_as.startswith("media/") and saved_as.endswith(f"-{name}")
    turn = f"[document: {name}, saved as {saved_as}]\n{text.rstrip()}\n[end of {name}]"
    turn += f"\n{caption}" if caption else ""
    assert turns(fake_openai) == [turn]
    assert users(workspace) == [turn]
    assert fake_telegram.sent_texts(OWNER) == ["Butter. / 黄油。"]
    assert len(fake_telegram.downloads()) == 1


def test_a_pdf_and_a_gbk_file_are_read_too(home: Path, fake_telegram: FakeTelegramServer,
                                          fake_openai: FakeOpenAIServer) -> None:
    workspace = reading(home, fake_telegram, fake_openai)
    fake_openai.reply_text("A report.")
    fake_openai.reply_text("一份清单。")
    pdf = make_pdf(text_page("Quarterly report"), text_page("季度报告", ZH_CODES), codes=ZH_CODES)
    gbk = ZH.encode("gbk")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_document(OWNER, OWNER, pdf, file_name="report.pdf", mime_type="application/pdf")
        await until(fake_telegram, replied(fake_telegram, OWNER))
        fake_telegram.send_document(OWNER, OWNER, gbk, file_name="清单.txt", mime_type="text/plain")
        await until(fake_telegram, replied(fake_telegram, OWNER, 2))
    serve(workspace, fake_telegram, fake_openai, body)

    files = saved(workspace)
    assert sorted(files.values()) == sorted([pdf, gbk])
    pdf_at = next(path for path, data in files.items() if data == pdf)
    first, second = turns(fake_openai)
    assert first == (f"[document: report.pdf (PDF, 2 pages, its text), saved as {pdf_at}]\n"
                     "[page 1]\nQuarterly report\n\n[page 2]\n季度报告\n[end of report.pdf]")
    assert "GBK" in second.splitlines()[1] and ZH.rstrip() in second


def test_a_long_document_reaches_the_model_cut_at_document_chars(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer) -> None:
    workspace = reading(home, fake_telegram, fake_openai, document_chars=1_000)
    fake_openai.reply_text("Long.")
    text = (EN + ZH) * 60

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_document(OWNER, OWNER, text.encode(), file_name="long.md")
        await until(fake_telegram, replied(fake_telegram, OWNER))
    serve(workspace, fake_telegram, fake_openai, body)

    [(saved_as, kept)] = saved(workspace).items()
    assert kept == text.encode()  # the whole file, for read_file
    [turn] = turns(fake_openai)
    assert text[:1_000] in turn and text[:1_001] not in turn
    assert f"[cut at 1,000 of {len(text):,} characters: the rest is in {saved_as}; read it with read_file" in turn


REFUSALS = {
    "too large, said by the message": (dict(data=b"a" * 2_000), None,
                                       "That file is 2 KB; I read documents of up to 1 KB"),
    "too large, found in the bytes": (dict(data=b"a" * 2_000, file_size=10), None,
                                      "That file is 2 KB; I read documents of up to 1 KB"),
    "a zip": (dict(data=b"PK\x03\x04" + bytes(200), file_name="photos.zip", mime_type="application/zip"), None,
              f"I cannot read photos.zip: it is a zip archive (so are .docx, .xlsx and .pptx). I read {ACCEPTED}."),
    "binary named txt": (dict(data=bytes(range(256)), file_name="notes.txt"), None,
                         f"I cannot read notes.txt: it is binary data, not text. I read {ACCEPTED}."),
    "audio as a file": (dict(data=b"ID3\x04" + bytes(300), file_name="song.mp3", mime_type="audio/mpeg"), None,
                        f"I cannot read song.mp3: it is audio. I read {ACCEPTED}."),
    "a scanned pdf": (dict(data=make_pdf(b"0 0 m 10 10 l S"), file_name="scan.pdf"), None,
                      "scan.pdf has no text I can read (a scanned PDF, or only images)"),
    "a broken pdf": (dict(data=b"%PDF-1.7\n garbage", file_name="broken.pdf"), None,
                     "I could not read broken.pdf: the PDF is damaged or not a real PDF."),
    "an image by its bytes": (dict(data=b"\xff\xd8\xff\xe0" + bytes(100), file_name="scan.dat"), None,
                              "That is a JPEG image sent as a file, not a document: send it as a photo"),
    "telegram refuses the file": (dict(), "getFile", "Telegram could not give me that file (Bad Request: file is "
                                                     "too big)."),
    "the download fails": (dict(), "download", "Telegram could not give me that file (ClientResponseError)."),
}
NOT_FETCHED = {"too large, said by the message"}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_document_that_cannot_be_read_is_one_line_and_nothing_is_kept(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, case: str,
        caplog: pytest.LogCaptureFixture) -> None:
    workspace = reading(home, fake_telegram, fake_openai, document_kilobytes=1)
    sent, fault, line = REFUSALS[case]
    sent = {"data": EN.encode(), "file_name": "list.txt", "mime_type": "text/plain", **sent}
    if fault == "getFile":
        fake_telegram.fail_next("getFile", 400, "Bad Request: file is too big")
    elif fault == "download":
        fake_telegram.fail_next_download(500)
    caplog.set_level("INFO", logger="picoclaw")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_document(OWNER, OWNER, sent.pop("data"), caption="read this / 读一下", **sent)
        await until(fake_telegram, replied(fake_telegram, OWNER))
    serve(workspace, fake_telegram, fake_openai, body)

    refused_with_nothing_kept(fake_telegram, fake_openai, workspace, line)
    assert saved(workspace) == {}  # nothing saved
    if case in NOT_FETCHED:
        assert fake_telegram.calls("getFile") == [] and fake_telegram.downloads() == []
    assert len([r for r in caplog.records if "not read" in r.getMessage()]) == 1  # one log line says why
    assert not [r for r in caplog.records if r.exc_info]  # and no traceback


def test_a_strangers_document_is_never_fetched(home: Path, fake_telegram: FakeTelegramServer,
                                               fake_openai: FakeOpenAIServer) -> None:
    workspace = reading(home, fake_telegram, fake_openai)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_document(STRANGER, STRANGER, ZH.encode(), file_name="清单.md", mime_type="text/markdown")
        await until(fake_telegram, replied(fake_telegram, STRANGER))
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.sent_texts(STRANGER) == [not_authorised(STRANGER)]
    assert fake_telegram.calls("getFile") == [] and fake_telegram.downloads() == []
    assert fake_openai.requests == []
    assert saved(workspace) == {}
