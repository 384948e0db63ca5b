"""Ask first: a call of a tool `tools.approval.ask_first` names runs only after the user's yes;
a no, or no one to ask, and nothing runs and the model reads why. ask_user's options, and bad ones. The terminal's
side here (a y/N at the prompt, a numbered list); Telegram's buttons in tests/test_telegram_buttons.py."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest

from picoclaw.app import App
from picoclaw.channels import ReplChannel
from picoclaw.config import ApprovalConfig
from picoclaw.errors import ConfigError
from picoclaw.tools.approval import shown_arguments
from tests.agent_helpers import API_KEY, make_provider
from tests.fakes import FakeOpenAIServer
from tests.homes import edit_config


class Lines:
    """What the person at the terminal types, in order; the prompts they were shown are kept."""

    def __init__(self, *lines: str) -> None:
        self.left = list(lines)
        self.prompts: list[str] = []

    async def read(self, prompt: str) -> str:
        self.prompts.append(prompt)
        if not self.left:
            raise EOFError
        return self.left.pop(0)


def configure(home: Path, model: FakeOpenAIServer, *, exec_enabled: bool = True, **tools: Any) -> None:
    with edit_config(home) as config:
        config["providers"]["openai"] = {"api_key": API_KEY, "api_base": model.base_url}
        config["agents"]["defaults"]["context_window"] = 128_000
        config["tools"]["exec"] = {"enabled": exec_enabled}
        config["tools"].update(tools)


def chat(home: Path, model: FakeOpenAIServer, lines: Lines | None, message: str | None = None) -> tuple[str, str]:
    """Run `picoclaw chat` (the conversation when `lines`, else `chat -m message`); what it printed (out, err)."""
    out, err = io.StringIO(), io.StringIO()

    async def main() -> None:
        app = App.open(home)
        app._make_provider = lambda _config: make_provider(app.workspace, model)
        async with app:
            repl = ReplChannel(app.agent(), out=out, err=err, lines=lines)
            if lines is not None:
                await repl.run()
            else:
                await repl.answer_once(message)
        app.close()
    asyncio.run(main())
    return out.getvalue(), err.getvalue()


def tool_results(model: FakeOpenAIServer) -> list[str]:
    return [m["content"] for m in model.chat_requests()[-1]["messages"] if m["role"] == "tool"]


COMMANDS = [("list my files", "touch ran", "ran"), ("列出我的文件", "touch 已运行", "已运行")]


def root(home: Path) -> Path:
    """The workspace folder, where exec runs (and may write)."""
    return App.open(home).workspace.root


@pytest.mark.parametrize(("asked", "command", "made"), COMMANDS)
def test_yes_at_the_terminal_runs_the_command(home: Path, fake_openai: FakeOpenAIServer,
                                              asked: str, command: str, made: str) -> None:
    configure(home, fake_openai)
    fake_openai.reply_tool_calls([("exec", {"command": command})])
    fake_openai.reply_text("Done. / 好了。")
    lines = Lines(asked, "y")
    out, _ = chat(home, fake_openai, lines)

    assert lines.prompts[1] == f"Run exec: touch {made}? [y/N] "
    assert (root(home) / made).exists()
    assert tool_results(fake_openai)[0].startswith("exit code 0")
    assert "Done. / 好了。" in out


@pytest.mark.parametrize(("asked", "command", "made"), COMMANDS)
@pytest.mark.parametrize("answer", ["n", "", "不"])
def test_anything_but_yes_runs_nothing_and_tells_the_model(home: Path, fake_openai: FakeOpenAIServer,
                                                           asked: str, command: str, made: str, answer: str) -> None:
    configure(home, fake_openai)
    fake_openai.reply_tool_calls([("exec", {"command": command})])
    fake_openai.reply_text("OK, I won't. / 好的，不运行。")
    chat(home, fake_openai, Lines(asked, answer))

    assert not (root(home) / made).exists()
    assert tool_results(fake_openai) == [
        "not run: the user pressed Deny on this exec call. Do not try it again unless they ask; tell them what you "
        "would have done instead."]


@pytest.mark.parametrize(("asked", "command", "made"), COMMANDS)
def test_chat_m_cannot_ask_so_nothing_runs_and_one_line_says_why(home: Path,
                                                                 fake_openai: FakeOpenAIServer, asked: str,
                                                                 command: str, made: str) -> None:
    configure(home, fake_openai)
    fake_openai.reply_tool_calls([("exec", {"command": command})])
    fake_openai.reply_text("I could not run it. / 我没法运行。")
    out, err = chat(home, fake_openai, None, asked)

    assert not (root(home) / made).exists()
    assert err.splitlines() == ["picoclaw: not run: exec asks first (tools.approval.ask_first), and chat -m or piped "
                                "input cannot ask; set tools.approval.unattended to \"allow\" to run such calls "
                                "unasked"]
    assert tool_results(fake_openai)[0].startswith("not run: exec runs only after the user approves it")
    assert "我没法运行" in out or "could not" in out


def test_unattended_allow_runs_it_unasked_and_an_empty_ask_first_asks_nothing(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai, approval={"unattended": "allow"})
    fake_openai.reply_tool_calls([("exec", {"command": "touch a"})])
    fake_openai.reply_text("Done.")
    chat(home, fake_openai, None, "go")
    assert (root(home) / "a").exists()

    configure(home, fake_openai, approval={"ask_first": []})
    fake_openai.reply_tool_calls([("exec", {"command": "touch b"})])
    fake_openai.reply_text("Done.")
    lines = Lines("go")
    chat(home, fake_openai, lines)
    assert (root(home) / "b").exists() and lines.prompts == ["", ""]  # no y/N was asked


def test_write_file_asks_first_when_named_and_a_bad_call_is_not_asked_about(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai, exec_enabled=False, approval={"ask_first": ["write_file", "mcp__*"]})
    fake_openai.reply_tool_calls([("write_file", {"path": "notes/秘密.md"})])  # no content: invalid, not asked
    fake_openai.reply_tool_calls([("write_file", {"path": "notes/计划.md", "content": "去上海 / to Shanghai"})])
    fake_openai.reply_text("Written. / 写好了。")
    lines = Lines("write my plan / 写下我的计划", "是")
    chat(home, fake_openai, lines)

    assert lines.prompts[1] == "Run write_file: path=notes/计划.md, content=去上海 / to Shanghai? [y/N] "
    assert len(lines.prompts) == 3  # one question: the invalid call got its error without one
    workspace = App.open(home).workspace
    assert (workspace.root / "notes" / "计划.md").read_text(encoding="utf-8") == "去上海 / to Shanghai"


# -- what a request shows -----------------------------------------------------------------------------


@pytest.mark.parametrize(("arguments", "shown"), [
    ('{"command": "ls -la"}', "ls -la"),
    ('{"command": "列出 文件"}', "列出 文件"),
    ('{"command": "curl -H \\"Authorization: Bearer abcdef123456\\" x"}', 'curl -H "Authorization: Bearer ***" x'),
    ('{"command": "mysql --password hunter2 -e 1"}', "mysql --password *** -e 1"),
    ('{"command": "API_KEY=sk-abcdefghijklmnop run"}', "API_KEY=*** run"),
    ('{"url": "https://x", "token": "t0ps3cret", "n": 2}', "url=https://x, token=***, n=2"),
    ('{"command": "echo ' + "长" * 300 + '"}', "echo " + "长" * 194 + "…"),
])
def test_a_request_shows_short_arguments_without_secrets(arguments: str, shown: str) -> None:
    assert shown_arguments(arguments) == shown


def test_a_secret_of_the_config_is_masked_wherever_it_appears() -> None:
    assert shown_arguments('{"command": "echo my-very-long-key-123"}', ["my-very-long-key-123"]) == "echo ***"


@pytest.mark.parametrize(("settings", "line"), [
    ({"timeout_seconds": 1}, "timeout_seconds"),
    ({"timeout_seconds": 7200}, "timeout_seconds"),
    ({"unattended": "maybe"}, "unattended"),
    ({"ask_first": ["exec; rm"]}, "not a tool name"),
])
def test_a_bad_approval_setting_is_one_clear_line(home: Path, fake_openai: FakeOpenAIServer,
                                                  settings: dict[str, Any], line: str) -> None:
    configure(home, fake_openai, approval=settings)
    with pytest.raises(ConfigError) as raised:
        App.open(home)
    assert line in str(raised.value) and "\n" not in str(raised.value).strip()
    assert ApprovalConfig().ask_first == ["exec"]


# -- ask_user in the terminal -------------------------------------------------------------------------


@pytest.mark.parametrize(("question", "options", "typed", "sent"), [
    ("Which city?", ["Paris", "Rome", "Tokyo"], "2", "Rome"),
    ("去哪个城市？", ["北京", "上海"], "2", "上海"),
    ("去哪个城市？", ["北京", "上海"], "广州", "广州"),  # not a number: the line as typed
])
def test_ask_users_options_are_a_numbered_list_and_a_number_sends_the_option(
        home: Path, fake_openai: FakeOpenAIServer, question: str, options: list[str], typed: str, sent: str) -> None:
    configure(home, fake_openai, exec_enabled=False, ask_user=True)
    fake_openai.reply_tool_calls([("ask_user", {"question": question, "options": options})])
    fake_openai.reply_text("")  # nothing more to say this turn
    fake_openai.reply_text("Good choice. / 好选择。")
    out, _ = chat(home, fake_openai, Lines("plan a trip / 计划旅行", typed))

    listed = "\n".join([question] + [f"  {n}. {o}" for n, o in enumerate(options, 1)])
    assert listed in out
    last_user = [m for m in fake_openai.chat_requests()[-1]["messages"] if m["role"] == "user"][-1]
    assert str(last_user["content"]).endswith(sent)


@pytest.mark.parametrize(("arguments", "error"), [
    ({"question": "Pick", "options": ["a"]}, "options: List should have at least 2 items"),
    ({"question": "Pick", "options": [str(n) for n in range(9)]}, "options: List should have at most 8 items"),
    ({"question": "", "options": ["a", "b"]}, "question: String should have at least 1 character"),
    ({"question": "选哪个？", "options": ["北京", "  "]}, "error: option 2 is empty"),
    ({"question": "选哪个？", "options": ["北京", "长" * 41]}, "error: option 2 is 41 characters long; at most 40"),
    ({"question": "Pick", "options": ["Yes", "yes"]}, "error: two options are the same"),
])
def test_bad_ask_user_input_is_a_clear_tool_error(home: Path, fake_openai: FakeOpenAIServer,
                                                  arguments: dict[str, Any], error: str) -> None:
    configure(home, fake_openai, exec_enabled=False, ask_user=True)
    fake_openai.reply_tool_calls([("ask_user", arguments)])
    fake_openai.reply_text("Sorry.")
    out, _ = chat(home, fake_openai, Lines("ask me"))
    [result] = tool_results(fake_openai)
    assert result.startswith("error: ") and error in result
    assert "(type a number to answer)" not in out


def test_without_a_chooser_ask_user_tells_the_model_to_ask_in_its_reply(home: Path,
                                                                        fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai, exec_enabled=False, ask_user=True)
    fake_openai.reply_tool_calls([("ask_user", {"question": "Tea or coffee?", "options": ["Tea", "Coffee"]})])
    fake_openai.reply_text("Tea or coffee? 1. Tea 2. Coffee")
    chat(home, fake_openai, None, "what should I drink?")
    assert tool_results(fake_openai)[0].startswith("not shown: this chat has no buttons")
