"""Streaming replies on Telegram: the answer previewed while written (a draft in a private
chat, else one message edited), then sent whole; a preview's failure or 429 never costs the final answer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from picoclaw.channels.telegram import TelegramChannel, Webhook, make_bot
from picoclaw.channels.telegram.stream import PREVIEW_CHARS, ReplyStream, preview_of, tool_status
from picoclaw.config import TelegramConfig
from tests.fakes import FakeOpenAIServer
from tests.fakes.telegram_server import BOT_USERNAME, TOKEN, FakeTelegramServer, free_port
from tests.test_telegram import OWNER, Sleeps, configure, serve, until
from tests.test_telegram_webhook import hook_settings, serve_webhook

GROUP = -100777
INTERVAL = 0.05  # seconds between previews in these tests
# ~1,200 characters of plain text (rendered as is), streamed 3 characters a chunk.
ANSWERS = {
    "en": " ".join(f"Sentence {i} of a long answer that the model writes slowly." for i in range(20)),
    "zh": "".join(f"这是模型慢慢写出的长回答中的第{i}句话，用来测试流式回复是否完整无缺。" for i in range(34)),
}
CHUNK_DELAY = 0.004  # seconds before each chunk: the answer takes over a second and a half to arrive


@pytest.fixture(params=sorted(ANSWERS))
def answer(request: pytest.FixtureRequest) -> str:
    text = ANSWERS[request.param]
    assert 1_100 <= len(text) <= 1_300
    return text


def whole(telegram: FakeTelegramServer, chat: int, text: str) -> Callable[[], bool]:
    return lambda: text in telegram.sent_texts(chat)


def grows(previews: list[str], final: str) -> None:
    """Each preview is a start of the answer (white space at its end trimmed), and each shows more."""
    assert all(final.startswith(p) for p in previews), previews
    assert [len(p) for p in previews] == sorted(len(p) for p in previews)


def test_a_private_reply_is_drafted_then_sent_whole(home: Path, fake_telegram: FakeTelegramServer,
                                                    fake_openai: FakeOpenAIServer, answer: str) -> None:
    workspace = configure(home, fake_telegram, fake_openai, stream=True, stream_interval=INTERVAL)
    fake_openai.reply_text(answer, chunk_delay=CHUNK_DELAY)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "tell me a long story / 讲个长故事")
        await until(fake_telegram, whole(fake_telegram, OWNER, answer))
    serve(workspace, fake_telegram, fake_openai, body)

    drafts = fake_telegram.drafts(OWNER)
    assert len(drafts) >= 2
    grows(drafts, answer)
    assert fake_telegram.sent_texts(OWNER) == [answer]  # one whole final message
    assert fake_telegram.calls("editMessageText") == []
    draft_ids = {int(c.params["draft_id"]) for c in fake_telegram.calls("sendMessageDraft")}
    assert len(draft_ids) == 1 and 0 not in draft_ids
    # No draft after the final message: it would show a stale preview.
    final_at = next(c.at for c in fake_telegram.calls("sendMessage") if c.params["text"] == answer)
    assert all(c.at < final_at for c in fake_telegram.calls("sendMessageDraft"))


def test_a_group_reply_edits_one_message_then_sends_whole(home: Path, fake_telegram: FakeTelegramServer,
                                                          fake_openai: FakeOpenAIServer, answer: str) -> None:
    workspace = configure(home, fake_telegram, fake_openai, stream=True, stream_interval=INTERVAL)
    fake_openai.reply_text(answer, chunk_delay=CHUNK_DELAY)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(GROUP, OWNER, f"@{BOT_USERNAME} a long story please / 讲个长故事",
                                chat_type="supergroup")
        await until(fake_telegram, lambda: whole(fake_telegram, GROUP, answer)() and bool(fake_telegram.deleted(GROUP)))
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.calls("sendMessageDraft") == []  # no drafts outside private chats
    edits = fake_telegram.edits(GROUP)
    assert len(edits) >= 2
    grows(edits, answer)
    assert fake_telegram.sent_texts(GROUP) == [answer]  # the preview deleted, the answer whole
    [preview] = fake_telegram.deleted(GROUP)
    assert {int(c.params["message_id"]) for c in fake_telegram.calls("editMessageText")} == {preview}


def test_where_drafts_are_refused_the_preview_edits_a_message(home: Path, fake_telegram: FakeTelegramServer,
                                                              fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai, stream=True, stream_interval=INTERVAL)
    fake_telegram.drafts_available = False  # a Bot API server before 9.x
    first, second = ANSWERS["en"], ANSWERS["zh"]
    fake_openai.reply_text(first, chunk_delay=CHUNK_DELAY)
    fake_openai.reply_text(second, chunk_delay=CHUNK_DELAY)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "a long story")
        await until(fake_telegram, whole(fake_telegram, OWNER, first))
        fake_telegram.send_text(OWNER, OWNER, "再讲一个")
        await until(fake_telegram, lambda: whole(fake_telegram, OWNER, second)()
                    and len(fake_telegram.deleted(OWNER)) == 2)
    serve(workspace, fake_telegram, fake_openai, body)

    assert len(fake_telegram.calls("sendMessageDraft")) == 1  # refused once, not tried again in this chat
    assert len(fake_telegram.edits(OWNER)) >= 2
    assert fake_telegram.sent_texts(OWNER) == [first, second]


def test_a_429_on_an_edit_is_waited_out_and_the_final_text_is_whole(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, answer: str) -> None:
    workspace = configure(home, fake_telegram, fake_openai, stream=True, stream_interval=INTERVAL)
    fake_openai.reply_text(answer, chunk_delay=2 * CHUNK_DELAY)  # over 3 s: previews go on after the wait
    fake_telegram.fail_next("editMessageText", 429, "Too Many Requests: retry after 1", retry_after=1)
    sleeps = Sleeps()

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(GROUP, OWNER, f"@{BOT_USERNAME} a long story please / 讲个长故事",
                                chat_type="supergroup")
        await until(fake_telegram, lambda: whole(fake_telegram, GROUP, answer)() and bool(fake_telegram.deleted(GROUP)))
    serve(workspace, fake_telegram, fake_openai, body, sleeps=sleeps)

    [limited, *after] = fake_telegram.calls("editMessageText")
    assert not limited.params.get("_ok")
    assert after and all(c.at >= limited.at + 0.9 for c in after)  # nothing sent while Telegram said wait
    assert after[-1].params["_ok"]
    grows(fake_telegram.edits(GROUP), answer)
    assert sleeps.seconds == []  # the preview skipped its updates; no call sat the 429 out
    assert fake_telegram.sent_texts(GROUP) == [answer]


def test_a_failing_draft_or_edit_never_costs_the_answer(home: Path, fake_telegram: FakeTelegramServer,
                                                        fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai, stream=True, stream_interval=INTERVAL)
    fake_openai.reply_text(ANSWERS["zh"], chunk_delay=CHUNK_DELAY)
    fake_telegram.fail_next("editMessageText", 400, "Bad Request: message can't be edited", times=100)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(GROUP, OWNER, f"@{BOT_USERNAME} 讲个长故事", chat_type="supergroup")
        await until(fake_telegram, lambda: whole(fake_telegram, GROUP, ANSWERS["zh"])()
                    and bool(fake_telegram.deleted(GROUP)))
    serve(workspace, fake_telegram, fake_openai, body)

    assert len(fake_telegram.calls("editMessageText")) == 1  # the preview ends at its first failure
    assert fake_telegram.sent_texts(GROUP) == [ANSWERS["zh"]]


def test_a_tool_call_shows_as_a_status_line(home: Path, fake_telegram: FakeTelegramServer,
                                            fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai, stream=True, stream_interval=INTERVAL)
    fake_openai.reply_tool_calls([("memory_search", {"query": "birthday 生日"})])
    fake_openai.reply_text("Your birthday is in May. 你的生日在五月。", delay=0.5)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "when is my birthday? 我的生日是哪天？")
        await until(fake_telegram, lambda: bool(fake_telegram.sent_texts(OWNER)))
    serve(workspace, fake_telegram, fake_openai, body)

    assert tool_status("memory_search") in fake_telegram.drafts(OWNER)
    assert fake_telegram.sent_texts(OWNER) == ["Your birthday is in May. 你的生日在五月。"]


def test_with_stream_off_the_answer_comes_as_one_message(home: Path, fake_telegram: FakeTelegramServer,
                                                         fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai, stream=False, stream_interval=INTERVAL)
    fake_openai.reply_text(ANSWERS["en"], chunk_delay=CHUNK_DELAY)
    fake_openai.reply_text(ANSWERS["zh"], chunk_delay=CHUNK_DELAY)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "a long story")
        await until(fake_telegram, whole(fake_telegram, OWNER, ANSWERS["en"]))
        fake_telegram.send_text(GROUP, OWNER, f"@{BOT_USERNAME} 讲个长故事", chat_type="supergroup")
        await until(fake_telegram, whole(fake_telegram, GROUP, ANSWERS["zh"]))
    serve(workspace, fake_telegram, fake_openai, body)

    assert [c.method for c in fake_telegram.calls() if c.method in {"sendMessageDraft", "editMessageText",
                                                                     "deleteMessage"}] == []
    assert len(fake_telegram.calls("sendMessage")) == 2


def test_a_preview_shows_the_end_of_a_long_text_and_the_tool_under_way() -> None:
    assert preview_of("  hello \n") == "hello"
    assert preview_of("", tool_status("web_search")) == "· running web_search…"
    assert preview_of("查一下", tool_status("web_search")) == "查一下\n\n· running web_search…"
    long = "字" * 5000 + "END"
    shown = preview_of(long)
    assert len(shown) == PREVIEW_CHARS and shown.startswith("…") and shown.endswith("END")


def test_stream_settings_are_bounded() -> None:
    assert TelegramConfig().stream is False and TelegramConfig().stream_interval == 1.0  # opt-in: it costs CPU
    with pytest.raises(ValueError):
        TelegramConfig(stream_interval=0)
    with pytest.raises(ValueError):
        TelegramConfig(stream_interval=600)


def test_in_webhook_mode_a_reply_is_drafted_then_sent_whole(home: Path, fake_telegram: FakeTelegramServer,
                                                            fake_openai: FakeOpenAIServer, answer: str) -> None:
    port = free_port()
    workspace = configure(home, fake_telegram, fake_openai, stream=True, stream_interval=INTERVAL,
                          **hook_settings(port))
    fake_openai.reply_text(answer, chunk_delay=CHUNK_DELAY)

    async def run(channel: TelegramChannel, webhook: Webhook) -> None:
        fake_telegram.deliver_to([port])
        fake_telegram.send_text(OWNER, OWNER, "tell me a long story / 讲个长故事")
        await until(fake_telegram, whole(fake_telegram, OWNER, answer))
    serve_webhook(workspace, fake_telegram, fake_openai, run)

    drafts = fake_telegram.drafts(OWNER)
    assert len(drafts) >= 2
    grows(drafts, answer)
    assert fake_telegram.sent_texts(OWNER) == [answer]


@pytest.mark.slow
@pytest.mark.parametrize(("first", "more"), [("The first part", " and more."), ("第一部分", "，还有更多。")])
def test_a_worker_that_lost_its_update_shows_no_more_previews(fake_telegram: FakeTelegramServer, first: str,
                                                              more: str) -> None:
    asked: list[bool] = []
    held = [True]

    async def main() -> None:
        asked_again = asyncio.Event()

        async def still_ours() -> bool:
            asked.append(held[0])
            if len(asked) == 2:
                asked_again.set()
            return held[0]

        bot = make_bot(TelegramConfig(token=TOKEN, api_base=fake_telegram.origin), TOKEN)
        try:
            stream = ReplyStream(bot, OWNER, topic=None, draft_id=5, interval=INTERVAL, may_show=still_ours)
            await stream.on_text(first)
            await until(fake_telegram, lambda: len(fake_telegram.drafts(OWNER)) == 1)
            held[0] = False  # another worker took the update over
            await stream.on_text(more)
            # Awaited here, not through the fake: a preview not shown makes no API call that would wake its wait.
            await asyncio.wait_for(asked_again.wait(), 60)
            await stream.close()
        finally:
            await bot.session.close()
    asyncio.run(main())

    assert asked == [True, False]
    assert fake_telegram.drafts(OWNER) == [first]  # nothing shown after the update was lost
