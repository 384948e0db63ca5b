"""A file attached to a message, whatever the face: what it is, told by its bytes, and the turn
it makes (picoclaw/channels/attachments.py). Audio is transcribed (none configured: one line), an image is kept and
sent only to a model that sees, anything else is read as a document; what cannot be taken is one line, and nothing
is kept of it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from picoclaw.app import App
from picoclaw.channels import NO_VISION, NOT_LISTENING, SPOKEN_MARK, MediaRefused, Transcriber
from picoclaw.channels.attachments import Attached, attach, audio_format, kind_of, largest_attachment, read_attachment
from picoclaw.config import MediaConfig
from picoclaw.memory.workspace import Workspace
from tests.test_documents import ZH_CODES, make_pdf, text_page

PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)
OGG = b"OggS\x00\x02" + bytes(200)
EN = "Meeting notes\n- the launch moves to Friday\n"
ZH = "会议记录\n- 发布改到周五\n- 安娜负责预算\n"


@dataclass
class Agent:
    """What `attach` asks of an agent: its workspace, and whether its model sees."""

    workspace: Workspace
    sees: bool = True

    async def sees_images(self) -> bool:
        return self.sees


class Heard:
    """A transcriber that hears `words` and records what it was given."""

    def __init__(self, words: str = "", max_bytes: int = 20_000_000):
        self.words = words
        self.given: list[tuple[str, int]] = []
        self.transcriber = Transcriber(self.transcribe, 600, max_bytes)

    async def transcribe(self, audio: bytes, filename: str) -> str:
        self.given.append((filename, len(audio)))
        return self.words


@pytest.fixture
def workspace(home: Path) -> Workspace:
    return App.open(home).workspace


def attached(workspace: Workspace, name: str, data: bytes, caption: str | None = None, *, sees: bool = True,
             transcriber: Transcriber | None = None) -> Attached:
    agent: Any = Agent(workspace, sees)
    return asyncio.run(attach(name, data, caption, agent=agent, transcriber=transcriber))


def media_files(workspace: Workspace) -> list[Path]:
    folder = workspace.media().folder
    return sorted(path for path in folder.rglob("*") if path.is_file()) if folder.is_dir() else []


@pytest.mark.parametrize(("data", "kind", "extension"), [
    (OGG, "audio", "ogg"), (b"ID3\x04\x00" + bytes(50), "audio", "mp3"),
    (b"\xff\xfb\x90\x64" + bytes(50), "audio", "mp3"),
    (b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(40), "audio", "wav"), (b"fLaC" + bytes(40), "audio", "flac"),
    (b"\x00\x00\x00\x20ftypM4A " + bytes(40), "audio", "m4a"),
    (b"\x00\x00\x00\x20ftypisom" + bytes(40), "audio", "mp4"),
    (b"\x1aE\xdf\xa3" + bytes(40), "audio", "webm"),
    (PNG, "image", None), (b"\xff\xd8\xff\xe0" + bytes(40), "image", None),
    (b"\x00\x00\x00\x20ftypheic" + bytes(40), "document", None),  # a HEIC photo is no audio
    ("\ufeffhello".encode("utf-16-le"), "document", None),  # FF FE: a UTF-16 text, not an MPEG frame
    (EN.encode(), "document", None), (b"%PDF-1.4", "document", None),
], ids=["ogg", "id3", "mp3-frame", "wav", "flac", "m4a", "mp4", "webm", "png", "jpeg", "heic", "utf16", "text", "pdf"])
def test_what_a_file_is_is_told_by_its_bytes(data: bytes, kind: str, extension: str | None) -> None:
    assert kind_of(data) == kind
    assert audio_format(data) == extension


@pytest.mark.parametrize(("name", "text", "caption"), [("notes.txt", EN, "Summarise this"), ("笔记", ZH, "总结一下")],
                         ids=["english", "chinese"])
def test_a_text_file_becomes_a_document_turn_with_the_message_as_its_caption(
        workspace: Workspace, name: str, text: str, caption: str) -> None:
    turn = attached(workspace, name, text.encode("utf-8"), caption)
    assert turn.kind == "document" and turn.images == () and turn.notices == ()
    assert turn.saved_as is not None and turn.saved_as.startswith("media/")
    lines = turn.text.splitlines()
    assert lines[0] == f"[document: {name}, saved as {turn.saved_as}]"
    assert text.strip() in turn.text and lines[-1] == caption
    assert (workspace.layout.files_root / turn.saved_as).read_bytes() == text.encode("utf-8")


def test_a_chinese_gbk_file_is_read_and_the_model_told_so(workspace: Workspace) -> None:
    turn = attached(workspace, "报告.txt", ZH.encode("gbk"))
    assert "安娜负责预算" in turn.text
    assert "[note: the file is not UTF-8; it was read as Chinese GB18030/GBK" in turn.text


def test_a_pdf_gives_its_text(workspace: Workspace) -> None:
    pdf = make_pdf(text_page("Quarterly report"), text_page("你好世界", codes=ZH_CODES), codes=ZH_CODES)
    turn = attached(workspace, "report.pdf", make_pdf(text_page("Quarterly report")), "what is it?")
    assert turn.text.startswith("[document: report.pdf (PDF, 1 page, its text), saved as media/")
    assert "Quarterly report" in turn.text and turn.text.endswith("what is it?")
    chinese = attached(workspace, "报告.pdf", pdf)
    assert "[page 2]\n你好世界" in chinese.text


@pytest.mark.parametrize("caption", ["What does this sign say?", "这个牌子上写的是什么？"], ids=["english", "chinese"])
def test_an_image_goes_to_a_model_that_sees_and_is_kept(workspace: Workspace, caption: str) -> None:
    turn = attached(workspace, "sign.png", PNG, caption, sees=True)
    assert turn.kind == "image" and turn.images == (PNG,) and turn.notices == ()
    assert turn.text == f"{caption}\n[image: {turn.saved_as}]"
    assert [path.read_bytes() for path in media_files(workspace)] == [PNG]


def test_a_model_that_does_not_see_gets_the_text_and_the_person_hears_so(workspace: Workspace) -> None:
    turn = attached(workspace, "sign.png", PNG, "这是什么？", sees=False)
    assert turn.images == () and turn.notices == (NO_VISION,)
    assert turn.text.startswith("这是什么？\n[image: media/") and "cannot see images" in turn.text


def test_an_image_over_the_limit_is_refused_and_not_kept(home: Path) -> None:
    workspace = App.open(home).workspace
    big = PNG + bytes(10_000_001)
    with pytest.raises(MediaRefused, match=r"That image is 10\.0 MB; I take up to 10 MB \(media.image_megabytes\)"):
        attached(workspace, "big.png", big)
    assert media_files(workspace) == []


@pytest.mark.parametrize("words", ["Buy oat milk on the way home", "回家路上买燕麦奶"], ids=["english", "chinese"])
def test_audio_is_transcribed_and_the_transcript_shown_first(workspace: Workspace, words: str) -> None:
    heard = Heard(words)
    turn = attached(workspace, "memo", OGG, "remind me", transcriber=heard.transcriber)
    assert heard.given == [("memo.ogg", len(OGG))]  # named by what its bytes are, for the transcriber
    assert turn.kind == "audio" and turn.text == f"{SPOKEN_MARK} {words}\nremind me"
    assert turn.notices == (f"🎤 {words}",) and turn.images == ()
    assert media_files(workspace) == []
    named = Heard(words)
    attached(workspace, "voice.mp3", OGG, transcriber=named.transcriber)
    assert named.given == [("voice.ogg", len(OGG))]


def test_audio_without_a_transcriber_or_words_or_over_the_limit_is_one_line(workspace: Workspace) -> None:
    with pytest.raises(MediaRefused) as refused:
        attached(workspace, "voice.ogg", OGG, transcriber=None)
    assert str(refused.value) == NOT_LISTENING
    with pytest.raises(MediaRefused, match="I heard no words in that audio file"):
        attached(workspace, "voice.ogg", OGG, transcriber=Heard("  ").transcriber)
    small = Heard("hi", max_bytes=100)
    with pytest.raises(MediaRefused, match=r"That audio file is 0\.0 MB; I take up to 0 MB"):
        attached(workspace, "voice.ogg", OGG, transcriber=small.transcriber)
    assert small.given == []


@pytest.mark.parametrize(("data", "said"), [
    (b"PK\x03\x04" + bytes(100), "it is a zip archive"),
    (bytes(range(256)) * 4, "it is binary data, not text"),
    (b"   \n", "is empty"),
])
def test_what_is_neither_is_refused_in_one_line_and_not_kept(workspace: Workspace, data: bytes, said: str) -> None:
    with pytest.raises(MediaRefused, match=said) as refused:
        attached(workspace, "blob.bin", data)
    assert "\n" not in str(refused.value)
    assert media_files(workspace) == []


def test_a_file_is_read_within_the_largest_limit_and_a_bad_path_is_one_line(tmp_path: Path) -> None:
    media = MediaConfig(image_megabytes=1, document_kilobytes=10)
    assert largest_attachment(media, None) == 1_000_000
    assert largest_attachment(media, Heard().transcriber) == 20_000_000
    (tmp_path / "notes.txt").write_text(ZH, encoding="utf-8")
    assert read_attachment(tmp_path / "notes.txt", media, None) == ("notes.txt", ZH.encode("utf-8"))
    (tmp_path / "big.bin").write_bytes(bytes(1_000_001))
    refusals: dict[str, Any] = {"missing": tmp_path / "gone.txt", "folder": tmp_path, "big": tmp_path / "big.bin"}
    said = {}
    for what, path in refusals.items():
        with pytest.raises(MediaRefused) as refused:
            read_attachment(path, media, None)
        said[what] = str(refused.value)
    assert said["missing"] == f"There is no file {tmp_path / 'gone.txt'}."
    assert said["folder"].endswith("is not a file (a folder?); attach one file.")
    assert said["big"].startswith("That file is 1.0 MB; I take images of up to 1 MB (media.image_megabytes), "
                                  "documents up to 10 KB")
