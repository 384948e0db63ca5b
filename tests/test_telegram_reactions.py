"""Reactions: a fact remembered from the user's words is receipted with a ✍ reaction on their
message (a line of text where reactions cannot be set), and an allowed user's 👍 ❤ 🔥 / 👎 on a reply is recorded
once as feedback on that turn; a stranger's is ignored."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from picoclaw.channels.telegram import TelegramChannel, Webhook
from picoclaw.memory import memory_stats
from picoclaw.memory.feedback import FeedbackLedger, Reaction
from picoclaw.memory.learnings import given_by_a_person
from picoclaw.memory.workspace import Workspace
from tests.agent_helpers import is_lesson_request
from tests.fakes import FakeOpenAIServer
from tests.fakes.telegram_server import FakeTelegramServer, free_port
from tests.test_telegram import FRIEND, OWNER, STRANGER, configure, echo, replied, serve, until
from tests.test_telegram_webhook import backend_dsn, hook_settings, inbox_done, serve_webhook
from tests.waiting import wait_until

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


DISLIKED = [("what is the capital of Australia?", "Sydney.",
             "When asked for a country's capital, check it: Canberra, not Sydney, is the capital of Australia."),
            ("澳大利亚的首都是哪里？", "悉尼。", "回答首都问题时要核实：澳大利亚的首都是堪培拉，不是悉尼。")]


def answer_then_lesson(reply: str, lesson: str) -> Callable[[dict[str, Any]], str]:
    """The fake model: `reply` to the user's question, `LESSON: lesson` to a lesson request."""
    return lambda body: f"LESSON: {lesson}" if is_lesson_request(body) else reply


@pytest.mark.parametrize(("question", "reply", "lesson"), DISLIKED)
def test_a_thumbs_down_asks_for_a_lesson_once_for_its_turn(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, question: str, reply: str,
        lesson: str) -> None:
    workspace = configure(home, fake_telegram, fake_openai, allow_from=[OWNER, FRIEND])
    fake_openai.responder = answer_then_lesson(reply, lesson)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, question)  # message 1; the reply is message 2
        await until(fake_telegram, replied(fake_telegram, OWNER))
        fake_telegram.send_reaction(OWNER, OWNER, 2, ["👎"])
        await until(fake_telegram, lambda: lesson in workspace.store.read_learnings())
        fake_telegram.send_reaction(OWNER, FRIEND, 2, ["👎"])  # counted, but the turn had its lesson call
        fake_telegram.send_reaction(OWNER, FRIEND, 2, ["👍"], ["👎"])  # a change of mind: no lesson either
        await until(fake_telegram, lambda: len(feedback(workspace)) == 3)
    serve(workspace, fake_telegram, fake_openai, body)  # returns once the background work is done

    requests = [b for b in fake_openai.chat_requests() if is_lesson_request(b)]
    assert len(requests) == 1
    assert "thumbs-down" in json.dumps(requests[0], ensure_ascii=False)
    assert question in json.dumps(requests[0], ensure_ascii=False)  # the turn the 👎 was on
    assert {r.turn for r in feedback(workspace)} == {feedback(workspace)[0].turn} != {None}
    learnings = workspace.store.read_learnings()
    assert lesson in learnings
    assert f"Source: session telegram:{OWNER} (disliked)" in learnings
    assert not given_by_a_person(learnings)  # the model's guess at what was wrong: never a standing lesson


def test_a_thumbs_up_asks_for_no_lesson(home: Path, fake_telegram: FakeTelegramServer,
                                        fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_openai.responder = answer_then_lesson("Canberra. / 堪培拉。", "never used")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "capital of Australia? / 澳大利亚的首都？")
        await until(fake_telegram, replied(fake_telegram, OWNER))
        fake_telegram.send_reaction(OWNER, OWNER, 2, ["❤"])
        await until(fake_telegram, lambda: len(feedback(workspace)) == 1)
    serve(workspace, fake_telegram, fake_openai, body)

    assert not any(is_lesson_request(b) for b in fake_openai.chat_requests())
    assert feedback(workspace)[0].verdict == "positive"


@pytest.mark.parametrize("question", ["what is 2+2?", "二加二等于几？"])
def test_a_reaction_after_a_restart_still_finds_its_turn(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, question: str) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_openai.responder = echo

    async def ask(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, question)
        await until(fake_telegram, replied(fake_telegram, OWNER))
    serve(workspace, fake_telegram, fake_openai, ask)

    async def react(channel: TelegramChannel) -> None:  # another process: nothing of the first is in memory
        fake_telegram.send_reaction(OWNER, OWNER, 2, ["🔥"])
        await until(fake_telegram, lambda: len(feedback(workspace)) == 1)
    serve(workspace, fake_telegram, fake_openai, react)

    [kept] = feedback(workspace)
    assert (kept.session, kept.message_id, kept.verdict) == (f"telegram:{OWNER}", 2, "positive")
    assert kept.turn is not None


@pytest.mark.parametrize("backend", ["files", "postgres"])
def test_in_webhook_mode_a_reaction_is_an_update_of_the_inbox_and_any_worker_finds_its_turn(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer,
        request: pytest.FixtureRequest, backend: str) -> None:
    backend_dsn(request, home, backend)
    port = free_port()
    workspace = configure(home, fake_telegram, fake_openai, **hook_settings(port))
    fake_openai.responder = answer_then_lesson(*DISLIKED[1][1:])

    async def ask(channel: TelegramChannel, webhook: Webhook) -> None:
        fake_telegram.deliver_to([port])  # on to the second worker, on the same port, once it listens
        fake_telegram.send_text(OWNER, OWNER, DISLIKED[1][0])
        await until(fake_telegram, replied(fake_telegram, OWNER))
        await inbox_done(webhook, 1)
    serve_webhook(workspace, fake_telegram, fake_openai, ask)

    async def react(channel: TelegramChannel, webhook: Webhook) -> None:  # another worker, started afresh
        await wait_until(lambda: webhook.inbox is not None, what="the second worker's inbox")
        fake_telegram.send_reaction(OWNER, OWNER, 2, ["👎"])
        await inbox_done(webhook, 2)
        await until(fake_telegram, lambda: len(feedback(workspace)) == 1)
    serve_webhook(workspace, fake_telegram, fake_openai, react)

    [kept] = feedback(workspace)
    assert (kept.session, kept.message_id, kept.verdict, kept.turn is not None) == (
        f"telegram:{OWNER}", 2, "negative", True)
    assert DISLIKED[1][2] in workspace.store.read_learnings()  # the 👎's lesson, drafted by the second worker
