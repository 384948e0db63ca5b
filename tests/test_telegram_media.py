"""Voice notes, audio files and video notes on Telegram: fetched through the fake Bot API (getFile,
then the file), transcribed by the fake OpenAI-compatible server's /audio/transcriptions, shown back, and
answered as a turn; every way it can fail is one line to the user with nothing sent to the model and nothing
stored; a stranger's file is never fetched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from picoclaw.app import App
from picoclaw.channels import NOT_LISTENING, SPOKEN_MARK
from picoclaw.channels.telegram import TelegramChannel, not_authorised
from picoclaw.config import ConfigError, parse_config
from picoclaw.memory.workspace import Workspace
from tests.agent_helpers import contents, session_path, session_records
from tests.fakes import FakeOpenAIServer
from tests.fakes.telegram_server import FakeTelegramServer
from tests.homes import edit_config
from tests.test_telegram import OWNER, STRANGER, configure, refused_with_nothing_kept, replied, serve, until

OGG = b"OggS\x00\x02" + bytes(200)  # what a voice note's file starts with; the fake transcriber never decodes it
KEY = f"telegram:{OWNER}"


def listening(home: Path, telegram: FakeTelegramServer, model: FakeOpenAIServer, **settings: Any) -> Workspace:
    """config.json pointed at both fakes, with a `transcription` entry (the fake server's "openai" provider)."""
    configure(home, telegram, model)
    with edit_config(home) as config:
        config["transcription"] = {"provider": "openai", "model": "whisper-1", **settings}
        config["providers"]["openai"]["max_retries"] = 0  # a failure scripted once is the transcriber's answer
    return App.open(home).workspace


def turns(fake_openai: FakeOpenAIServer) -> list[str]:
    """The last user message of each chat request (the turn's text as the model got it)."""
    return [contents(body["messages"])[-1] for body in fake_openai.chat_requests()]


@pytest.mark.parametrize(("heard", "language"), [
    ("My sister Anna lives in Lyon, remember that.", None),
    ("我妹妹安娜住在里昂，记住这个。", "zh"),
], ids=["english", "chinese"])
def test_a_voice_note_is_heard_shown_first_and_answered_as_spoken(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, heard: str,
        language: str | None) -> None:
    workspace = listening(home, fake_telegram, fake_openai, language=language)
    fake_openai.reply_transcript(heard)
    fake_openai.reply_text("Noted. / 记下了。")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_voice(OWNER, OWNER, OGG, duration=4)
        await until(fake_telegram, replied(fake_telegram, OWNER, 2))
    serve(workspace, fake_telegram, fake_openai, body)

    [asked] = fake_openai.transcription_requests()
    assert (asked["model"], asked["language"], asked["filename"], asked["data"]) == ("whisper-1", language,
                                                                                     "voice.ogg", OGG)
    echo, answer = fake_telegram.sent_texts(OWNER)
    assert f"🎤 {heard}" in echo and echo.startswith("<blockquote")  # what was heard, before the answer
    assert answer == "Noted. / 记下了。"
    # The model got the words marked as spoken, and the session keeps them as the user's message.
    assert turns(fake_openai) == [f"{SPOKEN_MARK} {heard}"]
    users = [r["message"]["content"] for r in session_records(workspace, KEY)
             if r["type"] == "message" and r["message"]["role"] == "user"]
    assert users == [f"{SPOKEN_MARK} {heard}"]


def test_an_audio_file_with_its_caption_and_a_video_note_are_heard_too(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer) -> None:
    workspace = listening(home, fake_telegram, fake_openai)
    fake_openai.reply_transcript("Meeting notes: the launch moves to Friday.")
    fake_openai.reply_text("Got it.")
    fake_openai.reply_transcript("视频里说：周五发布。")
    fake_openai.reply_text("好的。")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_audio(OWNER, OWNER, b"ID3" + bytes(64), file_name="standup.m4a", caption="summarise it")
        await until(fake_telegram, replied(fake_telegram, OWNER, 2))
        fake_telegram.send_video_note(OWNER, OWNER, bytes(64))
        await until(fake_telegram, replied(fake_telegram, OWNER, 4))
    serve(workspace, fake_telegram, fake_openai, body)

    assert [r["filename"] for r in fake_openai.transcription_requests()] == ["standup.m4a", "video_note.mp4"]
    assert turns(fake_openai) == [f"{SPOKEN_MARK} Meeting notes: the launch moves to Friday.\nsummarise it",
                                  f"{SPOKEN_MARK} 视频里说：周五发布。"]


def test_without_transcription_a_voice_note_is_told_how_to_turn_it_on_and_nothing_is_fetched(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_voice(OWNER, OWNER, OGG)
        await until(fake_telegram, replied(fake_telegram, OWNER))
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.sent_texts(OWNER) == [NOT_LISTENING]
    assert fake_telegram.calls("getFile") == [] and fake_telegram.downloads() == []
    assert fake_openai.requests == []
    assert not session_path(workspace, KEY).exists()


REFUSALS = {
    "too long": ({"duration": 601}, None, "That voice note is 601 s long; I transcribe up to 600 s"),
    "too large": ({"file_size": 21_000_000}, None, "That voice note is 21.0 MB; I take up to 20 MB"),
    "telegram refuses the file": ({}, "getFile", "Telegram could not give me that voice note (Bad Request: "
                                                 "file is too big)."),
    "the download fails": ({}, "download", "Telegram could not give me that voice note (ClientResponseError)."),
    "the transcriber fails": ({}, "transcriber", "I could not transcribe that: the model provider 'openai' is "
                                                 "unavailable (HTTP 500): whisper crashed / 转写失败"),
    "the transcriber answers garbage": ({}, "garbage", "I could not transcribe that: the model provider 'openai' "
                                                       "sent a reply picoclaw cannot read"),
    "nothing was heard": ({}, "silence", "I heard no words in that voice note, so I did not answer it."),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_voice_note_that_cannot_be_heard_is_one_line_and_nothing_is_stored(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, case: str,
        caplog: pytest.LogCaptureFixture) -> None:
    workspace = listening(home, fake_telegram, fake_openai, max_seconds=600)
    sent, fault, line = REFUSALS[case]
    if fault == "getFile":
        fake_telegram.fail_next("getFile", 400, "Bad Request: file is too big")
    elif fault == "download":
        fake_telegram.fail_next_download(500)
    elif fault == "transcriber":
        fake_openai.reply_error(500, "whisper crashed / 转写失败", endpoint="transcription")
    elif fault == "garbage":
        fake_openai.reply_garbage(endpoint="transcription")
    elif fault == "silence":
        fake_openai.reply_transcript("  \n ")
    caplog.set_level("INFO", logger="picoclaw")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_voice(OWNER, OWNER, OGG, **sent)
        await until(fake_telegram, replied(fake_telegram, OWNER))
    serve(workspace, fake_telegram, fake_openai, body)

    refused_with_nothing_kept(fake_telegram, fake_openai, workspace, line)
    if fault is None:  # refused on what the message says: nothing fetched
        assert fake_telegram.calls("getFile") == [] and fake_telegram.downloads() == []
    assert [r for r in caplog.records if "not transcribed" in r.getMessage()]  # one log line says why
    assert not [r for r in caplog.records if r.exc_info]  # and no traceback


def test_a_transcriber_that_does_not_answer_in_time_is_one_line(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer) -> None:
    listening(home, fake_telegram, fake_openai)
    with edit_config(home) as config:
        config["transcription"]["timeout"] = 1.0  # its own, not the chat provider's
    workspace = App.open(home).workspace
    fake_openai.reply_transcript("too late / 太晚了", delay=5)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_voice(OWNER, OWNER, OGG)
        await until(fake_telegram, replied(fake_telegram, OWNER))
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.sent_texts(OWNER) == ["I could not transcribe that: the model provider 'openai' did not "
                                               "answer within 1 s"]
    assert len(fake_openai.transcription_requests()) == 1  # a timed-out upload is not sent again
    assert fake_openai.chat_requests() == [] and not session_path(workspace, KEY).exists()


def test_a_strangers_voice_note_is_never_fetched(home: Path, fake_telegram: FakeTelegramServer,
                                                 fake_openai: FakeOpenAIServer) -> None:
    workspace = listening(home, fake_telegram, fake_openai)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_voice(STRANGER, STRANGER, OGG)
        await until(fake_telegram, replied(fake_telegram, STRANGER))
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.sent_texts(STRANGER) == [not_authorised(STRANGER)]
    assert fake_telegram.calls("getFile") == [] and fake_telegram.downloads() == []
    assert fake_openai.transcription_requests() == []


@pytest.mark.parametrize(("entry", "message"), [
    ({"provider": "whisper"}, "transcription.provider 'whisper' is not in providers"),
    ({"provider": "openai", "max_seconds": 0}, "transcription.max_seconds"),
    ({"provider": "openai", "max_megabytes": 21}, "transcription.max_megabytes"),
    ({"provider": "openai", "language": "Chinese"}, "transcription.language"),
    ({"provider": "openai", "max_seconds": "600"}, "transcription.max_seconds"),
], ids=["unknown provider", "no seconds", "over Telegram's 20 MB", "a language name", "seconds as text"])
def test_a_bad_transcription_entry_is_one_config_error(tmp_path: Path, entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"transcription": entry}, tmp_path / "config.json")
    assert message in str(raised.value) and "\n" not in str(raised.value).strip()
