"""Photos on Telegram: the largest size within media.image_megabytes fetched, kept in the
scope's media/ folder, and sent to a model that sees as an image part beside the caption; a model that does not
see gets the caption and a note, and the user hears so in one line; a photo too large or damaged is one line
with nothing stored; a stranger's photo is never fetched."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from picoclaw.app import App
from picoclaw.channels import NO_VISION
from picoclaw.channels.telegram import TelegramChannel, not_authorised
from picoclaw.memory.workspace import Workspace
from tests.agent_helpers import contents, session_path
from tests.fakes import FakeOpenAIServer
from tests.fakes.telegram_server import BOT_USERNAME, FakeTelegramServer
from tests.homes import edit_config
from tests.test_telegram import FRIEND, OWNER, STRANGER, configure, replied, serve, until

SMALL = b"\xff\xd8\xff\xe0" + b"small" + bytes(32)
LARGE = b"\xff\xd8\xff\xe0" + b"large" + bytes(64)
KEY = f"telegram:{OWNER}"


def seeing(home: Path, telegram: FakeTelegramServer, model: FakeOpenAIServer, *, vision: bool,
           telegram_settings: dict[str, Any] | None = None, **media: Any) -> Workspace:
    """config.json pointed at both fakes, with agents.defaults.vision and `media` settings."""
    configure(home, telegram, model, **(telegram_settings or {}))
    with edit_config(home) as config:
        config["agents"]["defaults"]["vision"] = vision
        config["media"] = media
    return App.open(home).workspace


def last_user(body: dict[str, Any]) -> Any:
    return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]


@pytest.mark.parametrize("caption", ["What does this sign say?", "这个牌子上写的是什么？"], ids=["english", "chinese"])
def test_a_photo_reaches_a_model_that_sees_as_an_image_beside_its_caption(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, caption: str) -> None:
    workspace = seeing(home, fake_telegram, fake_openai, vision=True, image_megabytes=1)
    fake_openai.reply_text("It says: no parking. / 上面写着：禁止停车。")
    fake_openai.reply_text("ok / 好")
    too_big = b"\xff\xd8\xff\xe0" + bytes(64)

    async def body(channel: TelegramChannel) -> None:
        # Three sizes: the largest is over the 1 MB limit, so the next one is taken.
        sizes = [(SMALL, 90, 60, None), (LARGE, 800, 600, None), (too_big, 2560, 1920, 2_000_000)]
        fake_telegram.send_photo(OWNER, OWNER, caption=caption, sizes=sizes)
        await until(fake_telegram, replied(fake_telegram, OWNER))
        fake_telegram.send_text(OWNER, OWNER, "thanks / 谢谢")
        await until(fake_telegram, replied(fake_telegram, OWNER, 2))
    serve(workspace, fake_telegram, fake_openai, body)

    first, second = fake_openai.chat_requests()
    text, image = last_user(first)
    assert text["type"] == "text" and caption in text["text"] and "[image: media/" in text["text"]
    url = f"data:image/jpeg;base64,{base64.b64encode(LARGE).decode()}"
    assert image == {"type": "image_url", "image_url": {"url": url}}
    assert fake_telegram.sent_texts(OWNER)[0] == "It says: no parking. / 上面写着：禁止停车。"
    # Kept once in media/, named in the session's text; never sent again, never in the session file.
    [kept] = list((workspace.root / "media").rglob("*.jpg"))
    assert kept.read_bytes() == LARGE
    assert "base64" not in json.dumps(second["messages"])
    stored = session_path(workspace, KEY).read_text(encoding="utf-8")
    assert kept.relative_to(workspace.root).as_posix() in stored and base64.b64encode(LARGE).decode() not in stored


def test_an_image_sent_as_a_file_is_looked_at_like_a_photo(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer) -> None:
    workspace = seeing(home, fake_telegram, fake_openai, vision=True)
    png = b"\x89PNG\r\n\x1a\n" + bytes(40)
    fake_openai.reply_text("A chart. / 一张图表。")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_document(OWNER, OWNER, png, file_name="chart 图表.png", mime_type="image/png")
        await until(fake_telegram, replied(fake_telegram, OWNER))
    serve(workspace, fake_telegram, fake_openai, body)

    [request] = fake_openai.chat_requests()
    text, image = last_user(request)
    assert image["image_url"]["url"].startswith("data:image/png;base64,")
    assert "chart_图表.png]" in text["text"]


@pytest.mark.parametrize("caption", ["Is this mushroom safe to eat?", "这个蘑菇能吃吗？"], ids=["english", "chinese"])
def test_a_model_that_cannot_see_gets_the_caption_and_the_user_is_told(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, caption: str) -> None:
    workspace = seeing(home, fake_telegram, fake_openai, vision=False)
    fake_openai.reply_text("I cannot see it. / 我看不到图片。")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_photo(OWNER, OWNER, caption=caption, data=LARGE)
        await until(fake_telegram, replied(fake_telegram, OWNER, 2))
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.sent_texts(OWNER) == [NO_VISION, "I cannot see it. / 我看不到图片。"]
    [request] = fake_openai.chat_requests()
    said = contents(request["messages"])[-1]
    assert isinstance(said, str) and said.startswith(caption) and "cannot see images" in said


@pytest.mark.parametrize(("send", "line"), [
    ({"sizes": [(SMALL, 90, 60, 3_000_000), (LARGE, 800, 600, 6_000_000)]},
     "That image is 3.0 MB; I take up to 2 MB (media.image_megabytes)."),
    ({"data": b"\xff\xd8not really a jpeg"}, "That image could not be read: it is damaged, or not a JPEG"),
    ({"data": b"%PDF-1.4 a pdf named photo"}, "That image could not be read"),
], ids=["too large", "damaged", "not an image"])
def test_a_photo_that_cannot_be_taken_is_one_line_and_nothing_is_stored(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, send: dict[str, Any],
        line: str) -> None:
    workspace = seeing(home, fake_telegram, fake_openai, vision=True, image_megabytes=2)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_photo(OWNER, OWNER, caption="look / 看", **send)
        await until(fake_telegram, replied(fake_telegram, OWNER))
    serve(workspace, fake_telegram, fake_openai, body)

    [said] = fake_telegram.sent_texts(OWNER)
    assert said.startswith(line)
    assert fake_openai.chat_requests() == [] and not session_path(workspace, KEY).exists()
    assert not (workspace.root / "media").exists() or not any((workspace.root / "media").rglob("*.*"))
    if "sizes" in send:
        assert fake_telegram.calls("getFile") == []  # too large by what the message says: nothing fetched


def test_a_strangers_photo_is_never_fetched(home: Path, fake_telegram: FakeTelegramServer,
                                            fake_openai: FakeOpenAIServer) -> None:
    workspace = seeing(home, fake_telegram, fake_openai, vision=True)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_photo(STRANGER, STRANGER, caption="看看这个", data=LARGE)
        await until(fake_telegram, replied(fake_telegram, STRANGER))
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.sent_texts(STRANGER) == [not_authorised(STRANGER)]
    assert fake_telegram.calls("getFile") == [] and fake_telegram.downloads() == []


def test_with_per_user_memory_each_users_photos_are_kept_in_their_own_folder(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer) -> None:
    workspace = seeing(home, fake_telegram, fake_openai, vision=True,
                       telegram_settings={"allow_from": [OWNER, FRIEND], "memory_scope": "per_user"})
    fake_openai.reply_text("Nice. / 不错。")
    fake_openai.reply_text("Lovely. / 真好。")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_photo(OWNER, OWNER, caption="my garden / 我的花园", data=SMALL)
        await until(fake_telegram, replied(fake_telegram, OWNER))
        fake_telegram.send_photo(FRIEND, FRIEND, caption="my cat / 我的猫", data=LARGE)
        await until(fake_telegram, replied(fake_telegram, FRIEND))
    serve(workspace, fake_telegram, fake_openai, body)

    users = workspace.root / "users"
    assert [p.read_bytes() for p in (users / str(OWNER) / "media").rglob("*.jpg")] == [SMALL]
    assert [p.read_bytes() for p in (users / str(FRIEND) / "media").rglob("*.jpg")] == [LARGE]
    assert not (workspace.root / "media").exists()  # nothing in the shared scope


@pytest.mark.parametrize("caption", [f"@{BOT_USERNAME} what is this?", f"@{BOT_USERNAME} 这是什么？"],
                         ids=["english", "chinese"])
def test_in_a_group_a_caption_that_mentions_the_bot_addresses_it(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, caption: str) -> None:
    workspace = seeing(home, fake_telegram, fake_openai, vision=True)
    group = -100123
    fake_openai.reply_text("A bridge. / 一座桥。")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_photo(group, OWNER, caption="no mention here / 没有提到", data=SMALL, chat_type="group")
        fake_telegram.send_photo(group, OWNER, caption=caption, data=LARGE, chat_type="group")
        await until(fake_telegram, replied(fake_telegram, group))
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.sent_texts(group) == ["A bridge. / 一座桥。"]  # the photo without a mention was left alone
    [request] = fake_openai.chat_requests()
    text, _ = last_user(request)
    assert f"@{BOT_USERNAME}" not in text["text"] and caption.split(" ", 1)[1] in text["text"]
