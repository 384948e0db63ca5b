"""`picoclaw onboard` on a real pseudo-terminal: the questions as a person sees them, a key typed without echo,
Ctrl-C at a question, and the README's first run (onboard, then chat) ending in an answer.

The child is `main(["onboard"])` in a fresh interpreter whose terminal is the pty (its controlling terminal, so
getpass reads the key with echo off there) and whose local-server ports are the test's fake servers: the real
ports 11434/8080/8765/1234 of this machine are never touched, and the network guard is installed there too.
"""

from __future__ import annotations

import json
import os
import select
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import picoclaw
from tests.fakes import FakeOpenAIServer
from tests.homes import edit_config
from tests.zones import onboard_in_shanghai

pytestmark = pytest.mark.slow  # every test here runs onboarding in a process on a terminal of its own

REPO = Path(picoclaw.__file__).resolve().parent.parent
RIGHT_KEY = "sk-right-0123456789abcdef"
WRONG_KEY = "sk-wrong-fedcba9876543210"
WAIT = 60.0  # seconds: only a hung child takes this long; nothing here waits on purpose
CHILD = """
import fcntl, json, sys, termios
fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # the pty becomes this session's terminal: getpass opens /dev/tty
from tests.fakes import network_guard
network_guard.install()
from picoclaw.cli import main, model_probe
model_probe.LOCAL_SERVERS = tuple(model_probe.LocalServer(*each) for each in json.loads(sys.argv[1]))
sys.exit(main(["onboard"]))
"""


class Terminal:
    """A child process on a pty: what it shows (`transcript`), what is typed into it (`type`)."""

    def __init__(self, home: Path, servers: Sequence[tuple[str, str, int]]):
        self.master, slave = os.openpty()
        env = {**os.environ, "PICOCLAW_HOME": str(home), "PYTHONUTF8": "1", "TERM": "dumb",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        env.pop("OPENAI_API_KEY", None)
        self.child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(servers)], stdin=slave, stdout=slave,
                                      stderr=slave, env=env, cwd=REPO, start_new_session=True)
        os.close(slave)
        self.raw = b""
        self._seen = 0

    @property
    def transcript(self) -> str:
        return self.raw.decode("utf-8", "replace").replace("\r\n", "\n")

    def expect(self, text: str) -> None:
        """Wait until the child shows `text` (after what was expected before)."""
        deadline = time.monotonic() + WAIT
        while (found := self.transcript.find(text, self._seen)) < 0:
            shown = self.transcript
            assert self._read(deadline - time.monotonic()), f"{text!r} never came; the terminal shows:\n{shown}"
        self._seen = found + len(text)

    def type(self, text: str) -> None:
        os.write(self.master, text.encode("utf-8"))

    def wait_until_reading(self) -> None:
        """Wait until the child is blocked reading its terminal (Linux's /proc/PID/syscall: read on fd 0).

        CPython writes input()'s prompt and then reads; a SIGINT landing between the two is only noticed when the
        read returns, so a Ctrl-C sent on seeing the prompt can go unanswered (seen once on a busy CI machine)."""
        deadline = time.monotonic() + WAIT
        syscall = Path(f"/proc/{self.child.pid}/syscall")
        while not syscall.read_text().startswith("0 0x0 "):
            assert time.monotonic() < deadline, f"the child never read its terminal:\n{self.transcript}"
            self._read(0.01)  # a bounded poll: returns at once when the child shows something

    def finish(self) -> int:
        """Read to the end; the child's exit code."""
        deadline = time.monotonic() + WAIT
        while self._read(deadline - time.monotonic()):
            pass
        return self.child.wait(timeout=max(deadline - time.monotonic(), 1))

    def close(self) -> None:
        if self.child.poll() is None:
            self.child.kill()
            self.child.wait()
        os.close(self.master)

    def _read(self, timeout: float) -> bool:
        if timeout <= 0 or not select.select([self.master], [], [], timeout)[0]:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the child has gone and the pty with it
            return False
        self.raw += data
        return bool(data)


def port_of(server: FakeOpenAIServer) -> int:
    port = urlsplit(server.origin).port
    assert port is not None
    return port


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    started: list[Terminal] = []
    yield started
    for terminal in started:
        terminal.close()


@pytest.fixture
def refusing_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_first_run_finds_the_local_server_and_the_chat_answers(
        tmp_path: Path, fake_openai: FakeOpenAIServer, terminals: list[Terminal], refusing_port: int) -> None:
    home = tmp_path / "家"
    fake_openai.models = ["qwen2.5:7b", "通义千问-7b"]
    with FakeOpenAIServer() as other_app:
        other_app.reply_garbage(endpoint="models")  # something else on a usual port
        terminal = Terminal(home, [("Ollama", "ollama", port_of(fake_openai)),
                                   ("llama.cpp", "llamacpp", port_of(other_app)),
                                   ("LM Studio", "lmstudio", refusing_port)])
        terminals.append(terminal)
        terminal.expect(f"Found Ollama at {fake_openai.base_url} (2 models).")
        terminal.expect("  2) 通义千问-7b on Ollama (this machine, no key needed)")
        terminal.expect("Choose 1-5 [1]: ")
        terminal.type("２\r")  # a full-width digit, as a Chinese input method types it
        terminal.expect(f"OK: {fake_openai.base_url} answered and offers 通义千问-7b.")
        terminal.expect("Done. picoclaw will use 通义千问-7b on ollama")
        assert terminal.finish() == 0, terminal.transcript
    config = json.loads((home / "config.json").read_text(encoding="utf-8"))
    assert config["agents"]["defaults"] == {**config["agents"]["defaults"], "provider": "ollama",
                                            "model": "通义千问-7b"}
    assert config["timezone"] == "local"
    assert "Traceback" not in terminal.transcript

    # …and the README's second half: `picoclaw chat` talks to it.
    fake_openai.reply_text("你好！我在本机运行。Hello from this machine.")
    chat = subprocess.run([sys.executable, "-m", "picoclaw", "chat", "-m", "你好"], capture_output=True,
                          env={**os.environ, "PICOCLAW_HOME": str(home), "PYTHONUTF8": "1",
                               "PYTHONPATH": str(REPO)}, timeout=WAIT, cwd=REPO)
    assert chat.returncode == 0, chat.stderr.decode("utf-8", "replace")
    assert "你好！我在本机运行。Hello from this machine." in chat.stdout.decode("utf-8")
    assert fake_openai.chat_requests()[-1]["model"] == "通义千问-7b"


def test_a_key_typed_is_never_shown_and_a_refused_one_is_said_plainly(
        tmp_path: Path, terminals: list[Terminal], refusing_port: int) -> None:
    home = tmp_path / "home"
    onboard_in_shanghai(home)  # set up before, without a key: onboarding asks again
    path = home / "config.json"
    with FakeOpenAIServer(api_key=RIGHT_KEY) as openai:
        with edit_config(home) as data:
            data["providers"]["openai"]["api_base"] = openai.base_url
        terminal = Terminal(home, [("Ollama", "ollama", refusing_port)])
        terminals.append(terminal)
        terminal.expect(f"{path} names gpt-4o-mini on openai, which has no API key.")
        terminal.expect(f"No model server answers on this machine (looked for Ollama on port {refusing_port}).")
        terminal.expect("Choose 1-3 [1]: ")
        terminal.type("\r")
        terminal.expect("API key for OpenAI (not shown as you type): ")
        terminal.type(WRONG_KEY + "\r")
        terminal.expect("That did not work: the server refused the API key (HTTP 401).")
        terminal.expect("Keep this choice anyway? [y/N] ")
        terminal.type("n\r")
        terminal.expect("Choose 1-3 [1]: ")
        terminal.type("1\r")
        terminal.expect("API key for OpenAI (not shown as you type): ")
        terminal.type(RIGHT_KEY + "\r")
        terminal.expect(f"OK: {openai.base_url} answered and offers gpt-4o-mini.")
        terminal.expect(f"updated with your choice           {path}")
        terminal.expect(f"Done. picoclaw will use gpt-4o-mini on openai ({openai.base_url}); run `picoclaw chat`.")
        assert terminal.finish() == 0, terminal.transcript
    assert RIGHT_KEY not in terminal.transcript and WRONG_KEY not in terminal.transcript  # echo was off
    after = json.loads(path.read_text(encoding="utf-8"))
    assert after["providers"]["openai"]["api_key"] == RIGHT_KEY and after["timezone"] == "Asia/Shanghai"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_ctrl_c_at_a_question_writes_nothing(tmp_path: Path, terminals: list[Terminal], refusing_port: int) -> None:
    home = tmp_path / "home"
    terminal = Terminal(home, [("Ollama", "ollama", refusing_port)])
    terminals.append(terminal)
    terminal.expect("Choose 1-3 [1]: ")
    terminal.wait_until_reading()
    terminal.type("\x03")  # Ctrl-C as a person types it: the pty's line discipline sends SIGINT
    terminal.expect("picoclaw: onboarding stopped at a question; nothing was written")
    assert terminal.finish() == 130, terminal.transcript
    assert not home.exists()
    assert "Traceback" not in terminal.transcript
