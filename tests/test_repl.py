"""`picoclaw chat` end to end: a real subprocess on stdin/stdout, talking HTTP to the fake model server."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from picoclaw.agent import Reply
from picoclaw.channels.repl import CANCELLED, SCHEDULED_MARK, ReplChannel, _ctrl_c_cancels, _ctrl_c_leaves
from tests.agent_helpers import said
from tests.fakes import FakeOpenAIServer, Text
from tests.homes import edit_config
from tests.waiting import wait_until_sync

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-repl-test-0123456789"


def configure(home: Path, server: FakeOpenAIServer, **memory: Any) -> None:
    """Point the onboarded config at the fake server (and set policy keys in its memory block)."""
    with edit_config(home) as config:
        config["providers"]["openai"] = {"api_key": KEY, "api_base": server.base_url}
        config["memory"].update(memory)


def picoclaw(home: Path, *args: str, stdin: str = "", env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PICOCLAW_HOME": str(home), "PYTHONPATH": str(REPO), **(env or {})}
    environment.pop("OPENAI_API_KEY", None)
    return subprocess.run([sys.executable, "-m", "picoclaw", *args], input=stdin, env=environment,
                          capture_output=True, text=True, encoding="utf-8", timeout=60)


def session_records(home: Path, name: str = "cli%3Adefault.jsonl") -> list[dict[str, Any]]:
    path = home / "workspace" / "sessions" / name
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


@pytest.mark.slow
def test_conversation_stores_a_fact_and_a_restart_continues_it(home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai)
    fake_openai.reply_tool_calls([("memory_append", {"content": "Coffee: oat-milk latte / 咖啡：燕麦拿铁"})])
    fake_openai.reply_text("Noted, oat-milk latte.")
    fake_openai.reply_text("你喜欢燕麦拿铁。")

    first = picoclaw(home, "chat", stdin="remember: my coffee is an oat-milk latte\n\n我喜欢什么咖啡？\nexit\n")

    assert first.returncode == 0, first.stderr
    # The write's receipt is shown after the reply, by background work; a pipe's next line is read at once, so it
    # comes while the second answer is written, and waits for that answer's end instead of cutting into it. The
    # user never said 燕麦拿铁, so the words are the model's.
    assert first.stdout.splitlines() == ['· memory_append {"content": "Coffee: oat-milk latte / 咖啡：燕麦拿铁"}',
                                         "Noted, oat-milk latte.",
                                         "你喜欢燕麦拿铁。",
                                         "✍ remembered (the assistant's words, not yours): Coffee: oat-milk latte / "
                                         "咖啡：燕麦拿铁"]
    memory = (home / "workspace" / "memory" / "MEMORY.md").read_text(encoding="utf-8")
    assert "Coffee: oat-milk latte / 咖啡：燕麦拿铁" in memory
    # The Chinese question found the stored block and sent it to the model.
    assert "燕麦拿铁" in fake_openai.chat_requests()[2]["messages"][-1]["content"]

    fake_openai.reply_text("We talked about your coffee.")
    second = picoclaw(home, "chat", "-m", "what did we talk about?")

    assert second.returncode == 0, second.stderr
    assert second.stdout == "We talked about your coffee.\n"
    resumed = [said(m) for m in fake_openai.chat_requests()[3]["messages"] if m["role"] == "user"]
    assert resumed == ["remember: my coffee is an oat-milk latte", "我喜欢什么咖啡？", "what did we talk about?"]


@pytest.mark.slow
def test_one_shot_waits_for_the_summary_before_exiting(home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai, session_summary_message_threshold=4, session_summary_keep_count=2)
    for answer in ("one", "two"):
        fake_openai.reply_text(answer)
    assert picoclaw(home, "chat", "-m", "first").returncode == 0
    assert picoclaw(home, "chat", "-m", "second").returncode == 0
    fake_openai.reply_text("three")
    fake_openai.reply_text("NONE")  # the memory flush before the summary: nothing worth keeping
    fake_openai.reply_text("## Goal\nTest summaries\n## Progress\nThree messages\n## Next steps\nNone\n"
                           "## Key context\n数字 1, 2, 3", delay=0.3)

    third = picoclaw(home, "chat", "-m", "third")

    assert third.returncode == 0, third.stderr
    assert third.stdout.splitlines() == ["three", "Memory threshold reached. Optimizing conversation history..."]
    compactions = [r for r in session_records(home) if r["type"] == "compaction"]
    assert len(compactions) == 1 and "数字 1, 2, 3" in compactions[0]["summary"]
    assert fake_openai.pending() == 0


@pytest.mark.slow
def test_no_api_key_is_one_clear_line_and_no_request(home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai)
    with edit_config(home) as config:
        config["providers"]["openai"]["api_key"] = ""

    result = picoclaw(home, "chat", "-m", "hello")

    assert result.returncode == 1
    assert result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if "WARNING" not in line]
    assert errors == [errors[0]] and "has no API key" in errors[0] and "OPENAI_API_KEY" in errors[0]
    assert fake_openai.requests == []
    assert not (home / "workspace" / "sessions").exists()


@pytest.mark.slow
def test_model_down_is_one_line_and_the_session_is_untouched(home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai)
    fake_openai.reply_text("hi")
    assert picoclaw(home, "chat", "-m", "hello").returncode == 0
    before = (home / "workspace" / "sessions" / "cli%3Adefault.jsonl").read_bytes()
    for _ in range(4):  # the first try and every retry
        fake_openai.reply_error(503, "overloaded", headers={"retry-after-ms": "1"})

    result = picoclaw(home, "chat", "-m", "are you there?")

    assert result.returncode == 1  # no answer: a script running `chat -m` must be able to tell
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "picoclaw: error: the model provider 'openai' is unavailable (HTTP 503): overloaded"]
    assert (home / "workspace" / "sessions" / "cli%3Adefault.jsonl").read_bytes() == before


@pytest.mark.slow
def test_empty_message_is_a_usage_error(home: Path) -> None:
    result = picoclaw(home, "chat", "-m", "   ")
    assert result.returncode == 2
    assert result.stderr.strip() == "picoclaw: error: the message given with -m is empty"


@pytest.mark.slow
def test_one_shot_streams_the_answer_and_shows_a_tool_call_as_one_line(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai)
    fake_openai.reply_tool_calls([("memory_append", {"content": "Tea: 龙井 (Longjing), no sugar / 不加糖"})])
    fake_openai.reply_text("记住了：龙井，不加糖。Noted: Longjing, no sugar.")

    result = picoclaw(home, "chat", "-m", "remember my tea: 龙井, no sugar")

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ['· memory_append {"content": "Tea: 龙井 (Longjing), no sugar / 不加糖"}',
                                          "记住了：龙井，不加糖。Noted: Longjing, no sugar.",
                                          "✍ remembered (the assistant's words, not yours): Tea: 龙井 (Longjing), no "
                                          "sugar / 不加糖"]
    requests = fake_openai.chat_requests()
    assert len(requests) == 2 and all(body["stream"] is True for body in requests)  # -m streams too
    memory = (home / "workspace" / "memory" / "MEMORY.md").read_text(encoding="utf-8")
    assert "Tea: 龙井 (Longjing), no sugar / 不加糖" in memory


class Repl:
    """`picoclaw chat` on pipes held open: lines are sent one at a time, output is read as it comes."""

    def __init__(self, home: Path) -> None:
        environment = {**os.environ, "PICOCLAW_HOME": str(home), "PYTHONPATH": str(REPO)}
        environment.pop("OPENAI_API_KEY", None)
        self.process = subprocess.Popen([sys.executable, "-m", "picoclaw", "chat"], env=environment,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, encoding="utf-8")
        self._out: list[str] = []
        self._err: list[str] = []
        for stream, sink in ((self.process.stdout, self._out), (self.process.stderr, self._err)):
            threading.Thread(target=self._pump, args=(stream, sink), daemon=True).start()

    @staticmethod
    def _pump(stream: Any, sink: list[str]) -> None:
        for line in iter(stream.readline, ""):
            sink.append(line)

    @property
    def stdout(self) -> str:
        return "".join(self._out)

    @property
    def stderr(self) -> str:
        return "".join(self._err)

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def close_stdin(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()

    def wait_for_output(self, text: str, timeout: float = 20) -> None:
        wait_until_sync(lambda: text in self.stdout or self.process.poll() is not None, timeout=timeout,
                        what=f"{text!r} on the REPL's stdout")
        assert text in self.stdout, (self.stdout, self.stderr)

    def wait_exit(self, timeout: float) -> int:
        """The exit code; fails when the process is still running after `timeout` seconds."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"picoclaw chat still running {timeout:g} s later; stdout: {self.stdout!r}, "
                                 f"stderr: {self.stderr!r}") from None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture
def repl(home: Path, fake_openai: FakeOpenAIServer) -> Iterator[Repl]:
    configure(home, fake_openai)
    session = Repl(home)
    try:
        yield session
    finally:
        session.kill()


@pytest.mark.slow
def test_ctrl_c_at_the_idle_prompt_ends_at_once(repl: Repl, fake_openai: FakeOpenAIServer) -> None:
    """The prompt waits on a pipe that stays open: Ctrl-C must end the program there and then, not after
    another line comes."""
    fake_openai.reply_text("你好！Hello there.")
    repl.send("你好 hello")
    repl.wait_for_output("你好！Hello there.\n")

    repl.process.send_signal(signal.SIGINT)

    assert repl.wait_exit(timeout=30) == 130, repl.stderr  # bounds a hang only: no line ever comes
    assert repl.stdout == "你好！Hello there.\n"


def test_a_ctrl_c_after_the_answer_is_done_but_before_the_prompt_is_back_still_ends_the_program() -> None:
    """The gap the test above can hit only by chance (it did, in CI): the answer's task has finished, its
    Ctrl-C handler is still installed. Cancelling a finished task does nothing, so the Ctrl-C must leave."""
    async def main() -> None:
        turn = asyncio.get_running_loop().create_future()
        turn.set_result(None)
        with _ctrl_c_cancels(turn):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(20):  # the loop reads the signal from its wake-up pipe, then runs the handler
                await asyncio.sleep(0)

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(main())


def test_ctrl_c_at_the_prompt_is_seen_whichever_thread_the_kernel_hands_it_to() -> None:
    """The idle prompt's flake in CI: SIGINT taken by another thread (the stdin reader, a worker writing the
    turn's metrics) never woke the loop, which slept on until its next timer. The loop's own handler sees it."""
    async def main() -> None:
        reading = asyncio.current_task()
        ready = threading.Event()

        def send() -> None:
            ready.wait()
            os.kill(os.getpid(), signal.SIGINT)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()  # before the mask below: a thread inherits the mask of the thread that starts it
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # only another thread may take it
        try:
            with _ctrl_c_leaves(reading):
                asyncio.get_running_loop().call_soon(ready.set)
                await asyncio.sleep(60)  # bounds a hang only: the Ctrl-C ends the wait long before
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    with pytest.raises(KeyboardInterrupt) as raised:
        asyncio.run(main())
    # Raised by the prompt's handler, not by Python's default one once the sleep ran out.
    assert raised.traceback[-1].name == "_ctrl_c_leaves"


def test_a_notice_during_an_answer_waits_for_its_end_and_after_a_cancel_for_the_line_saying_so() -> None:
    """Background work of an earlier turn speaks while an answer is written: its line comes after that answer, never
    glued into it; when Ctrl-C cancels the answer, after the line that says so."""
    async def main() -> str:
        out = io.StringIO()
        told = asyncio.Event()

        class Agent:
            async def handle(self, key: str, text: str, *, notify: Any, on_text: Any, remembered: Any,
                             **_: Any) -> Reply:
                await on_text("部分 partial")
                await notify(key, "summary started / 开始总结")
                if text == "second":
                    await on_text(" answer")
                    return Reply("部分 partial answer")
                told.set()
                await asyncio.sleep(60)  # until the Ctrl-C
                raise AssertionError("not cancelled")

        class Lines:
            def __init__(self) -> None:
                self.left = ["first", "second"]

            async def read(self, prompt: str) -> str:
                if not self.left:
                    raise EOFError
                return self.left.pop(0)

        repl = ReplChannel(Agent(), out=out, err=io.StringIO(), lines=Lines())  # type: ignore[arg-type]

        async def ctrl_c() -> None:
            await told.wait()
            os.kill(os.getpid(), signal.SIGINT)

        pressing = asyncio.create_task(ctrl_c())
        await repl._read_and_answer(Lines(), "")
        await pressing
        return out.getvalue()

    assert asyncio.run(main()) == (f"部分 partial\n{CANCELLED}\nsummary started / 开始总结\n"
                                   "部分 partial answer\nsummary started / 开始总结\n")


@pytest.mark.slow
def test_ctrl_c_during_an_answer_cancels_it_and_the_repl_goes_on(
        home: Path, repl: Repl, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(Text("slow answer that never arrives / 慢", delay=30))
    fake_openai.reply_text("第二个回答。Second answer.")
    repl.send("第一个问题 first question")
    wait_until_sync(lambda: fake_openai.chat_requests(), timeout=20, what="the first question to reach the model")

    repl.process.send_signal(signal.SIGINT)
    repl.wait_for_output(CANCELLED)
    repl.send("第二个问题 second question")
    repl.wait_for_output("第二个回答。Second answer.\n")
    repl.close_stdin()

    assert repl.wait_exit(timeout=10) == 0, repl.stderr
    assert repl.stdout == f"\n{CANCELLED}\n第二个回答。Second answer.\n"
    said_in_file = [(r["message"]["role"], said(r["message"])) for r in session_records(home) if r["type"] == "message"]
    assert said_in_file == [("user", "第二个问题 second question"), ("assistant", "第二个回答。Second answer.")]
    # The second request carried nothing of the cancelled turn either.
    second = fake_openai.chat_requests()[1]
    assert [said(m) for m in second["messages"][1:]] == ["第二个问题 second question"]


@pytest.mark.slow
def test_a_reminder_for_this_terminal_session_is_printed_once_while_the_chat_runs(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai)
    # A delay, resolved when added: an absolute time a few seconds ahead could pass while a busy machine starts
    # the `cron add` process, and be refused as "in the past". A job due before the chat opens still comes.
    for key, text in (("cli:default", "给银行打电话 call the bank"), ("cli:work", "not this terminal's")):
        added = picoclaw(home, "cron", "add", "--in", "2 seconds", "--message", text, "--session", key)
        assert added.returncode == 0, added.stderr
        assert f"delivered while an interactive `picoclaw chat --session {key}` runs" in added.stdout
        assert "`chat -m` does not wait for jobs" in added.stdout
    session = Repl(home)
    try:
        session.wait_for_output(f"{SCHEDULED_MARK}给银行打电话 call the bank\n")
        fake_openai.reply_text("好的。OK.")
        session.send("谢谢 thanks")
        session.wait_for_output("好的。OK.\n")
        session.close_stdin()
        assert session.wait_exit(timeout=20) == 0, session.stderr
    finally:
        session.kill()
    assert session.stdout.count("给银行打电话") == 1 and "not this terminal's" not in session.stdout
    jobs = {job["text"]: job for job in orjson.loads((home / "workspace" / "cron" / "jobs.json").read_bytes())["jobs"]}
    assert jobs["给银行打电话 call the bank"]["last_outcome"] == "ok"
    assert jobs["not this terminal's"]["last_outcome"] is None  # left for `picoclaw chat --session cli:work`


@pytest.mark.slow
def test_a_named_terminal_session_is_cli_name_and_an_older_bare_transcript_is_carried_over(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai)
    sessions = home / "workspace" / "sessions"
    fake_openai.reply_text("Noted. 记住了。")
    assert picoclaw(home, "chat", "--session", "work", "-m", "my desk is 4B 我的工位是4B").returncode == 0
    named = sessions / "cli%3Awork.jsonl"  # the key a job can name: cli:work
    assert named.is_file() and not (sessions / "work.jsonl").exists()
    named.rename(sessions / "work.jsonl")  # how versions before cli: keys kept it
    fake_openai.reply_text("4B.")
    result = picoclaw(home, "chat", "--session", "work", "-m", "where is my desk?")
    assert result.returncode == 0, result.stderr
    assert named.is_file() and not (sessions / "work.jsonl").exists()
    assert "我的工位是4B" in json.dumps(fake_openai.chat_requests()[-1]["messages"], ensure_ascii=False)


# -- terminal escapes -------------------------------------------------------------------------------------

# What would act on a terminal if printed: ESC, BEL and the 8-bit CSI and OSC.
ACTING = ("\x1b", "\x07", "\x9b", "\x9d")
# Streamed 3 characters a piece, this cuts ESC [ 3 1 m, the OSC title and the CRLF between pieces.
HOSTILE_ANSWER = "好的\x1b[31mred\x1b[0m OK\x07 \x1b]0;pwned\x07done\x9b1m!\r\nline two \x9d0;t\x9c🎉"
HOSTILE_SHOWN = "好的red OK done!\nline two 🎉"


def assert_inert(*texts: str) -> None:
    for text in texts:
        assert not any(byte in text for byte in ACTING), repr(text)


@pytest.mark.slow
def test_a_streamed_answer_with_escapes_prints_none_of_them(home: Path, fake_openai: FakeOpenAIServer) -> None:
    configure(home, fake_openai)
    # Arguments as JSON escape the ESC as \u001b (inert as shown); raw ones carry the byte itself.
    fake_openai.reply_tool_calls([("memory_append", {"content": "茶 tea\x1b[2J\x1b]0;pwned\x07: 龙井"}),
                                  ("list_dir", '{"path": "\x1b]0;pwned\x07memory"}')])
    fake_openai.reply_text(HOSTILE_ANSWER)

    result = picoclaw(home, "chat", "-m", "remember my tea 龙井")

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        '· memory_append {"content": "茶 tea\\u001b[2J\\u001b]0;pwned\\u0007: 龙井"}',
        '· list_dir {"path": "memory"}', *HOSTILE_SHOWN.splitlines(),
        "✍ remembered (the assistant's words, not yours): 茶 tea: 龙井"]
    assert_inert(result.stdout, result.stderr)
    memory = (home / "workspace" / "memory" / "MEMORY.md").read_text(encoding="utf-8")
    assert "茶 tea: 龙井" in memory
    assert_inert(memory)


@pytest.mark.slow
def test_the_repl_prints_no_escapes_from_answers_commands_or_errors(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    """Streamed answers, a slash command's reply (memory as stored by hand) and a failure's line."""
    configure(home, fake_openai)
    memory = home / "workspace" / "memory" / "MEMORY.md"
    memory.write_text(f"# Long-term memory\n\n## 2025-03-01\n咖啡 coffee {HOSTILE_ANSWER}\n", encoding="utf-8")
    fake_openai.reply_text(HOSTILE_ANSWER)
    for _ in range(4):  # the first try and every retry
        fake_openai.reply_error(503, f"refused {HOSTILE_ANSWER}", headers={"retry-after-ms": "1"})

    result = picoclaw(home, "chat", stdin="你好 hello\n/memory 咖啡\nagain\nexit\n")

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{HOSTILE_SHOWN}\n")
    assert "  咖啡 coffee 好的red OK done!\n  line two 🎉\n" in result.stdout  # the /memory reply
    assert result.stderr.splitlines()[-1].startswith("picoclaw: error: ")
    assert f"refused {HOSTILE_SHOWN.splitlines()[0]}" in result.stderr
    assert_inert(result.stdout, result.stderr)


@pytest.mark.slow
def test_log_lines_print_no_escapes(home: Path, fake_openai: FakeOpenAIServer) -> None:
    """A background failure is logged with the server's words: the log goes to the terminal too."""
    configure(home, fake_openai, session_summary_message_threshold=4, session_summary_keep_count=2)
    for answer in ("one", "two", "three"):
        fake_openai.reply_text(answer)
    fake_openai.reply_text("NONE")  # the memory flush before the summary
    # Refused after the conversation and then in its own prompt (a refusal after it is tried once alone).
    for _ in range(2):
        fake_openai.reply_error(400, f"summary refused {HOSTILE_ANSWER}")

    result = picoclaw(home, "chat", stdin="first\nsecond\nthird\n")

    assert result.returncode == 0, result.stderr
    assert "summary failed" in result.stderr and "summary refused 好的red OK done!" in result.stderr
    assert_inert(result.stdout, result.stderr)
