"""Images in a turn: whether the model sees (agents.defaults.vision, or "auto": the server's /props,
else the model's name), the image sent as an `image_url` part of the turn's own requests only, the session
keeping the text that names it and never its bytes, and what an image costs as counted."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from picoclaw.agent.budget import message_tokens
from picoclaw.agent.images import IMAGE_TOKENS, with_images
from picoclaw.agent.loop import AgentLoop
from picoclaw.memory import MediaFolder, image_type, safe_name
from picoclaw.providers.vision import named_for_vision
from tests.agent_helpers import reopen, session_path, with_agent
from tests.fakes import FakeOpenAIServer

PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)
JPEG = b"\xff\xd8\xff\xe0" + bytes(64)


@pytest.mark.parametrize(("model", "sees"), [
    ("gpt-4o-mini", True), ("gpt-4.1", True), ("claude-3-5-sonnet", True), ("gemini-2.0-flash", True),
    ("qwen2.5-vl-7b-instruct", True), ("llava:13b", True), ("llama3.2-vision", True), ("minicpm-v", True),
    ("gemma3:4b", True), ("Qwen/Qwen2-VL-2B", True),
    ("gpt-3.5-turbo", False), ("qwen2.5:7b", False), ("deepseek-chat", False), ("/work/llm/qwen.gguf", False),
    ("llama3.1:8b", False), ("solvable-model", False),
])
def test_a_vision_model_is_known_by_its_name(model: str, sees: bool) -> None:
    assert named_for_vision(model) is sees


@pytest.mark.parametrize(("setting", "model", "props", "sees"), [
    (True, "qwen2.5:7b", None, True),  # the setting wins, whatever the name
    (False, "gpt-4o", None, False),
    ("auto", "/models/qwen.gguf", {"modalities": {"vision": True}}, True),  # llama.cpp says so
    ("auto", "gpt-4o", {"modalities": {"vision": False}}, False),  # the server's word beats the name
    ("auto", "gpt-4o", None, True),  # no /props: the name decides
    ("auto", "qwen2.5:7b", None, False),
])
def test_whether_the_model_sees_images(home: Path, fake_openai: FakeOpenAIServer, setting: bool | str, model: str,
                                       props: dict[str, Any] | None, sees: bool) -> None:
    workspace = reopen(home, vision=setting, model=model, context_window=8192)
    if props is not None:
        fake_openai.reply_raw(props, endpoint="props")

    async def body(loop: AgentLoop) -> bool:
        return await loop.sees_images() and await loop.sees_images()  # asked once, the answer kept
    assert with_agent(workspace, fake_openai, body) is sees
    asked = [r for r in fake_openai.requests if r.path == "/props"]
    assert len(asked) == (1 if setting == "auto" else 0)


@pytest.mark.parametrize("caption", ["What is on this receipt?", "这张收据上写了什么？"], ids=["english", "chinese"])
def test_an_image_goes_with_its_turn_only_and_the_session_keeps_where_it_is(
        home: Path, fake_openai: FakeOpenAIServer, caption: str) -> None:
    workspace = reopen(home, vision=True, model="gpt-4o-mini", context_window=128_000)
    saved = workspace.media().save(PNG, "receipt.png")
    text = f"{caption}\n[image: {saved}]"
    fake_openai.reply_text("A coffee for 3.50. / 一杯咖啡，3.50。")
    fake_openai.reply_text("You are welcome. / 不客气。")

    async def body(loop: AgentLoop) -> None:
        await loop.handle("cli:test", text, images=[PNG])
        await loop.handle("cli:test", "thanks / 谢谢")
    with_agent(workspace, fake_openai, body)

    first, second = fake_openai.chat_requests()
    parts = first["messages"][-1]["content"]
    assert parts[0]["type"] == "text" and parts[0]["text"].endswith(text)
    assert parts[1] == {"type": "image_url",
                        "image_url": {"url": f"data:image/png;base64,{base64.b64encode(PNG).decode()}"}}
    # The next turn sends the earlier message as the text naming the image, never the image again.
    earlier = [m for m in second["messages"] if m["role"] == "user"][0]
    assert isinstance(earlier["content"], str) and earlier["content"].endswith(text)
    assert "base64" not in str(second["messages"])
    # The session file holds the text that names the image, never its bytes.
    stored = session_path(workspace, "cli:test").read_text(encoding="utf-8")
    assert saved in stored and base64.b64encode(PNG).decode() not in stored
    assert (workspace.root / saved).read_bytes() == PNG


def test_an_image_costs_its_estimate_not_its_data_url() -> None:
    message = {"role": "user", "content": "look / 看"}
    big = JPEG + bytes(400_000)
    assert message_tokens(with_images(message, [big, PNG])) < message_tokens(message) + 2 * IMAGE_TOKENS + 20
    assert message_tokens(with_images(message, [PNG])) >= message_tokens(message) + IMAGE_TOKENS


def test_image_types_by_their_bytes() -> None:
    assert image_type(PNG) == "image/png" and image_type(JPEG) == "image/jpeg"
    assert image_type(b"GIF89a" + bytes(8)) == "image/gif"
    assert image_type(b"RIFF\x10\x00\x00\x00WEBPVP8 ") == "image/webp"
    assert image_type(b"%PDF-1.7") is None and image_type(b"") is None and image_type(b"\xff\xd8") is None


@pytest.mark.parametrize(("name", "safe"), [
    ("photo.jpg", "photo.jpg"), ("../../etc/passwd", "passwd"), ("C:\\Users\\me\\报告.pdf", "报告.pdf"),
    (".hidden", "hidden"), ("", "file"), ("a b;rm -rf.txt", "a_b_rm_-rf.txt"), ("x" * 300 + ".md", "x" * 117 + ".md"),
    ("报" * 100 + ".pdf", "报" * 38 + ".pdf"),  # cut by bytes: a CJK character is three
])
def test_a_sent_file_name_is_made_harmless(name: str, safe: str) -> None:
    assert safe_name(name) == safe


def test_a_long_chinese_file_name_is_kept(tmp_path: Path) -> None:
    folder = MediaFolder(tmp_path / "media", tmp_path, keep_days=30, keep_bytes=10_000)
    saved = folder.save(b"%PDF-1.7", "季度报告" * 40 + ".pdf")
    assert folder.read(saved) == b"%PDF-1.7" and saved.endswith(".pdf")


def test_the_media_folder_keeps_each_content_once_and_prunes_the_oldest(tmp_path: Path) -> None:
    import os

    folder = MediaFolder(tmp_path / "media", tmp_path, keep_days=30, keep_bytes=250)
    first = folder.save(bytes(100), "a.bin")
    assert folder.save(bytes(100), "a.bin") == first  # the same bytes, kept once
    os.utime(tmp_path / first, (1, 1))  # the oldest
    second = folder.save(b"\x01" * 100, "b.bin")
    third = folder.save(b"\x02" * 100, "c.bin")  # 300 bytes in all: over 250, the oldest goes
    assert not (tmp_path / first).exists()
    assert folder.read(second) == b"\x01" * 100 and folder.read(third) == b"\x02" * 100
    with pytest.raises(ValueError):
        folder.read("../outside.txt")
    # A file older than keep_days goes at the next save, whatever the size.
    os.utime(tmp_path / second, (1, 1))
    folder.save(b"\x03", "d.bin")
    assert not (tmp_path / second).exists() and (tmp_path / third).exists()



def test_the_first_request_of_an_image_turn_is_fitted_with_room_for_the_image(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    # A small window: the reply's room is what the prompt leaves, so an image counted shows in max_tokens.
    workspace = reopen(home, vision=True, model="gpt-4o-mini", context_window=8192, max_tokens=8192)
    fake_openai.reply_text("ok / 好")
    fake_openai.reply_text("ok / 好")

    async def body(loop: AgentLoop) -> None:
        await loop.handle("cli:plain", "What is this? 这是什么？")
        await loop.handle("cli:image", "What is this? 这是什么？", images=[PNG])
    with_agent(workspace, fake_openai, body)

    plain, image = fake_openai.chat_requests()
    assert plain["max_tokens"] - image["max_tokens"] >= IMAGE_TOKENS - 50
