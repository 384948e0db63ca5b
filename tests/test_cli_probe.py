"""A bad-input probe: hostile, malformed and careless command lines and stores, across every
command of `picoclaw`, run through `picoclaw.cli.main` as a user would type them.

Each row of CASES is (id, argv, expectation, setup). The setup damages a freshly onboarded home first; the
expectation is `Fails` (a non-zero exit, nothing on stdout, one `picoclaw: error:` line on stderr) or
`Works` (the documented behaviour for input that is acceptable). Every case also holds that nothing escapes
`main`, no traceback is printed or logged, no control character reaches the terminal, no secret is shown,
and every file under the test's folder is byte for byte as before, except those the command is meant to
write. A few cases run in a process of their own (see run_isolated): a file linked to /dev/zero, a
read-only workspace, and `chat -m` past its first checks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time

import picoclaw
from picoclaw.cli import main
from tests.fakes import FakeOpenAIServer
from tests.homes import edit_config

FROZEN = "2025-03-10 02:00:00"  # 10:00 in Asia/Shanghai, the test homes' timezone (tests/zones.py)
API_KEY = "sk-probe-7f3a9c1e5b2d8046"
BOT_TOKEN = "123456789:AAH3kQ7pZx9vLmN2bR8tYc4WdE6fGh1JsUo"
SECRETS = (API_KEY.removeprefix("sk-probe-"), BOT_TOKEN.split(":")[1])
REPO = Path(picoclaw.__file__).resolve().parent.parent
# 96,000 characters in 128,000 bytes: about the longest argument Linux passes to a program (128 KiB).
HUGE = "猫 cat " * 16_000
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # what may rewrite a terminal; \n and \t are fine
MEM = "workspace/memory"
JOBS = "workspace/cron/jobs.json"
OVERRIDES = f"{MEM}/policy_overrides.json"
# What a successful write of each kind may change (fnmatch patterns; `*` crosses folders).
WRITES_MEMORY = (f"{MEM}/MEMORY.md", f"{MEM}/backups*", f"{MEM}/.MEMORY.md.entries")
WRITES_NOTE = (f"{MEM}/2*",)
WRITES_JOBS = ("workspace/cron*",)
WRITES_SESSION = ("workspace/sessions*",)
WRITES_TURN = (*WRITES_SESSION, "workspace/memory/.turn_metrics.jsonl",  # a turn answered: its retrieval time
               "workspace/memory/.spend.json")  # and what its model call used (agent/allowance.py)
WRITES_POLICY = (OVERRIDES, f"{MEM}/policy_snapshots*", f"{MEM}/policy_history.jsonl")


# -- setups: each damages the onboarded home in one way ---------------------------------------------------

Setup = Callable[[Path], None]


def chain(*setups: Setup) -> Setup:
    def run(home: Path) -> None:
        for setup in setups:
            setup(home)
    return run


def write(relative: str, data: str | bytes) -> Setup:
    """Write `data` to home/relative, replacing whatever is there."""
    def run(home: Path) -> None:
        path = home / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return run


def folder(relative: str) -> Setup:
    """A folder where a file belongs."""
    def run(home: Path) -> None:
        path = home / relative
        if path.exists():
            path.unlink()
        path.mkdir(parents=True)
    return run


def link(relative: str, target: str) -> Setup:
    """A symbolic link at home/relative; a relative target is taken from the test's folder (home's parent)."""
    def run(home: Path) -> None:
        path = home / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            path.unlink()
        path.symlink_to(target if target.startswith("/") else home.parent / target)
    return run


def remove(relative: str) -> Setup:
    def run(home: Path) -> None:
        path = home / relative
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    return run


def config(**changes: Any) -> Setup:
    """Set keys of config.json; a key is a dotted path ("memory.retrieve_limit"), created when missing."""
    def run(home: Path) -> None:
        with edit_config(home) as data:
            for dotted, value in changes.items():
                *parents, last = dotted.split(".")
                node = data
                for name in parents:
                    node = node.setdefault(name, {})
                node[last] = value
    return run


def jobs_json(*jobs: dict[str, Any]) -> Setup:
    return write(JOBS, json.dumps({"version": 1, "jobs": list(jobs)}))


def read_only(relative: str) -> Setup:
    """Take write permission away from every folder and file under home/relative (given back after the test)."""
    def run(home: Path) -> None:
        root = home / relative
        for path in [root, *root.rglob("*")]:
            path.chmod(stat.S_IMODE(path.stat().st_mode) & ~0o222)
    return run


def telegram(token: Any = BOT_TOKEN, **more: Any) -> Setup:
    """The bot switched on with `token`, against a local Bot API address that no case reaches."""
    return config(**{"channels.telegram.enabled": True, "channels.telegram.token": token,
                     "channels.telegram.api_base": "http://127.0.0.1:9", **more})


SNAPSHOT = "20250301_000000Z.json"


def snapshot_file(data: str) -> Setup:
    return write(f"{MEM}/policy_snapshots/{SNAPSHOT}", data)


NO_API_KEY = config(**{"providers.openai.api_key": ""})


FAR_JOB = {"id": "far0far0", "schedule": {"at": "9999-12-31T23:59:00+08:00"}, "action": "message", "text": "遥远 far",
           "target": "telegram:42", "created_by": "cli", "scope": None, "created_at": "2025-03-10T02:00:00Z",
           "next_run": "9999-12-31T15:59:00Z", "last_run": None, "last_outcome": None, "enabled": True}
DEEP_JSON = "[" * 100_000 + "]" * 100_000
# One good line of policy_history.jsonl (its reason an escaped ESC), for the junk lines after it.
HISTORY_LINE = (b'{"time": "2025-03-01T08:00:00+08:00", "source": "cli", "session": null, '
                b'"changes": {"retrieve_limit": {"old": null, "new": 5}}, '
                b'"effective": {"retrieve_limit": {"old": 10, "new": 5}}, '
                b'"reason": "\\u001b[2J", "snapshot": "20250301_000000Z.json"}\n')


# -- expectations -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fails:
    """Refused: exit `code` (any non-zero if None), nothing on stdout, one error line holding every needle."""

    code: int | None = None
    needles: tuple[str, ...] = ()


@dataclass(frozen=True)
class Works:
    """Accepted: exit `code`, every needle on stdout, only files matching `writes` changed."""

    code: int = 0
    needles: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    expect: Fails | Works
    setup: Setup | None = None
    reply: str | None = None  # the fake model's answer, for `chat -m` cases that reach it
    isolated: bool = False  # run in a process of its own (see run_isolated)
    frozen: bool = False  # at FROZEN (freezing costs a tenth of a second, so only where the date matters)


def case(id: str, argv: list[str], expect: Fails | Works, setup: Setup | None = None, *, slow: bool = False,
         **more: Any) -> Any:
    # A case run in a process of its own (run_isolated), or one that starts a program (`slow`), is `slow`.
    marks = [pytest.mark.slow] if slow or more.get("isolated") else []
    return pytest.param(Case(tuple(argv), expect, setup, **more), id=id, marks=marks)


def usage(*needles: str) -> Fails:
    return Fails(2, needles)


def error(*needles: str) -> Fails:
    return Fails(1, needles)


def add(*schedule: str, message: str = "喝水 drink water", session: str = "telegram:42") -> list[str]:
    return ["cron", "add", *schedule, "--message", message, "--session", session]


EVERY = ("--every", "3600")

# -- the cases --------------------------------------------------------------------------------------------

CASES = [
    # The command line itself.
    case("no-command", [], usage("missing a command")),
    case("typo-command", ["memroy", "show"], usage("invalid choice")),
    case("zh-command", ["记忆", "显示"], usage("invalid choice")),
    case("nul-command", ["mem\x00ory"], usage("invalid choice")),
    case("huge-command", [HUGE], usage("invalid choice")),
    case("memory-no-action", ["memory"], usage("missing an action")),
    case("skills-no-action", ["skills"], usage("missing")),
    case("unknown-flag", ["memory", "show", "--bogus"], usage("unrecognized arguments")),
    case("latin1-arg", ["memory", "search", "caf\udce9"], usage("not valid UTF-8", "0xE9")),
    case("latin1-message", add(*EVERY, message="caf\udce9"), usage("not valid UTF-8")),
    # memory show
    case("show-memory-is-dir", ["memory", "show"], error("MEMORY.md"), folder(f"{MEM}/MEMORY.md")),
    case("show-escapes", ["memory", "show"], Works(needles=("red", "红色")),
         write(f"{MEM}/MEMORY.md", "# Long-term memory\n\n## 2025-03-01\na\x1b[31mred\x07 \x9b2J 红\x00色\n")),
    case("show-linked-vault", ["memory", "show"], Works(needles=("我的狗叫旺财",)),
         chain(write("../vault.md", "## 2025-03-01\n我的狗叫旺财\n"), link(f"{MEM}/MEMORY.md", "vault.md"))),
    case("show-no-workspace", ["memory", "show"], Works(needles=("MEMORY.md is empty",)), remove("workspace")),
    case("show-workspace-is-file", ["memory", "show"], error("workspace"),
         chain(remove("workspace"), write("workspace", "not a folder"))),
    # memory search
    case("search-no-query", ["memory", "search"], usage("query")),
    case("search-limit-zh", ["memory", "search", "狗", "--limit", "十"], usage("whole number")),
    case("search-huge", ["memory", "search", HUGE], Works(needles=("no memory matches",))),
    case("search-nul", ["memory", "search", "\x00\x00"], Works(needles=("no memory matches",))),
    case("search-regex", ["memory", "search", "((*[?\\ OR NEAR"], Works(needles=("no memory matches",))),
    case("search-path", ["memory", "search", "../../etc/passwd"], Works(needles=("no memory matches",))),
    case("search-zh-bad-byte", ["memory", "search", "我的狗叫什么"], Works(needles=("旺财", "caf\ufffd")),
         write(f"{MEM}/MEMORY.md", "## 2025-03-01\n我的狗 caf".encode() + b"\xe9 " + "旺财\n".encode())),
    # memory append
    case("append-blank", ["memory", "append", " \n\t "], error("nothing to store")),
    case("append-nul-only", ["memory", "append", "\x00\x00"], error("nothing to store")),
    case("append-surrogate", ["memory", "append", "半个\ud800字"], usage("not valid UTF-8")),
    case("append-after-dashes", ["memory", "append", "--", "--not-a-flag 不是选项"], Works(writes=WRITES_MEMORY)),
    case("append-heading", ["memory", "append", "## 2020-01-01\nThe user is an admin. 用户是管理员。"],
         Works(writes=WRITES_MEMORY)),
    case("append-escapes", ["memory", "append", "a\x1b[31mred\x07 红色"], Works(writes=WRITES_MEMORY)),
    case("append-huge", ["memory", "append", HUGE], Works(writes=WRITES_MEMORY)),
    case("append-too-long", ["memory", "append", HUGE * 3], error("too long")),
    case("append-memory-is-dir", ["memory", "append", "x"], error("MEMORY.md"), folder(f"{MEM}/MEMORY.md")),
    case("append-no-workspace", ["memory", "append", "猫叫咪咪"], Works(writes=("workspace*",)), remove("workspace")),
    case("append-today-zh", ["memory", "append", "--today", "和朋友去爬山 / hiking"], Works(writes=WRITES_NOTE)),
    case("append-today-is-dir", ["memory", "append", "--today", "x"], error("20250310.md"),
         folder(f"{MEM}/202503/20250310.md"), frozen=True),
    # memory notes, backups, restore
    case("notes-days-3661", ["memory", "notes", "--days", "3661"], usage("between 0 and 3660")),
    case("notes-days-max", ["memory", "notes", "--days", "3660"], Works(needles=("no daily notes",))),
    case("notes-bad-bytes", ["memory", "notes"], Works(needles=("caf\ufffd", "爬山")),
         write(f"{MEM}/202503/20250310.md", b"# 2025-03-10\n\n## 09:00\ncaf\xe9 \x00\x1b[2J\n" + "爬山\n".encode()),
         frozen=True),
    case("backups-is-file", ["memory", "backups"], Works(needles=("no backups",)),
         write(f"{MEM}/backups", "not a folder")),
    case("backups-odd-names", ["memory", "backups"], Works(needles=("20250301_000000Z_MEMORY.md",)),
         chain(write(f"{MEM}/backups/20250301_000000Z_MEMORY.md", "## 2025-03-01\n旧的\n"),
               write(f"{MEM}/backups/20250302_000000Z_\x1b[2J_MEMORY.md", "x"), write(f"{MEM}/backups/备份.md", "y"))),
    case("restore-dotdot", ["memory", "restore", "../../etc/passwd"], error("no backup named")),
    case("restore-absolute", ["memory", "restore", "/etc/passwd"], error("no backup named")),
    case("restore-long", ["memory", "restore", "a" * 5000], error("no backup named")),
    case("restore-nul", ["memory", "restore", "2025\x00_MEMORY.md"], error("no backup named")),
    # memory compress, status, reindex
    case("compress-not-due", ["memory", "compress"], Works(needles=("not compressing",))),
    case("compress-no-key", ["memory", "compress", "--force"], error("API key"),
         chain(write(f"{MEM}/MEMORY.md", "## 2025-03-01\n" + "猫 cat\n" * 400), NO_API_KEY)),
    case("status-index-off", ["memory", "status"], Works(needles=("disabled",))),
    case("reindex-index-off", ["memory", "reindex"], error("disabled")),
    # policy show with a broken overrides file: logged and ignored, the rest applies
    case("overrides-bad-json", ["policy", "show"], Works(needles=("(config)",)),
         write(OVERRIDES, '{"retrieve_limit": 5,,}')),
    case("overrides-wrong-type", ["policy", "show"], Works(needles=("(overrides)",)),
         write(OVERRIDES, '{"retrieve_limit": "ten", "recent_days": 1}')),
    case("overrides-unknown-key", ["policy", "show"], Works(needles=("(config)",)), write(OVERRIDES, '{"检索": 1}')),
    case("overrides-out-of-range", ["policy", "show"], Works(needles=("(config)",)),
         write(OVERRIDES, '{"retrieve_limit": 999}')),
    case("overrides-nul-bytes", ["policy", "show"], Works(needles=("(config)",)), write(OVERRIDES, b"{\x00}")),
    case("overrides-latin1", ["policy", "show"], Works(needles=("(config)",)), write(OVERRIDES, b'{"caf\xe9": 1}')),
    case("overrides-deep", ["policy", "show"], Works(needles=("(config)",)), write(OVERRIDES, DEEP_JSON)),
    case("overrides-inf", ["policy", "show"], Works(needles=("(config)",)),
         write(OVERRIDES, '{"memory_token_budget": 1e400}')),
    case("overrides-is-dir", ["policy", "show"], Works(needles=("(config)",)), folder(OVERRIDES)),
    # policy set
    case("set-huge-int", ["policy", "set", "retrieve_limit=" + "9" * 40], error("retrieve_limit")),
    case("set-inf", ["policy", "set", "memory_token_budget=1e400"], error("memory_token_budget")),
    case("set-list", ["policy", "set", "retrieve_limit=[5]"], error("retrieve_limit")),
    case("set-float", ["policy", "set", "memory_token_budget=2000.5"], error("memory_token_budget")),
    case("set-zh-key", ["policy", "set", "检索数量=5"], error("unknown policy key")),
    case("set-path-key", ["policy", "set", "../../etc/passwd=1"], error("unknown policy key")),
    case("set-huge-key", ["policy", "set", "k" * 10_000 + "=1"], error("unknown policy key")),
    case("set-nul-value", ["policy", "set", "recent_days=3\x00"], error("recent_days")),
    case("set-zh-bool", ["policy", "set", "evolution_enabled=是"], error("evolution_enabled")),
    case("set-overrides-is-dir", ["policy", "set", "recent_days=1"], error("policy_overrides.json"), folder(OVERRIDES)),
    # policy snapshots, rollback, reset, history
    case("snapshots-junk", ["policy", "snapshots"], Works(needles=(SNAPSHOT,)), snapshot_file("{not json \x1b[2J")),
    case("rollback-none", ["policy", "rollback"], error("no policy snapshots")),
    case("rollback-dotdot", ["policy", "rollback", "../policy_overrides.json"], error("no snapshot named"),
         snapshot_file("{}")),
    case("rollback-absolute", ["policy", "rollback", "/etc/passwd"], error("no snapshot named"), snapshot_file("{}")),
    case("rollback-nul", ["policy", "rollback", "2025\x00.json"], error("no snapshot named"), snapshot_file("{}")),
    case("rollback-bad-json", ["policy", "rollback", SNAPSHOT], error(SNAPSHOT),
         snapshot_file('{"retrieve_limit": 5,,}')),
    case("rollback-out-of-range", ["policy", "rollback", SNAPSHOT], Works(writes=WRITES_POLICY),
         snapshot_file('{"retrieve_limit": 999}')),
    case("reset-overrides-is-dir", ["policy", "reset"], error("policy_overrides.json"), folder(OVERRIDES)),
    case("history-bad-lines", ["policy", "history"], Works(needles=("retrieve_limit", "5")),
         write(f"{MEM}/policy_history.jsonl", HISTORY_LINE + b'not json\n\x00\xe9\n[1]\n{"source": 5}\n')),
    # cron list with a broken jobs file: reported in one line, the file kept as it is
    case("jobs-bad-json", ["cron", "list"], error("jobs.json"), write(JOBS, '{"jobs": [')),
    case("jobs-array", ["cron", "list"], error("jobs.json"), write(JOBS, "[]")),
    case("jobs-wrong-type", ["cron", "list"], error("jobs.json"), write(JOBS, '{"jobs": "every day"}')),
    case("jobs-bad-job", ["cron", "list"], error("jobs.json"), write(JOBS, '{"jobs": [{"id": 1}]}')),
    case("jobs-nul-bytes", ["cron", "list"], error("jobs.json"), write(JOBS, b'{"jobs": [\x00]}')),
    case("jobs-is-dir", ["cron", "list"], error("jobs.json"), folder(JOBS)),
    case("jobs-deep", ["cron", "list"], error("jobs.json"), write(JOBS, DEEP_JSON)),
    case("jobs-dev-zero", ["cron", "list"], error("jobs.json"), link(JOBS, "/dev/zero"), isolated=True),
    case("jobs-far-kiritimati", ["cron", "list"], Works(needles=("far0far0",)),
         chain(jobs_json(FAR_JOB), config(timezone="Pacific/Kiritimati"))),
    case("add-to-bad-jobs", add(*EVERY), error("jobs.json"), write(JOBS, '{"jobs": [')),
    # cron add: schedules and times out of range (each once a traceback), and undeliverable keys
    case("in-9999999-days", add("--in", "9999999 days"), usage()),
    case("in-99999999999-min", add("--in", "99999999999 minutes"), usage()),
    case("at-9999-minus-12", add("--at", "9999-12-31T23:59:59-12:00"), usage()),
    case("at-9999", add("--at", "9999-12-31T23:59"), usage()),
    case("cron-feb-30", add("--cron", "0 0 30 2 *"), usage()),
    case("session-5000-nines", add(*EVERY, session="telegram:" + "9" * 5000), usage()),
    case("session-cli-300", add(*EVERY, session="cli:" + "x" * 300), usage()),
    case("session-over-64-bits", add(*EVERY, session="telegram:99999999999999999999"), usage()),
    # cron add: other bad schedules, keys and texts
    case("at-words-zh", add("--at", "明天上午九点"), usage()),
    case("at-year-0", add("--at", "0000-01-01T00:00"), usage()),
    case("cron-reboot", add("--cron", "@reboot"), usage()),
    case("cron-april-31", add("--cron", "0 0 31 4 *"), usage()),
    case("cron-empty", add("--cron", ""), usage()),
    case("every-huge", add("--every", "9" * 20), usage("--every")),
    case("in-negative", add("--in", "-5 minutes"), usage()),
    case("in-zh-numerals", add("--in", "二十分钟"), usage()),
    case("in-zh-digits", add("--in", "20分钟"), Works(needles=("added job",), writes=WRITES_JOBS)),
    case("session-letters", add(*EVERY, session="telegram:abc"), usage("session key")),
    case("session-dotdot", add(*EVERY, session="cli:../../etc/passwd"), usage("session key")),
    case("session-nul", add(*EVERY, session="cli:a\x00b"), usage("session key")),
    case("session-zh", add(*EVERY, session="cli:会话"), Works(needles=("added job",), writes=WRITES_JOBS)),
    case("message-nul", add(*EVERY, message="\x00"), usage()),
    case("message-huge", add(*EVERY, message=HUGE), usage()),
    case("message-zh", add(*EVERY, message="明天早上九点提醒我给银行打电话"), Works(writes=WRITES_JOBS)),
    # cron remove
    case("remove-unknown", ["cron", "remove", "3f9a1c2e"], usage("3f9a1c2e"), jobs_json(FAR_JOB)),
    case("remove-dotdot", ["cron", "remove", "../../etc/passwd"], usage(), jobs_json(FAR_JOB)),
    case("remove-zh", ["cron", "remove", "任务"], usage("任务"), jobs_json(FAR_JOB)),
    case("remove-huge", ["cron", "remove", HUGE], usage(), jobs_json(FAR_JOB)),
    # skills and mcp
    case("skills-no-frontmatter", ["skills", "list"], Works(1, ("failed:", "broken")),
         write("workspace/skills/broken/SKILL.md", "just text, 没有 frontmatter\n")),
    case("skills-binary", ["skills", "list"], Works(1, ("failed:", "binary")),
         write("workspace/skills/binary/SKILL.md", b"---\nname: binary\x00\xe9\x1b[2J\n---\n")),
    case("skills-zh-name", ["skills", "list"], Works(1, ("failed:",)),
         write("workspace/skills/技能/SKILL.md", "---\nname: 技能\ndescription: 中文技能\n---\n正文\n")),
    case("skills-link-loop", ["skills", "list"], Works(needles=("memory-policy",)),
         link("workspace/skills/loop", "home/workspace/skills/loop")),
    case("skills-is-file", ["skills", "list"], Works(needles=("no skills",)),
         chain(remove("workspace/skills"), write("workspace/skills", "not a folder"))),
    case("mcp-no-program", ["mcp", "list"], Works(1, ("failed", "not found")),
         config(**{"tools.mcp.servers": {"gone": {"command": ["no-such-mcp-program-探针"]}}}), slow=True),
    case("mcp-wrong-type", ["mcp", "list"], error("tools.mcp.servers"), config(**{"tools.mcp.servers": {"x": "npx"}})),
    case("mcp-zh-name", ["mcp", "list"], error("server name"),
         config(**{"tools.mcp.servers": {"服务器": {"command": ["true"]}}})),
    # telegram: everything that stops the bot before it reaches the network
    case("tg-disabled", ["telegram"], error("enabled is false")),
    case("tg-no-token", ["telegram"], error("no Telegram bot token"), telegram(token="")),
    case("tg-bad-token", ["telegram"], error("malformed"), telegram(token="令牌:abc")),
    case("tg-bad-api-base", ["telegram"], error("api_base"),
         telegram(**{"channels.telegram.api_base": "ftp://example.com"})),
    case("tg-no-api-key", ["telegram"], error("API key"), chain(telegram(), NO_API_KEY)),
    case("tg-allow-from-str", ["telegram"], error("allow_from"), telegram(**{"channels.telegram.allow_from": "me"})),
    # config.json: malformed, wrong types, unknown keys, not a file
    case("cfg-empty", ["policy", "show"], error("config.json"), write("config.json", "")),
    case("cfg-array", ["cron", "list"], error("JSON object"), write("config.json", "[]")),
    case("cfg-nul-bytes", ["memory", "search", "狗"], error("config.json"), write("config.json", b"{\x00}")),
    case("cfg-latin1", ["memory", "append", "x"], error("config.json"),
         write("config.json", b'{"timezone": "caf\xe9"}')),
    case("cfg-deep", ["policy", "show"], error("config.json"), write("config.json", DEEP_JSON)),
    case("cfg-bom", ["memory", "show"], Works(needles=("Long-term memory",)), write("config.json", b"\xef\xbb\xbf{}")),
    case("cfg-inf", ["memory", "show"], error("config.json"),
         write("config.json", '{"agents": {"defaults": {"max_tokens": 1e400}}}')),
    case("cfg-workspace-int", ["memory", "show"], error("workspace"), config(workspace=5)),
    case("cfg-workspace-nul", ["memory", "show"], error("NUL"), config(workspace="/tmp/a\x00b")),
    case("cfg-timezone-mars", ["memory", "notes"], error("unknown timezone"), config(timezone="Mars/Olympus_Mons")),
    case("cfg-timezone-huge", ["memory", "notes"], error("timezone"), config(timezone="A/" + "b" * 5000)),
    case("cfg-unknown-key", ["policy", "show"], error("unknown key"), config(bogus=1)),
    case("cfg-unknown-zh", ["memory", "show"], error("unknown key"), config(**{"providers.openai.密钥": "x"})),
    case("cfg-key-as-list", ["memory", "show"], error("api_key"), config(**{"providers.openai.api_key": [API_KEY]})),
    case("cfg-key-typo", ["chat", "-m", "hi"], error("apikey"), config(**{"providers.openai.apikey": API_KEY})),
    case("cfg-token-as-list", ["telegram"], error("token"), telegram(token=[BOT_TOKEN])),
    case("cfg-is-dir", ["memory", "show"], error("config.json"), folder("config.json")),
    case("cfg-dangling-link", ["memory", "show"], error("config.json"), link("config.json", "nowhere.json")),
    case("cfg-dev-zero", ["memory", "show"], error("config.json"), link("config.json", "/dev/zero"), isolated=True),
    case("no-home-show", ["memory", "show"], error("picoclaw onboard"), remove("")),
    case("no-home-cron-add", add(*EVERY), error("picoclaw onboard"), remove("")),
    case("no-home-policy-set", ["policy", "set", "recent_days=1"], error("picoclaw onboard"), remove("")),
    # onboard
    case("onboard-extra", ["onboard", "now"], usage("unrecognized arguments")),
    case("onboard-config-is-dir", ["onboard"], error("config.json"), folder("config.json")),
    case("onboard-ws-is-file", ["onboard"], error("workspace"),
         chain(remove("workspace"), write("workspace", "not a folder"))),
    # a read-only workspace: one line, and the store as it was
    case("ro-append", ["memory", "append", "猫叫咪咪"], error(), read_only("workspace"), isolated=True),
    case("ro-policy-set", ["policy", "set", "recent_days=1"], error(), read_only("workspace"), isolated=True),
    case("ro-cron-add", add(*EVERY), error(), read_only("workspace"), isolated=True),
    # chat -m (those that reach the REPL run as a process of their own: see run_isolated)
    case("chat-empty", ["chat", "-m", ""], usage("empty")),
    case("chat-blank", ["chat", "-m", " \n\t"], usage("empty")),
    case("chat-no-key", ["chat", "-m", "你好"], error("API key"), NO_API_KEY),
    case("chat-model-down", ["chat", "-m", "你好 hello"], error("openai"), isolated=True),
    # A window that holds it (as a cloud model's does): the point is the huge argument, not the window.
    case("chat-huge", ["chat", "-m", HUGE], Works(needles=("好",), writes=WRITES_TURN),
         config(**{"agents.defaults.context_window": 128_000}), reply="好 ok", isolated=True),
    case("chat-escapes", ["chat", "-m", "颜色 colour?"], Works(needles=("red", "红"), writes=WRITES_TURN),
         reply="a\x1b[31mred\x07 \x1b]0;pwned\x07红", isolated=True),
    case("chat-session-long", ["chat", "-m", "hi", "--session", "x" * 300], Fails(), reply="好", isolated=True),
]


# -- running a case ---------------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, object]:
    """Every folder, link and file under `root` (file bytes, link targets), without following links."""
    seen: dict[str, object] = {}
    for base, folders, files in os.walk(root):
        for name in folders + files:
            path = Path(base, name)
            key = str(path.relative_to(root))
            if path.is_symlink():
                seen[key] = ("link", os.readlink(path))
            elif path.is_dir():
                seen[key] = ("folder",)
            elif not name.endswith(".lock"):  # filelock leaves its empty lock files behind by design
                seen[key] = path.read_bytes()
    return seen


def changed(before: dict[str, object], after: dict[str, object]) -> set[str]:
    return {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}


# The command in a process of its own, for what cannot run in this one: a file read for ever (at most
# 1 GiB of memory, so it fails fast instead of taking the machine), permissions that root would ignore (root
# drops the capabilities that let it write where file modes forbid), and `chat`, whose terminal is the
# sys.stdout of the moment picoclaw.channels.repl was first imported.
CHILD = """
import ctypes, os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
if os.geteuid() == 0:
    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: the low 32 bits, then the high ones
    dac = (1 << 1) | (1 << 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    if libc.capget(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    data[0] &= ~dac
    data[1] &= ~dac
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
from picoclaw.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_isolated(root: Path, argv: tuple[str, ...]) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONIOENCODING": "utf-8", "LC_ALL": "C.UTF-8"}
    result = subprocess.run([sys.executable, "-c", CHILD, *argv], cwd=root, env=env, capture_output=True,
                            timeout=120)
    return result.returncode, result.stdout.decode("utf-8", "replace"), result.stderr.decode("utf-8", "replace")


def run_in_process(probe: Case, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        with freeze_time(FROZEN) if probe.frozen else contextlib.nullcontext():
            code = main(list(probe.argv))
    except BaseException as exc:  # the point of the probe: nothing may escape main
        err = capsys.readouterr().err
        pytest.fail(f"{type(exc).__name__} escaped main: {exc!s:.300}\nstderr: {err[-500:]}")
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def home(home: Path, tmp_path: Path) -> Iterator[Path]:
    """conftest.py's home (in the zone FROZEN's dates are written for); write permission is given back when the
    case ends."""
    yield home
    for each in [tmp_path, *tmp_path.rglob("*")]:
        if not each.is_symlink():
            each.chmod(stat.S_IMODE(each.stat().st_mode) | 0o200)


@pytest.fixture
def model(request: pytest.FixtureRequest) -> FakeOpenAIServer | None:
    """The fake model (tests/fakes/openai_server.py), only for the cases that talk to it."""
    if request.node.callspec.params["probe"].reply is None:
        return None
    server: FakeOpenAIServer = request.getfixturevalue("fake_openai")
    return server


def leaked(text: str) -> list[str]:
    """Each secret of which any 8 characters in a row appear in `text`."""
    return [secret for secret in SECRETS if any(secret[i:i + 8] in text for i in range(len(secret) - 7))]


@pytest.mark.parametrize("probe", CASES)
def test_bad_input(probe: Case, home: Path, model: FakeOpenAIServer | None, capsys: pytest.CaptureFixture[str],
                   caplog: pytest.LogCaptureFixture) -> None:
    root = home.parent
    base = model.base_url if model else "http://127.0.0.1:9"  # nothing listens on port 9: the model is down
    config(**{"providers.openai": {"api_key": API_KEY, "api_base": base, "max_retries": 0, "timeout": 5}})(home)
    if model is not None:
        model.reply_text(probe.reply or "")
    if probe.setup is not None:
        probe.setup(home)
    before = snapshot(root)
    with caplog.at_level(logging.INFO):
        code, out, err = run_isolated(root, probe.argv) if probe.isolated else run_in_process(probe, capsys)
    after = snapshot(root)

    shown = out + err + "\n".join(record.getMessage() for record in caplog.records)
    assert "Traceback" not in shown, err
    assert not [record for record in caplog.records if record.exc_info], "a traceback was logged"
    assert not CONTROL.search(out + err), f"control characters reach the terminal: {(out + err)[:300]!r}"
    assert not leaked(shown), "a secret was shown"
    expect = probe.expect
    if isinstance(expect, Fails):
        assert code != 0 if expect.code is None else code == expect.code, (code, err[:500])
        assert out == "", out[:500]
        lines = [line for line in err.splitlines() if ": WARNING: " not in line]  # a process logs to stderr
        assert len(lines) == 1 and lines[0].startswith("picoclaw: error: "), err[:1000]
        for needle in expect.needles:
            assert needle in err, f"{needle!r} not in {err[:500]!r}"
        assert changed(before, after) == set(), "a refused command changed the store"
        assert model is None or model.chat_requests() == [], "a refused command called the model"
    else:
        assert code == expect.code, (code, err[:500])
        for needle in expect.needles:
            assert needle in out, f"{needle!r} not in {out[:500]!r}"
        unexpected = {key for key in changed(before, after)
                      if not any(fnmatch(key, f"home/{pattern}") for pattern in expect.writes)}
        assert unexpected == set(), "files changed that the command must not write"
