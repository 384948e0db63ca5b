"""Skill drafts from lessons: when the same workflow has worked `skill_draft_successes` times, the
lessons learned from its runs become a skill draft in `skills/_drafts/<name>/`, and the chat is told once.

A workflow is known by its tools (turn_review.workflow_of: the tools that worked, in the order each first
worked). The memory folder's `.skill_workflows.json` counts each workflow's successes and keeps the lessons
written from them (the newest MAX_LESSONS_KEPT), under a cross-process lock, written atomically; a workflow
is drafted once: the success that makes it due marks it in the same locked update, so no other turn, process
or restart drafts it again. A workflow without any lesson yet is not drafted (there is nothing to say); its
next success with a lesson drafts it.

The draft is a template filled with those lessons, not written by the model: the lessons already are the
model's own words, checked when they were written, so a second call would cost money and add a new way to
fail (a malformed skill) without adding knowledge; the user reads and edits the draft before accepting it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
import yaml

from picoclaw.curation.turn_review import FinishedTurn, workflow_of
from picoclaw.errors import ConfigError
from picoclaw.jsonio import read_json_object
from picoclaw.memory import Workspace
from picoclaw.storage import Storage, StorageError, document_of
from picoclaw.tools import SkillDraftError, SkillDrafts, safe_name

log = logging.getLogger(__name__)

WORKFLOWS_FILE = ".skill_workflows.json"
MAX_LESSONS_KEPT = 5
MAX_WORKFLOWS = 50  # the least recently successful beyond this are forgotten
MAX_DESCRIPTION_LESSON_CHARS = 300
LOCK_WAIT_SECONDS = 10.0
_VERSION = 1


@dataclass(frozen=True)
class Workflow:
    """One workflow's record: its tools, how often it worked, the lessons from its runs, whether it was drafted."""

    tools: tuple[str, ...]
    successes: int = 0
    lessons: tuple[str, ...] = ()
    sessions: tuple[str, ...] = ()
    drafted: bool = False

    def record(self) -> dict[str, Any]:
        return {"tools": list(self.tools), "successes": self.successes, "lessons": list(self.lessons),
                "sessions": list(self.sessions), "drafted": self.drafted}


class WorkflowTally:
    """The successes of each workflow of one memory folder (`.skill_workflows.json`, a dot file the file
    tools cannot write). Fails closed: a ledger that cannot be updated drafts nothing."""

    def __init__(self, memory_dir: Path, *, storage: Storage, lock_wait: float = LOCK_WAIT_SECONDS):
        self.path = Path(memory_dir) / WORKFLOWS_FILE
        self._lock = storage.lock(Path(memory_dir) / ".skill_workflows.lock", timeout=lock_wait)
        self.documents, self.name = document_of(storage, self.path)

    def record(self, tools: tuple[str, ...], lesson: str | None, session: str, due_at: int) -> Workflow | None:
        """Count one success of `tools` (with the lesson it taught, if any); the workflow when this success makes
        it due for a draft (`due_at` successes and a lesson, not drafted yet; marked drafted now), else None."""
        try:
            with self._lock:
                workflows = self._load()
                old = workflows.pop(tools, Workflow(tools))
                lessons = old.lessons
                if lesson and lesson not in lessons:
                    lessons = (*lessons, lesson)[-MAX_LESSONS_KEPT:]
                sessions = old.sessions if session in old.sessions else (*old.sessions, session)[-MAX_LESSONS_KEPT:]
                due = not old.drafted and old.successes + 1 >= due_at and bool(lessons)
                workflow = Workflow(tools, old.successes + 1, lessons, sessions, old.drafted or due)
                workflows[tools] = workflow  # last: the most recently successful
                self._save(workflows)
        except (OSError, StorageError) as exc:  # a held lock past its wait, a lost server: skipped, not fatal
            log.warning("skill drafts: cannot update %s (%s); this success is not counted", self.path, exc)
            return None
        return workflow if due else None

    def release(self, tools: tuple[str, ...]) -> None:
        """Undo the drafted mark of `tools` (its draft could not be written): a later success tries again."""
        try:
            with self._lock:
                workflows = self._load()
                if tools in workflows:
                    workflows[tools] = replace(workflows[tools], drafted=False)
                    self._save(workflows)
        except (OSError, StorageError) as exc:  # a held lock past its wait, a lost server: skipped, not fatal
            log.warning("skill drafts: cannot update %s (%s)", self.path, exc)

    def workflows(self) -> list[Workflow]:
        """Every workflow counted, the least recently successful first."""
        return list(self._load().values())

    def _load(self) -> dict[tuple[str, ...], Workflow]:
        file = self.documents.local(self.name)
        try:
            raw = read_json_object(file)
        except ConfigError as exc:
            if file.exists() or file.is_symlink():
                log.warning("skill drafts: %s; counting starts afresh", exc)
            return {}
        items = raw.get("workflows")
        if raw.get("version") != _VERSION or not isinstance(items, list):
            log.warning("skill drafts: %s is not a version %d file; counting starts afresh", self.path, _VERSION)
            return {}
        found: dict[tuple[str, ...], Workflow] = {}
        for item in items:
            workflow = _workflow(item)
            if workflow is not None:
                found[workflow.tools] = workflow
        return found

    def _save(self, workflows: dict[tuple[str, ...], Workflow]) -> None:
        kept = list(workflows.values())[-MAX_WORKFLOWS:]
        self.documents.replace(self.name, orjson.dumps({"version": _VERSION, "workflows": [w.record() for w in kept]},
                                             option=orjson.OPT_INDENT_2))


def _workflow(item: Any) -> Workflow | None:
    """A workflow read from the file, or None for an entry a hand edit broke."""
    if not isinstance(item, dict):
        return None
    tools, lessons, sessions = item.get("tools"), item.get("lessons", []), item.get("sessions", [])
    successes, drafted = item.get("successes"), item.get("drafted", False)
    texts = (tools, lessons, sessions)
    if not all(isinstance(value, list) and all(isinstance(text, str) for text in value) for value in texts):
        return None
    if not tools or type(successes) is not int or successes < 0 or not isinstance(drafted, bool):
        return None
    return Workflow(tuple(tools), successes, tuple(lessons), tuple(sessions), drafted)


def draft_name(tools: tuple[str, ...]) -> str:
    """The name a draft of `tools` is given (before a number is added to make it unique)."""
    return safe_name("workflow-" + "-".join(tools)) or "workflow"


def draft_text(name: str, workflow: Workflow) -> str:
    """The SKILL.md of a draft: front matter (name, a one-line description), the steps, the lessons."""
    steps = " → ".join(workflow.tools)
    first = " ".join(workflow.lessons[0].split()) if workflow.lessons else ""
    if len(first) > MAX_DESCRIPTION_LESSON_CHARS:
        first = first[:MAX_DESCRIPTION_LESSON_CHARS].rstrip() + "…"
    description = f"Tasks done with {steps}. {first}".strip()
    front = yaml.safe_dump({"name": name, "description": description}, allow_unicode=True, sort_keys=False,
                           width=100_000)
    lines = [f"---\n{front}---", f"# {steps}", "",
             f"Drafted from the lessons of {workflow.successes} runs of these steps that worked "
             f"(sessions: {', '.join(workflow.sessions)}).", "", "## Steps that worked"]
    lines += [f"{number}. `{tool}`" for number, tool in enumerate(workflow.tools, 1)]
    lines += ["", "## Lessons"]
    lines += [f"- {' '.join(lesson.split())}" for lesson in workflow.lessons]
    return "\n".join(lines) + "\n"


def draft_notice(name: str, workflow: Workflow) -> str:
    """What the chat is told, once, when a draft is written."""
    return (f"The same steps ({' → '.join(workflow.tools)}) worked {workflow.successes} times, so I drafted a skill "
            f"from what I learned: {name}. It is not used until you accept it: `picoclaw skills drafts` shows it, "
            f"`picoclaw skills accept {name}` installs it, `picoclaw skills reject {name}` deletes it.")


@dataclass(frozen=True)
class DraftWritten:
    """A draft just written: its name, and the notice the chat gets (once)."""

    name: str
    notice: str


class SkillDrafter:
    """Counts one workspace's workflows that worked and drafts a skill from the lessons of one that keeps working."""

    def __init__(self, workspace: Workspace):
        self.workspace = workspace
        self.tally = WorkflowTally(workspace.memory_dir, storage=workspace.storage)
        self.drafts = SkillDrafts(workspace.layout.skills_dir)

    async def after_turn(self, turn: FinishedTurn, lesson: str | None) -> DraftWritten | None:
        """Count `turn` if it was a workflow that worked, and draft its skill when due (None: no draft now)."""
        policy = self.workspace.policy.current()
        tools = workflow_of(turn)
        if not policy.learning_enabled or tools is None:
            return None
        due = await asyncio.to_thread(self.tally.record, tools, lesson, turn.key, policy.skill_draft_successes)
        if due is None:
            return None
        try:
            name = await asyncio.to_thread(self._write, due)
        except (SkillDraftError, OSError) as exc:
            log.warning("session %s: skill draft of %s not written: %s", turn.key, " → ".join(tools), exc)
            await asyncio.to_thread(self.tally.release, tools)
            return None
        log.info("session %s: drafted skill %s from %d lesson(s) of %d runs of %s", turn.key, name,
                 len(due.lessons), due.successes, " → ".join(tools))
        return DraftWritten(name, draft_notice(name, due))

    def _write(self, workflow: Workflow) -> str:
        name = self.drafts.free_name(draft_name(workflow.tools))
        self.drafts.write(name, draft_text(name, workflow))
        return name

