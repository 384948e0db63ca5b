"""Forum topics: in a forum supergroup each topic is a conversation of its own
(`telegram:<chat>:t<topic>`), answered in its topic; /new, reminders and notices keep to the topic; the General
topic is the chat's own conversation; per_user memory still gives each member their own, per topic."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiogram.types import Chat, Message, Update, User

from picoclaw.app import App
from picoclaw.channels.telegram import (
    AddressedToBot,
    AllowedUser,
    TelegramChannel,
    Webhook,
    chat_of,
    not_authorised,
    topic_in,
    topic_of,
    webhook_secret,
)
from picoclaw.channels.telegram.access import Refusal, screen
from picoclaw.session_key import SessionKey
from picoclaw.transcripts.session_store import session_filename
from tests.agent_helpers import contents, is_flush_request, session_records
from tests.fakes import FakeOpenAIServer
from tests.fakes.telegram_server import BOT_ID, BOT_USERNAME, TOKEN, FakeTelegramServer, free_port
from tests.test_telegram import FRIEND, OWNER, STRANGER, configure, echo, serve, until
from tests.test_telegram_webhook import hook_settings, inbox_done, inbox_rows, post, serve_webhook

FORUM = -1001234567890


def in_topics(telegram: FakeTelegramServer, count: int) -> bool:
    return len(telegram.sent_texts(FORUM)) >= count


def test_a_message_in_topic_7_is_answered_in_topic_7_and_topic_9_hears_nothing_of_it(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_openai.responder = echo

    async def body(channel: TelegramChannel) -> None:
        # Not addressed to the bot: a topic's message comes as a reply to the topic's creation, not to the bot.
        fake_telegram.send_text(FORUM, OWNER, "just chatting in the topic", topic=7)
        fake_telegram.send_text(FORUM, OWNER, f"@{BOT_USERNAME} my code word is pineapple / 我的暗号是菠萝", topic=7)
        await until(fake_telegram, lambda: in_topics(fake_telegram, 1))
        fake_telegram.send_text(FORUM, OWNER, f"@{BOT_USERNAME} what is my code word? 我的暗号是什么？", topic=9)
        await until(fake_telegram, lambda: in_topics(fake_telegram, 2))
        fake_telegram.send_text(FORUM, OWNER, "and in topic 7 again? 再问一次", topic=7, reply_to_bot=True)
        await until(fake_telegram, lambda: in_topics(fake_telegram, 3))
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.sent_in(FORUM) == [
        (7, "echo: my code word is pineapple / 我的暗号是菠萝"),
        (9, "echo: what is my code word? 我的暗号是什么？"),
        (7, "echo: and in topic 7 again? 再问一次"),
    ]
    typing = fake_telegram.calls("sendChatAction")
    assert typing and {int(c.params["message_thread_id"]) for c in typing} == {7, 9}
    first, second, third = fake_openai.chat_requests()
    asked_in_9 = json.dumps(second, ensure_ascii=False)
    assert "pineapple" not in asked_in_9 and "菠萝" not in asked_in_9 and "just chatting" not in asked_in_9
    assert "pineapple" in json.dumps(third, ensure_ascii=False)  # topic 7 goes on with its own history
    topic_7 = [r["message"] for r in session_records(workspace, f"telegram:{FORUM}:t7")]
    assert contents(topic_7) == ["my code word is pineapple / 我的暗号是菠萝",
                                 "echo: my code word is pineapple / 我的暗号是菠萝",
                                 "and in topic 7 again? 再问一次", "echo: and in topic 7 again? 再问一次"]
    topic_9 = [r["message"] for r in session_records(workspace, f"telegram:{FORUM}:t9")]
    assert contents(topic_9) == ["what is my code word? 我的暗号是什么？",
                                 "echo: what is my code word? 我的暗号是什么？"]
    assert not (workspace.root / "sessions" / session_filename(f"telegram:{FORUM}")).exists()


def test_the_general_topic_is_the_chats_own_conversation(home: Path, fake_telegram: FakeTelegramServer,
                                                         fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai, group_trigger="always")
    fake_openai.responder = echo

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(FORUM, OWNER, "hello in General / 大家好", forum=True)
        await until(fake_telegram, lambda: in_topics(fake_telegram, 1))
        fake_telegram.send_text(FORUM, OWNER, "and in a topic / 在话题里", topic=5)
        await until(fake_telegram, lambda: in_topics(fake_telegram, 2))
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.sent_in(FORUM) == [(None, "echo: hello in General / 大家好"),
                                            (5, "echo: and in a topic / 在话题里")]
    general = [r["message"] for r in session_records(workspace, f"telegram:{FORUM}")]
    assert contents(general) == ["hello in General / 大家好", "echo: hello in General / 大家好"]
    assert "大家好" not in json.dumps(fake_openai.chat_requests()[1], ensure_ascii=False)


def test_new_in_topic_7_archives_only_topic_7(home: Path, fake_telegram: FakeTelegramServer,
                                              fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai, group_trigger="always")
    fake_openai.responder = echo

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(FORUM, OWNER, "topic seven: tea / 第七个话题：茶", topic=7)
        fake_telegram.send_text(FORUM, OWNER, "topic nine: coffee / 第九个话题：咖啡", topic=9)
        await until(fake_telegram, lambda: in_topics(fake_telegram, 2))
        fake_telegram.send_text(FORUM, OWNER, "/new", topic=7)
        await until(fake_telegram, lambda: in_topics(fake_telegram, 3))
        fake_telegram.send_text(FORUM, OWNER, "what did I say? 我说了什么？", topic=7)
        fake_telegram.send_text(FORUM, OWNER, "and here? 这里呢？", topic=9)
        await until(fake_telegram, lambda: in_topics(fake_telegram, 5))
    serve(workspace, fake_telegram, fake_openai, body)

    sent = fake_telegram.sent_in(FORUM)
    assert [topic for topic, text in sent if text.startswith("Started a new conversation")] == [7]
    sessions = workspace.root / "sessions"
    archived = [p.name for p in (sessions / "archive").iterdir()]
    assert len(archived) == 1 and archived[0].endswith("_" + session_filename(f"telegram:{FORUM}:t7"))
    assert (sessions / session_filename(f"telegram:{FORUM}:t9")).exists()
    requests = [json.dumps(r, ensure_ascii=False) for r in fake_openai.chat_requests()]
    [flush] = [r for r in fake_openai.chat_requests() if is_flush_request(r)]  # /new keeps topic 7's facts first
    assert "茶" in json.dumps(flush, ensure_ascii=False) and "咖啡" not in json.dumps(flush, ensure_ascii=False)
    [after_new_7] = [r for r in requests if "我说了什么" in r]
    [after_new_9] = [r for r in requests if "这里呢" in r]
    assert "茶" not in after_new_7 and "咖啡" not in after_new_7
    assert "第九个话题：咖啡" in after_new_9 and "茶" not in after_new_9  # topic 9 kept its conversation


def test_a_reminder_set_in_a_topic_comes_back_into_that_topic(home: Path, fake_telegram: FakeTelegramServer,
                                                             fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai, group_trigger="always")
    fake_openai.reply_tool_calls([("cron", {"action": "add", "in": "20 minutes",
                                            "message": "Call the bank / 给银行打电话"})])
    fake_openai.reply_text("OK, in 20 minutes. 好的。")
    jobs = []

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(FORUM, OWNER, "remind me in 20 minutes to call the bank / 20分钟后提醒我", topic=7)
        await until(fake_telegram, lambda: in_topics(fake_telegram, 1))
        jobs.extend(await asyncio.to_thread(lambda: App.open(home).jobs().load()))
        [job] = jobs
        await channel.deliver(job.target, job.text)  # what the scheduler does when it is due
        await channel.deliver(f"telegram:{FORUM}:t9", "**Stand up** / 站起来")
        await channel.deliver(f"telegram:{FORUM}", "to General / 发到总话题")
    serve(workspace, fake_telegram, fake_openai, body)

    [job] = jobs
    assert job.target == f"telegram:{FORUM}:t7"
    assert fake_telegram.sent_in(FORUM) == [(7, "OK, in 20 minutes. 好的。"), (7, "Call the bank / 给银行打电话"),
                                            (9, "<b>Stand up</b> / 站起来"), (None, "to General / 发到总话题")]


def test_per_user_memory_in_a_topic_keeps_each_member_apart(home: Path, fake_telegram: FakeTelegramServer,
                                                            fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai, allow_from=[OWNER, FRIEND], memory_scope="per_user",
                          group_trigger="always")
    fake_openai.responder = echo

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(FORUM, OWNER, "I like oolong / 我喜欢乌龙茶", topic=7)
        await until(fake_telegram, lambda: in_topics(fake_telegram, 1))
        fake_telegram.send_text(FORUM, FRIEND, "what do I like? 我喜欢什么？", topic=7)
        await until(fake_telegram, lambda: in_topics(fake_telegram, 2))
    serve(workspace, fake_telegram, fake_openai, body)

    assert [topic for topic, _ in fake_telegram.sent_in(FORUM)] == [7, 7]
    for user, said_ in ((OWNER, "I like oolong / 我喜欢乌龙茶"), (FRIEND, "what do I like? 我喜欢什么？")):
        folder = workspace.for_user(str(user)).layout.sessions_dir
        path = folder / session_filename(f"telegram:{FORUM}:t7:{user}")
        assert said_ in path.read_text(encoding="utf-8")
    assert "乌龙茶" not in json.dumps(fake_openai.chat_requests()[1], ensure_ascii=False)


def test_a_stranger_in_a_topic_is_told_their_id_in_that_topic(home: Path, fake_telegram: FakeTelegramServer,
                                                              fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai, group_trigger="always")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(FORUM, STRANGER, "let me in / 让我进去", topic=9)
        await until(fake_telegram, lambda: in_topics(fake_telegram, 1))
    serve(workspace, fake_telegram, fake_openai, body)

    [(topic, _text)] = fake_telegram.sent_in(FORUM)
    assert topic == 9 and fake_openai.chat_requests() == []


def test_a_webhook_worker_answers_in_the_topic_and_keeps_a_strangers_topic_only(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer) -> None:
    port = free_port()
    workspace = configure(home, fake_telegram, fake_openai, group_trigger="always", **hook_settings(port))
    fake_openai.responder = echo
    secret = {"X-Telegram-Bot-Api-Secret-Token": webhook_secret(TOKEN)}
    forum = {"id": FORUM, "type": "supergroup", "title": "家 family", "is_forum": True}

    def in_topic(update_id: int, user: int, topic: int, text: str) -> dict[str, Any]:
        return {"update_id": update_id, "message": {
            "message_id": update_id, "date": 1_700_000_000, "chat": forum, "message_thread_id": topic,
            "is_topic_message": True, "from": {"id": user, "is_bot": False, "first_name": "u"}, "text": text}}

    updates = [in_topic(1, OWNER, 7, "tea in topic 7 / 第七个话题喝茶"), in_topic(2, STRANGER, 9, "let me in / 让我进"),
               in_topic(3, OWNER, 9, "what do I drink? 我喝什么？")]

    async def run(channel: TelegramChannel, webhook: Webhook) -> list[int]:
        statuses = [await post(port, body, secret) for body in updates]
        await inbox_done(webhook, 3)
        return statuses
    assert serve_webhook(workspace, fake_telegram, fake_openai, run) == [200] * 3

    assert fake_telegram.sent_in(FORUM) == [(7, "echo: tea in topic 7 / 第七个话题喝茶"), (9, not_authorised(STRANGER)),
                                            (9, "echo: what do I drink? 我喝什么？")]
    assert "喝茶" not in json.dumps(fake_openai.chat_requests()[1], ensure_ascii=False)
    rows = inbox_rows(home, None, "update_id, chat, body")
    assert [row[:2] for row in rows] == [(1, str(FORUM)), (2, str(FORUM)), (3, str(FORUM))]  # one chat's order
    assert json.loads(rows[1][2]) == {"update_id": 2, "refusal": {"chat_id": FORUM, "user_id": STRANGER, "topic_id": 9}}


# -- the parts, without a bot ----------------------------------------------------------------------------------


def forum_message(text: str, *, thread: int | None, topic_message: bool, forum: bool = True,
                  user: int = OWNER) -> Message:
    chat = Chat(id=FORUM, type="supergroup", is_forum=forum or None)
    return Message(message_id=50, date=datetime(2025, 3, 10, tzinfo=UTC), chat=chat, text=text,
                   from_user=User(id=user, is_bot=False, first_name="u"), message_thread_id=thread,
                   is_topic_message=topic_message or None)


def test_which_messages_are_in_a_topic() -> None:
    assert topic_of(forum_message("hi", thread=7, topic_message=True)) == 7
    assert topic_of(forum_message("hi", thread=None, topic_message=False)) is None  # General
    assert topic_of(forum_message("hi", thread=1, topic_message=True)) is None  # General, as some clients say
    # A reply thread of an ordinary supergroup has a thread id, and is no topic: the chat's own conversation.
    assert topic_of(forum_message("hi", thread=33, topic_message=False, forum=False)) is None


def test_a_strangers_refusal_keeps_the_topic() -> None:
    bot = User(id=BOT_ID, is_bot=True, first_name="picoclaw", username=BOT_USERNAME)
    addressed = AddressedToBot("always", lambda: bot)
    update = Update(update_id=1, message=forum_message("你好", thread=9, topic_message=True, user=STRANGER))
    assert screen(update, AllowedUser([OWNER]), addressed) == Refusal(FORUM, STRANGER, 9)


@pytest.mark.parametrize(("key", "chat", "topic"), [
    (f"telegram:{FORUM}:t7", FORUM, 7), (f"telegram:{FORUM}:t7:{OWNER}", FORUM, 7), (f"telegram:{FORUM}", FORUM, None),
    (f"telegram:{FORUM}:{OWNER}", FORUM, None), ("cli:工作", None, None), ("telegram:1:t", None, None),
])
def test_the_chat_and_topic_of_a_session_key(key: str, chat: int | None, topic: int | None) -> None:
    assert (chat_of(key), topic_in(key)) == (chat, topic)


def test_a_topic_key_names_a_conversation_of_its_own() -> None:
    key = SessionKey.parse(f"telegram:{FORUM}:t7:{OWNER}")
    assert (key.chat_id, key.topic_id, key.user_id) == (FORUM, 7, OWNER)
    assert key.scope("per_user") == str(OWNER) and key.scope("shared") is None  # the member's memory, as in groups
    assert str(SessionKey.telegram(FORUM, topic_id=7)) == f"telegram:{FORUM}:t7"
