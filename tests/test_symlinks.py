"""Memory files that are symbolic links: a MEMORY.md kept in a synced folder or a notes vault and
linked into the workspace (`ln -s ~/vault/memory.md workspace/memory/MEMORY.md`) is written through, and
stays a link; a link to anything but a regular file is refused in one line and never replaced."""

from __future__ import annotations

import multiprocessing
import os
import re
from datetime import date
from multiprocessing.synchronize import Event
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from freezegun import freeze_time

from picoclaw.app import App
from picoclaw.cli import main
from tests.fakes import FakeOpenAIServer
from tests.stores import memory_store
from tests.test_compression import CHINESE, CHINESE_REWRITE, PREAMBLE
from tests.test_repl import configure, picoclaw

FROZEN = "2025-03-10 02:00:00"  # 10:00 in Asia/Shanghai, the test homes' timezone (tests/zones.py)
CTX = multiprocessing.get_context("spawn")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def link_memory(home: Path, vault: Path, text: str) -> Path:
    """Put `text` in the vault file and link the workspace's MEMORY.md to it, as `ln -s` does."""
    vault.parent.mkdir(parents=True, exist_ok=True)
    vault.write_text(text, encoding="utf-8")
    link = home / "workspace" / "memory" / "MEMORY.md"
    link.unlink()
    link.symlink_to(vault)
    return link


def assert_still_linked(link: Path, vault: Path) -> None:
    assert link.is_symlink() and os.readlink(link) == str(vault)
    assert not vault.is_symlink() and vault.is_file()


@freeze_time(FROZEN)
def test_append_compress_and_restore_go_through_the_link(home: Path, tmp_path: Path, fake_openai: FakeOpenAIServer,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    configure(home, fake_openai)
    vault = tmp_path / "vault" / "memory.md"
    original = PREAMBLE + "\n" + "\n\n".join(CHINESE) + "\n"
    link = link_memory(home, vault, original)

    assert run(capsys, "memory", "append", "My dog is called Bob / 我的狗叫 Bob")[0] == 0
    assert run(capsys, "memory", "append", "喜欢在西湖边跑步 / likes running by the West Lake")[0] == 0
    assert_still_linked(link, vault)
    text = vault.read_text(encoding="utf-8")
    assert text.startswith(original)
    assert text.endswith("## 2025-03-10\nMy dog is called Bob / 我的狗叫 Bob\n\n"
                         "## 2025-03-10\n喜欢在西湖边跑步 / likes running by the West Lake\n")
    assert run(capsys, "memory", "append", "my dog is called bob / 我的狗叫 Bob")[1].startswith("already stored")
    appended = vault.read_bytes()

    # A rewrite (compression) replaces the vault file, in the vault; the link stays a link.
    fake_openai.reply_text(CHINESE_REWRITE + "\n## 2025-03-10\nMy dog is called Bob / 我的狗叫 Bob\n\n"
                           "## 2025-03-10\n喜欢在西湖边跑步 / likes running by the West Lake\n")
    code, out, err = run(capsys, "memory", "compress", "--force")
    assert code == 0, err
    assert_still_linked(link, vault)
    assert vault.read_text(encoding="utf-8").startswith(PREAMBLE + "\n" + CHINESE_REWRITE)
    backup = re.search(r"saved as (\S+_MEMORY\.md)", out)
    assert backup is not None

    # And so does a restore: the vault file holds the appended version again.
    assert run(capsys, "memory", "restore", backup.group(1))[0] == 0
    assert_still_linked(link, vault)
    assert vault.read_bytes() == appended
    assert run(capsys, "memory", "search", "西湖 跑步")[1].count("likes running by the West Lake") == 1
    # Beside the link, nothing but the store's own files (and no temp file beside the vault file).
    assert sorted(p.name for p in link.parent.iterdir() if not p.name.endswith(".lock")) == [
        ".last_compression.json", ".last_longterm_compress", "LEARNINGS.md", "MEMORY.md", "backups"]
    assert sorted(p.name for p in vault.parent.iterdir()) == [".memory.md.lock", "memory.md"]


@freeze_time(FROZEN)
def test_a_linked_daily_note_is_written_through(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    vault_note = tmp_path / "vault" / "2025-03-10.md"
    vault_note.parent.mkdir()
    vault_note.write_text("# 2025-03-10\n\n## 09:00\n早上去爬山 / hiking in the morning\n", encoding="utf-8")
    note = App.open(home).workspace.store.note_path(date(2025, 3, 10))
    note.parent.mkdir(parents=True, exist_ok=True)
    note.symlink_to(vault_note)
    assert run(capsys, "memory", "append", "--today", "晚上吃饺子 / dumplings for dinner")[0] == 0
    assert note.is_symlink()
    assert vault_note.read_text(encoding="utf-8") == ("# 2025-03-10\n\n## 09:00\n早上去爬山 / hiking in the morning\n\n"
                                                     "## 10:00\n晚上吃饺子 / dumplings for dinner\n")


def _target(tmp_path: Path, link: Path, kind: str) -> Path:
    if kind == "dev-null":
        return Path("/dev/null")
    if kind == "folder":
        (tmp_path / "a-folder").mkdir()
        return tmp_path / "a-folder"
    if kind == "fifo":
        os.mkfifo(tmp_path / "a-pipe")
        return tmp_path / "a-pipe"
    if kind == "dangling":
        return tmp_path / "vault" / "gone.md"
    (tmp_path / "loop.md").symlink_to(link)
    return tmp_path / "loop.md"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dev-null", "folder", "fifo", "dangling", "loop"])
def test_a_link_to_no_regular_file_is_refused_in_one_line(home: Path, tmp_path: Path, kind: str) -> None:
    link = home / "workspace" / "memory" / "MEMORY.md"
    link.unlink()
    target = _target(tmp_path, link, kind)
    link.symlink_to(target)
    memory_dir = link.parent

    def files() -> list[str]:
        return sorted(p.name for p in memory_dir.iterdir() if not p.name.endswith(".lock"))

    before = files()

    # A real process: reading a FIFO would wait for a writer for ever, and the test with it.
    for args in (("memory", "append", "猫叫咪咪 / the cat is Mimi"), ("memory", "show")):
        done = picoclaw(home, *args)
        assert done.returncode == 1 and done.stdout == "", (args, done)
        [line] = done.stderr.splitlines()
        assert line.startswith("picoclaw: error: ") and "MEMORY.md is a link to" in line and "nothing was" in line
    assert os.readlink(link) == str(target)  # the link was never replaced
    assert files() == before  # and nothing was written beside it
    if kind == "dev-null":
        assert "/dev/null" in line and "character device" in line


def _append_through(memory_dir: str, worker: int, count: int, go: Event) -> None:
    store = memory_store(Path(memory_dir), ZoneInfo("Asia/Shanghai"))
    go.wait()
    for number in range(count):
        # The same words with another number: each entry updates (marks) the older ones, so every append is a
        # rewrite of the whole file, the kind of write that loses an entry appended meanwhile without a lock.
        store.append_long_term(f"worker {worker} locker {number:03d} 储物柜")


@pytest.mark.slow
def test_two_memory_folders_linking_one_file_take_turns(tmp_path: Path) -> None:
    vault = tmp_path / "vault" / "memory.md"
    vault.parent.mkdir()
    vault.write_text("# Shared memory\n", encoding="utf-8")
    folders = []
    for name in ("work", "home"):
        folder = tmp_path / name / "memory"
        folder.mkdir(parents=True)
        (folder / "MEMORY.md").symlink_to(vault)
        folders.append(folder)
    go = CTX.Event()
    workers = [CTX.Process(target=_append_through, args=(str(folder), worker, 20, go))
               for worker, folder in enumerate(folders)]
    for process in workers:
        process.start()
    go.set()
    for process in workers:
        process.join(timeout=300)
    assert [process.exitcode for process in workers] == [0, 0]
    text = vault.read_text(encoding="utf-8")
    found = re.findall(r"^worker (\d) locker (\d{3}) 储物柜$", text, flags=re.MULTILINE)
    assert sorted(found) == sorted((str(w), f"{n:03d}") for w in range(2) for n in range(20))
    for folder in folders:
        assert (folder / "MEMORY.md").is_symlink()
