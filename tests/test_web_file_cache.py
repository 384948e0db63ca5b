"""The console's pages keep what they parsed while its files are unchanged, and never show an older version."""

from __future__ import annotations

from pathlib import Path

from picoclaw.web.file_cache import FileCache, identity
from tests.fakes.console import Console, logged_in


def test_a_value_is_kept_while_its_file_is_the_same_and_never_when_it_changed_meanwhile(tmp_path: Path) -> None:
    note = tmp_path / "MEMORY.md"
    note.write_text("one", encoding="utf-8")
    cache: FileCache[str] = FileCache(2)
    computed: list[str] = []

    def read() -> str:
        computed.append(note.read_text(encoding="utf-8"))
        return computed[-1]

    version = lambda: identity([note])  # noqa: E731
    assert cache.get("m", version, read) == "one" and cache.get("m", version, read) == "one"
    assert computed == ["one"]
    note.write_text("two", encoding="utf-8")  # same size: the time or the inode tells
    assert cache.get("m", lambda: identity([note]), read) == "two" and computed == ["one", "two"]

    def changing() -> str:  # a write while the value is computed: the value is used once, not kept
        value = read()
        note.write_text("three!", encoding="utf-8")
        return value

    note.write_text("four", encoding="utf-8")
    assert cache.get("m", lambda: identity([note]), changing) == "four"
    assert cache.get("m", lambda: identity([note]), read) == "three!" and computed[-2:] == ["four", "three!"]


def test_pages_show_what_was_written_since_they_were_last_shown(console: Console) -> None:
    store = console.app.workspace.store
    store.append_long_term("My bike is in the garage")
    client = logged_in(console)
    assert "My bike is in the garage" in client.get("/memory").text
    store.append_long_term("我的自行车是蓝色的")
    page = client.get("/memory").text
    assert "我的自行车是蓝色的" in page and "My bike is in the garage" in page
    store.rewrite_long_term(store.read_long_term().replace("garage", "shed"))
    assert "My bike is in the shed" in client.get("/memory").text
    stats = client.get("/memory/stats").text
    store.append_long_term("A third fact")
    assert client.get("/memory/stats").text != stats  # counted again: one entry more
