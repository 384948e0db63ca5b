"""Reactions (issue 44, item 4): a fact remembered from the user's words is receipted with a ✍ reaction on their
message (a line of text where reactions cannot be set), and an allowed user's 👍 ❤ 🔥 / 👎 on a reply is recorded
once as feedback on that turn; a stranger's is ignored."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from picoclaw.channels.telegram import TelegramChannel
from picoclaw.memory import memory_stats
from picoclaw.memory.feedback import FeedbackLedger, Reaction
from picoclaw.memory.workspace import Workspace
from tests.fakes import FakeOpenAIServer
from tests.fakes.telegram_server import FakeTelegramServer
from tests.test_telegram import FRIEND, OWNER, STRANGER, configure, echo, replied, serve, until

FACTS = ["I drink oolong tea every morning", "我每天早上喝乌龙茶"]


def feedback(workspace: Workspace) -> list[Reaction]:
    return FeedbackLedger(workspace.memory_dir, storage=workspace.storage).read()


@pytest.mark.parametrize("fact", FACTS)
def test_a_fact_saved_from_the_users_words_gets_a_writing_hand_on_their_message(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, fact: str) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_openai.reply_tool_calls([("memory_append", {"content": fact})])
    fake_openai.reply_text("Noted. / 记下了。")
    fake_openai.responder = echo

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, f"remember / 记住: {fact}")  # message 1: nothing was sent before
        await until(fake_telegram, lambda: bool(fake_telegram.reactions(OWNER)) and replied(fake_telegram, OWNER)())
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.reactions(OWNER) == [(1, ["✍"])]
    assert fake_telegram.sent_texts(OWNER) == ["Noted. / 记下了。"]  # no "remembered" line beside the reaction
    assert fact in workspace.store.read_long_term()


@pytest.mark.parametrize("fact", FACTS)
def test_where_reactions_are_refused_the_receipt_is_the_line_and_the_chat_is_not_asked_again(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, fact: str) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_telegram.fail_next("setMessageReaction", 400, "Bad Request: REACTION_INVALID")
    fake_openai.reply_tool_calls([("memory_append", {"content": fact})])
    fake_openai.reply_text("Noted.")
    fake_openai.reply_tool_calls([("memory_append", {"content": "my cat is Mochi / 我的猫叫麻糬"})])
    fake_openai.reply_text("Noted again.")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, f"remember: {fact}")
        await until(fake_telegram, replied(fake_telegram, OWNER, 2))
        fake_telegram.send_text(OWNER, OWNER, "remember: my cat is Mochi / 我的猫叫麻糬")
        await until(fake_telegram, replied(fake_telegram, OWNER, 4))
    serve(workspace, fake_telegram, fake_openai, body)

    sent = fake_telegram.sent_texts(OWNER)
    assert sorted(sent) == sorted(["Noted.", f"remembered: {fact}", "Noted again.",
                                   "remembered: my cat is Mochi / 我的猫叫麻糬"])
    assert len(fake_telegram.calls("setMessageReaction")) == 1  # refused once: the chat's receipts are lines
    assert fake_telegram.reactions(OWNER) == []


def test_the_assistants_own_words_keep_the_line(home: Path, fake_telegram: FakeTelegramServer,
                                                fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_openai.reply_tool_calls([("memory_append", {"content": "Owner drinks oolong / 主人喝乌龙茶"})])
    fake_openai.reply_text("Noted.")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "remember: I drink oolong / 我喝乌龙茶")
        await until(fake_telegram, replied(fake_telegram, OWNER, 2))
    serve(workspace, fake_telegram, fake_openai, body)

    assert "remembered (the assistant's words, not yours): Owner drinks oolong / 主人喝乌龙茶" in \
        fake_telegram.sent_texts(OWNER)
    assert fake_telegram.reactions(OWNER) == []


@pytest.mark.parametrize("question", ["what is 2+2?", "二加二等于几？"])
def test_a_thumbs_down_on_a_reply_is_recorded_once_and_a_strangers_reaction_is_not(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, question: str) -> None:
    workspace = configure(home, fake_telegram, fake_openai, allow_from=[OWNER, FRIEND])
    fake_openai.responder = echo

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, question)  # message 1; the reply is message 2
        await until(fake_telegram, replied(fake_telegram, OWNER))
        first = fake_telegram.send_reaction(OWNER, OWNER, 2, ["👎"])
        await until(fake_telegram, lambda: len(feedback(workspace)) == 1)
        fake_telegram.resend(first)  # the same update again: not counted twice
        fake_telegram.send_reaction(OWNER, STRANGER, 2, ["👍"])  # not let in: ignored, nothing kept
        fake_telegram.send_reaction(OWNER, OWNER, 1, ["👍"])  # the user's own message: no reply of the bot
        fake_telegram.send_reaction(OWNER, OWNER, 2, ["👎", "😁"], ["👎"])  # another emoji: no feedback
        fake_telegram.send_reaction(OWNER, FRIEND, 2, ["🔥"])
        await until(fake_telegram, lambda: len(feedback(workspace)) == 2)
        await asyncio.sleep(0.3)  # anything wrongly counted would land by now
    serve(workspace, fake_telegram, fake_openai, body)

    kept = feedback(workspace)
    assert [(r.session, r.chat_id, r.message_id, r.user_id, r.emoji, r.verdict) for r in kept] == [
        (f"telegram:{OWNER}", OWNER, 2, OWNER, "👎", "negative"),
        (f"telegram:{OWNER}", OWNER, 2, FRIEND, "🔥", "positive")]
    counts = FeedbackLedger(workspace.memory_dir, storage=workspace.storage).counts()
    assert (counts.positive, counts.negative) == (1, 1)
    assert memory_stats(workspace).to_json()["feedback"] == {"positive": 1, "negative": 1}  # `memory stats`
    assert str(STRANGER) not in (workspace.memory_dir / ".feedback.jsonl").read_text(encoding="utf-8")
    polls = fake_telegram.calls("getUpdates")
    assert polls and all("message_reaction" in c.params["allowed_updates"] for c in polls)
    assert "message" in polls[0].params["allowed_updates"]
