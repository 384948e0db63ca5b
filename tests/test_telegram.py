"""The Telegram channel: real aiogram over HTTP to the fake Bot API, real openai client to the fake model."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import weakref
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
from aiogram import loggers as aiogram_loggers
from aiogram.methods import Response
from aiogram.types import Chat, Message, User

from picoclaw.agent.loop import SUMMARY_NOTICE
from picoclaw.app import App
from picoclaw.channels.telegram import (
    APOLOGY,
    COMMANDS,
    NOT_TEXT,
    RETRY_AFTER_ATTEMPTS,
    RETRY_AFTER_MAX_WAIT,
    AddressedToBot,
    AllowedUser,
    BestEffortChatActions,
    KeptResponseModels,
    RetryAfterMiddleware,
    SlashCommand,
    TelegramChannel,
    chat_of,
    make_bot,
    not_authorised,
)
from picoclaw.channels.telegram.bot import install_middlewares
from picoclaw.channels.telegram.channel import TOLD_SIZE, TYPING_DELAY
from picoclaw.cli import main
from picoclaw.memory.workspace import Workspace
from picoclaw.transcripts.session_store import session_filename
from tests.agent_helpers import (
    API_KEY,
    SUMMARY_EN,
    contents,
    is_flush_request,
    is_summary_request,
    make_provider,
    said,
    session_records,
    set_policy,
)
from tests.fakes import FakeOpenAIServer, Text
from tests.fakes.telegram_server import BOT_USERNAME, ENTITY_ERROR, TOKEN, FakeTelegramServer
from tests.homes import edit_config
from tests.waiting import wait_until

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[1]
OWNER = 1001
FRIEND = 1002
STRANGER = 6666


def configure(home: Path, telegram: FakeTelegramServer, model: FakeOpenAIServer, **settings: Any) -> Workspace:
    """Point config.json at both fakes; `settings` go into channels.telegram (allow_from: the owner)."""
    with edit_config(home) as config:
        config["providers"]["openai"] = {"api_key": API_KEY, "api_base": model.base_url}
        # A cloud model's window: these tests are about Telegram; on the local default (8,192) a long reply in the
        # history is summarised within the next turn, which takes a scripted answer (tests/test_prompt_budget.py).
        config["agents"]["defaults"]["context_window"] = 128_000
        config["channels"]["telegram"].update({"enabled": True, "token": TOKEN, "api_base": telegram.origin,
                                              "allow_from": [OWNER], **settings})
    return App.open(home).workspace


class Sleeps:
    """Stands in for asyncio.sleep where the channel honours Telegram's retry_after: records, never waits."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


def serve(workspace: Workspace, telegram: FakeTelegramServer, model: FakeOpenAIServer,
          body: Callable[[TelegramChannel], Awaitable[T]], *, sleeps: Sleeps | None = None,
          told_size: int = TOLD_SIZE, typing_delay: float = 0) -> T:
    """Run the bot until `body(channel)` returns, then stop it the way SIGTERM does and wait for it. "typing…"
    starts at once (`typing_delay`), so a test sees it even with a model that answers at once."""
    async def main() -> T:
        settings = workspace.config.channels.telegram
        bot = make_bot(settings, workspace.config.telegram_token())
        app = App(workspace.config, workspace.home,  # the provider with a short timeout and no retries
                  make_provider=lambda _config: make_provider(workspace, model))
        async with app:
            channel = TelegramChannel(settings, bot, app.agent, replies=app.storage.telegram_replies,
                                      transcriber=app.transcriber(), typing_interval=0.05,
                                      typing_delay=typing_delay, sleep=sleeps or Sleeps(), told_size=told_size)
            running = asyncio.create_task(channel.run(handle_signals=False, polling_timeout=1))
            await until(telegram, lambda: bool(telegram.calls("getUpdates")))
            try:
                return await body(channel)
            finally:
                await channel.stop()
                await running
    return asyncio.run(main())


async def until(telegram: FakeTelegramServer, condition: Callable[[], bool]) -> None:
    await asyncio.to_thread(telegram.wait_until, condition)


def replied(telegram: FakeTelegramServer, chat_id: int, count: int = 1) -> Callable[[], bool]:
    return lambda: len(telegram.sent_texts(chat_id)) >= count


def refused_with_nothing_kept(telegram: FakeTelegramServer, model: FakeOpenAIServer, workspace: Workspace,
                              line: str, key: str = f"telegram:{OWNER}") -> None:
    """The owner got one line starting with `line`, nothing reached the model and no conversation was stored."""
    [said] = telegram.sent_texts(OWNER)
    assert said.startswith(line)
    assert model.chat_requests() == []  # nothing reached the model
    assert not (workspace.root / "sessions" / session_filename(key)).exists()  # nothing stored


def echo(body: dict[str, Any]) -> str:
    """The fake model's answer: the last user message, so a reply shows which chat it was for."""
    return "echo: " + said([m for m in body["messages"] if m["role"] == "user"][-1])


def tree(home: Path) -> dict[str, bytes]:
    return {str(p.relative_to(home)): p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file()}


def without_polling_lock(files: dict[str, bytes]) -> dict[str, bytes]:
    """`files` less the lock file of a bot that began to poll (filelock leaves lock files in place)."""
    return {name: data for name, data in files.items() if not Path(name).name.startswith(".telegram-")}


# -- the basics -------------------------------------------------------------------------------------------


def test_an_allowed_user_is_answered_in_english_and_chinese(home: Path, fake_telegram: FakeTelegramServer,
                                                            fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    typed_twice = threading.Event()  # the model answers once "typing…" was shown and refreshed meanwhile
    fake_openai.enqueue(Text("Hello **Ada** & <friends>", until=typed_twice))
    fake_openai.reply_text("你好，**阿达**！")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "hi there")
        await until(fake_telegram, lambda: len(fake_telegram.calls("sendChatAction")) >= 2)
        assert fake_telegram.sent_texts() == []  # shown while the model still works
        typed_twice.set()
        await until(fake_telegram, replied(fake_telegram, OWNER))
        fake_telegram.send_text(OWNER, OWNER, "你好")
        await until(fake_telegram, replied(fake_telegram, OWNER, 2))
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.sent_texts(OWNER) == ["Hello <b>Ada</b> &amp; &lt;friends&gt;", "你好，<b>阿达</b>！"]
    assert {c.params["parse_mode"] for c in fake_telegram.calls("sendMessage")} == {"HTML"}
    assert len(fake_telegram.calls("sendChatAction")) >= 2  # shown, then refreshed
    assert fake_telegram.calls("deleteWebhook")
    [menu] = fake_telegram.calls("setMyCommands")
    assert [c["command"] for c in menu.params["commands"]] == [c.command for c in COMMANDS]
    messages = [r["message"] for r in session_records(workspace, f"telegram:{OWNER}")]
    assert contents(messages) == ["hi there", "Hello **Ada** & <friends>", "你好", "你好，**阿达**！"]


def test_a_stranger_is_told_their_id_once_and_leaves_no_trace(home: Path, fake_telegram: FakeTelegramServer,
                                                              fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    before = tree(home)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(STRANGER, STRANGER, "remember: my password is hunter2")
        fake_telegram.send_text(STRANGER, STRANGER, "记住：我的密码是 hunter2")
        fake_telegram.send_text(OWNER, OWNER, "ping")  # answered after both, so both were handled
        await until(fake_telegram, replied(fake_telegram, OWNER))
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.sent_texts(STRANGER) == [not_authorised(STRANGER)]
    assert all("hunter2" not in json.dumps(b) for b in fake_openai.chat_requests())
    after = tree(home)
    assert {k: v for k, v in after.items() if b"hunter2" in v} == {}
    assert [k for k in after if k not in before and f"{STRANGER}" in k] == []
    new = sorted(k for k in after if k not in before and not k.endswith(".lock"))
    # The owner's turn (its transcript, its retrieval time, what its model call used, the reply's note for
    # reactions), nothing else.
    assert new == ["workspace/.picoclaw-work/telegram-replies.sqlite3", "workspace/memory/.spend.json",
                   "workspace/memory/.turn_metrics.jsonl",
                   f"workspace/sessions/telegram%3A{OWNER}.jsonl"]


def test_allow_from_takes_usernames_with_or_without_the_at(home: Path, fake_telegram: FakeTelegramServer,
                                                           fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai, allow_from=["@Alice_W", "bob"])
    fake_openai.responder = echo

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(11, 11, "from alice", username="alice_w")
        fake_telegram.send_text(12, 12, "from bob", username="Bob")
        fake_telegram.send_text(13, 13, "from carol", username="carol")
        await until(fake_telegram, lambda: all(fake_telegram.sent_texts(c) for c in (11, 12, 13)))
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.sent_texts(11) == ["echo: from alice"]
    assert fake_telegram.sent_texts(12) == ["echo: from bob"]
    assert fake_telegram.sent_texts(13) == [not_authorised(13)]


@pytest.mark.parametrize("allow_from", [[OWNER, ""], ["@"], [" "], ["@ "], [OWNER, "\t@\n"]],
                         ids=["empty", "at", "space", "at-space", "tab-at-newline"])
def test_an_allow_from_entry_that_would_match_everyone_is_a_config_error(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer,
        capsys: pytest.CaptureFixture[str], allow_from: list[int | str]) -> None:
    configure(home, fake_telegram, fake_openai)  # written valid, then broken: configure() opens the App
    with edit_config(home) as config:
        config["channels"]["telegram"]["allow_from"] = allow_from
    assert main(["telegram"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "channels.telegram.allow_from" in err and "Traceback" not in err, err
    assert not fake_telegram.calls()  # refused before the bot said a word


def test_the_allowlist_never_matches_a_user_without_a_username() -> None:
    # Config validation refuses such entries; the allowlist must not rely on that alone.
    nameless = User(id=STRANGER, is_bot=False, first_name="stranger")
    blank = User(id=STRANGER, is_bot=False, first_name="stranger", username="")
    for entries in ([OWNER, ""], ["@"], [" "], ["@ "]):
        allowlist = AllowedUser(entries)
        assert not allowlist.allows(nameless) and not allowlist.allows(blank), entries
    assert AllowedUser(["@Alice_W"]).allows(User(id=5, is_bot=False, first_name="a", username="alice_w"))


def message(text: str | None, *, user: User | None = None, chat_type: str = "private",
            reply_to: Message | None = None) -> Message:
    """A Message as aiogram hands it to filters (from the owner, in their private chat, unless told)."""
    sender = user if user is not None else User(id=OWNER, is_bot=False, first_name="owner")
    chat = Chat(id=sender.id if chat_type == "private" else -100500, type=chat_type)
    return Message(message_id=7, date=datetime(2025, 3, 10, tzinfo=UTC), chat=chat, from_user=sender, text=text,
                   reply_to_message=reply_to)


def passes(telegram_filter: Any, event: Message) -> bool:
    return bool(asyncio.run(telegram_filter(event)))


def test_the_allow_list_is_a_filter_on_messages() -> None:
    allowed = AllowedUser([OWNER, "@Alice_W"])
    alice = User(id=5, is_bot=False, first_name="a", username="ALICE_w")
    stranger = User(id=STRANGER, is_bot=False, first_name="s", username="mallory")
    for text in ("hello", "你好，记住我的咖啡"):
        assert passes(allowed, message(text))
        assert passes(allowed, message(text, user=alice, chat_type="group"))
        assert not passes(allowed, message(text, user=stranger))
    channel_post = Message(message_id=8, date=datetime(2025, 3, 10, tzinfo=UTC), chat=Chat(id=-1, type="channel"),
                           text="频道 post")  # no sender: nobody to allow
    assert not passes(allowed, channel_post)
    assert not passes(AllowedUser([]), message("hi"))  # an empty allow_from lets nobody in


def test_addressed_to_the_bot_is_a_filter_on_messages() -> None:
    me = User(id=123456, is_bot=True, first_name="picoclaw", username=BOT_USERNAME)
    mention = AddressedToBot("mention", lambda: me)
    from_bot = User(id=42, is_bot=True, first_name="other bot")
    earlier = message("earlier answer / 之前的回答", user=me, chat_type="group")
    assert passes(mention, message("你好 hello"))  # a private chat: everything is for the bot
    assert passes(mention, message(f"@{BOT_USERNAME.upper()} 今天天气？", chat_type="group"))
    assert passes(mention, message("谢谢 thanks", chat_type="group", reply_to=earlier))
    assert not passes(mention, message("大家好 hi all", chat_type="group"))
    assert not passes(mention, message("hi", user=from_bot))
    assert passes(AddressedToBot("always", lambda: me), message("大家好 hi all", chat_type="group"))
    assert not passes(AddressedToBot("always", lambda: me), message("hi", user=from_bot, chat_type="group"))


def test_a_slash_command_is_what_the_agent_reads_as_one() -> None:
    me = User(id=123456, is_bot=True, first_name="picoclaw", username=BOT_USERNAME)
    command = SlashCommand(lambda: me)
    for text in ("/new", f"/memory@{BOT_USERNAME} 咖啡", f"@{BOT_USERNAME} /status", "/nonsense 什么"):
        assert passes(command, message(text, chat_type="group")), text
    for text in ("hello /new", "你好", "  "):
        assert not passes(command, message(text)), text
    assert not passes(command, message(None))


# -- replies that arrive ----------------------------------------------------------------------------------


def test_a_10000_character_reply_arrives_in_ordered_parts(home: Path, fake_telegram: FakeTelegramServer,
                                                          fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    english = "\n\n".join(f"Paragraph {i}: " + ("the quick brown fox jumps. " * 14).strip() for i in range(26))
    chinese = "\n\n".join(f"第{i}段：" + "我们明天在杭州见面，记得带伞。" * 30 for i in range(23))
    assert len(english) > 10_000 and len(chinese) > 10_000
    fake_openai.reply_text(english)
    fake_openai.reply_text(chinese)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "write a lot")
        fake_telegram.send_text(OWNER, OWNER, "写很多")
        await until(fake_telegram, lambda: fake_telegram.sent_texts(OWNER)[-1:] != []
                    and fake_telegram.sent_texts(OWNER)[-1].endswith(chinese[-20:]))
    serve(workspace, fake_telegram, fake_openai, body)

    sent = fake_telegram.sent_texts(OWNER)
    assert all(len(part) <= 4096 for part in sent) and len(sent) >= 6
    english_parts = [p for p in sent if p.startswith("Paragraph")]
    assert "\n\n".join(english_parts) == english  # in order, nothing lost, cut only between paragraphs
    assert "\n\n".join(p for p in sent if p.startswith("第")) == chinese


def test_an_entity_error_falls_back_to_plain_text(home: Path, fake_telegram: FakeTelegramServer,
                                                  fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_openai.reply_text("**粗体** and <b>odd</b> markup, see [docs](https://x.com/_a_)")
    fake_telegram.fail_next("sendMessage", 400, ENTITY_ERROR)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "hi")
        await until(fake_telegram, replied(fake_telegram, OWNER))
    serve(workspace, fake_telegram, fake_openai, body)

    first, second = fake_telegram.calls("sendMessage")
    assert first.params["parse_mode"] == "HTML" and "_ok" not in first.params
    assert first.params["text"] == ('<b>粗体</b> and &lt;b&gt;odd&lt;/b&gt; markup, see '
                                    '<a href="https://x.com/_a_">docs</a>')
    assert "parse_mode" not in second.params
    # The plain twin: what the HTML shows, with the link's URL after its text.
    assert fake_telegram.sent_texts(OWNER) == ["粗体 and <b>odd</b> markup, see docs (https://x.com/_a_)"]


def test_telegrams_retry_after_is_honoured(home: Path, fake_telegram: FakeTelegramServer,
                                           fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_telegram.fail_next("sendMessage", 429, "Too Many Requests: retry after 7", retry_after=7, times=2)
    sleeps = Sleeps()

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "hi")
        await until(fake_telegram, replied(fake_telegram, OWNER))
    serve(workspace, fake_telegram, fake_openai, body, sleeps=sleeps)

    assert sleeps.seconds == [7, 7]
    assert fake_telegram.sent_texts(OWNER) == ["ok"]
    assert len(fake_telegram.calls("sendMessage")) == 3


def test_a_model_failure_is_an_apology_and_the_bot_keeps_serving(home: Path, fake_telegram: FakeTelegramServer,
                                                                 fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_openai.reply_error(500, "the model is on fire")
    fake_openai.reply_raw({"choices": "not a list"})
    fake_openai.reply_text("back again")

    async def body(channel: TelegramChannel) -> None:
        for text in ("one", "two", "three"):
            fake_telegram.send_text(OWNER, OWNER, text)
        await until(fake_telegram, replied(fake_telegram, OWNER, 3))
    serve(workspace, fake_telegram, fake_openai, body)

    first, second, third = fake_telegram.sent_texts(OWNER)
    assert first.startswith("Sorry") and second.startswith("Sorry") and third == "back again"
    assert len(first.splitlines()) == 1 and APOLOGY.startswith("Sorry")


# -- chats at once, in order -------------------------------------------------------------------------------


def test_twenty_chats_at_once_get_their_own_answers(home: Path, fake_telegram: FakeTelegramServer,
                                                    fake_openai: FakeOpenAIServer) -> None:
    chats = [2000 + n for n in range(20)]
    workspace = configure(home, fake_telegram, fake_openai, allow_from=chats)
    all_asked = threading.Event()  # answers wait for every chat's question: turns one at a time would never get there

    def answer(body: dict[str, Any]) -> Text:
        if len(fake_openai.chat_requests()) >= len(chats):
            all_asked.set()
        return Text(echo(body), until=all_asked)
    fake_openai.responder = answer

    async def body(channel: TelegramChannel) -> None:
        for n, chat in enumerate(chats):
            fake_telegram.send_text(chat, chat, f"chat {n} 秘密 {chat * 7}")
        await until(fake_telegram, lambda: all(fake_telegram.sent_texts(c) for c in chats))
    serve(workspace, fake_telegram, fake_openai, body)

    for n, chat in enumerate(chats):
        assert fake_telegram.sent_texts(chat) == [f"echo: chat {n} 秘密 {chat * 7}"]
    # Every chat's model call had arrived before the first answer went out: they ran at once.
    first_answer = min(c.at for c in fake_telegram.calls("sendMessage"))
    assert max(r.received_at for r in fake_openai.requests) < first_answer


def test_one_chats_messages_are_answered_in_order(home: Path, fake_telegram: FakeTelegramServer,
                                                  fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_openai.responder = lambda body: Text(echo(body), delay=0.05)
    texts = [f"message {n} / 第{n}条" for n in range(6)]

    async def body(channel: TelegramChannel) -> None:
        for text in texts:
            fake_telegram.send_text(OWNER, OWNER, text)
        await until(fake_telegram, replied(fake_telegram, OWNER, len(texts)))
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.sent_texts(OWNER) == [f"echo: {t}" for t in texts]
    # Each turn saw the ones before it: the history sent with the last call has all earlier messages.
    last = fake_openai.chat_requests()[-1]["messages"]
    assert [said(m) for m in last if m["role"] == "user"] == texts


# -- whose memory ------------------------------------------------------------------------------------------


def test_per_user_memory_keeps_each_users_facts_their_own(home: Path, fake_telegram: FakeTelegramServer,
                                                          fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai, allow_from=[OWNER, FRIEND], memory_scope="per_user")
    shared_before = workspace.store.long_term_path.read_bytes()
    # A stores a fact; B asks for it, searches for it, and tries to read A's file.
    fake_openai.reply_tool_calls([("memory_append", {"content": "My bank PIN is 4321 / 银行密码 4321"})])
    fake_openai.reply_text("Stored.")
    fake_openai.reply_text("I don't know your PIN.")
    fake_openai.reply_tool_calls([("memory_search", {"query": "bank PIN 银行密码"})])
    fake_openai.reply_tool_calls([("read_file", {"path": f"users/{OWNER}/memory/MEMORY.md"})])
    fake_openai.reply_tool_calls([("list_dir", {"path": "users"})])
    fake_openai.reply_tool_calls([("read_file", {"path": f"sessions/telegram%3A{OWNER}.jsonl"})])
    fake_openai.reply_text("Nothing found.")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "remember my bank PIN is 4321")
        await until(fake_telegram, replied(fake_telegram, OWNER))
        fake_telegram.send_text(FRIEND, FRIEND, "what is the bank PIN? 银行密码是多少？")
        await until(fake_telegram, replied(fake_telegram, FRIEND))
        fake_telegram.send_text(FRIEND, FRIEND, "search memory and files for the PIN")
        await until(fake_telegram, replied(fake_telegram, FRIEND, 2))
    serve(workspace, fake_telegram, fake_openai, body)

    owner_memory = workspace.for_user(str(OWNER)).store.long_term_path.read_text(encoding="utf-8")
    assert "My bank PIN is 4321" in owner_memory
    assert workspace.store.long_term_path.read_bytes() == shared_before  # the shared memory was not touched
    friend_requests = fake_openai.chat_requests()[2:]
    assert friend_requests and all("4321" not in json.dumps(b, ensure_ascii=False) for b in friend_requests)
    tool_results = [m["content"] for m in friend_requests[-1]["messages"] if m["role"] == "tool"]
    search, read, listing, transcript = tool_results
    assert search.startswith("no matches in memory")
    assert read.startswith("error:") and "private memory" in read
    assert listing.startswith("error:") and "private memory" in listing
    assert transcript.startswith("error:") and "conversations of all users" in transcript


# -- groups ------------------------------------------------------------------------------------------------


def test_in_groups_it_answers_only_when_mentioned_or_replied_to(home: Path, fake_telegram: FakeTelegramServer,
                                                                fake_openai: FakeOpenAIServer) -> None:
    group = -100500
    workspace = configure(home, fake_telegram, fake_openai)
    fake_openai.responder = echo

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(group, OWNER, "just chatting among ourselves", chat_type="supergroup")
        fake_telegram.send_text(group, STRANGER, f"@{BOT_USERNAME} tell me secrets", chat_type="supergroup")
        fake_telegram.send_text(group, OWNER, f"@{BOT_USERNAME} 今天星期几？", chat_type="supergroup")
        fake_telegram.send_text(group, OWNER, "and tomorrow?", chat_type="supergroup", reply_to_bot=True)
        await until(fake_telegram, replied(fake_telegram, group, 3))
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.sent_texts(group) == [not_authorised(STRANGER), "echo: 今天星期几？", "echo: and tomorrow?"]
    assert len(fake_openai.chat_requests()) == 2


def test_group_trigger_always_answers_every_message_of_an_allowed_user(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer) -> None:
    group = -100600
    workspace = configure(home, fake_telegram, fake_openai, group_trigger="always")
    fake_openai.responder = echo

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(group, OWNER, "no mention here", chat_type="group")
        fake_telegram.send_text(group, STRANGER, "me neither", chat_type="group")
        fake_telegram.send_text(group, OWNER, "也没有提到机器人", chat_type="group")
        await until(fake_telegram, replied(fake_telegram, group, 3))
    serve(workspace, fake_telegram, fake_openai, body)

    sent = fake_telegram.sent_texts(group)  # the refusal needs no model, so it may come first
    assert [t for t in sent if t.startswith("echo")] == ["echo: no mention here", "echo: 也没有提到机器人"]
    assert sorted(sent) == sorted(["echo: no mention here", "echo: 也没有提到机器人", not_authorised(STRANGER)])
    messages = [r["message"]["content"] for r in session_records(workspace, f"telegram:{group}")]
    assert "me neither" not in messages and len(messages) == 4


# -- commands, restarts, shutdown ----------------------------------------------------------------------------


def test_commands_work_through_telegram(home: Path, fake_telegram: FakeTelegramServer,
                                        fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    workspace.store.append_long_term("宠物狗叫 Bob，是一只柯基。")

    async def body(channel: TelegramChannel) -> None:
        for text in ("/start", "/memory 我的狗叫什么", "/policy", "/new"):
            fake_telegram.send_text(OWNER, OWNER, text)
        await until(fake_telegram, replied(fake_telegram, OWNER, 4))
    serve(workspace, fake_telegram, fake_openai, body)

    start, memory, policy, new = fake_telegram.sent_texts(OWNER)
    assert "/compact" in start and "宠物狗叫 Bob" in memory and "retrieve_limit = " in policy
    assert new.startswith("Started a new conversation")
    assert fake_openai.chat_requests() == []


def test_a_restart_resumes_the_chat_and_old_updates_are_not_answered_twice(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_openai.responder = echo

    async def first(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "my name is Ada / 我叫阿达")
        await until(fake_telegram, replied(fake_telegram, OWNER))
    serve(workspace, fake_telegram, fake_openai, first)

    async def second(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "what is my name?")
        await until(fake_telegram, replied(fake_telegram, OWNER, 2))
    serve(App.open(home).workspace, fake_telegram, fake_openai, second)

    assert fake_telegram.sent_texts(OWNER) == ["echo: my name is Ada / 我叫阿达", "echo: what is my name?"]
    history = contents(fake_openai.chat_requests()[-1]["messages"][1:])
    assert history == ["my name is Ada / 我叫阿达", "echo: my name is Ada / 我叫阿达", "what is my name?"]


def test_stopping_lets_every_turn_under_way_or_queued_finish(home: Path, fake_telegram: FakeTelegramServer,
                                                             fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai, allow_from=[OWNER, FRIEND])
    answering = threading.Event()  # the model answers once the test has seen the turns under way
    fake_openai.responder = lambda body: Text(echo(body), until=answering)
    texts = {OWNER: ["a slow question", "然后呢？"], FRIEND: ["another slow one / 另一个"]}

    async def body(channel: TelegramChannel) -> None:
        last = max(fake_telegram.send_text(chat, chat, text) for chat, chat_texts in texts.items()
                   for text in chat_texts)
        # Every update was handed to the bot (its next poll confirms them) and a turn is under way; the
        # owner's second message still waits behind the first in its chat.
        await until(fake_telegram, lambda: fake_telegram.calls("sendChatAction") != [] and any(
            int(c.params.get("offset") or 0) > last for c in fake_telegram.calls("getUpdates")))
        assert fake_telegram.sent_texts() == []
        asyncio.get_running_loop().call_later(0.3, answering.set)
        # serve() now stops polling, as SIGTERM does, while the model is still answering.
    serve(workspace, fake_telegram, fake_openai, body)

    for chat, chat_texts in texts.items():
        assert fake_telegram.sent_texts(chat) == [f"echo: {t}" for t in chat_texts]
        messages = [r["message"]["content"] for r in session_records(workspace, f"telegram:{chat}")]
        assert messages == [m for t in chat_texts for m in (t, f"echo: {t}")]


def test_logs_name_the_chat_and_user_and_never_the_token(home: Path, fake_telegram: FakeTelegramServer,
                                                          fake_openai: FakeOpenAIServer,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_openai.reply_error(500, "the model is on fire")
    url = f"{fake_telegram.origin}/bot{TOKEN}/getUpdates"

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "hi / 你好")
        fake_telegram.send_text(STRANGER, STRANGER, "let me in")
        await until(fake_telegram, lambda: bool(fake_telegram.sent_texts(OWNER) and fake_telegram.sent_texts(STRANGER)))
        # What aiogram logs when a request fails: aiohttp's error text quotes the URL with the token in it.
        try:
            raise ConnectionError(f"InvalidUrlClientError: {url}")
        except ConnectionError:
            aiogram_loggers.dispatcher.exception("Failed to fetch updates - %s", url)
    with caplog.at_level(logging.DEBUG):
        serve(workspace, fake_telegram, fake_openai, body)

    logged = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert f"chat {OWNER} user {OWNER}" in logged and f"refused chat {STRANGER} user {STRANGER}" in logged
    assert "session telegram:1001: model call failed" in logged
    assert TOKEN not in logged + caplog.text and "bot***/getUpdates" in logged


@pytest.mark.parametrize("echoed", [TOKEN, TOKEN.replace(":", "%3A")], ids=["plain", "url-quoted"])
def test_a_bot_api_error_echoing_the_token_is_logged_redacted(home: Path, fake_telegram: FakeTelegramServer,
                                                               fake_openai: FakeOpenAIServer,
                                                               caplog: pytest.LogCaptureFixture, echoed: str) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_openai.reply_text("an answer that will not arrive")
    fake_openai.reply_text("this one will")
    # A proxy or self-hosted Bot API that quotes the request path in its error description.
    fake_telegram.fail_next("sendMessage", 400, f"Bad Request: POST /bot{echoed}/sendMessage: chat is gone")
    fake_telegram.fail_next("setMyCommands", 400, f"Bad Request: /bot{echoed}/setMyCommands refused")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "first")
        await until(fake_telegram, lambda: bool(fake_telegram.calls("sendMessage")))
        fake_telegram.send_text(OWNER, OWNER, "second")
        await until(fake_telegram, replied(fake_telegram, OWNER))
    with caplog.at_level(logging.DEBUG):
        serve(workspace, fake_telegram, fake_openai, body)

    logged = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records) + caplog.text
    assert "could not send a reply" in logged and "could not register the command menu" in logged
    secret = TOKEN.split(":", 1)[1]
    assert TOKEN not in logged and secret not in logged, logged
    assert "/bot***/sendMessage" in logged or "/bot123456%3A***/sendMessage" in logged


# -- the command ---------------------------------------------------------------------------------------------


def picoclaw_telegram(home: Path, *args: str, log: Path | None = None) -> subprocess.Popen[str]:
    """`picoclaw telegram ARGS` in a process of its own, with the home's config only; its output goes to `log`
    when given (a long run writes more than a pipe holds while no one reads it), else to pipes."""
    environment = {**os.environ, "PICOCLAW_HOME": str(home), "PYTHONPATH": str(REPO)}
    for name in ("OPENAI_API_KEY", "TELEGRAM_BOT_TOKEN"):
        environment.pop(name, None)
    command = [sys.executable, "-m", "picoclaw", "telegram", *args]
    if log is None:
        return subprocess.Popen(command, env=environment, text=True, encoding="utf-8", stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    with log.open("w", encoding="utf-8") as output:
        return subprocess.Popen(command, env=environment, text=True, encoding="utf-8", stdout=output,
                                stderr=subprocess.STDOUT)


@pytest.mark.parametrize(("token", "settings", "expected"), [
    ("999999:WRONG-token-that-telegram-does-not-know", {}, "401 Unauthorized"),
    ("", {}, "no Telegram bot token"),
    ("not a token", {}, "malformed"),
    # aiohttp quotes the whole request URL, token included, when it cannot use it: the line must not.
    (TOKEN, {"api_base": "http://[::1"}, "answered getMe with: InvalidUrlClientError: http://[::1/bot***/getMe"),
    (TOKEN, {"api_base": "127.0.0.1:8081"}, "channels.telegram.api_base must be an http(s) URL"),
])
def test_a_bad_token_or_api_base_is_one_clear_line(home: Path, fake_telegram: FakeTelegramServer,
                                                   fake_openai: FakeOpenAIServer, capsys: pytest.CaptureFixture[str],
                                                   token: str, settings: dict[str, Any], expected: str) -> None:
    configure(home, fake_telegram, fake_openai, token=token, **settings)
    before = tree(home)
    code = main(["telegram"])
    out, err = capsys.readouterr()
    assert code == 1 and err.count("\n") == 1 and err.startswith("picoclaw: error: ") and expected in err, err
    assert "Traceback" not in err and (not token or token not in err + out)
    assert without_polling_lock(tree(home)) == before


def test_an_unreachable_bot_api_or_a_revoked_token_is_one_clear_line(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    closed = FakeTelegramServer().start()
    unreachable = closed.origin
    closed.stop()
    configure(home, fake_telegram, fake_openai, token="", api_base=unreachable)
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", TOKEN)  # the token may come from the environment instead
    assert main(["telegram"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot start the Telegram bot: {unreachable} answered getMe" in err, err
    configure(home, fake_telegram, fake_openai, token="")
    fake_telegram.revoked = True  # as after /revoke in @BotFather: the environment's token is now refused
    assert main(["telegram"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Telegram rejected the bot token (401 Unauthorized)" in err and TOKEN not in err


def test_a_non_json_get_me_reply_is_one_clear_line(home: Path, fake_telegram: FakeTelegramServer,
                                                   fake_openai: FakeOpenAIServer,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    configure(home, fake_telegram, fake_openai)
    page = ("<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
            "<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
            + "<!-- padding -->\r\n" * 50 + "</body>\r\n</html>\r\n")
    fake_telegram.fail_next_with_page("getMe", 502, page)
    assert main(["telegram"]) == 1
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("picoclaw: error: cannot start the Telegram bot: "), err
    assert "not a Bot API answer" in err and "502 Bad Gateway" in err and len(err) < 400, err
    assert "Traceback" not in err and TOKEN not in err + out


def test_a_disabled_channel_refuses_to_start(home: Path, fake_telegram: FakeTelegramServer,
                                             fake_openai: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    configure(home, fake_telegram, fake_openai, enabled=False)
    assert main(["telegram"]) == 1
    err = capsys.readouterr().err
    assert err == ("picoclaw: error: channels.telegram.enabled is false in config.json; "
                   "set it to true to run the bot\n"), err
    assert not fake_telegram.calls()


@pytest.mark.slow
def test_sigterm_stops_polling_and_the_turn_under_way_still_answers(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_telegram, fake_openai)
    answering = threading.Event()  # the model answers once SIGTERM was sent, so the turn is under way at it
    fake_openai.enqueue(Text("answered before exiting / 退出前已回答", until=answering))
    process = picoclaw_telegram(home)
    try:
        # Generous bounds, for hangs only: the child imports aiogram (20 s on a busy 2-core machine).
        fake_telegram.wait_until(lambda: bool(fake_telegram.calls("getUpdates")), timeout=180)
        fake_telegram.send_text(OWNER, OWNER, "one last question")
        fake_telegram.wait_until(lambda: bool(fake_telegram.calls("sendChatAction")), timeout=60)
        process.send_signal(signal.SIGTERM)
        answering.set()
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert fake_telegram.sent_texts(OWNER) == ["answered before exiting / 退出前已回答"]
    assert f"chat {OWNER} user {OWNER}" in err and "Traceback" not in err  # the daemon's log, by default
    assert TOKEN not in err + out


def test_a_refused_command_menu_does_not_stop_the_bot(home: Path, fake_telegram: FakeTelegramServer,
                                                      fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_telegram.fail_next("setMyCommands", 400, "Bad Request: BOT_COMMANDS_TOO_MUCH")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "/help")
        await until(fake_telegram, replied(fake_telegram, OWNER))
    serve(workspace, fake_telegram, fake_openai, body)

    assert len(fake_telegram.calls("setMyCommands")) == 1
    assert "/new" in fake_telegram.sent_texts(OWNER)[0]


# -- a bot that runs for months: every message kind, notices, per-user groups, flood control, bounded state ----


def test_a_sticker_is_answered_with_what_is_read(home: Path, fake_telegram: FakeTelegramServer,
                                                fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_sticker(OWNER, OWNER)
        await until(fake_telegram, replied(fake_telegram, OWNER))
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.sent_texts(OWNER) == [NOT_TEXT]  # photos, voice and documents: tests/test_telegram_*.py
    assert fake_openai.requests == []
    assert fake_openai.chat_requests() == []  # nothing reached the model
    assert not (workspace.root / "sessions" / session_filename(f"telegram:{OWNER}")).exists()


def test_without_always_a_group_message_needs_a_mention(home: Path, fake_telegram: FakeTelegramServer,
                                                        fake_openai: FakeOpenAIServer) -> None:
    """The other half of group_trigger "always" (tested above): by default the same message is not answered."""
    group = -100601
    workspace = configure(home, fake_telegram, fake_openai)
    fake_openai.responder = echo

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(group, OWNER, "no mention here", chat_type="group")
        fake_telegram.send_text(group, OWNER, f"@{BOT_USERNAME} now with one", chat_type="group")
        await until(fake_telegram, replied(fake_telegram, group))
    serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.sent_texts(group) == ["echo: now with one"]
    assert len(fake_openai.chat_requests()) == 1


@pytest.mark.parametrize("where", ["private", "per_user_group"])
def test_the_summary_notice_reaches_the_chat(home: Path, fake_telegram: FakeTelegramServer,
                                             fake_openai: FakeOpenAIServer, where: str) -> None:
    group = -100700
    chat = OWNER if where == "private" else group
    settings: dict[str, Any] = {} if where == "private" else {"memory_scope": "per_user", "group_trigger": "always"}
    workspace = configure(home, fake_telegram, fake_openai, **settings)
    set_policy(workspace, session_summary_message_threshold=5)
    fake_openai.responder = lambda body: (SUMMARY_EN if is_summary_request(body) else "NONE" if is_flush_request(body)
                                          else echo(body))
    texts = ["one 一", "two 二", "three 三"]  # six messages after the third turn: over the threshold of 5

    async def body(channel: TelegramChannel) -> None:
        for number, text in enumerate(texts, 1):
            fake_telegram.send_text(chat, OWNER, text, chat_type="private" if chat == OWNER else "supergroup")
            await until(fake_telegram, replied(fake_telegram, chat, number))
        await until(fake_telegram, lambda: SUMMARY_NOTICE in fake_telegram.sent_texts(chat))
    serve(workspace, fake_telegram, fake_openai, body)

    sent = fake_telegram.sent_texts(chat)  # the notice comes from background work: it may beat the last answer
    assert [t for t in sent if t != SUMMARY_NOTICE] == [f"echo: {t}" for t in texts]
    assert sent.count(SUMMARY_NOTICE) == 1
    [notice] = [c for c in fake_telegram.calls("sendMessage") if c.params["text"] == SUMMARY_NOTICE]
    assert "parse_mode" not in notice.params and int(notice.params["chat_id"]) == chat
    assert any(is_summary_request(b) for b in fake_openai.chat_requests())


def test_per_user_scope_in_a_group_keeps_each_member_apart(home: Path, fake_telegram: FakeTelegramServer,
                                                           fake_openai: FakeOpenAIServer) -> None:
    group = -100800
    workspace = configure(home, fake_telegram, fake_openai, allow_from=[OWNER, FRIEND], memory_scope="per_user",
                          group_trigger="always")
    fake_openai.reply_tool_calls([("memory_append", {"content": "Owner drinks oolong / 喝乌龙茶"})])
    fake_openai.reply_text("Noted, owner.")
    fake_openai.reply_tool_calls([("memory_append", {"content": "Friend drinks espresso / 喝浓缩咖啡"})])
    fake_openai.reply_text("Noted, friend.")
    fake_openai.responder = echo  # once the scripted replies are used up

    def shown(*texts: str) -> Callable[[], bool]:
        return lambda: all(any(text in sent for sent in fake_telegram.sent_texts(group)) for text in texts)

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(group, OWNER, "remember: I drink oolong", chat_type="supergroup")
        await until(fake_telegram, shown("Noted, owner.", "喝乌龙茶"))  # the answer, and the write's receipt
        fake_telegram.send_text(group, FRIEND, "remember: I drink espresso", chat_type="supergroup")
        await until(fake_telegram, shown("Noted, friend.", "喝浓缩咖啡"))
        fake_telegram.send_text(group, FRIEND, "what do I drink?", chat_type="supergroup")
        await until(fake_telegram, shown("echo: what do I drink?"))
    serve(workspace, fake_telegram, fake_openai, body)

    sent = fake_telegram.sent_texts(group)
    # Each memory_append is shown once, as the model's words (the user said "I drink …", not "Owner drinks …").
    receipts = [text for text in sent if text.startswith("remembered")]
    assert receipts == ["remembered (the assistant's words, not yours): Owner drinks oolong / 喝乌龙茶",
                        "remembered (the assistant's words, not yours): Friend drinks espresso / 喝浓缩咖啡"]
    assert [text for text in sent if text not in receipts] == ["Noted, owner.", "Noted, friend.",
                                                               "echo: what do I drink?"]

    def transcript(user: int) -> list[str]:
        scope = workspace.for_user(str(user))
        path = scope.layout.sessions_dir / session_filename(f"telegram:{group}:{user}")
        return [str(orjson.loads(line)["message"].get("content") or "")
                for line in path.read_bytes().splitlines() if line.strip()]

    assert transcript(OWNER)[0] == "remember: I drink oolong" and "espresso" not in " ".join(transcript(OWNER))
    assert transcript(FRIEND)[0] == "remember: I drink espresso" and "oolong" not in " ".join(transcript(FRIEND))
    assert not (workspace.root / "sessions" / session_filename(f"telegram:{group}")).exists()
    owner_memory = workspace.for_user(str(OWNER)).store.long_term_path.read_text(encoding="utf-8")
    friend_memory = workspace.for_user(str(FRIEND)).store.long_term_path.read_text(encoding="utf-8")
    assert "oolong" in owner_memory and "espresso" not in owner_memory
    assert "espresso" in friend_memory and "oolong" not in friend_memory
    # The friend's question went to the model with the friend's memory only.
    question = fake_openai.chat_requests()[-1]
    assert "oolong" not in json.dumps(question, ensure_ascii=False)


@pytest.mark.parametrize(("question", "answer"), [("what is 2+2?", "4"), ("二加二等于几？", "等于四")])
def test_typing_is_shown_only_once_a_turn_runs_past_the_typing_delay(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer, question: str,
        answer: str) -> None:
    # The Bot API asks for a chat action only when a reply takes a while: each is a call against the bot's limit.
    workspace = configure(home, fake_telegram, fake_openai)
    fake_openai.reply_text(answer)
    typed = threading.Event()  # the second answer waits for "typing…"
    fake_openai.enqueue(Text(answer, until=typed))

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, question)
        await until(fake_telegram, replied(fake_telegram, OWNER))
        assert fake_telegram.calls("sendChatAction") == []  # answered within the delay: nothing shown
        channel.typing_delay = 0.05  # a delay this turn outlasts
        fake_telegram.send_text(OWNER, OWNER, question)
        await until(fake_telegram, lambda: bool(fake_telegram.calls("sendChatAction")))
        assert fake_telegram.sent_texts(OWNER) == [answer]  # shown while the model still works
        typed.set()
        await until(fake_telegram, replied(fake_telegram, OWNER, 2))
    # A delay no turn of this test comes near, however busy the machine: the first answer is always sooner.
    serve(workspace, fake_telegram, fake_openai, body, typing_delay=600)

    assert fake_telegram.sent_texts(OWNER) == [answer, answer]
    assert TelegramChannel.__init__.__kwdefaults__["typing_delay"] == TYPING_DELAY > 0  # what picoclaw runs


def test_a_429_on_send_chat_action_is_waited_out_and_retried(home: Path, fake_telegram: FakeTelegramServer,
                                                             fake_openai: FakeOpenAIServer,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_openai.reply_text("typed and answered", delay=0.2)
    fake_telegram.fail_next("sendChatAction", 429, "Too Many Requests: retry after 3", retry_after=3)
    sleeps = Sleeps()

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "hi")
        await until(fake_telegram, replied(fake_telegram, OWNER))
    with caplog.at_level(logging.DEBUG, logger="picoclaw.channels.telegram"):
        serve(workspace, fake_telegram, fake_openai, body, sleeps=sleeps)

    assert sleeps.seconds == [3]
    first, second, *_ = fake_telegram.calls("sendChatAction")
    assert "_ok" not in first.params and second.params.get("_ok")
    assert "typing action failed" not in caplog.text  # the 429 never reached the channel
    assert "sendChatAction rate limited" in caplog.text


def test_a_typing_action_that_fails_is_logged_and_typing_goes_on(home: Path, fake_telegram: FakeTelegramServer,
                                                                 fake_openai: FakeOpenAIServer,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    typed_again = threading.Event()  # the model answers once "typing…" was sent again after the failure
    fake_openai.enqueue(Text("答好了 answered", until=typed_again))
    fake_telegram.fail_next("sendChatAction", 400, "Bad Request: not enough rights / 权限不足")

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "你好 hi")
        await until(fake_telegram, lambda: len(fake_telegram.calls("sendChatAction")) >= 2)
        typed_again.set()
        await until(fake_telegram, replied(fake_telegram, OWNER))
    with caplog.at_level(logging.DEBUG, logger="picoclaw.channels.telegram"):
        serve(workspace, fake_telegram, fake_openai, body)

    assert fake_telegram.sent_texts(OWNER) == ["答好了 answered"]
    first, second, *_ = fake_telegram.calls("sendChatAction")
    assert "_ok" not in first.params and second.params.get("_ok")  # refreshed after the failure
    assert f"chat {OWNER}: typing action failed" in caplog.text and "权限不足" in caplog.text
    assert "could not send a reply" not in caplog.text and "the turn failed" not in caplog.text


def test_a_429_on_start_up_and_on_send_message_is_retried_with_the_wait_capped(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_telegram.fail_next("deleteWebhook", 429, "Too Many Requests: retry after 2", retry_after=2)
    fake_telegram.fail_next("sendMessage", 429, "Too Many Requests: retry after 900", retry_after=900)
    sleeps = Sleeps()

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "hi")
        await until(fake_telegram, replied(fake_telegram, OWNER))
    serve(workspace, fake_telegram, fake_openai, body, sleeps=sleeps)

    assert sleeps.seconds == [2, RETRY_AFTER_MAX_WAIT]  # a flood ban's 900 s is not sat out by one call
    assert [bool(c.params.get("_ok")) for c in fake_telegram.calls("deleteWebhook")] == [False, True]
    assert fake_telegram.sent_texts(OWNER) == ["ok"]


def test_a_call_still_limited_after_its_tries_is_given_up_and_the_bot_serves_on(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer,
        caplog: pytest.LogCaptureFixture) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_openai.reply_text("lost to the flood")
    fake_openai.reply_text("this one arrives")
    fake_telegram.fail_next("sendMessage", 429, "Too Many Requests: retry after 5", retry_after=5,
                            times=RETRY_AFTER_ATTEMPTS)
    sleeps = Sleeps()

    async def body(channel: TelegramChannel) -> None:
        fake_telegram.send_text(OWNER, OWNER, "first")
        await until(fake_telegram, lambda: len(fake_telegram.calls("sendMessage")) == RETRY_AFTER_ATTEMPTS)
        fake_telegram.send_text(OWNER, OWNER, "second")
        await until(fake_telegram, replied(fake_telegram, OWNER))
    with caplog.at_level(logging.WARNING):
        serve(workspace, fake_telegram, fake_openai, body, sleeps=sleeps)

    assert sleeps.seconds == [5] * (RETRY_AFTER_ATTEMPTS - 1)
    assert fake_telegram.sent_texts(OWNER) == ["this one arrives"]
    assert "could not send a reply" in caplog.text


def test_the_retry_middleware_is_installed_once_per_bot(home: Path, fake_telegram: FakeTelegramServer,
                                                        fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    settings = workspace.config.channels.telegram

    async def main() -> list[object]:
        bot = make_bot(settings, TOKEN)
        try:
            for _ in range(3):
                TelegramChannel(settings, bot, lambda scope: pytest.fail("no agent is needed"),
                                replies=lambda bot_id: pytest.fail("no reply log is needed"))
            return list(bot.session.middleware)
        finally:
            await bot.session.close()
    middlewares = asyncio.run(main())

    assert [type(m) for m in middlewares] == [KeptResponseModels, BestEffortChatActions, RetryAfterMiddleware]


def test_the_model_a_reply_is_parsed_with_outlives_the_garbage_collector(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer) -> None:
    # pydantic keeps Response[Message] only weakly; rebuilding it stalls the event loop for 100 ms and more.
    workspace = configure(home, fake_telegram, fake_openai)
    settings = workspace.config.channels.telegram

    async def main() -> bool:
        bot = make_bot(settings, TOKEN)
        install_middlewares(bot)
        try:
            await bot.send_message(42, "hello / 你好")
            model = weakref.ref(Response[Message])
            gc.collect()
            return model() is not None
        finally:
            await bot.session.close()

    assert asyncio.run(main())
    assert fake_telegram.sent_texts(42) == ["hello / 你好"]


def test_per_chat_locks_exist_only_while_a_chat_is_busy(home: Path, fake_telegram: FakeTelegramServer,
                                                        fake_openai: FakeOpenAIServer) -> None:
    chats = [3001, 3002, 3003]
    workspace = configure(home, fake_telegram, fake_openai, allow_from=chats)
    counted = threading.Event()  # the model answers once the test has counted the locks
    fake_openai.responder = lambda body: Text(echo(body), until=counted)

    async def body(channel: TelegramChannel) -> tuple[TelegramChannel, int]:
        for chat in chats:
            fake_telegram.send_text(chat, chat, f"hello from {chat}")
            fake_telegram.send_text(chat, chat, f"again from {chat}")  # waits behind the first: same lock
        await wait_until(lambda: len(fake_openai.chat_requests()) >= len(chats), what="every chat's model call")
        busy = len(channel._chat_locks)  # every chat's first turn is with the model now
        counted.set()
        await until(fake_telegram, lambda: all(len(fake_telegram.sent_texts(c)) == 2 for c in chats))
        return channel, busy
    channel, busy = serve(workspace, fake_telegram, fake_openai, body)

    assert busy == len(chats)
    assert len(channel._chat_locks) == 0  # every turn is over: no chat keeps a lock
    for chat in chats:
        assert fake_telegram.sent_texts(chat) == [f"echo: hello from {chat}", f"echo: again from {chat}"]


def test_strangers_told_their_id_are_remembered_within_a_bound(home: Path, fake_telegram: FakeTelegramServer,
                                                                fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    strangers = [7001, 7002, 7003]

    async def body(channel: TelegramChannel) -> None:
        for stranger in strangers:
            fake_telegram.send_text(stranger, stranger, "hello?")
            await until(fake_telegram, replied(fake_telegram, stranger))
        fake_telegram.send_text(7003, 7003, "hello again")  # still remembered: not told twice
        fake_telegram.send_text(7001, 7001, "hello again")  # forgotten (the oldest of three): told again
        await until(fake_telegram, replied(fake_telegram, 7001, 2))
    serve(workspace, fake_telegram, fake_openai, body, told_size=2)

    assert fake_telegram.sent_texts(7001) == [not_authorised(7001)] * 2
    assert fake_telegram.sent_texts(7003) == [not_authorised(7003)]


@pytest.mark.parametrize(("key", "chat"), [("telegram:42", 42), ("telegram:-100500:1001", -100500),
                                           ("cli:default", None), ("telegram:abc", None), ("telegram", None)])
def test_the_chat_of_a_session_key(key: str, chat: int | None) -> None:
    assert chat_of(key) == chat


def test_while_serving_the_startup_objects_are_frozen_out_of_full_collections(
        home: Path, fake_telegram: FakeTelegramServer, fake_openai: FakeOpenAIServer) -> None:
    workspace = configure(home, fake_telegram, fake_openai)
    fake_openai.responder = echo

    async def body(channel: TelegramChannel) -> int:
        fake_telegram.send_text(OWNER, OWNER, "hi 你好")
        await until(fake_telegram, replied(fake_telegram, OWNER))
        return gc.get_freeze_count()

    frozen_while_serving = serve(workspace, fake_telegram, fake_openai, body)
    assert frozen_while_serving > 10_000  # modules and all: a full pass no longer walks them
    assert gc.get_freeze_count() == 0  # and thawed when the bot stops
