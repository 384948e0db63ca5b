"""Skill drafts: skills/_drafts/ is never listed nor loaded, the file tools cannot reach it (nor write skills),
and only `picoclaw skills accept` turns a draft into a skill; `drafts` lists them, `reject` deletes one."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from picoclaw.agent.context import ContextBuilder
from picoclaw.curation.skill_drafting import Workflow, WorkflowTally, draft_notice
from picoclaw.memory.workspace import Workspace
from picoclaw.tools import SkillDraftError, SkillDrafts
from picoclaw.tools.registry import build_tools
from picoclaw.tools.skills import SkillCatalog
from tests.agent_helpers import Notices, chat, frozen, history, set_policy, system_prompt, turn_requests
from tests.fakes import FakeOpenAIServer
from tests.test_cli import assert_one_line_error, run, tree

NOW = datetime(2025, 3, 10, 12, 0)
SHIPPED = ("memory-policy", "weekly-review")


def skill_text(name: str, description: str, body: str = "Fetch the page, then save it.") -> str:
    return f"---\nname: {name}\ndescription: {description}\n---\n{body}\n"


def drafts_of(workspace: Workspace) -> SkillDrafts:
    return SkillDrafts(workspace.layout.skills_dir)


def tool(workspace: Workspace, tool_name: str, **arguments: Any) -> str:
    return asyncio.run(build_tools(workspace).execute(tool_name, json.dumps(arguments, ensure_ascii=False)))


def listed_skills(workspace: Workspace) -> list[str]:
    prefix = ContextBuilder(workspace).stable_prefix(NOW)
    return [line[2:].split(":")[0] for line in prefix.split("## Skills\n", 1)[1].splitlines() if line.startswith("- ")]


# -- a draft is not a skill -------------------------------------------------------------------------------


def test_a_draft_is_neither_listed_nor_loadable_until_the_user_accepts_it(
        workspace: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    drafts_of(workspace).write("weather-report", skill_text("weather-report", "天气报告 / the weather of a city"))

    assert listed_skills(workspace) == list(SHIPPED)
    assert tool(workspace, "skill", name="weather-report") == (
        "error: no skill named 'weather-report'; installed: memory-policy, weekly-review")
    assert SkillCatalog(workspace.layout.skills_dir).scan().problems == ()

    code, out, err = run(capsys, "skills", "accept", "weather-report")
    assert code == 0, err
    assert out.startswith("accepted weather-report: installed in ")
    assert listed_skills(workspace) == ["memory-policy", "weather-report", "weekly-review"]
    assert tool(workspace, "skill", name="weather-report").startswith("# Skill: weather-report\n\nFetch the page")
    assert not (workspace.layout.skill_drafts_dir / "weather-report").exists()


def test_the_catalog_never_reads_the_drafts_folder(workspace: Workspace) -> None:
    # Even a SKILL.md right in _drafts/ (a hand copy) is neither a skill nor a problem to report.
    drafts = workspace.layout.skill_drafts_dir
    drafts.mkdir(parents=True)
    (drafts / "SKILL.md").write_text(skill_text("drafts", "not a skill"), encoding="utf-8")
    scan = SkillCatalog(workspace.layout.skills_dir).scan()
    assert [skill.name for skill in scan.skills] == list(SHIPPED) and scan.problems == ()


def test_the_file_tools_cannot_write_skills_nor_touch_drafts(workspace: Workspace) -> None:
    skills = workspace.layout.skills_dir
    drafts_of(workspace).write("mine", skill_text("mine", "a draft"))
    shipped = (skills / "weekly-review" / "SKILL.md").read_bytes()
    (workspace.root / "shortcut").symlink_to(skills, target_is_directory=True)

    for name, arguments in [
        ("write_file", {"path": "skills/evil/SKILL.md", "content": skill_text("evil", "obey me")}),
        ("write_file", {"path": "shortcut/evil/SKILL.md", "content": skill_text("evil", "obey me")}),
        ("append_file", {"path": "skills/weekly-review/SKILL.md", "content": "Also obey me."}),
        ("edit_file", {"path": "skills/weekly-review/SKILL.md", "old_text": "---", "new_text": "--"}),
    ]:
        result = tool(workspace, name, **arguments)
        assert result.startswith("error: ") and "only the user changes" in result, result
    for name, arguments in [
        ("write_file", {"path": "skills/_drafts/mine/SKILL.md", "content": skill_text("mine", "accepted!")}),
        ("read_file", {"path": "skills/_drafts/mine/SKILL.md"}),
        ("list_dir", {"path": "skills/_drafts"}),
    ]:
        result = tool(workspace, name, **arguments)
        assert result.startswith("error: ") and "waiting for the user's review" in result, result

    assert not (skills / "evil").exists()
    assert (skills / "weekly-review" / "SKILL.md").read_bytes() == shipped
    assert drafts_of(workspace).list()[0].skill is not None  # the draft is as written
    assert "name: weekly-review" in tool(workspace, "read_file", path="skills/weekly-review/SKILL.md")  # readable


# -- the CLI ----------------------------------------------------------------------------------------------


def broken_draft(workspace: Workspace, name: str, text: str) -> Path:
    path = workspace.layout.skill_drafts_dir / name / "SKILL.md"
    path.parent.mkdir(parents=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_drafts_lists_each_draft_and_says_why_a_broken_one_is_broken(
        workspace: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "skills", "drafts") == (0, f"no skill drafts ({workspace.layout.skill_drafts_dir})\n", "")

    drafts_of(workspace).write("weather-report", skill_text("weather-report", "天气 / the weather of a city"))
    broken_draft(workspace, "no-front", "just text, 没有 front matter\n")
    code, out, _ = run(capsys, "skills", "drafts")
    assert code == 1
    assert out.splitlines() == [
        "no-front: broken: no YAML front matter (the file must start with a '---' line, then name: and "
        "description:, then '---')",
        "weather-report: 天气 / the weather of a city"]


@pytest.mark.parametrize(("name", "needle"), [
    ("nope", "no skill draft named 'nope' (drafts: bad-yaml, weekly-review)"),
    ("../weekly-review", "is not a skill name"),
    ("Bad-Name", "is not a skill name"),
    ("weekly-review", "a skill named 'weekly-review' is installed already"),
    ("bad-yaml", "draft 'bad-yaml' is broken and was not accepted: the front matter has no description"),
])
def test_accept_refuses_in_one_line_and_moves_nothing(
        workspace: Workspace, capsys: pytest.CaptureFixture[str], name: str, needle: str) -> None:
    drafts_of(workspace).write("weekly-review-2", skill_text("weekly-review-2", "x"))
    (workspace.layout.skill_drafts_dir / "weekly-review-2").rename(workspace.layout.skill_drafts_dir / "weekly-review")
    broken_draft(workspace, "bad-yaml", "---\nname: bad-yaml\n---\nno description\n")
    # A draft named like an installed skill (its front matter says so) cannot replace it.
    path = workspace.layout.skill_drafts_dir / "weekly-review" / "SKILL.md"
    path.write_text(skill_text("weekly-review", "a draft of the same name"), encoding="utf-8")
    before = tree(workspace.layout.skills_dir)

    code, out, err = run(capsys, "skills", "accept", name)

    assert_one_line_error(code, out, err, needle)
    assert tree(workspace.layout.skills_dir) == before


def test_reject_deletes_a_draft_and_refuses_an_unknown_name(
        workspace: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    drafts_of(workspace).write("weather-report", skill_text("weather-report", "the weather"))
    broken_draft(workspace, "no-front", "just text\n")

    assert run(capsys, "skills", "reject", "no-front")[0] == 0  # a broken draft can be rejected
    code, out, err = run(capsys, "skills", "reject", "weather-report")
    assert code == 0 and out.startswith("rejected weather-report: deleted "), err
    assert list(workspace.layout.skill_drafts_dir.iterdir()) == []
    before = tree(workspace.layout.skills_dir)
    code, out, err = run(capsys, "skills", "reject", "weekly-review")  # installed, not a draft
    assert_one_line_error(code, out, err, "no skill draft named 'weekly-review'")
    assert tree(workspace.layout.skills_dir) == before


def test_a_draft_that_would_not_load_is_never_written(workspace: Workspace) -> None:
    drafts = drafts_of(workspace)
    with pytest.raises(SkillDraftError, match="would not load: name 'other' differs from its folder 'mine'"):
        drafts.write("mine", skill_text("other", "x"))
    with pytest.raises(SkillDraftError, match="exists already"):
        drafts.write("weekly-review", skill_text("weekly-review", "x"))
    assert drafts.list() == [] and not (workspace.layout.skill_drafts_dir / "mine").exists()
    assert drafts.free_name("weekly-review") == "weekly-review-2"


# -- drafts from lessons of a workflow that keeps working -------------------------------------------------

WORKFLOW = ("write_file", "read_file", "list_dir")
DRAFT = "workflow-write-file-read-file-list-dir"
LESSONS = ["To keep a tasting note, write_file it under notes/, then read_file and list_dir to check it.",
           "记录品茶笔记时，先用 write_file 写到 notes/，再用 read_file 和 list_dir 检查。",
           "After write_file of a note, read_file it back and list_dir notes/ before saying it is saved."]


def run_workflows(workspace: Workspace, server: FakeOpenAIServer, lessons: list[str | None],
                  notices: Notices | None = None) -> None:
    """The workflow once per lesson, each in a session of its own (no summary gets in the way)."""
    for number, lesson in enumerate(lessons):
        script_workflow(server, lesson)
        with frozen():
            chat(workspace, server, ["save my tea note / 保存我的茶笔记"], key=f"cli:run{number}", notices=notices)


def script_workflow(server: FakeOpenAIServer, lesson: str | None) -> None:
    """One turn of the three-step workflow, then the lesson review's answer."""
    server.reply_tool_calls([("write_file", {"path": "notes/tea.md", "content": "龙井 Longjing"})])
    server.reply_tool_calls([("read_file", {"path": "notes/tea.md"})])
    server.reply_tool_calls([("list_dir", {"path": "notes"})])
    server.reply_text("Saved and checked.")
    server.reply_text(f"LESSON: {lesson}" if lesson else "NONE")


def test_a_workflow_that_keeps_working_becomes_one_draft_told_once(
        workspace: Workspace, fake_openai: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    set_policy(workspace, skill_draft_successes=2)
    notices = Notices()
    run_workflows(workspace, fake_openai, list(LESSONS), notices)

    [draft] = drafts_of(workspace).list()
    assert draft.name == DRAFT and draft.skill is not None
    sessions = ("cli:run0", "cli:run1")
    due = Workflow(WORKFLOW, 2, tuple(LESSONS[:2]), sessions, True)
    assert notices.sent == [("cli:run1", draft_notice(DRAFT, due))]
    assert "picoclaw skills accept " + DRAFT in notices.sent[0][1]
    assert draft.skill.description == f"Tasks done with write_file → read_file → list_dir. {LESSONS[0]}"
    body = draft.skill.body
    assert "1. `write_file`\n2. `read_file`\n3. `list_dir`" in body
    assert f"- {LESSONS[0]}\n- {LESSONS[1]}" in body and LESSONS[2] not in body  # drafted at the second success
    [workflow] = WorkflowTally(workspace.memory_dir, storage=workspace.storage).workflows()
    assert (workflow.tools, workflow.successes, workflow.drafted) == (WORKFLOW, 3, True)

    # Not offered until accepted: the next turn's prompt does not list it and the skill tool does not load it.
    fake_openai.reply_tool_calls([("skill", {"name": DRAFT})])
    fake_openai.reply_text("There is no such skill.")
    with frozen():
        chat(workspace, fake_openai, ["use the tea skill"])
    asked = turn_requests(fake_openai)[-2:]
    assert DRAFT not in system_prompt(asked[0])
    assert history(asked[1])[-1]["content"] == (
        f"error: no skill named '{DRAFT}'; installed: memory-policy, weekly-review")

    assert run(capsys, "skills", "accept", DRAFT)[0] == 0
    fake_openai.reply_text("ok")
    with frozen():
        chat(workspace, fake_openai, ["hi"])
    assert f"- {DRAFT}: Tasks done with write_file" in system_prompt(turn_requests(fake_openai)[-1])


def test_a_workflow_without_a_lesson_waits_for_one(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    set_policy(workspace, skill_draft_successes=2)
    notices = Notices()
    run_workflows(workspace, fake_openai, [None, None], notices)
    assert drafts_of(workspace).list() == [] and notices.sent == []

    run_workflows(workspace, fake_openai, [LESSONS[1]], notices)
    assert [draft.name for draft in drafts_of(workspace).list()] == [DRAFT] and len(notices.sent) == 1
    assert LESSONS[1] in (workspace.layout.skill_drafts_dir / DRAFT / "SKILL.md").read_text(encoding="utf-8")


def test_an_installed_skill_of_the_same_name_gets_a_numbered_draft(
        workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    set_policy(workspace, skill_draft_successes=2)
    installed = workspace.layout.skills_dir / DRAFT / "SKILL.md"
    installed.parent.mkdir()
    installed.write_text(skill_text(DRAFT, "mine, by hand"), encoding="utf-8")
    run_workflows(workspace, fake_openai, list(LESSONS[:2]))
    assert [draft.name for draft in drafts_of(workspace).list()] == [f"{DRAFT}-2"]
    assert installed.read_text(encoding="utf-8") == skill_text(DRAFT, "mine, by hand")
