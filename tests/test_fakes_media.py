"""The fakes' media support: Telegram files (getFile and downloads) and OpenAI-compatible transcription."""

from __future__ import annotations

import asyncio
import io
import threading
from typing import Any

import openai
import pytest
from aiogram import Bot
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import TelegramBadRequest
from aiohttp import ClientResponseError

from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.telegram_server import DOWNLOAD_LIMIT, FakeTelegramServer

VOICE = b"OggS\x00\x02fake-opus\r\n\x00\xff" * 50  # binary, with CR LF and NUL inside


def bot_for(telegram: FakeTelegramServer) -> Bot:
    return Bot(telegram.token, session=AiohttpSession(api=TelegramAPIServer.from_base(telegram.origin)))


def client_for(server: FakeOpenAIServer, **options: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="sk-test", **options)


def updates(telegram: FakeTelegramServer) -> list[dict[str, Any]]:
    async def poll() -> list[dict[str, Any]]:
        bot = bot_for(telegram)
        try:
            return [update.model_dump(exclude_none=True) for update in await bot.get_updates(timeout=0)]
        finally:
            await bot.session.close()
    return asyncio.run(poll())


# -- Telegram -------------------------------------------------------------------------------------------------


def test_each_media_message_parses_in_aiogram_with_its_file(fake_telegram: FakeTelegramServer) -> None:
    fake_telegram.send_voice(42, 42, VOICE, caption="语音 voice")
    fake_telegram.send_audio(42, 42, b"ID3-mp3", file_name="歌.mp3")
    fake_telegram.send_video_note(42, 42, b"mp4-bytes", length=360)
    fake_telegram.send_document(42, 42, b"%PDF-1.7", file_name="report.pdf", mime_type="application/pdf",
                                caption="看看")
    fake_telegram.send_photo(42, 42, caption="photo")
    fake_telegram.send_photo(42, 42, data=b"\xff\xd8real-jpeg\xff\xd9")
    messages = [update["message"] for update in updates(fake_telegram)]

    voice = messages[0]["voice"]
    assert voice["duration"] == 3 and voice["mime_type"] == "audio/ogg" and voice["file_size"] == len(VOICE)
    assert messages[0]["caption"] == "语音 voice"
    assert fake_telegram.file(voice["file_id"]).file_path.startswith("voice/")
    assert fake_telegram.file(voice["file_id"]).file_path.endswith(".oga")
    assert messages[1]["audio"]["file_name"] == "歌.mp3" and messages[1]["audio"]["mime_type"] == "audio/mpeg"
    assert messages[2]["video_note"]["length"] == 360 and messages[2]["video_note"]["duration"] == 3
    document = messages[3]["document"]
    assert (document["file_name"], document["mime_type"], document["file_size"]) == ("report.pdf",
                                                                                     "application/pdf", 8)
    assert fake_telegram.file(messages[5]["photo"][-1]["file_id"]).data == b"\xff\xd8real-jpeg\xff\xd9"
    ids = [m[kind]["file_id"] for m, kind in zip(messages, ["voice", "audio", "video_note", "document"])]
    ids += [m["photo"][-1]["file_id"] for m in messages[4:]]
    assert len(set(ids)) == 6
    unique = {fake_telegram.file(file_id).file_unique_id for file_id in ids}
    assert len(unique) == 6


def test_the_bot_gets_and_downloads_a_voice_note(fake_telegram: FakeTelegramServer) -> None:
    fake_telegram.send_voice(42, 42, VOICE)
    file_id = updates(fake_telegram)[0]["message"]["voice"]["file_id"]

    async def fetch() -> tuple[Any, bytes]:
        bot = bot_for(fake_telegram)
        try:
            info = await bot.get_file(file_id)
            got = await bot.download(file_id)
            assert got is not None
            return info, got.read()
        finally:
            await bot.session.close()
    info, data = asyncio.run(fetch())

    assert data == VOICE
    assert info.file_size == len(VOICE) and info.file_path == fake_telegram.file(file_id).file_path
    assert info.file_unique_id == fake_telegram.file(file_id).file_unique_id
    assert fake_telegram.downloads() == [info.file_path]
    assert [call.params["file_id"] for call in fake_telegram.calls("getFile")] == [file_id, file_id]


def test_unknown_too_big_and_scripted_failures(fake_telegram: FakeTelegramServer) -> None:
    fake_telegram.send_voice(42, 42, VOICE, file_size=DOWNLOAD_LIMIT + 1)
    fake_telegram.send_document(42, 42, b"doc", file_name="a.txt")
    big, small = (update["message"] for update in updates(fake_telegram))

    async def attempts() -> None:
        bot = bot_for(fake_telegram)
        try:
            with pytest.raises(TelegramBadRequest, match="invalid file_id"):
                await bot.get_file("no-such-file")
            with pytest.raises(TelegramBadRequest, match="file is too big"):
                await bot.get_file(big["voice"]["file_id"])
            fake_telegram.fail_next("getFile", 400, "Bad Request: file is too big")
            with pytest.raises(TelegramBadRequest, match="file is too big"):
                await bot.get_file(small["document"]["file_id"])
            fake_telegram.fail_next_download(503)
            with pytest.raises(ClientResponseError) as failed:
                await bot.download(small["document"]["file_id"], io.BytesIO())
            assert failed.value.status == 503
            again = await bot.download(small["document"]["file_id"])
            assert again is not None and again.read() == b"doc"
            with pytest.raises(ClientResponseError) as missing:
                await bot.download_file("documents/nothing.txt")
            assert missing.value.status == 404
        finally:
            await bot.session.close()
    asyncio.run(attempts())

    path = fake_telegram.file(small["document"]["file_id"]).file_path
    assert fake_telegram.downloads() == [path, path, "documents/nothing.txt"]
    assert fake_telegram.file(big["voice"]["file_id"]).file_path not in fake_telegram.downloads()
    assert len(fake_telegram.calls("getFile")) == 5


def test_nothing_is_fetched_unless_asked(fake_telegram: FakeTelegramServer) -> None:
    fake_telegram.send_voice(-100, 7, VOICE, chat_type="group")
    assert updates(fake_telegram)[0]["message"]["chat"]["type"] == "group"
    assert fake_telegram.calls("getFile") == [] and fake_telegram.downloads() == []


# -- OpenAI transcription -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "language"), [("Remind me to buy milk.", "en"), ("明天提醒我买牛奶。", "zh")])
def test_the_openai_client_gets_the_scripted_transcript(fake_openai: FakeOpenAIServer, text: str,
                                                        language: str) -> None:
    fake_openai.reply_transcript(text)

    async def transcribe() -> str:
        async with client_for(fake_openai) as client:
            result = await client.audio.transcriptions.create(model="whisper-1", file=("voice.oga", VOICE),
                                                              language=language)
            return result.text
    assert asyncio.run(transcribe()) == text

    [request] = fake_openai.transcription_requests()
    assert request["model"] == "whisper-1" and request["language"] == language
    assert request["filename"] == "voice.oga" and request["size"] == len(VOICE) and request["data"] == VOICE
    assert request["content_type"] in ("audio/ogg", "application/octet-stream")
    assert request["response_format"] is None
    assert fake_openai.pending("transcription") == 0


def test_transcription_formats_errors_and_defaults() -> None:
    with FakeOpenAIServer(api_key="sk-test") as server:
        server.reply_transcript("纯文本 plain", delay=0.01)
        server.reply_error(429, "Rate limit reached", endpoint="transcription")
        server.reply_garbage(endpoint="transcription")
        held = threading.Event()
        held.set()
        server.reply_transcript("held", until=held)

        async def run() -> list[Any]:
            out: list[Any] = []
            async with client_for(server, max_retries=0) as client:
                out.append(await client.audio.transcriptions.create(
                    model="whisper-1", file=("v.ogg", b"x"), response_format="text"))
                try:
                    await client.audio.transcriptions.create(model="whisper-1", file=("v.ogg", b"x"))
                except openai.RateLimitError as exc:
                    out.append(exc)
                # A 200 with an HTML page: the SDK does not raise, it hands back the body as a str.
                out.append(await client.audio.transcriptions.create(model="whisper-1", file=("v.ogg", b"x")))
                out.append((await client.audio.transcriptions.create(model="m", file=("v.ogg", b"x"))).text)
                for file in [("voice", b"x"), ("v.ogg", b"x")]:  # no extension; nothing scripted
                    try:
                        await client.audio.transcriptions.create(model="whisper-1", file=file)
                    except openai.APIStatusError as exc:
                        out.append(exc)
                server.transcriber = lambda request: f"{request['size']} bytes"
                out.append((await client.audio.transcriptions.create(model="m", file=("a.mp3", b"abc"))).text)
            async with openai.AsyncOpenAI(base_url=server.base_url, api_key="sk-wrong", max_retries=0) as wrong:
                try:
                    await wrong.audio.transcriptions.create(model="whisper-1", file=("v.ogg", b"x"))
                except openai.AuthenticationError as exc:
                    out.append(exc)
            return out
        plain, limited, garbage, from_hold, no_extension, unscripted, computed, unauthorized = asyncio.run(run())

    assert plain == "纯文本 plain"
    assert isinstance(limited, openai.RateLimitError)
    assert isinstance(garbage, str) and garbage.startswith("<html>")
    assert from_hold == "held"
    assert no_extension.status_code == 400 and "Invalid file format" in no_extension.message
    assert unscripted.status_code == 500 and "no scripted transcription" in unscripted.message
    assert computed == "3 bytes"
    assert unauthorized.status_code == 401
    assert len(server.transcription_requests()) == 8
