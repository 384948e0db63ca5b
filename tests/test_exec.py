"""exec: off by default; when on, runs in the workspace with a timeout, a deny list and no secrets in its env."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from picoclaw.config import ExecConfig, ToolsConfig
from picoclaw.memory.workspace import Workspace
from picoclaw.tools.base import ToolRegistry, current_session
from picoclaw.tools.exec import denied, safe_environment
from picoclaw.tools.registry import build_tools
from tests.waiting import wait_until

PY = shlex.quote(sys.executable)


def exec_tools(workspace: Workspace, **settings: Any) -> ToolRegistry:
    config = workspace.config.model_copy(update={"tools": ToolsConfig(exec=ExecConfig(enabled=True, **settings))})
    return build_tools(dataclasses.replace(workspace, config=config))


def run(tools: ToolRegistry, command: str, session: str = "cli:test") -> str:
    async def call() -> str:
        current_session.set(session)
        return await tools.execute("exec", json.dumps({"command": command}))

    return asyncio.run(call())


def test_exec_is_off_by_default(workspace: Workspace) -> None:
    assert workspace.config.tools.exec.enabled is False
    assert "exec" not in build_tools(workspace).tools
    assert "exec" in exec_tools(workspace).tools


def test_runs_in_the_workspace_and_reports_exit_code(workspace: Workspace) -> None:
    tools = exec_tools(workspace)
    out = run(tools, f"{PY} -c \"import os, sys; print(os.getcwd()); sys.exit(3)\"")
    assert out == f"exit code 3\n{workspace.layout.files_root}"
    assert run(tools, f"{PY} -c \"import sys; sys.stderr.write('oops')\"") == "exit code 0\noops"


def test_environment_has_no_keys_or_tokens(workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MY_API_KEY", "GITHUB_TOKEN", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY", "OPENAI_BASE_URL",
                 "TELEGRAM_CHAT"):
        monkeypatch.setenv(name, "leak")
    monkeypatch.setenv("HARMLESS_SETTING", "kept")
    out = run(exec_tools(workspace), f"{PY} -c \"import os, json; print(json.dumps(sorted(os.environ)))\"")
    names = json.loads(out.split("\n", 1)[1])
    assert "HARMLESS_SETTING" in names and "PATH" in names
    assert not {"MY_API_KEY", "GITHUB_TOKEN", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY", "OPENAI_BASE_URL",
                "TELEGRAM_CHAT"} & set(names)
    assert safe_environment({"a_key": "x", "Path": "y"}) == {"Path": "y"}


@pytest.mark.slow
def test_timeout_kills_the_process_group(workspace: Workspace) -> None:
    # A shell and `sleep` start in milliseconds even on a busy machine, so the grandchild runs well before the
    # timeout (two Python start-ups took most of a 0.5 s timeout there).
    started = time.monotonic()
    out = run(exec_tools(workspace, timeout=1, shell=True), "sleep 60 & echo $! > child.pid; echo started; sleep 60")
    assert out == "timed out after 1 s and was killed\nstarted"
    assert time.monotonic() - started < 30  # killed, not left to finish its 60 s
    child = int((workspace.layout.files_root / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)  # the grandchild went with the group


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state  # a zombie is dead, only not yet reaped


def test_output_is_truncated(workspace: Workspace) -> None:
    out = run(exec_tools(workspace, max_output_chars=1000), f"{PY} -c \"print('x' * 100000 + 'TAIL')\"")
    assert len(out) < 1200 and "truncated" in out and out.endswith("TAIL")


def test_no_shell_unless_configured(workspace: Workspace) -> None:
    root = workspace.layout.files_root
    out = run(exec_tools(workspace), "echo hi > made.txt")
    assert out.startswith("error: refused: shell syntax (>) needs tools.exec.shell")
    assert not (root / "made.txt").exists()
    assert run(exec_tools(workspace, shell=True), "echo hi > made.txt && cat made.txt") == "exit code 0\nhi"


DENIED = ["rm -rf /", "rm -rf / --no-preserve-root", "rm -fr ~", "rm -r -f /*", "sudo rm -rf $HOME", "rm -rf /etc",
          "mkfs.ext4 /dev/sda1", "dd if=/dev/zero of=/dev/sda bs=1M", ":(){ :|:& };:", "bomb(){ bomb|bomb& }; bomb",
          "shutdown -h now", "reboot", "systemctl poweroff", "echo pwned > /etc/passwd", "echo x >> ~/.bashrc",
          "cat notes | tee /tmp/elsewhere.txt", "cp notes.txt /usr/local/bin/x", "mv a ../../outside",
          "touch /root/x", "chmod -R 777 /"]
ALLOWED = ["ls -la", "rm -rf build", "echo hi > notes.txt", "cat /etc/hostname", "cp /etc/hostname copy.txt",
           "python3 script.py > /dev/null 2>&1", "dd if=in.img of=out.img", "git status"]


@pytest.mark.parametrize("command", DENIED)
def test_deny_list(workspace: Workspace, command: str) -> None:
    assert denied(command, workspace.layout.files_root) is not None


@pytest.mark.parametrize("command", ALLOWED)
def test_ordinary_commands_pass_the_deny_list(workspace: Workspace, command: str) -> None:
    assert denied(command, workspace.layout.files_root) is None


def test_a_denied_command_never_runs_and_is_logged(workspace: Workspace, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    target = tmp_path / "outside.txt"
    tools = exec_tools(workspace, shell=True, deny_patterns=[r"\bcurl\b"])
    with caplog.at_level(logging.INFO, logger="picoclaw.tools.exec"):
        out = run(tools, f"echo pwned > {target}", session="telegram:42")
        assert out == f"error: refused: it writes outside the workspace ({target})"
        assert run(tools, "curl http://x") == r"error: refused: matches the configured deny pattern \bcurl\b"
        run(tools, "echo fine", session="telegram:42")
    assert not target.exists()
    messages = [r.getMessage() for r in caplog.records]
    assert any("refused [session telegram:42]" in m and str(target) in m for m in messages)
    assert any(m.startswith("exec [session telegram:42] in ") and "'echo fine'" in m for m in messages)
    assert any(m.startswith("exec [session telegram:42] finished: exit 0") for m in messages)


def test_unknown_program(workspace: Workspace) -> None:
    assert run(exec_tools(workspace), "no-such-program-xyz --help") == "error: no such program: no-such-program-xyz"


def test_the_event_loop_keeps_running_during_a_command(workspace: Workspace) -> None:
    # The command waits for a file that only a task on the event loop writes, once the command runs: had exec
    # blocked the loop, the command would wait in vain and give up after 20 s (no count of ticks to race).
    tools = exec_tools(workspace)
    root = workspace.layout.files_root
    script = ("import os, sys, time\nopen('running', 'w').close()\nend = time.monotonic() + 20\n"
              "while not os.path.exists('loop-ran') and time.monotonic() < end:\n    time.sleep(0.01)\n"
              "sys.exit(0 if os.path.exists('loop-ran') else 3)")

    async def both() -> str:
        async def answer() -> None:
            await wait_until(lambda: (root / "running").exists(), timeout=30, what="the command to start")
            (root / "loop-ran").touch()

        helper = asyncio.create_task(answer())
        out = await tools.execute("exec", json.dumps({"command": f"{PY} -c {shlex.quote(script)}"}))
        await helper
        return out

    assert asyncio.run(both()) == "exit code 0\n(no output)"
