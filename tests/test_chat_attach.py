"""`picoclaw chat --attach FILE` and the REPL's `/attach PATH [message]`: a document read, an
image to a model that sees (else the text and NO_VISION), audio transcribed with its transcript shown first; a
file that cannot be taken is one line on stderr, exit 1, nothing sent to the model and nothing stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from picoclaw.channels import NO_VISION, NOT_LISTENING, SPOKEN_MARK
from tests.agent_helpers import said
from tests.fakes import FakeOpenAIServer
from tests.homes import edit_config
from tests.test_attachments import OGG, PNG, ZH
from tests.test_repl import configure, picoclaw, session_records

pytestmark = pytest.mark.slow  # every test here runs `picoclaw chat` in a process of its own

SESSION = "cli%3Adefault.jsonl"


def setup(home: Path, fake: FakeOpenAIServer, *, vision: bool | None = None, transcription: bool = False) -> None:
    configure(home, fake)
    with edit_config(home) as config:
        config["providers"]["openai"]["max_retries"] = 0
        if vision is not None:
            config["agents"]["defaults"]["vision"] = vision
        if transcription:
            config["transcription"] = {"provider": "openai", "model": "whisper-1"}


def last_user(fake: FakeOpenAIServer) -> Any:
    return [m for m in fake.chat_requests()[-1]["messages"] if m["role"] == "user"][-1]["content"]


def test_a_document_goes_with_the_message_in_english_and_chinese(home: Path, fake_openai: FakeOpenAIServer,
                                                                  tmp_path: Path) -> None:
    setup(home, fake_openai)
    (tmp_path / "会议.txt").write_bytes(ZH.encode("gbk"))
    fake_openai.reply_text("发布改到了周五。")

    result = picoclaw(home, "chat", "-m", "发布是哪天？", "--attach", str(tmp_path / "会议.txt"))

    assert result.returncode == 0, result.stderr
    assert result.stdout == "发布改到了周五。\n"
    sent = said({"content": last_user(fake_openai)})
    assert "[document: 会议.txt, saved as media/" in sent and "安娜负责预算" in sent
    assert sent.endswith("发布是哪天？")
    [kept] = [r["message"]["content"] for r in session_records(home, SESSION) if r["message"].get("role") == "user"]
    assert kept.startswith("[document: 会议.txt, saved as media/") and sent.endswith(kept)


def test_an_image_reaches_a_model_that_sees_and_else_the_person_hears_so(home: Path, fake_openai: FakeOpenAIServer,
                                                                         tmp_path: Path) -> None:
    (tmp_path / "sign").write_bytes(PNG)  # no extension: the bytes tell
    setup(home, fake_openai, vision=True)
    fake_openai.reply_text("It says: no parking.")
    seen = picoclaw(home, "chat", "-m", "What does this sign say?", "--attach", str(tmp_path / "sign"))
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout == "It says: no parking.\n" and NO_VISION not in seen.stderr
    parts = last_user(fake_openai)
    assert [part["type"] for part in parts] == ["text", "image_url"]
    assert "What does this sign say?\n[image: media/" in parts[0]["text"]

    setup(home, fake_openai, vision=False)
    fake_openai.reply_text("I cannot tell without seeing it.")
    blind = picoclaw(home, "chat", "--attach", str(tmp_path / "sign"))
    assert blind.returncode == 0, blind.stderr
    assert NO_VISION in blind.stderr.splitlines() and blind.stdout == "I cannot tell without seeing it.\n"
    text = last_user(fake_openai)
    assert isinstance(text, str) and "[image: media/" in text and "cannot see images" in text


def test_audio_is_transcribed_its_transcript_shown_before_the_answer(home: Path, fake_openai: FakeOpenAIServer,
                                                                     tmp_path: Path) -> None:
    setup(home, fake_openai, transcription=True)
    (tmp_path / "memo.ogg").write_bytes(OGG)
    fake_openai.reply_transcript("回家路上买燕麦奶")
    fake_openai.reply_text("好的，记得买燕麦奶。")

    result = picoclaw(home, "chat", "--attach", str(tmp_path / "memo.ogg"))

    assert result.returncode == 0, result.stderr
    assert "🎤 回家路上买燕麦奶" in result.stderr.splitlines()
    assert result.stdout == "好的，记得买燕麦奶。\n"
    [request] = fake_openai.transcription_requests()
    assert request["filename"] == "memo.ogg" and request["data"] == OGG
    assert last_user(fake_openai).endswith(f"\n{SPOKEN_MARK} 回家路上买燕麦奶")


def test_a_file_that_cannot_be_taken_is_one_line_and_nothing_is_sent_or_kept(
        home: Path, fake_openai: FakeOpenAIServer, tmp_path: Path) -> None:
    setup(home, fake_openai)
    (tmp_path / "voice.ogg").write_bytes(OGG)
    (tmp_path / "app.zip").write_bytes(b"PK\x03\x04" + bytes(100))
    cases = {str(tmp_path / "gone.txt"): f"There is no file {tmp_path / 'gone.txt'}.",
             str(tmp_path): f"{tmp_path} is not a file (a folder?); attach one file.",
             str(tmp_path / "voice.ogg"): NOT_LISTENING}
    for path, line in cases.items():
        result = picoclaw(home, "chat", "-m", "hi", "--attach", path)
        assert result.returncode == 1
        assert result.stdout == ""
        assert [x for x in result.stderr.splitlines() if "WARNING" not in x] == [f"picoclaw: error: {line}"]
    archive = picoclaw(home, "chat", "--attach", str(tmp_path / "app.zip"))
    assert archive.returncode == 1 and "it is a zip archive" in archive.stderr
    assert fake_openai.chat_requests() == []
    assert not (home / "workspace" / "sessions" / SESSION).exists()
    assert not (home / "workspace" / "media").exists()


def test_the_repl_takes_an_attach_line_and_goes_on(home: Path, fake_openai: FakeOpenAIServer, tmp_path: Path) -> None:
    setup(home, fake_openai)
    folder = tmp_path / "my notes"
    folder.mkdir()
    (folder / "plan.md").write_text("# Plan\n- ship on Friday\n", encoding="utf-8")
    fake_openai.reply_text("You ship on Friday.")
    fake_openai.reply_text("Bye.")

    result = picoclaw(home, "chat", stdin=f'/attach "{folder / "plan.md"}" when do we ship?\n'
                                          f"/attach {tmp_path / 'nothing.txt'}\n/attach\nthanks\n")

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["You ship on Friday.", "Bye."]
    errors = [line for line in result.stderr.splitlines() if "WARNING" not in line]
    assert errors == [f"picoclaw: error: There is no file {tmp_path / 'nothing.txt'}.",
                      'usage: /attach PATH [message] (a path with spaces in "quotes")']
    first = said({"content": [m for m in fake_openai.chat_requests()[0]["messages"] if m["role"] == "user"][-1]
                  ["content"]})
    assert "[document: plan.md, saved as media/" in first and first.endswith("when do we ship?")
