"""/context and `picoclaw chat --show-context`: where the last request's tokens went, each part's share of the
window, and the window with where it came from; before any turn, what the next request would hold."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from picoclaw.agent.budget import PART_LABELS, PARTS, PromptSplit, split_report
from picoclaw.agent.loop import AgentLoop
from picoclaw.agent.slash_commands import HELP, LAST_REQUEST, NEXT_REQUEST
from picoclaw.channels.telegram.command_menu import COMMANDS
from picoclaw.cli import main
from picoclaw.memory.workspace import Workspace
from picoclaw.providers.base import ContextWindow, FixedWindow
from picoclaw.tools.registry import build_tools
from tests.agent_helpers import SESSION, make_provider, records_of, write_memory
from tests.fakes import FakeOpenAIServer
from tests.fakes.console import Console, logged_in
from tests.homes import edit_config
from tests.test_web_console import chat_events, chatting  # noqa: F401  (chatting: a fixture)

SMALL = ContextWindow(4096, "server", "llama.cpp /props")


def converse(workspace: Workspace, server: FakeOpenAIServer, texts: list[str],
             window: ContextWindow = SMALL) -> list[str]:
    """Each of `texts` (messages and commands) through AgentLoop.handle, as every channel sends them."""
    async def main_() -> list[str]:
        async with make_provider(workspace, server) as provider:
            loop = AgentLoop(workspace, provider, build_tools(workspace), windows=FixedWindow(window))
            replies = []
            for text in texts:
                replies.append((await loop.handle(SESSION, text)).text)
                await loop.wait_background()
            return replies
    return asyncio.run(main_())


def part_lines(report: str) -> dict[str, tuple[int, str]]:
    """Each part's (tokens, share) as the report shows them, by its label."""
    parts = {}
    for label in [*PART_LABELS.values(), "total"]:
        match = re.search(rf"^  {re.escape(label)}\s+([\d,]+)\s+([\d.]+%)", report, re.M)
        if match:
            parts[label] = (int(match.group(1).replace(",", "")), match.group(2))
    return parts


def test_before_any_turn_it_says_what_the_next_request_would_hold(workspace: Workspace,
                                                                  fake_openai: FakeOpenAIServer) -> None:
    [report] = converse(workspace, fake_openai, ["/context"])

    assert fake_openai.chat_requests() == []  # answered without the model
    assert report.startswith(NEXT_REQUEST)
    shown = part_lines(report)
    assert shown[PART_LABELS["system"]][0] > 0 and shown[PART_LABELS["tools"]][0] > 0
    assert PART_LABELS["user"] not in shown and PART_LABELS["memory"] not in shown  # not known before the message
    assert shown[PART_LABELS["reply"]][0] <= 4096 // 4 + 1  # the reply's share of a 4096 window
    assert "window: 4,096 tokens (server: llama.cpp /props)" in report
    assert re.search(r"memory and notes: up to 819 tokens", report)


def test_after_a_turn_it_shows_the_last_requests_split(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    write_memory(workspace, ["## 2025-03-01\nThe deploy runs on Thursdays."])
    fake_openai.reply_text("On Thursdays.")

    replies = converse(workspace, fake_openai, ["when is the deploy?", "/context"])

    report = replies[1]
    assert report.startswith(LAST_REQUEST)
    [user] = [r for r in records_of(workspace, "message") if r["message"]["role"] == "user"]
    recorded = user["why"]["context"]
    shown = part_lines(report)
    # The same numbers as the turn's record, each with its share of the window.
    for name in PARTS:
        tokens = recorded["parts"][name]
        assert shown[PART_LABELS[name]] == (tokens, f"{100 * tokens / 4096:.1f}%")
    assert shown["total"][0] == sum(recorded["parts"].values()) <= 4096
    assert recorded["parts"]["memory"] > 0
    assert recorded["parts"]["reply"] == fake_openai.chat_requests()[0]["max_tokens"]
    assert report.rstrip().endswith("window: 4,096 tokens (server: llama.cpp /props)")


def test_chinese_content_is_counted_and_shown(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    write_memory(workspace, ["## 2025-03-01\n部署在每周四进行，负责人是王五。"])
    fake_openai.reply_text("每周四。")
    message = "部署是哪一天？请用中文回答。" * 10

    replies = converse(workspace, fake_openai, [message, "/context"])

    shown = part_lines(replies[1])
    # A CJK character is about a token: the message's 140 characters are not counted as 35.
    assert shown[PART_LABELS["user"]][0] >= 100
    assert shown[PART_LABELS["memory"]][0] > 10
    assert "王五" in fake_openai.chat_requests()[0]["messages"][-1]["content"]


def test_a_split_that_shrank_says_so(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = lambda body: "NONE" if "facts" in str(body["messages"][0]["content"]) else "Thursdays."
    texts = []
    for n in range(8):
        texts += [f"project {n}: tell me about its deploy " + "please " * 150, "/context"]

    replies = converse(workspace, fake_openai, texts)

    reports = replies[1::2]
    turns = [r for r in records_of(workspace, "message") if r["message"]["role"] == "user"]
    moved = [turn["why"]["context"]["history_set_aside"] for turn in turns]
    assert any(moved)  # the history outgrew its room at least once …
    for count, report in zip(moved, reports, strict=True):
        # … and the report of that request says how many older messages were summarised or set aside.
        assert (f"({count} older message(s) summarised or set aside to fit)" in report) == bool(count), report
        assert part_lines(report)["total"][0] <= 4096
    assert any(r["reason"] in ("summary", "over_budget") for r in records_of(workspace, "compaction"))


def test_context_is_listed_where_channels_list_commands() -> None:
    assert any(line.startswith("/context — ") for line in HELP.splitlines())
    assert "context" in [command.command for command in COMMANDS]


# -- picoclaw chat --show-context ------------------------------------------------------------------------------


def configure(home: Path, server: FakeOpenAIServer) -> None:
    with edit_config(home) as config:
        config["providers"]["openai"] = {"api_key": "sk-context-test-0123456789", "api_base": server.base_url}
        config["agents"]["defaults"]["context_window"] = 16000


@pytest.mark.parametrize("message", ["what is on today?", "今天有什么安排？"])
def test_show_context_prints_the_split_after_the_answer_on_stderr(home: Path, fake_openai: FakeOpenAIServer,
                                                                   capsys: pytest.CaptureFixture[str],
                                                                   message: str) -> None:
    configure(home, fake_openai)
    fake_openai.reply_text("Nothing yet. 暂无安排。")

    code = main(["chat", "-m", message, "--show-context"])

    out, err = capsys.readouterr()
    assert code == 0
    assert out == "Nothing yet. 暂无安排。\n"  # the answer alone on stdout: `> file` keeps it clean
    assert err.startswith(LAST_REQUEST)
    assert "window: 16,000 tokens (config: config.json agents.defaults.context_window)" in err
    assert part_lines(err)[PART_LABELS["user"]][0] > 0


def test_without_show_context_nothing_more_is_printed_and_context_reads_the_record(
        home: Path, fake_openai: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    configure(home, fake_openai)
    fake_openai.reply_text("ok")

    assert main(["chat", "-m", "hello"]) == 0
    assert capsys.readouterr().err == ""
    # Another process: the last request's split comes from the turn's record.
    assert main(["chat", "-m", "/context"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(LAST_REQUEST)
    assert "window: 16,000 tokens (config: config.json agents.defaults.context_window)" in out
    assert len(fake_openai.chat_requests()) == 1


def test_the_web_console_chat_answers_context(chatting: tuple[Console, FakeOpenAIServer]) -> None:  # noqa: F811
    console, fake = chatting
    client = logged_in(console)
    page = client.get("/chat").text
    token = re.search(r'<meta name="csrf-token" content="([^"]+)">', page)
    assert token is not None
    before = chat_events(client, token.group(1), "/context")[-1]
    assert before["kind"] == "done" and before["text"].startswith(NEXT_REQUEST)
    fake.reply_text("你好！")
    chat_events(client, token.group(1), "你好，今天怎么样？")
    after = chat_events(client, token.group(1), "/context")[-1]
    assert after["kind"] == "done" and after["text"].startswith(LAST_REQUEST)
    assert "window: " in after["text"] and len(fake.chat_requests()) == 1


def test_the_split_shows_the_counting_margin_kept_free() -> None:
    report = split_report(PromptSplit(ContextWindow(4096, "server", "llama.cpp /props"), {"system": 300}), "h")
    assert "kept free" in report and "204" in report and "5.0%" in report
