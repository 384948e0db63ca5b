"""A small local model must never break a conversation: what llama.cpp's server refuses is never
stored or sent, and what a small model answers badly still ends in a working session."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from picoclaw.app import App
from picoclaw.channels.repl import PROMPT
from picoclaw.cli import main
from picoclaw.memory.workspace import Workspace
from picoclaw.tokens import count_tokens
from picoclaw.workspace_text import bootstrap_text
from tests.agent_helpers import (
    SESSION,
    chat,
    contents,
    frozen,
    history,
    is_summary_request,
    records_of,
    said,
    session_path,
)
from tests.fakes import Error, FakeOpenAIServer, Text
from tests.fakes.replies import null_answer
from tests.test_repl import REPO, configure, picoclaw
from tests.waiting import wait_until_sync


def test_an_answer_without_text_is_asked_again_never_stored_and_the_next_turn_works(workspace: Workspace) -> None:
    with FakeOpenAIServer(strict_content=True) as server, frozen():
        server.reply_raw(null_answer())
        server.reply_text("旺财 is your dog's name.")  # the answer to the question asked again
        server.reply_text("旺财。")
        replies = chat(workspace, server, ["我的狗叫什么？ What is my dog called?", "again, please / 再说一次"])

    assert replies == ["旺财 is your dog's name.", "旺财。"]
    stored = [r["message"] for r in records_of(workspace, "message")]
    assert stored[1] == {"role": "assistant", "content": "旺财 is your dog's name."}
    sent = history(server.chat_requests()[-1])
    assert [m["content"] for m in sent if m["role"] == "assistant"] == ["旺财 is your dog's name."]


def test_a_null_content_kept_by_an_older_version_is_sent_as_empty_text(workspace: Workspace) -> None:
    records = [{"type": "message", "id": 1, "message": {"role": "user", "content": "remember 龙井"}},
               {"type": "message", "id": 2, "message": {"role": "assistant", "content": None}}]
    path = session_path(workspace)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))

    with FakeOpenAIServer(strict_content=True) as server, frozen():
        server.reply_text("好的 / fine")
        assert chat(workspace, server, ["still there? 还在吗？"], SESSION) == ["好的 / fine"]

    assert contents(history(server.chat_requests()[0])) == ["remember 龙井", "", "still there? 还在吗？"]
    assert all(m["content"] is not None for m in server.chat_requests()[0]["messages"])


@pytest.mark.slow
def test_the_offline_token_estimate_is_not_a_warning_on_every_command(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    # The test run has no tiktoken encoding (an empty TIKTOKEN_CACHE_DIR, no network): counts are estimated.
    configure(home, fake_openai)
    memory = home / "workspace" / "memory" / "MEMORY.md"
    memory.write_text("# Long-term memory\n\n## 2025-03-01\n我的狗叫旺财 / my dog is Wangcai\n", encoding="utf-8")
    fake_openai.reply_text("旺财 / Wangcai")
    fake_openai.reply_text("旺财！Wangcai!")

    # Two sessions, so that both turns inject (and count) the memory block. A cache of their own: the first
    # process that finds no encoding remembers it there, and the processes after it say nothing even with -v.
    cache = {"TIKTOKEN_CACHE_DIR": str(home.parent / "tiktoken-cache")}
    verbose = picoclaw(home, "-v", "chat", "--session", "two", "-m", "my dog's name again? 狗叫什么", env=cache)
    quiet = picoclaw(home, "chat", "--session", "one", "-m", "我的狗叫什么？ what is my dog called?", env=cache)
    again = picoclaw(home, "-v", "chat", "--session", "three", "-m", "狗叫什么", env=cache)

    assert quiet.returncode == verbose.returncode == again.returncode == 0, quiet.stderr + verbose.stderr
    assert quiet.stdout == "旺财！Wangcai!\n"
    assert "tiktoken" not in again.stderr
    assert all("旺财" in body["messages"][-1]["content"] for body in fake_openai.chat_requests())  # counted, sent
    assert "tiktoken" not in quiet.stderr
    assert "token counts are estimated" in verbose.stderr


# -- the first request is small ---------------------------------------------------------------------------


def test_the_first_request_of_a_fresh_workspace_is_small(workspace: Workspace) -> None:
    # 2,419 tokens on llama.cpp's server once, 1,465 since the prompt was trimmed; picoclaw's own (offline)
    # estimate of the same request guards it here. A CPU model reads every one of them before it answers.
    with FakeOpenAIServer() as server, frozen():
        server.reply_text("Paris.")
        chat(workspace, server, ["What is the capital of France?"])
    body = server.chat_requests()[0]
    system = body["messages"][0]["content"]

    assert count_tokens(json.dumps(body, ensure_ascii=False)) < 1350
    assert "Write here what the assistant should always know" not in system  # the template's note to the user
    assert "# User" not in system  # a bootstrap file with nothing but its heading is not sent
    assert "memory_append" in system and "<context>" in system  # the guidance that matters is still there


@pytest.mark.parametrize(("text", "sent"), [
    ("# User\n\n<!--\nWrite about yourself here.\n-->\n", ""),
    ("# User\n\n<!-- 在这里写下你的名字 -->\n我叫李雷，住在上海。\n", "# User\n\n我叫李雷，住在上海。"),
    ("# User\n\nMy name is Li Lei.\n<!-- a note\nover lines -->\n\n\n\nI live in Shanghai.", (
        "# User\n\nMy name is Li Lei.\n\nI live in Shanghai.")),
    ("# 身份\n## 子标题\n", ""),
], ids=["template", "chinese", "comment-between", "headings-only"])
def test_bootstrap_files_are_sent_without_comments(text: str, sent: str) -> None:
    assert bootstrap_text(text) == sent


# -- a server that dies mid-answer ------------------------------------------------------------------------


@pytest.mark.parametrize("answer", ["The capital of France is Paris, a city on the Seine.",
                                    "法国的首都是巴黎，塞纳河穿城而过。"], ids=["english", "chinese"])
def test_a_server_that_dies_mid_answer_is_a_lost_connection_not_a_failed_one(
        home: Path, fake_openai: FakeOpenAIServer, capsys: pytest.CaptureFixture[str], answer: str) -> None:
    configure(home, fake_openai)
    fake_openai.enqueue(Text(answer, cut_after=3))
    workspace = App.open(home).workspace

    code = main(["chat", "-m", "What is the capital of France? 法国的首都是哪里？"])

    out, err = capsys.readouterr()
    assert code == 1
    assert out.startswith(answer[:3])  # it had connected, and was streaming
    [line] = err.splitlines()
    assert "lost during its answer" in line and "nothing of the answer was kept" in line
    assert "could not connect" not in line
    assert not session_path(workspace, "cli:default").exists()  # nothing of the turn was kept


# -- the REPL: an empty answer, and notices while the prompt waits (items 2 and 5) -------------------------


@pytest.mark.slow
@pytest.mark.parametrize("empty", ["\n", "  \n\t", ""], ids=["newline", "white-space", "nothing"])
def test_an_empty_answer_says_so_in_the_repl(home: Path, fake_openai: FakeOpenAIServer, empty: str) -> None:
    configure(home, fake_openai)
    for _ in range(3):  # as asked, then asked again twice: empty every time
        fake_openai.reply_text(empty)
    fake_openai.reply_text("旺财。Wangcai.")

    result = picoclaw(home, "chat", stdin="我的狗叫什么？\nwhat is my dog called?\n")

    assert result.returncode == 0, result.stderr
    assert result.stdout == "旺财。Wangcai.\n"  # nothing empty shown
    assert result.stderr.splitlines() == ["picoclaw: error: the model returned no answer, also when asked twice "
                                          "more without tools"]


@pytest.mark.slow
def test_a_warning_while_the_prompt_waits_is_printed_above_it_and_the_prompt_is_drawn_again(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    # The summary after the third turn is held until the prompt is on the screen, then fails: its warning
    # comes while the REPL waits for input, as a background notice or log line does in real use.
    configure(home, fake_openai, session_summary_message_threshold=4, session_summary_keep_count=2,
              memory_flush_enabled=False)
    release = threading.Event()

    def answer(body: dict[str, Any]) -> Error | Text:
        if is_summary_request(body):
            release.wait(60)
            return Error(503, "busy 忙")
        return Text(f"答：{said(body['messages'][-1])}")

    fake_openai.responder = answer
    terminal = Terminal(home)
    try:
        terminal.wait_for(SHOWN_PROMPT)
        for text in ["one 一", "two 二", "three 三"]:
            terminal.send(text)
            terminal.wait_for(SHOWN_PROMPT, after=f"答：{text}")
        release.set()  # the prompt after the third answer is on the screen, waiting for a line
        terminal.wait_for("summary failed")
        terminal.wait_for(SHOWN_PROMPT, after="summary failed")  # drawn again below it, no key pressed
        shown = terminal.screen
        terminal.send("exit")
        assert terminal.wait_exit() == 0
    finally:
        terminal.kill()
    lines = [line for line in shown.replace("\r", "\n").split("\n") if "summary failed" in line]
    assert lines and not any(SHOWN_PROMPT in line for line in lines)  # not written onto the prompt line


# prompt_toolkit draws "you> " as "you>" and a cursor move.
SHOWN_PROMPT = PROMPT.rstrip()


class Terminal:
    """`picoclaw chat` on a pseudo-terminal, as a person runs it: prompt_toolkit draws its prompt there."""

    def __init__(self, home: Path) -> None:
        environment = {**os.environ, "PICOCLAW_HOME": str(home), "PYTHONPATH": str(REPO), "TERM": "xterm",
                       "COLUMNS": "200", "LINES": "50"}
        environment.pop("OPENAI_API_KEY", None)
        main_fd, child_fd = pty.openpty()
        self.process = subprocess.Popen([sys.executable, "-m", "picoclaw", "chat"], env=environment,
                                        stdin=child_fd, stdout=child_fd, stderr=child_fd, close_fds=True)
        os.close(child_fd)
        self._fd = main_fd
        self._read: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 4096)
            except OSError:  # the child ended and closed its side
                return
            if not data:
                return
            self._read.append(data.decode("utf-8", "replace"))
            if "\x1b[6n" in self._read[-1]:  # prompt_toolkit asks where the cursor is: say, as a terminal would
                os.write(self._fd, b"\x1b[1;1R")

    @property
    def screen(self) -> str:
        """Everything written to the terminal so far, escape sequences included."""
        return "".join(self._read)

    def send(self, line: str) -> None:
        os.write(self._fd, (line + "\r").encode("utf-8"))

    def wait_for(self, text: str, after: str = "") -> None:
        """Wait until `text` is on the screen (after the last `after`, when given)."""
        def shown() -> bool:
            screen = self.screen
            start = screen.rfind(after) if after else 0
            return (start >= 0 and text in screen[start + len(after):]) or self.process.poll() is not None
        wait_until_sync(shown, timeout=60, what=f"{text!r} on the terminal" + (f" after {after!r}" if after else ""))
        assert shown() and self.process.poll() is None, self.screen[-2000:]

    def wait_exit(self) -> int:
        return self.process.wait(timeout=60)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        os.close(self._fd)
