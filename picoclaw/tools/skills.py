"""Skills: `workspace/skills/<name>/SKILL.md`, instructions the model loads only when a task needs them.

A SKILL.md starts with YAML front matter between `---` lines holding `name` (the folder's name) and a
one-line `description`; the rest is the instructions. The system prompt lists every skill's name and
description (sorted by name, so the prompt prefix stays byte-identical while the skills do not change);
the `skill` tool returns a skill's instructions, or a file beside its SKILL.md, on demand. `skills/_drafts/`
holds skills drafted from lessons (tools/drafts.py): the catalog never reads it, so a draft is neither listed
nor loadable until the user accepts it (`picoclaw skills accept`).

A process keeps one catalog per skills folder (`shared_catalog`): the prompt builder and the skill tool of
every agent, shared or per user, read the same scan, so a broken SKILL.md is parsed and logged once per
change of the file, not once per reader.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from picoclaw.disk.file_identity import FileCache, FileKey, stat_key
from picoclaw.layout import SKILL_DRAFTS_DIR
from picoclaw.memory import Workspace
from picoclaw.tools.base import Tool, ToolError

log = logging.getLogger(__name__)

SKILL_FILE = "SKILL.md"
MAX_SKILL_BYTES = 200_000
MAX_DESCRIPTION_CHARS = 1024
MAX_SKILL_FILES = 50
MAX_FILE_CHARS = 50_000
# The Agent Skills convention: lowercase letters, digits and hyphens; also a safe folder name.
SKILL_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.DOTALL)


@dataclass(frozen=True)
class Skill:
    """One installed skill: its name, one-line description, instructions and folder."""

    name: str
    description: str
    body: str
    folder: Path

    def files(self) -> list[str]:
        """Files beside SKILL.md (relative, sorted), which the skill's instructions may refer to."""
        found: list[str] = []
        root = os.path.realpath(self.folder)
        for path in sorted(self.folder.rglob("*")):
            # A link out of the folder is not the skill's file (the tool would read wherever it points).
            inside = os.path.commonpath([root, os.path.realpath(path)]) == root
            if inside and path.is_file() and path.name != SKILL_FILE and not path.name.startswith("."):
                found.append(path.relative_to(self.folder).as_posix())
                if len(found) >= MAX_SKILL_FILES:
                    break
        return found


@dataclass(frozen=True)
class SkillProblem:
    """A SKILL.md that could not be loaded, and why."""

    path: Path
    reason: str


@dataclass(frozen=True)
class SkillScan:
    """What the skills folder holds: the loaded skills sorted by name, and the files that failed."""

    skills: tuple[Skill, ...]
    problems: tuple[SkillProblem, ...]

    def get(self, name: str) -> Skill | None:
        return next((skill for skill in self.skills if skill.name == name), None)


class SkillFormatError(ValueError):
    """A SKILL.md without valid front matter."""


def parse_skill(path: Path) -> Skill:
    """Read one SKILL.md; raises SkillFormatError naming what is missing or wrong."""
    if path.stat().st_size > MAX_SKILL_BYTES:
        raise SkillFormatError(f"larger than {MAX_SKILL_BYTES} bytes")
    text = path.read_text(encoding="utf-8", errors="replace").lstrip("\ufeff")
    match = _FRONT_MATTER.match(text)
    if match is None:
        raise SkillFormatError("no YAML front matter (the file must start with a '---' line, then name: and "
                               "description:, then '---')")
    try:
        meta: Any = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        raise SkillFormatError(f"the front matter is not valid YAML: {exc}".splitlines()[0]) from exc
    if not isinstance(meta, dict):
        raise SkillFormatError("the front matter must be a mapping with name: and description:")
    name, description = meta.get("name"), meta.get("description")
    if not isinstance(name, str) or not name.strip():
        raise SkillFormatError("the front matter has no name")
    if not isinstance(description, str) or not description.strip():
        raise SkillFormatError("the front matter has no description")
    name = name.strip()
    if not SKILL_NAME.match(name):
        raise SkillFormatError(f"name {name!r} must be lowercase letters, digits and hyphens (at most 64)")
    if name != path.parent.name:
        raise SkillFormatError(f"name {name!r} differs from its folder {path.parent.name!r}")
    description = " ".join(description.split())  # one line in the prompt, whatever YAML folded
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise SkillFormatError(f"the description is longer than {MAX_DESCRIPTION_CHARS} characters")
    return Skill(name, description, text[match.end():].strip(), path.parent)


def _load_or_problem(path: Path) -> Skill | SkillProblem:
    # Called only when the file changed (FileCache), so a broken skill is logged once, not every turn.
    try:
        return parse_skill(path)
    except (SkillFormatError, OSError, UnicodeError) as exc:
        log.warning("skill %s rejected: %s", path, exc)
        return SkillProblem(path, str(exc))


class SkillCatalog:
    """The skills of one folder, scanned again only when a SKILL.md is added, removed or changed."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._files: FileCache[Skill | SkillProblem] = FileCache(lambda path, _: _load_or_problem(path))
        self._scan_key: tuple[tuple[str, FileKey], ...] | None = None
        self._scan = SkillScan((), ())
        self._offered: bool | None = None
        # The skill tool scans in a worker thread while a prompt may be built on the event loop: one scan
        # at a time, or both would parse (and log) a changed file.
        self._lock = threading.Lock()

    def scan(self) -> SkillScan:
        """Every skill, sorted by name; cheap when nothing changed (one stat per skill folder)."""
        with self._lock:
            return self._rescan()

    def offered(self) -> bool:
        """Whether skills are offered at all (the skill tool and the prompt's list): decided at the first call,
        by whether a skill loads then, and kept for the life of the catalog (the process)."""
        # Kept, not re-decided: an agent's tool schemas are made once (ToolRegistry), so a skill tool that
        # appeared with the first skill would be missing from the agents built before, whose prompts would
        # then name a tool they do not have. A first skill added while running is picked up at the next start.
        with self._lock:
            if self._offered is None:
                self._offered = bool(self._rescan().skills)
            return self._offered

    def _rescan(self) -> SkillScan:
        key = tuple(self._skill_files())
        if key == self._scan_key:
            return self._scan
        skills: dict[str, Skill] = {}
        problems: list[SkillProblem] = []
        for path, _ in key:
            loaded = self._files.get(Path(path))
            if isinstance(loaded, Skill):
                skills[loaded.name] = loaded
            elif isinstance(loaded, SkillProblem):
                problems.append(loaded)
        self._scan_key = key
        self._scan = SkillScan(tuple(skills[name] for name in sorted(skills)), tuple(problems))
        return self._scan

    def _skill_files(self) -> list[tuple[str, FileKey]]:
        """Each skill folder's SKILL.md by the folder's name, with its file_key: one stat a skill (a prompt is built
        each turn)."""
        try:
            entries = sorted(os.scandir(self.folder), key=lambda entry: entry.name)
        except (FileNotFoundError, NotADirectoryError):
            return []
        found = []
        for entry in entries:
            # Drafts (skills/_drafts/, picoclaw/tools/drafts.py) wait for the user: never listed nor loaded.
            if entry.name.startswith(".") or entry.name == SKILL_DRAFTS_DIR:
                continue
            path = os.path.join(entry.path, SKILL_FILE)
            try:
                info = os.stat(path)
            except OSError:  # not a folder, no SKILL.md in it, or a link that loops or leads nowhere: no skill
                continue
            if stat.S_ISREG(info.st_mode):
                found.append((path, stat_key(info)))
        return found


_catalogs: dict[Path, SkillCatalog] = {}
_catalogs_lock = threading.Lock()


def shared_catalog(folder: Path) -> SkillCatalog:
    """The process's one catalog of `folder`, shared by the prompt builders and skill tools of every agent."""
    key = Path(os.path.abspath(folder))
    with _catalogs_lock:
        catalog = _catalogs.get(key)
        if catalog is None:
            catalog = _catalogs[key] = SkillCatalog(key)
        return catalog


def skills_prompt(scan: SkillScan) -> str:
    """The system prompt's skill list (empty without skills): sorted, so it is the same bytes each turn."""
    if not scan.skills:
        return ""
    lines = ["## Skills", "When a request matches one, call the skill tool with its name and follow it."]
    lines += [f"- {skill.name}: {skill.description}" for skill in scan.skills]
    return "\n".join(lines)


class SkillArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    # Plain types, no null: small local models handle a flat schema best.
    file: str = Field("", description="a file beside its SKILL.md")


class SkillTool(Tool):
    """Returns a skill's instructions and the files beside it, or one of those files."""

    name = "skill"
    description = "Load a listed skill's instructions."
    Args = SkillArgs

    def __init__(self, workspace: Workspace, files: object = None, catalog: SkillCatalog | None = None):
        self.catalog = catalog or shared_catalog(workspace.layout.skills_dir)

    async def run(self, args: SkillArgs) -> str:
        # Scanning, listing and reading wait for the disk: in a worker thread, like the file tools.
        return await asyncio.to_thread(self.run_sync, args)

    def run_sync(self, args: SkillArgs) -> str:
        scan = self.catalog.scan()
        skill = scan.get(args.name.strip())
        if skill is None:
            known = ", ".join(s.name for s in scan.skills) or "none"
            raise ToolError(f"no skill named {args.name!r}; installed: {known}")
        try:
            listed = skill.files()
        except OSError as exc:
            raise ToolError(f"could not list the files of skill {skill.name!r}: {exc.strerror or exc}") from exc
        if not args.file.strip():
            text = f"# Skill: {skill.name}\n\n{skill.body}"
            if listed:
                text += "\n\nFiles beside this skill (read one with skill(name, file)):\n" + "\n".join(
                    f"- {name}" for name in listed)
            return text
        wanted = args.file.strip().removeprefix("./")
        if wanted not in listed:  # only listed files: no path tricks can leave the skill's folder
            raise ToolError(f"skill {skill.name!r} has no file {args.file!r}; it has: {', '.join(listed) or 'none'}")
        try:
            text = read_text(skill.folder / wanted, MAX_FILE_CHARS + 1)
        except OSError as exc:  # a file that is listed but unreadable (permissions, I/O): the model is told why
            raise ToolError(f"could not read {wanted} of skill {skill.name!r}: {exc.strerror or exc}") from exc
        if len(text) > MAX_FILE_CHARS:
            text = text[:MAX_FILE_CHARS] + f"\n[… truncated at {MAX_FILE_CHARS} characters]"
        return text


def read_text(path: Path, limit: int) -> str:
    """At most `limit` characters of a text file: a large file beside a skill is not read whole."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read(limit)
