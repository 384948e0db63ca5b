"""Skills: listed in a byte-stable system prompt prefix, loaded on demand, bad ones rejected with one log line."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from picoclaw.agent.context import ContextBuilder
from picoclaw.cli import main
from picoclaw.memory.workspace import Workspace
from picoclaw.storage import FilesStorage
from picoclaw.tools import skills as skills_module
from picoclaw.tools.registry import build_tools
from picoclaw.tools.skills import SkillCatalog, SkillFormatError, parse_skill, shared_catalog
from tests.agent_helpers import chat, system_prompt
from tests.fakes import FakeOpenAIServer

NOW = datetime(2024, 3, 5, 12, 0)
SHIPPED = ("memory-policy", "weekly-review")


def write_skill(folder: Path, name: str, description: str, body: str = "Do the thing.") -> Path:
    path = folder / name / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\nname: {name}\ndescription: {description}\n---\n{body}\n", encoding="utf-8")
    return path


def call(workspace: Workspace, **arguments: Any) -> str:
    return asyncio.run(build_tools(workspace).execute("skill", json.dumps(arguments, ensure_ascii=False)))


def test_onboarding_installs_the_shipped_skills(workspace: Workspace) -> None:
    scan = SkillCatalog(workspace.layout.skills_dir).scan()
    assert [skill.name for skill in scan.skills] == list(SHIPPED) and scan.problems == ()
    for skill in scan.skills:
        assert any("\u4e00" <= ch <= "\u9fff" for ch in skill.description)  # Chinese trigger words
        assert "\n" not in skill.description and len(skill.body) > 200


def test_skills_are_listed_sorted_in_a_byte_stable_prefix(workspace: Workspace) -> None:
    skills_dir = workspace.layout.skills_dir
    write_skill(skills_dir, "aaa-first", "sorted before the shipped ones / 排序")
    first = ContextBuilder(workspace).stable_prefix(NOW)
    builder = ContextBuilder(workspace)
    assert builder.stable_prefix(NOW) == first and builder.stable_prefix(NOW) == first
    listed = [line.split(":")[0] for line in first.split("## Skills\n", 1)[1].splitlines() if line.startswith("- ")]
    assert listed == ["- aaa-first", *(f"- {name}" for name in SHIPPED)]
    assert first.index("## Skills") < first.index("## Today")

    write_skill(skills_dir, "aaa-first", "a new description")
    changed = builder.stable_prefix(NOW)
    assert changed != first and "- aaa-first: a new description" in changed
    write_skill(skills_dir, "zzz-last", "added later")
    assert builder.stable_prefix(NOW).endswith(f"- zzz-last: added later\n\n## Today\n{NOW:%A %Y-%m-%d} "
                                               f"({workspace.config.timezone})")


def test_an_unchanged_folder_is_not_parsed_again(workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[Path] = []
    real = skills_module.parse_skill

    def counting(path: Path) -> Any:
        parsed.append(path)
        return real(path)

    monkeypatch.setattr(skills_module, "parse_skill", counting)
    builder = ContextBuilder(workspace)
    builder.stable_prefix(NOW)
    builder.stable_prefix(NOW)
    assert len(parsed) == len(SHIPPED)
    path = workspace.layout.skills_dir / "weekly-review" / "SKILL.md"
    path.write_text(path.read_text(encoding="utf-8") + "\nOne more line.\n", encoding="utf-8")
    os.utime(path, ns=(1, 1))  # a different mtime even on a coarse clock
    builder.stable_prefix(NOW)
    assert parsed[len(SHIPPED):] == [path]


def test_only_folders_holding_a_skill_md_are_skills(workspace: Workspace) -> None:
    skills_dir = workspace.layout.skills_dir
    write_skill(skills_dir, "weather", "每天的天气 / the weather")
    (skills_dir / "empty-folder").mkdir()
    (skills_dir / "notes.txt").write_text("not a skill 不是技能\n", encoding="utf-8")
    (skills_dir / "folder-skill" / "SKILL.md").mkdir(parents=True)  # a folder named SKILL.md is no skill file
    write_skill(skills_dir, ".hidden", "a dot folder is passed over")
    (skills_dir / "loop").symlink_to(skills_dir / "loop")  # a link to itself: skipped, not a failure
    (skills_dir / "nowhere").symlink_to(skills_dir / "gone")
    scan = SkillCatalog(skills_dir).scan()
    assert [skill.name for skill in scan.skills] == sorted([*SHIPPED, "weather"]) and scan.problems == ()
    assert "- weather: 每天的天气 / the weather" in ContextBuilder(workspace).stable_prefix(NOW)


def test_no_skills_no_section(workspace: Workspace) -> None:
    remove_shipped_skills(workspace)
    assert "## Skills" not in ContextBuilder(workspace).stable_prefix(NOW)


def test_the_skill_tool_loads_instructions_and_files(workspace: Workspace) -> None:
    folder = workspace.layout.skills_dir
    write_skill(folder, "tea-log", "log tea tastings / 品茶记录", body="# Tea log\nUse template.md.")
    (folder / "tea-log" / "template.md").write_text("| date | tea | notes |", encoding="utf-8")
    (folder / "tea-log" / "examples").mkdir()
    (folder / "tea-log" / "examples" / "one.md").write_text("2024-03-05 龙井", encoding="utf-8")
    assert call(workspace, name="tea-log") == (
        "# Skill: tea-log\n\n# Tea log\nUse template.md.\n\nFiles beside this skill (read one with skill(name, "
        "file)):\n- examples/one.md\n- template.md")
    assert call(workspace, name="tea-log", file="examples/one.md") == "2024-03-05 龙井"
    assert call(workspace, name="tea-log", file="./template.md") == "| date | tea | notes |"
    assert call(workspace, name="tea-log", file="../weekly-review/SKILL.md").startswith(
        "error: skill 'tea-log' has no file '../weekly-review/SKILL.md'")
    assert call(workspace, name="nope") == ("error: no skill named 'nope'; installed: memory-policy, tea-log, "
                                            "weekly-review")
    assert call(workspace, name="weekly-review").startswith("# Skill: weekly-review\n\n# Weekly review\n")


def test_the_model_loads_a_skill_on_demand_and_reads_it_in_the_next_request(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    """Only the description is in every prompt; the body reaches the model after it asks for it."""
    write_skill(workspace.layout.skills_dir, "tea-order", "how to order the office tea / 订茶",
                "Order 龙井 from the shop on Hefang Street; always two tins.")
    fake_openai.reply_tool_calls([("skill", {"name": "tea-order"})])
    fake_openai.reply_text("Two tins of 龙井 from Hefang Street.")

    assert chat(workspace, fake_openai, ["how do I order tea? 怎么订茶？"]) == ["Two tins of 龙井 from Hefang Street."]
    first, second = fake_openai.chat_requests()
    assert "- tea-order: how to order the office tea / 订茶" in system_prompt(first)
    assert "Hefang Street" not in json.dumps(first, ensure_ascii=False)  # not before it is asked for
    assert system_prompt(second) == system_prompt(first)  # loading a skill leaves the prefix as it was
    [result] = [m for m in second["messages"] if m["role"] == "tool"]
    assert "Order 龙井 from the shop on Hefang Street; always two tins." in result["content"]


def test_a_link_out_of_the_skill_folder_is_not_offered(workspace: Workspace, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET", encoding="utf-8")
    folder = workspace.layout.skills_dir
    write_skill(folder, "linked", "has a link")
    (folder / "linked" / "secret.txt").symlink_to(secret)
    assert "secret.txt" not in call(workspace, name="linked")
    assert call(workspace, name="linked", file="secret.txt").startswith("error: ")


def test_a_skill_without_front_matter_is_rejected_with_one_log_line(
        workspace: Workspace, caplog: pytest.LogCaptureFixture) -> None:
    bad = workspace.layout.skills_dir / "broken" / "SKILL.md"
    bad.parent.mkdir()
    bad.write_text("# Just a heading\nNo front matter here.\n", encoding="utf-8")
    builder = ContextBuilder(workspace)
    with caplog.at_level(logging.WARNING, logger="picoclaw.tools.skills"):
        prefix = builder.stable_prefix(NOW)
        assert builder.stable_prefix(NOW) == prefix
    lines = [r.getMessage() for r in caplog.records if r.name == "picoclaw.tools.skills"]
    assert lines == [f"skill {bad} rejected: no YAML front matter (the file must start with a '---' line, then "
                     "name: and description:, then '---')"]
    assert "broken" not in prefix
    assert call(workspace, name="broken").startswith("error: no skill named 'broken'")


def test_a_broken_skill_is_logged_once_whoever_reads_the_folder(
        workspace: Workspace, caplog: pytest.LogCaptureFixture) -> None:
    # The prompt builder and the skill tool of the shared agent and of a per-user agent read one catalog.
    bad = workspace.layout.skills_dir / "broken" / "SKILL.md"
    bad.parent.mkdir()
    bad.write_text("no front matter", encoding="utf-8")
    per_user = workspace.for_user("tg_42")

    def read_everywhere() -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="picoclaw.tools.skills"):
            for scope in (workspace, per_user):
                ContextBuilder(scope).stable_prefix(NOW)
                assert call(scope, name="weekly-review").startswith("# Skill: weekly-review")
                assert call(scope, name="broken").startswith("error: no skill named 'broken'")
        return [r.getMessage() for r in caplog.records if r.name == "picoclaw.tools.skills"]

    assert read_everywhere() == [f"skill {bad} rejected: no YAML front matter (the file must start with a '---' "
                                 "line, then name: and description:, then '---')"]
    assert read_everywhere() == []  # unchanged: not parsed, not logged again
    bad.write_text("---\nname: broken\n---\nstill no description", encoding="utf-8")
    os.utime(bad, ns=(1, 1))  # a different mtime even on a coarse clock
    assert read_everywhere() == [f"skill {bad} rejected: the front matter has no description"]  # once per change


def test_the_shared_catalog_is_one_per_folder(workspace: Workspace) -> None:
    folder = workspace.layout.skills_dir
    catalog = shared_catalog(folder)
    assert shared_catalog(folder / ".." / folder.name) is catalog
    assert shared_catalog(workspace.for_user("tg_42").layout.skills_dir) is catalog
    assert ContextBuilder(workspace).skills is catalog


def test_an_unreadable_skill_file_is_a_tool_error(workspace: Workspace, monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    folder = workspace.layout.skills_dir
    write_skill(folder, "tea-log", "log tea tastings", body="Use template.md.")
    (folder / "tea-log" / "template.md").write_text("| date | tea |", encoding="utf-8")

    def unreadable(path: Path, limit: int) -> str:  # what a file without read permission gives a non-root user
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(skills_module, "read_text", unreadable)
    with caplog.at_level(logging.WARNING):
        out = call(workspace, name="tea-log", file="template.md")
    assert out == "error: could not read template.md of skill 'tea-log': Permission denied"
    assert not [r for r in caplog.records if "failed" in r.getMessage()]  # no "tool skill failed" traceback


def test_a_large_skill_file_is_read_only_up_to_the_limit(workspace: Workspace) -> None:
    folder = workspace.layout.skills_dir
    write_skill(folder, "big", "a big data file beside it")
    (folder / "big" / "data.txt").write_text("x" * (skills_module.MAX_FILE_CHARS + 10), encoding="utf-8")
    assert call(workspace, name="big", file="data.txt") == (
        "x" * skills_module.MAX_FILE_CHARS + f"\n[… truncated at {skills_module.MAX_FILE_CHARS} characters]")


def remove_shipped_skills(workspace: Workspace) -> None:
    for name in SHIPPED:
        for path in (workspace.layout.skills_dir / name).iterdir():
            path.unlink()
        (workspace.layout.skills_dir / name).rmdir()


def bare_workspace(workspace: Workspace, home: Path) -> Workspace:
    """A second workspace of the same config, with no skills installed."""
    bare = workspace.config.model_copy(update={"workspace": str(home / "bare")})
    return Workspace.from_config(bare, home, FilesStorage(home / "bare"))


def test_the_skill_tool_is_offered_only_when_a_skill_loads(workspace: Workspace, home: Path) -> None:
    assert "skill" in build_tools(workspace).tools
    bare = bare_workspace(workspace, home)
    bad = bare.layout.skills_dir / "broken" / "SKILL.md"
    bad.parent.mkdir(parents=True)
    bad.write_text("no front matter", encoding="utf-8")
    tools = build_tools(bare)
    assert "skill" not in tools.tools and "skill" not in [s["function"]["name"] for s in tools.schemas()]
    assert "## Skills" not in ContextBuilder(bare).stable_prefix(NOW)


def test_offering_skills_is_decided_once_per_process(workspace: Workspace, home: Path) -> None:
    # An agent's tool schemas are made once: a skill tool that appeared with the first skill would be missing
    # from the agents built before it, whose prompts would list skills for it. So a first skill added while
    # running waits for the next start (a new catalog) ...
    bare = bare_workspace(workspace, home)
    assert "skill" not in build_tools(bare).tools
    write_skill(bare.layout.skills_dir, "tea-log", "log tea tastings")
    assert "skill" not in build_tools(bare).tools
    assert "## Skills" not in ContextBuilder(bare).stable_prefix(NOW)
    assert SkillCatalog(bare.layout.skills_dir).offered()

    # ... and a skill tool once offered stays, answering for what is installed now.
    assert "skill" in build_tools(workspace).tools
    remove_shipped_skills(workspace)
    assert "skill" in build_tools(workspace).tools
    assert call(workspace, name="weekly-review") == "error: no skill named 'weekly-review'; installed: none"
    assert "## Skills" not in ContextBuilder(workspace).stable_prefix(NOW)


@pytest.mark.parametrize(("text", "reason"), [
    ("---\ndescription: x\n---\nbody", "the front matter has no name"),
    ("---\nname: demo\n---\nbody", "the front matter has no description"),
    ("---\nname: other\ndescription: x\n---\nbody", "name 'other' differs from its folder 'demo'"),
    ("---\nname: Demo Skill\ndescription: x\n---\nbody", "must be lowercase letters, digits and hyphens"),
    ("---\nname: [demo\n---\nbody", "not valid YAML"),
    ("---\n- a list\n---\nbody", "must be a mapping"),
    ("---\nname: demo\ndescription: x\nno closing line", "no YAML front matter"),
])
def test_front_matter_problems_are_named(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "demo" / "SKILL.md"
    path.parent.mkdir()
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SkillFormatError, match=reason.replace("[", r"\[")):
        parse_skill(path)


def test_folded_yaml_description_becomes_one_line(tmp_path: Path) -> None:
    path = tmp_path / "demo" / "SKILL.md"
    path.parent.mkdir()
    path.write_text("\ufeff---\nname: demo\ndescription: >\n  two\n  lines\n---\n\nBody.\n", encoding="utf-8")
    skill = parse_skill(path)
    assert (skill.description, skill.body) == ("two lines", "Body.")


def test_cli_skills_list(home: Path, workspace: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["skills", "list"]) == 0
    out = capsys.readouterr().out
    assert [line.split(":")[0] for line in out.splitlines()] == list(SHIPPED)
    bad = workspace.layout.skills_dir / "broken" / "SKILL.md"
    bad.parent.mkdir()
    bad.write_text("no front matter", encoding="utf-8")
    assert main(["skills", "list"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"failed: {bad}: no YAML front matter (the file must start with a '---' line, " \
                                   "then name: and description:, then '---')"
