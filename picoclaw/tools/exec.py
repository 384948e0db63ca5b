"""exec: run a command in the workspace, when the owner turned it on (`tools.exec.enabled`).

The guards are a seat belt, not a sandbox: the command runs as the user who runs picoclaw and can do
what that user can. What they stop is the obvious accident: a deny list (wiping `/` or home, mkfs, dd
onto a device, fork bombs, shutdown, writes and redirections to absolute paths outside the workspace),
no shell unless `tools.exec.shell`, a timeout that kills the whole process group, truncated output, and
an environment without API keys and tokens. Every call is logged with the session it came from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shlex
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from picoclaw.config import ExecConfig
from picoclaw.memory import Workspace
from picoclaw.tools.base import Tool, ToolError, current_session

log = logging.getLogger(__name__)

# Names of environment variables that never reach the command (compared upper-cased).
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
SECRET_PREFIXES = ("OPENAI_", "TELEGRAM_")

_ROOTISH = (r"(?:/|/\*|~|~/|~/\*|\$HOME|\$HOME/|\$\{HOME\}|\$HOME/\*"
            r"|/(?:bin|boot|dev|etc|lib|lib64|opt|proc|root|sbin|sys|usr|var|home|Users|System)/?\*?)")
DENY_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\brm\s+(?:-\S+\s+)*(?:-\S*[rRf]\S*\s+)+(?:-\S+\s+)*" + _ROOTISH + r"(?=\s|$|;|&|\|)",
     "recursive delete of / , home or a system folder"),
    (r"--no-preserve-root", "rm --no-preserve-root"),
    (r"\b(?:mkfs(?:\.\w+)?|mke2fs|mkswap|wipefs|fdisk|sfdisk|parted|shred)\b", "formatting or wiping a disk"),
    (r"\bdd\b[^;&|]*\bof=/dev/", "dd onto a device"),
    (r"(\w+|:)\s*\(\)\s*\{[^}]*\1\s*\|\s*\1\s*&", "a fork bomb"),
    (r"\b(?:shutdown|reboot|halt|poweroff)\b|\binit\s+[06]\b|\bsystemctl\s+(?:poweroff|reboot|halt|suspend)\b",
     "shutting down or rebooting the machine"),
    (r"\bchmod\s+(?:-\S+\s+)*-\S*R\S*\s+(?:\S+\s+)?" + _ROOTISH + r"(?=\s|$)", "recursive chmod of / or home"),
    (r"\bchown\s+(?:-\S+\s+)*-\S*R\S*\s+(?:\S+\s+)?" + _ROOTISH + r"(?=\s|$)", "recursive chown of / or home"),
    (r">\s*/dev/(?:sd|hd|nvme|vd|xvd|mmcblk|disk)", "writing onto a disk device"),
)
_COMPILED = tuple((re.compile(pattern), why) for pattern, why in DENY_PATTERNS)
# Commands whose path arguments they write (all of them, or only the last: the destination).
_WRITES_ALL = frozenset({"rm", "rmdir", "touch", "mkdir", "truncate", "chmod", "chown", "tee", "shred", "unlink"})
_WRITES_LAST = frozenset({"cp", "mv", "ln", "install", "rsync"})
_HARMLESS_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"})
_SHELL_OPERATORS = frozenset({"|", "||", "&", "&&", ";", ">", ">>", "<", "<<", "2>", "2>>", "&>", "$(", "`"})


@dataclass(frozen=True)
class ExecResult:
    """A finished command: exit code (None when killed at the timeout), output and whether it was cut."""

    exit_code: int | None
    output: str
    timed_out: bool
    seconds: float


def safe_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """`environ` (default: this process's) without variables that look like secrets."""
    source = dict(os.environ if environ is None else environ)
    return {name: value for name, value in source.items()
            if not any(marker in name.upper() for marker in SECRET_MARKERS)
            and not name.upper().startswith(SECRET_PREFIXES)}


def _outside(path_text: str, root: Path) -> bool:
    """Whether a path the command writes lies outside the workspace (`~` and absolute ones are checked)."""
    if path_text in _HARMLESS_TARGETS:
        return False
    if path_text.startswith("~") or path_text.startswith("$HOME") or path_text.startswith("${HOME}"):
        return True
    candidate = Path(path_text) if path_text.startswith("/") else root / path_text
    real, base = os.path.realpath(candidate), os.path.realpath(root)
    return os.path.commonpath([real, base]) != base


def denied(command: str, root: Path, extra: list[str] | None = None) -> str | None:
    """Why `command` is refused, or None. A seat belt: it catches accidents, not a determined attacker."""
    for pattern, why in _COMPILED:
        if pattern.search(command):
            return why
    for pattern_text in extra or []:
        if re.search(pattern_text, command):
            return f"matches the configured deny pattern {pattern_text}"
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError as exc:
        return f"it cannot be parsed ({exc})"
    # Simple commands between operators; each redirection target and each written path is checked.
    segment: list[str] = []
    for n, token in enumerate([*tokens, ";"]):
        if token and set(token) <= set("<>&|;()"):
            if ">" in token and n + 1 < len(tokens) and _outside(tokens[n + 1], root):
                return f"it writes outside the workspace ({tokens[n + 1]})"
            writes = _segment_writes_outside(segment, root)
            if writes:
                return writes
            segment = []
        else:
            segment.append(token)
    return None


def _segment_writes_outside(segment: list[str], root: Path) -> str | None:
    words = list(segment)
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]):  # VAR=value prefixes set the environment
        words.pop(0)
    while words and words[0] in ("sudo", "env", "nice", "nohup", "command", "exec", "time"):
        words = words[1:]
    if not words:
        return None
    program = os.path.basename(words[0])
    paths = [w for w in words[1:] if not w.startswith("-")]
    if program == "dd":
        paths = [w.removeprefix("of=") for w in words[1:] if w.startswith("of=")]
    elif program in _WRITES_LAST:
        paths = paths[-1:]
    elif program not in _WRITES_ALL:
        return None
    for path in paths:
        if _outside(path, root):
            return f"{program} would write outside the workspace ({path})"
    return None


async def run_command(command: str, cwd: Path, config: ExecConfig) -> ExecResult:
    """Run `command` in `cwd` with the config's shell, timeout and output limit; never blocks the loop."""
    env = safe_environment()
    started = time.monotonic()
    pipe, devnull, merged = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL, asyncio.subprocess.STDOUT
    # Its own process group (session), so a timeout kills what the command started as well.
    new_session = sys.platform != "win32"
    if config.shell:
        process = await asyncio.create_subprocess_shell(
            command, cwd=cwd, env=env, stdin=devnull, stdout=pipe, stderr=merged, start_new_session=new_session)
    else:
        argv = shlex.split(command)
        if not argv:
            raise ToolError("the command is empty")
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, cwd=cwd, env=env, stdin=devnull, stdout=pipe, stderr=merged, start_new_session=new_session)
        except FileNotFoundError:
            raise ToolError(f"no such program: {argv[0]}") from None
        except PermissionError:
            raise ToolError(f"not allowed to run {argv[0]}") from None
    limit = config.max_output_chars * 4  # bytes kept: enough for max_output_chars of UTF-8
    head, tail = bytearray(), bytearray()
    dropped = 0

    async def collect() -> None:
        nonlocal head, tail, dropped
        assert process.stdout is not None
        while chunk := await process.stdout.read(65536):
            if len(head) < limit // 2:
                room = limit // 2 - len(head)
                head += chunk[:room]
                chunk = chunk[room:]
            tail += chunk
            if len(tail) > limit // 2:  # keep the end too: errors are usually printed last
                dropped += len(tail) - limit // 2
                del tail[:len(tail) - limit // 2]
        await process.wait()

    timed_out = False
    try:
        await asyncio.wait_for(collect(), timeout=config.timeout)
    except TimeoutError:
        timed_out = True
        _kill_group(process)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), timeout=5)
    except asyncio.CancelledError:
        _kill_group(process)
        raise
    output = head.decode("utf-8", errors="replace")
    if dropped:
        output += f"\n[… {dropped} bytes of output left out …]\n"
    output += tail.decode("utf-8", errors="replace")
    if len(output) > config.max_output_chars:
        half = config.max_output_chars // 2
        output = output[:half] + "\n[… output truncated …]\n" + output[-half:]
    return ExecResult(None if timed_out else process.returncode, output, timed_out, time.monotonic() - started)


def _kill_group(process: asyncio.subprocess.Process) -> None:
    try:
        if sys.platform != "win32":
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
    except ProcessLookupError:
        pass


class ExecArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str = Field(min_length=1, max_length=10_000, description="the command line to run")


class Exec(Tool):
    """Runs a command in the workspace folder (only offered when tools.exec.enabled is true)."""

    name = "exec"
    description = ("Run a command in the workspace folder and return its exit code and output (stdout and stderr, "
                   "truncated). It has a timeout. Pipes, redirection and && work only if the owner enabled a "
                   "shell; otherwise the command is split into arguments and run directly. Some dangerous "
                   "commands and writes outside the workspace are refused.")
    Args = ExecArgs

    def __init__(self, workspace: Workspace, files: object = None):
        self.config = workspace.config.tools.exec
        self.cwd = workspace.layout.files_root

    async def run(self, args: ExecArgs) -> str:
        session = current_session.get() or "-"
        command = args.command.strip()
        why = denied(command, self.cwd, self.config.deny_patterns)
        if why is None and not self.config.shell:
            try:
                operators = [t for t in shlex.split(command) if t in _SHELL_OPERATORS]
            except ValueError as exc:
                operators, why = [], f"it cannot be parsed ({exc})"
            if operators:
                why = (f"shell syntax ({operators[0]}) needs tools.exec.shell, which is off: run one program "
                       "with its arguments")
        if why is not None:
            log.warning("exec refused [session %s]: %r: %s", session, command, why)
            raise ToolError(f"refused: {why}")
        self.cwd.mkdir(parents=True, exist_ok=True)
        log.info("exec [session %s] in %s: %r", session, self.cwd, command)
        result = await run_command(command, self.cwd, self.config)
        log.info("exec [session %s] finished: exit %s, %.1f s, %d chars of output%s", session, result.exit_code,
                 result.seconds, len(result.output), " (timed out)" if result.timed_out else "")
        status = (f"timed out after {self.config.timeout:g} s and was killed" if result.timed_out
                  else f"exit code {result.exit_code}")
        return f"{status}\n{result.output.rstrip() or '(no output)'}"
