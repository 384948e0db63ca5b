"""Every memory read is current: what one machine appends, another machine's read commands and console pages
show at once, with no turn in between (on PostgreSQL two workspace folders on one database; on files one home)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from picoclaw.app import App
from picoclaw.memory import MemoryStore
from picoclaw.storage import StorageUnavailable
from picoclaw.storage.waits import LockWaitExpired
from picoclaw.tools.base import ToolError
from picoclaw.tools.files import os_errors
from tests.fakes.console import Console
from tests.homes import edit_config
from tests.test_cli import assert_one_line_error, run
from tests.zones import onboard_in_shanghai

# (the entry, a search for it, a word of it the notes show) in English and in Chinese
FACTS = [("The office door code is 4711.", "office door code", "4711"),
         ("项目 A 的截止日期是 3 月 15 日。", "项目 A 什么时候截止？", "截止日期")]


def _onboarded(home: Path, dsn: str | None) -> Path:
    """A home onboarded on files, or on the PostgreSQL database `dsn` (the templates go up to it)."""
    onboard_in_shanghai(home)
    if dsn is not None:
        with edit_config(home) as config:
            config["storage"] = {"backend": "postgres", "postgres": {"dsn": dsn}}
        onboard_in_shanghai(home)
    return home


@pytest.fixture(params=["files", "postgres"])
def homes(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Machine A's home and machine B's: on PostgreSQL two workspace folders on one database, on files the same."""
    for name in ("OPENAI_API_KEY", "TELEGRAM_BOT_TOKEN", "PICOCLAW_POSTGRES_DSN"):
        monkeypatch.delenv(name, raising=False)
    if request.param == "files":
        home = _onboarded(tmp_path / "home", None)
        return home, home
    dsn = request.getfixturevalue("postgres_dsn")
    return _onboarded(tmp_path / "a", dsn), _onboarded(tmp_path / "b", dsn)


def _in(home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        *argv: str) -> tuple[int, str, str]:
    """`picoclaw ARGV` run in-process with PICOCLAW_HOME set to `home`."""
    monkeypatch.setenv("PICOCLAW_HOME", str(home))
    return run(capsys, *argv)


def _entries(home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> int:
    """MEMORY.md's entry count, as `memory stats --json` in `home` says."""
    code, out, err = _in(home, monkeypatch, capsys, "memory", "stats", "--json")
    assert code == 0, err
    return next(doc["entries"] for doc in json.loads(out)["documents"] if doc["name"] == "MEMORY.md")


@pytest.mark.parametrize(("fact", "query", "word"), FACTS, ids=["english", "chinese"])
def test_a_second_machine_reads_an_append_at_once(homes: tuple[Path, Path], fact: str, query: str, word: str,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    a, b = homes
    # B reads first, so its folder holds a copy from before the append (a stale one, were reads not refreshed).
    code, out, _ = _in(b, monkeypatch, capsys, "memory", "show")
    assert code == 0 and fact not in out
    before = _entries(b, monkeypatch, capsys)

    code, _, err = _in(a, monkeypatch, capsys, "memory", "append", fact)
    assert (code, err) == (0, "")
    code, out, _ = _in(b, monkeypatch, capsys, "memory", "show")
    assert code == 0 and fact in out
    code, out, _ = _in(b, monkeypatch, capsys, "memory", "search", query)
    assert code == 0 and out.startswith("1. score") and fact in out, out
    assert _entries(b, monkeypatch, capsys) == before + 1

    code, out, _ = _in(b, monkeypatch, capsys, "memory", "notes")
    assert code == 0 and word not in out
    code, _, err = _in(a, monkeypatch, capsys, "memory", "append", "--today", f"Noted: {fact}")
    assert (code, err) == (0, "")
    code, out, _ = _in(b, monkeypatch, capsys, "memory", "notes")
    assert code == 0 and f"Noted: {fact}" in out


def test_a_second_machine_reads_a_policy_change_at_once(homes: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    a, b = homes
    code, out, _ = _in(b, monkeypatch, capsys, "policy", "show")
    assert code == 0 and "(config)" in next(line for line in out.splitlines() if line.startswith("retrieve_limit"))

    code, _, err = _in(a, monkeypatch, capsys, "policy", "set", "retrieve_limit=7")
    assert code == 0, err
    code, out, _ = _in(b, monkeypatch, capsys, "policy", "show")
    shown = next(line for line in out.splitlines() if line.startswith("retrieve_limit"))
    assert code == 0 and shown.split()[1] == "7" and "(config)" not in shown, out
    code, out, _ = _in(b, monkeypatch, capsys, "policy", "history")
    assert code == 0 and "retrieve_limit" in out, out
    code, out, _ = _in(b, monkeypatch, capsys, "policy", "snapshots")
    assert code == 0 and "no snapshots yet" not in out, out


@pytest.fixture
def console_b(homes: tuple[Path, Path]) -> Iterator[Console]:
    """Machine B's web console, started before anything is appended through A."""
    app = App.open(homes[1])
    try:
        with Console(app) as running:
            yield running
    finally:
        app.close()


def test_the_console_pages_show_another_machines_append(homes: tuple[Path, Path], console_b: Console,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    client = httpx2.Client(base_url=console_b.base, follow_redirects=False, timeout=60,
                           headers={"Authorization": f"Bearer {console_b.gate.script_token}"})
    assert "4711" not in client.get("/memory").text  # B's folder is filled before the append
    fact = "The gym locker is 4711. 健身房柜子是 4711。"
    for argv in (("memory", "append", fact), ("memory", "append", "--today", f"Noted: {fact}"),
                 ("memory", "append", "--learning", f"When asked for the locker, say {fact}")):
        code, _, err = _in(homes[0], monkeypatch, capsys, *argv)
        assert (code, err) == (0, ""), err
    for page in ("/memory", "/memory?q=gym+locker+柜子", "/memory/notes", "/memory/lessons"):
        answer = client.get(page)
        assert answer.status_code == 200 and "4711" in answer.text, page
    assert client.get("/memory/stats").status_code == 200
    code, _, err = _in(homes[0], monkeypatch, capsys, "policy", "set", "retrieve_limit=7")
    assert code == 0, err
    assert 'value="7"' in client.get("/policy").text or ">7<" in client.get("/policy").text


def _unreachable(monkeypatch: pytest.MonkeyPatch, message: str) -> None:
    """Every read of the documents port fails as a backend whose server is gone does."""
    from picoclaw.storage.files_documents import FilesDocuments

    def gone(*_: object) -> None:
        raise StorageUnavailable(message)

    for read in ("read", "local", "local_folder", "versions", "version_sizes"):
        monkeypatch.setattr(FilesDocuments, read, gone)


def test_a_read_that_cannot_reach_the_storage_is_one_line(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # Files never fail to be read this way; a backend whose server is gone does, and the read says so instead of
    # showing what it read before as if it were current.
    _unreachable(monkeypatch, "cannot reach the PostgreSQL server at db.example:5432")
    # (`memory status` with the index off reads no document: it has nothing to say about the storage.)
    for argv in (("memory", "show"), ("memory", "search", "door"), ("memory", "stats"), ("memory", "notes"),
                 ("memory", "backups"), ("policy", "show"), ("policy", "history"), ("policy", "snapshots")):
        assert_one_line_error(*run(capsys, *argv), "cannot reach the PostgreSQL server at db.example:5432")


def test_the_console_says_when_it_cannot_reach_the_storage(console: Console, monkeypatch: pytest.MonkeyPatch) -> None:
    # A page whose reads cannot reach the storage refuses in one line rather than show an old copy as current.
    _unreachable(monkeypatch, f"cannot reach the server; the lock {console.app.workspace.root}/memory/.lock")
    client = httpx2.Client(base_url=console.base, follow_redirects=False, timeout=60,
                           headers={"Authorization": f"Bearer {console.gate.script_token}"})
    for page in ("/memory", "/memory/notes", "/memory/lessons", "/memory/backups", "/memory/stats", "/policy"):
        answer = client.get(page)
        # one line, and no folder of the server's in it
        assert (answer.status_code, answer.text) == (503, "cannot reach the server; the lock memory/.lock\n"), page


def test_with_the_index_a_second_machine_finds_an_append_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 postgres_dsn: str) -> None:
    # The index (keyword-only here) syncs from the folder at every search: the refreshed copy is what it reads.
    for name in ("OPENAI_API_KEY", "PICOCLAW_POSTGRES_DSN"):
        monkeypatch.delenv(name, raising=False)
    a, b = (_onboarded(tmp_path / name, postgres_dsn) for name in ("a", "b"))
    for home in (a, b):
        with edit_config(home) as config:
            config.setdefault("memory", {})["index"] = {"enabled": True}
    for fact, query, _ in FACTS:
        assert fact not in _in(b, monkeypatch, capsys, "memory", "search", query)[1]  # B's index is built first
        assert _in(a, monkeypatch, capsys, "memory", "append", fact)[0] == 0
        code, out, _ = _in(b, monkeypatch, capsys, "memory", "search", query)
        assert code == 0 and out.startswith("1. score") and fact in out, out


@pytest.mark.parametrize("entry", ["The gym locker is 4711.", "健身房柜子是 4711。"], ids=["english", "chinese"])
def test_a_form_the_storage_cannot_take_is_one_line(console: Console, monkeypatch: pytest.MonkeyPatch,
                                                    entry: str) -> None:
    # A lock not free in time (another process holds it) answers the form in one line, not a 500 with a traceback,
    # and names no folder of the server's in full, not even the workspace folder itself.
    root = console.app.workspace.root

    def held(self: MemoryStore, text: str) -> None:
        raise LockWaitExpired(f"waited 1 s for the memory lock ({root}/memory/.memory.lock): another picoclaw "
                              f"process holds it; the memory documents of {root}")

    monkeypatch.setattr(MemoryStore, "append_long_term", held)
    client = httpx2.Client(base_url=console.base, follow_redirects=False, timeout=60,
                           headers={"Authorization": f"Bearer {console.gate.script_token}"})
    answer = client.post("/memory/entries", data={"content": entry})
    assert (answer.status_code, answer.text) == (503, "waited 1 s for the memory lock (memory/.memory.lock): another "
                                                      "picoclaw process holds it; the memory documents of "
                                                      "~/workspace\n")
    assert entry not in console.app.workspace.store.read_long_term()


@pytest.mark.parametrize("shown", ["MEMORY.md", "今天的笔记"])
def test_a_memory_tool_the_storage_cannot_serve_is_one_line_for_the_model(shown: str) -> None:
    with pytest.raises(ToolError) as caught:
        with os_errors("save to", shown):
            raise LockWaitExpired("waited 1 s for the memory lock (memory/.memory.lock): another picoclaw process "
                                  "holds it")
    assert str(caught.value) == (f"cannot save to {shown}: waited 1 s for the memory lock (memory/.memory.lock): "
                                 "another picoclaw process holds it")
