"""picoclaw/disk: atomic_write leaves the old file or the new one, and stamped names are never handed out twice."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from picoclaw.disk import appends, bounded_read, links
from picoclaw.disk.atomic import atomic_write
from picoclaw.disk.stamped import reserve_stamped_path, stamped_files, write_stamped

STAMP = "20260310_020000Z"  # as clock.stamp writes it: UTC, marked "Z"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022() -> Iterator[None]:
    """A known umask, so the default mode of new files is predictable."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


# -- atomic_write: success ------------------------------------------------------------------------


def test_replaces_content_and_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "MEMORY.md"
    target.write_text("old content\n", encoding="utf-8")

    atomic_write(target, "新的内容 new content\n")
    assert target.read_bytes() == "新的内容 new content\n".encode()

    atomic_write(target, b"\x00\xffraw bytes")
    assert target.read_bytes() == b"\x00\xffraw bytes"
    # Only the target: every temp file was renamed into place or removed.
    assert sorted(os.listdir(tmp_path)) == ["MEMORY.md"]


def test_creates_missing_folders(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "note.md"
    atomic_write(target, "x")
    assert target.read_text(encoding="utf-8") == "x"
    assert os.listdir(target.parent) == ["note.md"]


def test_new_file_gets_default_mode_from_umask(tmp_path: Path, umask_022: None) -> None:
    target = tmp_path / "new.md"
    atomic_write(target, "x")
    # mkstemp creates 0o600; a normal file must not end up private by accident.
    assert _mode(target) == 0o644


def test_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "config.json"
    target.write_text("{}", encoding="utf-8")
    os.chmod(target, 0o640)
    atomic_write(target, '{"a": 1}')
    assert target.read_text(encoding="utf-8") == '{"a": 1}'
    assert _mode(target) == 0o640


def test_explicit_mode_is_honoured_for_new_and_existing_files(tmp_path: Path, umask_022: None) -> None:
    fresh = tmp_path / "secret.json"
    atomic_write(fresh, "{}", mode=0o600)
    assert _mode(fresh) == 0o600

    existing = tmp_path / "was_public.json"
    existing.write_text("{}", encoding="utf-8")
    os.chmod(existing, 0o644)
    atomic_write(existing, '{"token": "t"}', mode=0o600)
    assert _mode(existing) == 0o600
    assert existing.read_text(encoding="utf-8") == '{"token": "t"}'


# -- atomic_write: failures -----------------------------------------------------------------------


def _assert_untouched(folder: Path, target: Path, original: bytes) -> None:
    assert target.read_bytes() == original
    assert sorted(os.listdir(folder)) == [target.name], "a temp file was left behind"


def test_failing_write_keeps_original_and_removes_temp(tmp_path: Path) -> None:
    target = tmp_path / "MEMORY.md"
    original = "## 2026-03-10\n原来的记忆\n".encode()
    target.write_bytes(original)

    # Not bytes: the temp file is already created when write() raises.
    with pytest.raises(TypeError):
        atomic_write(target, object())  # type: ignore[arg-type]
    _assert_untouched(tmp_path, target, original)


@pytest.mark.parametrize("error", [OSError(5, "Input/output error"), KeyboardInterrupt()])
def test_failing_fsync_keeps_original_and_removes_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    target = tmp_path / "MEMORY.md"
    original = b"original\n"
    target.write_bytes(original)

    def broken_fsync(fd: int) -> None:
        raise error

    # The data is written but not yet durable: an I/O error (or Ctrl-C) here must not publish it.
    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(type(error)):
        atomic_write(target, "new content that must not appear")
    monkeypatch.undo()
    _assert_untouched(tmp_path, target, original)


def test_failing_replace_keeps_original_and_removes_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "MEMORY.md"
    original = b"original\n"
    target.write_bytes(original)
    real_replace = os.replace
    attempts: list[str] = []

    def failing_replace(src: str, dst: str | Path) -> None:
        if Path(dst) == target:
            attempts.append(src)
            raise OSError(18, "Invalid cross-device link")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="cross-device"):
        atomic_write(target, "new")
    monkeypatch.undo()
    assert len(attempts) == 1  # the failure really came from the rename
    _assert_untouched(tmp_path, target, original)


def test_replace_onto_a_folder_fails_cleanly(tmp_path: Path) -> None:
    # A real os.replace failure: the target name is taken by a folder.
    target = tmp_path / "MEMORY.md"
    target.mkdir()
    (target / "inside.txt").write_text("keep", encoding="utf-8")
    with pytest.raises(OSError):
        atomic_write(target, "new")
    assert os.listdir(tmp_path) == ["MEMORY.md"]
    assert (target / "inside.txt").read_text(encoding="utf-8") == "keep"


def test_parent_that_is_a_file_fails_without_changes(tmp_path: Path) -> None:
    blocker = tmp_path / "memory"
    blocker.write_bytes(b"I am a file")
    with pytest.raises(OSError):
        atomic_write(blocker / "MEMORY.md", "new")
    assert blocker.read_bytes() == b"I am a file"
    assert os.listdir(tmp_path) == ["memory"]


# -- stamped names ---------------------------------------------------------------------------------


def test_reserve_stamped_path_adds_a_counter_within_one_stamp(tmp_path: Path) -> None:
    names = [reserve_stamped_path(tmp_path, STAMP, "_MEMORY.md").name for _ in range(3)]
    assert names == [f"{STAMP}_MEMORY.md", f"{STAMP}_1_MEMORY.md", f"{STAMP}_2_MEMORY.md"]
    for name in names:
        assert (tmp_path / name).read_bytes() == b""  # reserved means: exists, so nobody else gets it


def test_reserve_stamped_path_never_reuses_an_existing_file(tmp_path: Path) -> None:
    (tmp_path / f"{STAMP}_MEMORY.md").write_text("precious", encoding="utf-8")
    (tmp_path / f"{STAMP}_1_MEMORY.md").write_text("also precious", encoding="utf-8")
    reserved = reserve_stamped_path(tmp_path, STAMP, "_MEMORY.md")
    assert reserved.name == f"{STAMP}_2_MEMORY.md"
    assert (tmp_path / f"{STAMP}_MEMORY.md").read_text(encoding="utf-8") == "precious"
    assert (tmp_path / f"{STAMP}_1_MEMORY.md").read_text(encoding="utf-8") == "also precious"


def _from_threads(make: Callable[[], Path], threads: int = 8, each: int = 40) -> list[Path]:
    results: list[Path] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads)

    def work() -> None:
        barrier.wait()  # all threads race for the same names at once
        for _ in range(each):
            path = make()
            with lock:
                results.append(path)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return results


def test_reserve_stamped_path_is_unique_across_threads(tmp_path: Path) -> None:
    paths = _from_threads(lambda: reserve_stamped_path(tmp_path, STAMP, ".json"))
    assert len(paths) == 8 * 40
    assert len(set(paths)) == len(paths)
    assert all(path.exists() for path in paths)
    # No gaps and no doubles: counters 0..319, listed in counter order.
    expected = [f"{STAMP}.json"] + [f"{STAMP}_{n}.json" for n in range(1, 8 * 40)]
    assert [path.name for path in stamped_files(tmp_path, ".json")] == expected


def test_stamped_files_orders_by_stamp_then_numeric_counter(tmp_path: Path) -> None:
    names = [
        "20260101_000001Z_MEMORY.md",
        "20260101_000000Z_10_MEMORY.md",
        "20251231_235959Z_MEMORY.md",
        "20260101_000000Z_2_MEMORY.md",
        "20260101_000000Z_MEMORY.md",
    ]
    for name in names:
        (tmp_path / name).write_text(name, encoding="utf-8")
    # Not backups: other suffix, no stamp, a temp file, and a folder with a backup-like name.
    for other in ("20260101_000000Z.json", "notes_MEMORY.md", ".20260101_000000Z_MEMORY.md.x.tmp"):
        (tmp_path / other).write_text("", encoding="utf-8")
    (tmp_path / "20260102_000000Z_MEMORY.md").mkdir()

    assert [p.name for p in stamped_files(tmp_path, "_MEMORY.md")] == [
        "20251231_235959Z_MEMORY.md",
        "20260101_000000Z_MEMORY.md",
        "20260101_000000Z_2_MEMORY.md",  # counter 2 before 10: numeric, not text order
        "20260101_000000Z_10_MEMORY.md",
        "20260101_000001Z_MEMORY.md",
    ]
    assert stamped_files(tmp_path / "missing", "_MEMORY.md") == []


def _legacy(folder: Path, name: str, mtime: int) -> Path:
    path = folder / name
    path.write_text(name, encoding="utf-8")
    os.utime(path, (mtime, mtime))
    return path


def test_stamped_files_orders_legacy_local_time_names_by_mtime_before_utc_names(tmp_path: Path) -> None:
    # Older versions stamped local time without a mark: after a timezone change (Shanghai, then Berlin) the
    # names no longer sort in time order, so their modification times order them.
    shanghai = _legacy(tmp_path, "20260310_100000_MEMORY.md", 1_773_108_000)  # 02:00 UTC
    berlin = _legacy(tmp_path, "20260310_030001_MEMORY.md", 1_773_108_001)  # 02:00:01 UTC
    same_second = [_legacy(tmp_path, name, 1_773_108_002) for name in
                   ("20260310_030002_10_MEMORY.md", "20260310_030002_2_MEMORY.md")]  # equal mtimes: counters
    # Every UTC-marked name was written by this version, so after every legacy one, whatever the mtimes say.
    utc = _legacy(tmp_path, "20260310_020000Z_MEMORY.md", 1_000_000_000)
    assert stamped_files(tmp_path, "_MEMORY.md") == [shanghai, berlin, same_second[1], same_second[0], utc]


def test_a_utc_name_continues_the_counters_of_its_own_stamp_only(tmp_path: Path) -> None:
    (tmp_path / "20260310_020000_MEMORY.md").write_text("legacy, same digits", encoding="utf-8")
    first = write_stamped(tmp_path, STAMP, "_MEMORY.md", "new")
    assert first.name == "20260310_020000Z_MEMORY.md"
    assert stamped_files(tmp_path, "_MEMORY.md")[-1] == first


# -- append_jsonl: a torn last line does not swallow the next record ---------------------------------


def test_append_jsonl_starts_a_new_line_after_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"n":1}\n{"n":2,"te')  # a crash mid-append
    appends.append_jsonl(path, [{"n": 3}, {"n": 4}])
    assert path.read_bytes() == b'{"n":1}\n{"n":2,"te\n{"n":3}\n{"n":4}\n'


def test_append_jsonl_keeps_a_whole_record_that_lost_only_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"n":1}')
    appends.append_jsonl(path, [{"n": 2}])
    appends.append_jsonl(path, [{"n": 3}])
    assert path.read_bytes() == b'{"n":1}\n{"n":2}\n{"n":3}\n'


def test_append_jsonl_creates_the_file_and_its_folder(tmp_path: Path) -> None:
    path = tmp_path / "new" / "log.jsonl"
    appends.append_jsonl(path, [{"n": 1}])
    assert path.read_bytes() == b'{"n":1}\n'


# -- write_stamped: a stamped file that only ever appears complete -----------------------------------


def test_write_stamped_writes_whole_files_under_unique_names(tmp_path: Path, umask_022: None) -> None:
    first = write_stamped(tmp_path, STAMP, "_MEMORY.md", "第一版 v1")
    second = write_stamped(tmp_path, STAMP, "_MEMORY.md", b"v2")
    assert (first.name, second.name) == (f"{STAMP}_MEMORY.md", f"{STAMP}_1_MEMORY.md")
    assert first.read_text(encoding="utf-8") == "第一版 v1"
    assert second.read_bytes() == b"v2"
    assert _mode(first) == 0o644
    assert sorted(os.listdir(tmp_path)) == sorted([first.name, second.name])  # temp files gone


def test_write_stamped_is_unique_across_threads(tmp_path: Path) -> None:
    counter = iter(range(10_000))
    lock = threading.Lock()

    def make() -> Path:
        with lock:
            number = next(counter)
        return write_stamped(tmp_path, STAMP, ".json", f"payload {number}")

    paths = _from_threads(make)
    assert len(set(paths)) == len(paths) == 8 * 40
    # Each file holds exactly one payload, and no payload was overwritten by another thread.
    payloads = {path.read_text(encoding="utf-8") for path in paths}
    assert payloads == {f"payload {n}" for n in range(8 * 40)}
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]


def test_write_stamped_without_hard_links_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / f"{STAMP}.json").write_text("older", encoding="utf-8")

    def no_links(src: str, dst: str | Path) -> None:
        raise PermissionError(1, "Operation not permitted")

    # Some file systems (FAT, some network mounts) refuse hard links.
    monkeypatch.setattr(os, "link", no_links)
    path = write_stamped(tmp_path, STAMP, ".json", "newer")
    monkeypatch.undo()
    assert path.name == f"{STAMP}_1.json"
    assert path.read_text(encoding="utf-8") == "newer"
    assert (tmp_path / f"{STAMP}.json").read_text(encoding="utf-8") == "older"
    assert sorted(os.listdir(tmp_path)) == [f"{STAMP}.json", f"{STAMP}_1.json"]


@pytest.mark.parametrize("make", ["reserve", "write"])
def test_a_name_freed_by_pruning_is_not_handed_out_again(tmp_path: Path, make: str) -> None:
    def new_file() -> Path:
        if make == "reserve":
            return reserve_stamped_path(tmp_path, STAMP, "_MEMORY.md")
        return write_stamped(tmp_path, STAMP, "_MEMORY.md", "x")

    first, second = new_file(), new_file()
    first.unlink()  # pruned as the oldest of that second
    third = new_file()
    # Reusing the freed counter 0 would make the newest file sort as the oldest, next to be pruned.
    assert third.name == f"{STAMP}_2_MEMORY.md"
    assert stamped_files(tmp_path, "_MEMORY.md") == [second, third]


# -- links: written through, never replaced; anything but a regular file is refused -------------------------


VAULT_TEXT = "## 2025-03-01\n我的狗叫旺财 / my dog is Wangcai\n".encode()


def _vault_link(tmp_path: Path, content: bytes = VAULT_TEXT) -> tuple[Path, Path]:
    """A file in a "vault" folder of its own and a link to it in the workspace, as a user makes with `ln -s`."""
    vault = tmp_path / "vault" / "memory.md"
    vault.parent.mkdir()
    vault.write_bytes(content)
    link = tmp_path / "workspace" / "MEMORY.md"
    link.parent.mkdir()
    link.symlink_to(vault)
    return vault, link


def test_atomic_write_through_a_link_replaces_the_file_it_names(tmp_path: Path) -> None:
    vault, link = _vault_link(tmp_path)
    os.chmod(vault, 0o640)
    atomic_write(link, "## 2025-03-02\n新的内容 new content\n")
    assert link.is_symlink() and os.readlink(link) == str(vault)  # still a link, to the same file
    assert vault.read_text(encoding="utf-8") == "## 2025-03-02\n新的内容 new content\n"
    assert _mode(vault) == 0o640  # the file's own mode kept
    # The temp file went beside the file it replaced, and is gone: nothing was added next to the link.
    assert os.listdir(link.parent) == ["MEMORY.md"] and os.listdir(vault.parent) == ["memory.md"]


def test_a_relative_link_and_a_chain_of_links_are_followed(tmp_path: Path) -> None:
    vault, link = _vault_link(tmp_path)
    link.unlink()
    link.symlink_to(Path("..") / "vault" / "memory.md")  # relative to the link's folder, as `ln -s ../vault/..`
    second = tmp_path / "workspace" / "again.md"
    second.symlink_to("MEMORY.md")  # a link to the link
    atomic_write(second, "第二 second\n")
    assert vault.read_text(encoding="utf-8") == "第二 second\n"
    assert second.is_symlink() and link.is_symlink()


@pytest.mark.parametrize("kind", ["dev-null", "folder", "fifo", "dangling", "loop"])
def test_a_link_to_anything_but_a_regular_file_is_refused_and_left_alone(tmp_path: Path, kind: str) -> None:
    link = tmp_path / "MEMORY.md"
    target: str | Path
    if kind == "dev-null":
        target = "/dev/null"
    elif kind == "folder":
        target = tmp_path / "a-folder"
        target.mkdir()
    elif kind == "fifo":
        target = tmp_path / "pipe"
        os.mkfifo(target)
    elif kind == "dangling":
        target = tmp_path / "nowhere.md"
    else:
        target = tmp_path / "other.md"
        Path(target).symlink_to(link)
    link.symlink_to(target)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(links.NotAFileError) as caught:
        atomic_write(link, "记忆 memory\n")
    message = str(caught.value)
    assert "\n" not in message and str(link) in message and "nothing was written" in message
    assert isinstance(caught.value, OSError)  # every handler of file errors reports it
    assert os.readlink(link) == str(target)  # never replaced
    assert sorted(os.listdir(tmp_path)) == before  # no temp file left
    if kind == "dev-null":
        assert "/dev/null" in message and "character device" in message
    with pytest.raises(links.NotAFileError):
        appends.append_jsonl(link, [{"role": "user", "content": "你好"}])
    assert os.readlink(link) == str(target)


def test_a_fifo_or_device_in_place_of_the_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "MEMORY.md"
    os.mkfifo(fifo)
    with pytest.raises(links.NotAFileError, match="is a FIFO, not a regular file"):
        atomic_write(fifo, "x")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    # Reading it does not wait for a writer that never comes.
    with pytest.raises(links.NotAFileError, match="nothing was read"):
        bounded_read.read_regular(fifo)


def test_append_jsonl_writes_through_a_link(tmp_path: Path) -> None:
    vault, link = _vault_link(tmp_path, b'{"n":1}\n')
    appends.append_jsonl(link, [{"n": 2, "text": "第二"}])
    assert link.is_symlink()
    assert vault.read_bytes() == '{"n":1}\n{"n":2,"text":"第二"}\n'.encode()


# -- bounded reads ----------------------------------------------------------------------------------------


def test_read_bounded_stops_at_its_limit(tmp_path: Path) -> None:
    zero = tmp_path / "config.json"
    zero.symlink_to("/dev/zero")  # endless: reading it whole never ends
    with pytest.raises(bounded_read.FileTooLargeError) as caught:
        bounded_read.read_bounded(zero, 1 << 20)
    assert str(caught.value) == f"{zero}: larger than 1 MiB; is it the right file?"
    big = tmp_path / "jobs.json"
    big.write_bytes(b"[" + b"0," * 600_000 + b"0]")
    with pytest.raises(bounded_read.FileTooLargeError, match="larger than 1 MiB"):
        bounded_read.read_bounded(big, 1 << 20)
    assert bounded_read.read_bounded(big, 2 << 20) == big.read_bytes()
    assert bounded_read.read_bounded(Path("/dev/null"), 10) == b""
