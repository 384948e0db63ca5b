"""The model's tools, called the way the agent loop calls them: `ToolRegistry.execute(name, json_args)`."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time

from picoclaw.app import App
from picoclaw.memory.workspace import Workspace
from picoclaw.tools.base import ToolError, ToolRegistry
from picoclaw.tools.files import MAX_READ_CHARS, MAX_WRITE_BYTES
from picoclaw.tools.registry import TOOL_CLASSES, build_tools
from picoclaw.tools.sandbox import resolve_in_workspace
from tests.zones import onboard_in_shanghai

# 04:00 UTC is 12:00 in Asia/Shanghai (the test homes' timezone, tests/zones.py): the same date everywhere.
FROZEN = "2024-03-05 04:00:00"
SECRET = "SECRET\n"
FILE_TOOLS = ("read_file", "write_file", "edit_file", "append_file", "list_dir")


def call(tools: ToolRegistry, name: str, **arguments: Any) -> str:
    """One tool call with JSON arguments, as the model would send it."""
    return asyncio.run(tools.execute(name, json.dumps(arguments, ensure_ascii=False)))


def call_raw(tools: ToolRegistry, name: str, raw: str) -> str:
    return asyncio.run(tools.execute(name, raw))


def file_args(tool: str, path: str) -> dict[str, Any]:
    """Arguments that would change or reveal an outside file if the sandbox let `path` through."""
    return {
        "read_file": {"path": path},
        "write_file": {"path": path, "content": "pwned"},
        "edit_file": {"path": path, "old_text": "SECRET", "new_text": "pwned"},
        "append_file": {"path": path, "content": "pwned"},
        "list_dir": {"path": path},
    }[tool]


@pytest.fixture
def tools(workspace: Workspace) -> ToolRegistry:
    return build_tools(workspace)


@pytest.fixture
def root(workspace: Workspace) -> Path:
    return workspace.root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the workspace holding secret.txt and deep/secret.txt."""
    folder = tmp_path / "outside"
    (folder / "deep").mkdir(parents=True)
    (folder / "secret.txt").write_text(SECRET, encoding="utf-8")
    (folder / "deep" / "secret.txt").write_text(SECRET, encoding="utf-8")
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def memory_text(workspace: Workspace) -> str:
    return workspace.store.long_term_path.read_text(encoding="utf-8")


# -- the sandbox ---------------------------------------------------------------------------------------


ESCAPES = ["../outside-x.txt", "../../outside/secret.txt", "/etc/passwd", "memory/../../x",
           "memory/../../../outside/secret.txt", "link.txt", "linkdir/secret.txt", "linkdir/../secret.txt",
           "dangling.txt", "OUTSIDE_ABSOLUTE"]


@pytest.fixture
def links(root: Path, outside: Path) -> None:
    """Symlinks inside the workspace that point outside: a file, a folder, a dangling one."""
    (root / "link.txt").symlink_to(outside / "secret.txt")
    # linkdir -> outside/deep, so "linkdir/../secret.txt" is outside/secret.txt for the kernel, although
    # a lexical normalisation would call it <root>/secret.txt.
    (root / "linkdir").symlink_to(outside / "deep", target_is_directory=True)
    (root / "dangling.txt").symlink_to(outside / "created-through-link.txt")


@pytest.mark.parametrize("tool", FILE_TOOLS)
@pytest.mark.parametrize("escape", ESCAPES)
def test_every_escape_is_refused_and_the_outside_is_untouched(
    tools: ToolRegistry, outside: Path, links: None, tool: str, escape: str
) -> None:
    path = str(outside / "secret.txt") if escape == "OUTSIDE_ABSOLUTE" else escape
    before = snapshot(outside)
    result = call(tools, tool, **file_args(tool, path))
    assert result.startswith("error:"), result
    assert "outside the workspace" in result
    assert "SECRET" not in result and "root:" not in result  # nothing of the outside file was read
    assert snapshot(outside) == before
    assert not (outside.parent / "outside-x.txt").exists()


@pytest.mark.parametrize("tool", FILE_TOOLS)
@pytest.mark.parametrize(("bad", "reason"), [("a\x00b.txt", "NUL byte"), ("", "empty"), ("   ", "empty")])
def test_nul_and_empty_paths_are_refused(tools: ToolRegistry, root: Path, tool: str, bad: str, reason: str) -> None:
    before = snapshot(root)
    result = call(tools, tool, **file_args(tool, bad))
    assert result.startswith("error:") and reason in result
    assert snapshot(root) == before


def test_sandbox_names_the_reason(root: Path, outside: Path, links: None) -> None:
    assert resolve_in_workspace(root, "notes/a.md") == root.resolve() / "notes" / "a.md"
    assert resolve_in_workspace(root, str(root / "AGENTS.md")) == root.resolve() / "AGENTS.md"
    assert resolve_in_workspace(root, "memory/../AGENTS.md") == root.resolve() / "AGENTS.md"  # stays inside
    with pytest.raises(ToolError, match="symbolic link"):
        resolve_in_workspace(root, "linkdir/../secret.txt")
    with pytest.raises(ToolError, match="symbolic link"):
        resolve_in_workspace(root, "dangling.txt")
    with pytest.raises(ToolError, match="is outside the workspace"):
        resolve_in_workspace(root, "../x")


def test_symlinks_that_stay_inside_are_followed(tools: ToolRegistry, root: Path) -> None:
    (root / "real.md").write_text("inside\n", encoding="utf-8")
    (root / "alias.md").symlink_to(root / "real.md")
    assert call(tools, "read_file", path="alias.md") == "inside\n"
    assert call(tools, "write_file", path="alias.md", content="changed\n").startswith("replaced real.md")
    assert (root / "alias.md").is_symlink()
    assert (root / "real.md").read_text(encoding="utf-8") == "changed\n"


def test_absolute_path_inside_the_workspace_is_accepted(tools: ToolRegistry, root: Path) -> None:
    target = root / "notes" / "abs.md"
    assert call(tools, "write_file", path=str(target), content="hello 你好\n") == "created notes/abs.md (9 characters)"
    assert call(tools, "read_file", path=str(target)) == "hello 你好\n"


# -- read_file ----------------------------------------------------------------------------------------


def test_read_file_whole_and_by_lines(tools: ToolRegistry, root: Path) -> None:
    (root / "n.md").write_text("".join(f"line {i}\n" for i in range(1, 11)), encoding="utf-8")
    assert call(tools, "read_file", path="n.md") == "".join(f"line {i}\n" for i in range(1, 11))
    part = call(tools, "read_file", path="n.md", offset=3, limit=2)
    assert part == "line 3\nline 4\n[showing lines 3-4; more follows: read_file with offset=5]"
    tail = call(tools, "read_file", path="n.md", offset=9)
    assert tail == "line 9\nline 10\n[lines 9-10, end of file]"
    assert call(tools, "read_file", path="n.md", offset=20) == "n.md has only 10 lines; offset 20 is past its end"


def test_read_file_caps_what_it_returns(tools: ToolRegistry, root: Path) -> None:
    line = "x" * 999 + "\n"
    (root / "big.txt").write_text(line * 200, encoding="utf-8")  # 200,000 characters
    result = call(tools, "read_file", path="big.txt")
    assert len(result) < MAX_READ_CHARS + 200
    assert result.endswith("[truncated at 50,000 characters: showing lines 1-50; continue with offset=51]")
    (root / "one-line.txt").write_text("y" * (MAX_READ_CHARS * 2), encoding="utf-8")
    cut = call(tools, "read_file", path="one-line.txt")
    assert cut.startswith("y" * MAX_READ_CHARS) and "was cut" in cut


@pytest.mark.parametrize(("setup", "path", "message"), [
    (None, "missing.md", "no such file or folder: missing.md"),
    (None, "memory", "memory is a folder; use list_dir"),
    ("binary", "blob.bin", "blob.bin is not a UTF-8 text file"),
])
def test_read_file_errors(tools: ToolRegistry, root: Path, setup: str | None, path: str, message: str) -> None:
    if setup == "binary":
        (root / "blob.bin").write_bytes(b"\xff\xfe\x00\x81binary")
    assert call(tools, "read_file", path=path) == f"error: {message}"


# -- write_file / append_file / edit_file on ordinary files -------------------------------------------------


def test_write_append_edit_ordinary_file(tools: ToolRegistry, root: Path) -> None:
    assert call(tools, "write_file", path="notes/todo.md", content="- buy milk\n") == \
        "created notes/todo.md (11 characters)"
    assert call(tools, "append_file", path="notes/todo.md", content="- 买牛奶\n") == \
        "appended 6 characters to notes/todo.md"
    assert call(tools, "edit_file", path="notes/todo.md", old_text="milk", new_text="bread") == "edited notes/todo.md"
    assert (root / "notes" / "todo.md").read_text(encoding="utf-8") == "- buy bread\n- 买牛奶\n"
    assert call(tools, "write_file", path="notes/todo.md", content="fresh\n").startswith("replaced")
    assert (root / "notes" / "todo.md").read_text(encoding="utf-8") == "fresh\n"
    assert call(tools, "append_file", path="new.txt", content="first") == "appended 5 characters to new.txt"
    assert (root / "new.txt").read_text(encoding="utf-8") == "first"
    # Writes are atomic: no temp file is left behind next to the target.
    assert [p.name for p in (root / "notes").iterdir()] == ["todo.md"]


def test_edit_file_needs_exactly_one_match(tools: ToolRegistry, root: Path) -> None:
    (root / "a.md").write_text("cat and cat and dog\n", encoding="utf-8")
    missing = call(tools, "edit_file", path="a.md", old_text="bird", new_text="x")
    assert missing.startswith("error: old_text was not found in a.md")
    ambiguous = call(tools, "edit_file", path="a.md", old_text="cat", new_text="x")
    assert ambiguous.startswith("error: old_text occurs 2 times in a.md")
    assert (root / "a.md").read_text(encoding="utf-8") == "cat and cat and dog\n"
    assert call(tools, "edit_file", path="a.md", old_text="cat and dog", new_text="fox") == "edited a.md"
    assert (root / "a.md").read_text(encoding="utf-8") == "cat and fox\n"
    assert call(tools, "edit_file", path="nope.md", old_text="a", new_text="b") == \
        "error: no such file or folder: nope.md"
    assert call(tools, "edit_file", path="a.md", old_text="", new_text="b").startswith(
        "error: invalid arguments for edit_file: old_text:")


def test_writes_to_folders_and_huge_content_are_refused(tools: ToolRegistry, root: Path) -> None:
    assert call(tools, "write_file", path="memory", content="x") == "error: memory is a folder, not a file"
    assert call(tools, "append_file", path=".", content="x") == "error: . is a folder, not a file"
    huge = "x" * (MAX_WRITE_BYTES + 1)
    for tool in ("write_file", "append_file"):
        assert call(tools, tool, path="huge.txt", content=huge).startswith("error: content too large")
    assert not (root / "huge.txt").exists()
    (root / "grow.txt").write_text("y" * MAX_WRITE_BYTES, encoding="utf-8")
    assert "would grow to" in call(tools, "append_file", path="grow.txt", content="more")
    assert (root / "grow.txt").stat().st_size == MAX_WRITE_BYTES


@pytest.mark.parametrize("path", ["memory/backups/20240101_000000_MEMORY.md", "memory/policy_overrides.json",
                                  "memory/policy_history.jsonl", "memory/policy_snapshots/20240101_000000.json",
                                  "memory/index/fts.db", "memory/.last_longterm_compress", "memory/.memory.lock",
                                  "sessions/cli.jsonl", "memory/../sessions/x.jsonl"])
@pytest.mark.parametrize("tool", ["write_file", "append_file", "edit_file"])
def test_store_and_policy_files_cannot_be_written(tools: ToolRegistry, root: Path, tool: str, path: str) -> None:
    args = file_args(tool, path)
    result = call(tools, tool, **args)
    assert result.startswith("error:") and "cannot write there" in result
    assert not (root / path).exists()


def test_protected_files_can_still_be_read(tools: ToolRegistry, root: Path) -> None:
    (root / "sessions").mkdir()
    (root / "sessions" / "cli.jsonl").write_text('{"role": "user"}\n', encoding="utf-8")
    assert call(tools, "read_file", path="sessions/cli.jsonl") == '{"role": "user"}\n'


def test_config_file_with_secrets_is_never_opened(workspace: Workspace) -> None:
    # A config whose workspace is the home folder itself puts config.json inside the workspace.
    (workspace.root / "config.json").write_text('{"api_key": "sk-secret"}', encoding="utf-8")
    home_is_root = dataclasses.replace(workspace.layout, home=workspace.root)
    tools = build_tools(dataclasses.replace(workspace, layout=home_is_root))
    result = call(tools, "read_file", path="config.json")
    assert result.startswith("error:") and "secrets" in result and "sk-secret" not in result
    assert call(tools, "write_file", path="config.json", content="{}").startswith("error:")
    assert (workspace.root / "config.json").read_text(encoding="utf-8") == '{"api_key": "sk-secret"}'


# -- list_dir -------------------------------------------------------------------------------------------


def test_list_dir(tools: ToolRegistry, root: Path, outside: Path) -> None:
    (root / "linkdir").symlink_to(outside, target_is_directory=True)
    listing = call(tools, "list_dir")
    lines = listing.splitlines()
    assert lines[0].startswith("./ (")
    assert "memory/" in lines and "linkdir@" in lines
    size = (root / "AGENTS.md").stat().st_size
    assert f"AGENTS.md ({size} bytes)" in lines
    assert lines.index("memory/") < lines.index(f"AGENTS.md ({size} bytes)")  # folders first
    assert "secret.txt" not in listing  # the link is not followed
    assert call(tools, "list_dir", path="memory").splitlines()[1:] == [
        f"{name} ({(root / 'memory' / name).stat().st_size} bytes)" for name in ("LEARNINGS.md", "MEMORY.md")]
    (root / "empty").mkdir()
    assert call(tools, "list_dir", path="empty") == "empty/ is empty"
    assert call(tools, "list_dir", path="nope") == "error: no such folder: nope"
    assert call(tools, "list_dir", path="AGENTS.md") == "error: AGENTS.md is a file; use read_file"


# -- memory files through the file tools ------------------------------------------------------------------


@freeze_time(FROZEN)
def test_write_file_on_memory_md_appends_a_dated_entry(tools: ToolRegistry, workspace: Workspace) -> None:
    old = memory_text(workspace)
    result = call(tools, "write_file", path="memory/MEMORY.md", content="My dog is called Bob.")
    assert result.startswith("appended a '## 2024-03-05' entry to memory/MEMORY.md")
    text = memory_text(workspace)
    assert text.startswith(old.rstrip("\n"))  # the old content is kept
    assert text.endswith("\n\n## 2024-03-05\nMy dog is called Bob.\n")
    assert workspace.store.backups() == []  # an append copies nothing; backups are for rewrites


@freeze_time(FROZEN)
def test_write_file_of_whole_memory_md_appends_only_the_new_part(
    tools: ToolRegistry, workspace: Workspace
) -> None:
    old = memory_text(workspace)
    assert call(tools, "write_file", path="memory/MEMORY.md", content=old).endswith(
        "already holds this text; nothing was appended")
    assert memory_text(workspace) == old
    call(tools, "write_file", path="memory/MEMORY.md", content=old + "\nLikes 绿茶.\n")
    text = memory_text(workspace)
    assert text.count("# Long-term memory") == 1
    assert text.endswith("## 2024-03-05\nLikes 绿茶.\n")


@freeze_time(FROZEN)
def test_append_and_edit_memory_md_go_through_the_store(tools: ToolRegistry, workspace: Workspace) -> None:
    # Absolute path and a `..` detour are still recognised as MEMORY.md.
    target = str(workspace.root / "memory" / ".." / "memory" / "MEMORY.md")
    assert call(tools, "append_file", path=target, content="## sneaky heading\nworks at ACME").startswith(
        "appended a '## 2024-03-05' entry")
    text = memory_text(workspace)
    assert "## 2024-03-05\n### sneaky heading\nworks at ACME\n" in text  # one block under its date
    assert call(tools, "edit_file", path="memory/MEMORY.md", old_text="ACME", new_text="Initech") == \
        "edited memory/MEMORY.md (the previous version was backed up)"
    assert "works at Initech" in memory_text(workspace)
    backups = workspace.store.backups()
    assert len(backups) == 1 and "works at ACME" in backups[-1].read_text(encoding="utf-8")  # the edit's
    assert call(tools, "edit_file", path="memory/MEMORY.md", old_text="nothing like this", new_text="x").startswith(
        "error: old_text was not found in memory/MEMORY.md")
    assert len(workspace.store.backups()) == 1  # a refused edit takes no backup and changes nothing
    assert call(tools, "write_file", path="memory/MEMORY.md", content="   ").startswith("error: cannot write")


@freeze_time(FROZEN)
def test_daily_note_writes_append_through_the_store(tools: ToolRegistry, workspace: Workspace) -> None:
    note = workspace.root / "memory" / "202403" / "20240305.md"
    assert call(tools, "write_file", path="memory/202403/20240305.md", content="met Alice") == (
        "appended a '## 12:00' entry to the daily note memory/202403/20240305.md (daily notes are never overwritten)")
    assert call(tools, "write_file", path="memory/202403/20240305.md", content="遛狗").startswith("appended")
    assert call(tools, "append_file", path="memory/202403/20240305.md", content="lunch").startswith("appended")
    assert note.read_text(encoding="utf-8") == (
        "# 2024-03-05\n\n## 12:00\nmet Alice\n\n## 12:00\n遛狗\n\n## 12:00\nlunch\n")
    # A note of another day goes to that day's file, not today's.
    call(tools, "append_file", path="memory/202402/20240229.md", content="leap day")
    assert (workspace.root / "memory" / "202402" / "20240229.md").read_text(encoding="utf-8") == \
        "# 2024-02-29\n\n## 12:00\nleap day\n"
    assert call(tools, "edit_file", path="memory/202403/20240305.md", old_text="lunch", new_text="dinner") == \
        "edited memory/202403/20240305.md"
    assert note.read_text(encoding="utf-8").endswith("## 12:00\ndinner\n")


@pytest.mark.parametrize(("path", "reason"), [("memory/202403/20240399.md", "is not a date"),
                                              ("memory/202404/20240305.md", "belongs in memory/202403/")])
def test_malformed_daily_note_names_are_refused(tools: ToolRegistry, root: Path, path: str, reason: str) -> None:
    result = call(tools, "append_file", path=path, content="x")
    assert result.startswith("error:") and reason in result
    assert not (root / path).exists()
    # Reading one that exists anyway (made by hand) is fine.
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text("by hand\n", encoding="utf-8")
    assert call(tools, "read_file", path=path) == "by hand\n"


# -- memory tools ------------------------------------------------------------------------------------------


@freeze_time(FROZEN)
def test_memory_append_both_slots(tools: ToolRegistry, workspace: Workspace) -> None:
    assert call(tools, "memory_append", content="宠物狗叫 Bob") == \
        "saved to memory/MEMORY.md under '## 2024-03-05'"
    assert memory_text(workspace).endswith("## 2024-03-05\n宠物狗叫 Bob\n")
    assert call(tools, "memory_append", content="Dentist at 3pm", slot="today") == \
        "saved to today's daily note memory/202403/20240305.md"
    assert (workspace.root / "memory" / "202403" / "20240305.md").read_text(encoding="utf-8") == \
        "# 2024-03-05\n\n## 12:00\nDentist at 3pm\n"


@pytest.mark.parametrize(("arguments", "expected"), [
    ({"content": ""}, "content:"),
    ({"content": "x", "slot": "forever"}, "slot:"),
    ({"slot": "today"}, "content: Field required"),
])
def test_memory_append_bad_arguments(tools: ToolRegistry, workspace: Workspace,
                                     arguments: dict[str, Any], expected: str) -> None:
    old = memory_text(workspace)
    result = call(tools, "memory_append", **arguments)
    assert result.startswith("error: invalid arguments for memory_append") and expected in result
    assert memory_text(workspace) == old


def test_memory_append_blank_content_is_refused(tools: ToolRegistry, workspace: Workspace) -> None:
    old = memory_text(workspace)
    assert "the entry is empty" in call(tools, "memory_append", content="  \n ")
    assert memory_text(workspace) == old


@freeze_time(FROZEN)
def test_memory_append_stores_no_terminal_escapes(tools: ToolRegistry, workspace: Workspace) -> None:
    """A model (or a message it copies) may send escape sequences: memory keeps the text without them."""
    hostile = "a\x1b[31mred\x07 \x1b]0;pwned\x07狗叫\x9b1m Bob\tok"
    assert call(tools, "memory_append", content=hostile) == \
        "saved to memory/MEMORY.md under '## 2024-03-05' (terminal control characters were removed)"
    assert memory_text(workspace).endswith("## 2024-03-05\nared 狗叫 Bob\tok\n")
    assert call(tools, "memory_append", content="牙医 dentist\x1b[2J at 3pm", slot="today") == \
        "saved to today's daily note memory/202403/20240305.md (terminal control characters were removed)"
    note = (workspace.root / "memory" / "202403" / "20240305.md").read_text(encoding="utf-8")
    assert note == "# 2024-03-05\n\n## 12:00\n牙医 dentist at 3pm\n"
    for text in (memory_text(workspace), note):
        assert not any(byte in text for byte in ("\x1b", "\x07", "\x9b"))
    # Nothing but escapes is nothing to store.
    before = memory_text(workspace)
    assert "the entry is empty" in call(tools, "memory_append", content="\x1b[31m\x07")
    assert memory_text(workspace) == before


def line_of(path: Path, needle: str) -> int:
    return next(n for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if needle in line)


@freeze_time(FROZEN)
def test_memory_search_finds_chinese_and_english_with_file_and_lines(
    tools: ToolRegistry, workspace: Workspace
) -> None:
    call(tools, "memory_append", content="宠物狗叫 Bob")
    call(tools, "memory_append", content="住在上海浦东")
    call(tools, "memory_append", content="I prefer green tea over coffee", slot="today")
    memory_md = workspace.store.long_term_path
    chinese = call(tools, "memory_search", query="我的狗叫什么")
    first = chinese.split("\n\n")[1]
    line = line_of(memory_md, "宠物狗叫 Bob")
    assert first.startswith(f"[1] memory/MEMORY.md:{line - 1}-{line} (score ")
    assert first.endswith("## 2024-03-05\n宠物狗叫 Bob")
    assert "浦东" not in chinese  # unrelated entries do not match
    english = call(tools, "memory_search", query="what tea do I like?", limit=5)
    note = workspace.root / "memory" / "202403" / "20240305.md"
    tea = line_of(note, "green tea")
    assert english.startswith("1 match for 'what tea do I like?'")
    assert f"[1] memory/202403/20240305.md:{tea - 1}-{tea} (score " in english
    assert "I prefer green tea over coffee" in english


@freeze_time(FROZEN)
def test_memory_search_limit_and_no_matches(tools: ToolRegistry) -> None:
    for n in range(5):
        call(tools, "memory_append", content=f"project phoenix milestone {n}")
    assert call(tools, "memory_search", query="phoenix", limit=2).count("memory/MEMORY.md:") == 2
    assert call(tools, "memory_search", query="zebra") == "no matches in memory for 'zebra'; try other keywords"
    assert call(tools, "memory_search", query="the").startswith("no matches")  # stop words only
    for bad in ({"query": "x", "limit": 0}, {"query": "x", "limit": 51}, {"query": "   "}, {}):
        assert call(tools, "memory_search", **bad).startswith("error: invalid arguments for memory_search")


# -- the call protocol ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "raw", "expected"), [
    ("read_file", '{"path": ', "error: the arguments are not valid JSON"),
    ("read_file", '["AGENTS.md"]', "error: the arguments must be a JSON object"),
    ("write_file", '{"path": "a.md"}', "error: invalid arguments for write_file: content: Field required"),
    ("write_file", '{"path": "a.md", "content": 123}', "error: invalid arguments for write_file: content:"),
    ("read_file", '{"path": "AGENTS.md", "offset": "first"}', "error: invalid arguments for read_file: offset:"),
    ("read_file", '{"path": "AGENTS.md", "offset": 0}', "error: invalid arguments for read_file: offset:"),
    ("read_file", '{"file": "AGENTS.md"}', "error: invalid arguments for read_file: path: Field required"),
    ("list_dir", '{"path": ".", "recursive": true}', "error: invalid arguments for list_dir: recursive:"),
    ("delete_file", '{"path": "a.md"}', "error: unknown tool 'delete_file'"),
])
def test_bad_calls_return_error_text(tools: ToolRegistry, root: Path, name: str, raw: str, expected: str) -> None:
    assert call_raw(tools, name, raw).startswith(expected)
    assert not (root / "a.md").exists()


def test_schemas_are_generated_from_args(tools: ToolRegistry) -> None:
    schemas = tools.schemas()
    assert [s["function"]["name"] for s in schemas] == [
        "memory_search", "memory_append", "read_file", "write_file", "edit_file", "append_file", "list_dir",
        "cron", "skill", "web_fetch"]
    required = {"memory_search": ["query"], "memory_append": ["content"], "read_file": ["path"],
                "write_file": ["path", "content"], "edit_file": ["path", "old_text", "new_text"],
                "append_file": ["path", "content"], "list_dir": [], "cron": ["action"], "skill": ["name"],
                "web_fetch": ["url"]}
    for schema, cls in zip(schemas, TOOL_CLASSES, strict=True):
        assert schema["type"] == "function"
        function = schema["function"]
        assert function["description"].strip() and len(function["description"]) < 400
        parameters = function["parameters"]
        generated = cls.Args.model_json_schema()
        assert parameters["properties"].keys() == generated["properties"].keys()
        assert parameters["type"] == "object" and "additionalProperties" not in parameters
        assert parameters.get("required", []) == required[function["name"]]
        for prop_name, prop in parameters["properties"].items():
            assert prop.get("type") in {"string", "integer"} or "enum" in prop, (function["name"], prop_name)
            # What tells a model nothing is left out: every request carries it, and a CPU model reads it all.
            assert not {"title", "minLength", "minimum"} & prop.keys(), (function["name"], prop_name)
            assert prop.get("default", "x") not in ("", 0), (function["name"], prop_name)
        json.dumps(schema)  # plain JSON, ready for the provider


def test_what_the_schemas_leave_out_is_still_checked(tools: ToolRegistry) -> None:
    assert call_raw(tools, "memory_search", '{"query": "狗", "colour": "red"}').startswith(
        "error: invalid arguments for memory_search: colour: Extra inputs are not permitted")
    assert call_raw(tools, "memory_append", '{"content": ""}').startswith(
        "error: invalid arguments for memory_append: content:")
    assert call_raw(tools, "read_file", '{"path": "USER.md", "offset": 0}').startswith(
        "error: invalid arguments for read_file: offset:")


def test_each_workspace_gets_its_own_tools(tmp_path: Path, workspace: Workspace, tools: ToolRegistry) -> None:
    other_home = tmp_path / "other-home"
    onboard_in_shanghai(other_home)
    other = App.open(other_home).workspace
    other_tools = build_tools(other)
    call(other_tools, "write_file", path="mine.md", content="other")
    call(other_tools, "memory_append", content="only in the other workspace")
    assert (other.root / "mine.md").exists() and not (workspace.root / "mine.md").exists()
    assert "only in the other workspace" not in memory_text(workspace)
    assert call(tools, "memory_search", query="other workspace").startswith("no matches")
    assert "error:" in call(tools, "read_file", path=str(other.root / "mine.md"))  # the other root is outside


def test_concurrent_calls_all_complete(tools: ToolRegistry, workspace: Workspace) -> None:
    # The tools run in worker threads; parallel memory appends must all land (the store's lock serialises them).
    async def many() -> list[str]:
        calls = [tools.execute("memory_append", json.dumps({"content": f"fact number {n}"})) for n in range(8)]
        calls += [tools.execute("write_file", json.dumps({"path": f"p{n}.md", "content": "x"})) for n in range(8)]
        return list(await asyncio.gather(*calls))

    results = asyncio.run(many())
    assert all(not r.startswith("error") for r in results), results
    assert all(f"fact number {n}\n" in memory_text(workspace) for n in range(8))
    assert sorted(p.name for p in workspace.root.glob("p*.md")) == [f"p{n}.md" for n in range(8)]


@pytest.fixture
def user_workspace(workspace: Workspace) -> Workspace:
    """A per-user workspace as with memory_scope "per_user": same root, memory in users/42/memory/."""
    return workspace.for_user("42")


@freeze_time(FROZEN)
def test_per_user_tools_see_only_their_own_memory(workspace: Workspace, user_workspace: Workspace) -> None:
    shared_before = memory_text(workspace)
    other_user = workspace.root / "users" / "7" / "memory" / "MEMORY.md"
    other_user.parent.mkdir(parents=True)
    other_user.write_text("## 2024-01-01\nuser 7's secret diary\n", encoding="utf-8")
    tools = build_tools(user_workspace)
    # "memory/…" is this user's own memory folder, written through this user's store.
    assert call(tools, "write_file", path="memory/MEMORY.md", content="宠物狗叫 Bob") == (
        "appended a '## 2024-03-05' entry to memory/MEMORY.md (MEMORY.md is never overwritten; "
        "use edit_file to change existing entries)")
    assert memory_text(user_workspace) == "## 2024-03-05\n宠物狗叫 Bob\n"
    assert memory_text(workspace) == shared_before
    assert call(tools, "read_file", path="memory/MEMORY.md") == "## 2024-03-05\n宠物狗叫 Bob\n"
    assert call(tools, "memory_search", query="我的狗叫什么").startswith("1 match")
    assert "[1] memory/MEMORY.md:1-2 (score" in call(tools, "memory_search", query="宠物狗")
    size = user_workspace.store.long_term_path.stat().st_size
    assert f"MEMORY.md ({size} bytes)" in call(tools, "list_dir", path="memory").splitlines()
    assert "users/42/memory" not in call(tools, "list_dir", path="memory")  # shown as memory/
    # Another user's memory is private, for reading as well as writing.
    for tool in FILE_TOOLS:
        for path in ("users/7/memory/MEMORY.md", "users/7/memory", "users"):
            result = call(tools, tool, **file_args(tool, path))
            assert result.startswith("error:") and "private memory" in result, (tool, path, result)
    assert other_user.read_text(encoding="utf-8") == "## 2024-01-01\nuser 7's secret diary\n"
    # Escaping the memory folder through the alias is still an escape.
    assert "outside the workspace" in call(tools, "read_file", path="memory/../../x")


@freeze_time(FROZEN)
def test_per_user_tools_are_rooted_in_the_users_folder(workspace: Workspace, user_workspace: Workspace) -> None:
    # memory_scope "per_user": every path is in users/42/; the shared bootstrap files read, never written.
    tools = build_tools(user_workspace)
    own = workspace.root / "users" / "42"
    user_md = (workspace.root / "USER.md").read_text(encoding="utf-8")
    assert call(tools, "write_file", path="notes/todo.md", content="买牛奶 / buy milk") == (
        "created notes/todo.md (14 characters)")
    assert (own / "notes" / "todo.md").read_text(encoding="utf-8") == "买牛奶 / buy milk"
    assert not (workspace.root / "notes").exists()
    for path in ("USER.md", "user.md", "./SOUL.md", "memory/../AGENTS.md", "IDENTITY.md"):
        for tool in ("write_file", "edit_file", "append_file"):
            result = call(tools, tool, **file_args(tool, path))
            assert result.startswith("error:") and "read-only" in result, (tool, path, result)
    assert call(tools, "read_file", path="USER.md") == user_md
    assert not any((own / name).exists() for name in ("USER.md", "user.md", "SOUL.md", "AGENTS.md"))
    for path in ("sessions", "sessions/telegram%3A42.jsonl", "../7/memory/MEMORY.md", "../../USER.md"):
        assert call(tools, "read_file", path=path).startswith("error:"), path


def test_a_new_users_folder_lists_as_empty(user_workspace: Workspace) -> None:
    assert call(build_tools(user_workspace), "list_dir") == "./ is empty"
