"""Skill drafts: `workspace/skills/_drafts/<name>/SKILL.md`, skills picoclaw drafted from its lessons, which wait
there until the user accepts (moves into `skills/<name>/`) or rejects (deletes) them.

A draft is never listed in the prompt nor loadable by the skill tool (the catalog skips `_drafts/`), and the
file tools can neither read it nor write anywhere under `skills/` (tools/sandbox.py): only the user, through
`picoclaw skills accept`, turns a draft into a skill. A draft is checked by the same parser as an installed
skill (`parse_skill`), so one that would not load is refused before it is moved.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from picoclaw.disk.atomic import atomic_write, fsync_dir
from picoclaw.errors import PicoclawError
from picoclaw.layout import SKILL_DRAFTS_DIR
from picoclaw.tools.skills import SKILL_FILE, SKILL_NAME, Skill, SkillFormatError, parse_skill

log = logging.getLogger(__name__)

class SkillDraftError(PicoclawError):
    """A draft that cannot be accepted, rejected or written as asked; the message says why in one line."""


@dataclass(frozen=True)
class Draft:
    """One folder of `skills/_drafts/`: the skill it holds, or why it would not load (`problem`)."""

    name: str
    folder: Path
    skill: Skill | None
    problem: str | None = None


def safe_name(text: str) -> str:
    """`text` as a skill name: lowercase letters, digits and hyphens, at most 64 ("" when nothing is left)."""
    name = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return name[:64].rstrip("-")


class SkillDrafts:
    """The drafts folder of one skills folder."""

    def __init__(self, skills_dir: Path):
        self.skills_dir = skills_dir
        self.folder = skills_dir / SKILL_DRAFTS_DIR

    def list(self) -> list[Draft]:
        """Every draft, sorted by name, each parsed as the skill it would become."""
        try:
            entries = sorted(os.scandir(self.folder), key=lambda entry: entry.name)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [self._read(entry.name) for entry in entries
                if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False)]

    def taken(self, name: str) -> bool:
        """Whether `name` is used by a draft or an installed skill (a link or a file counts as used)."""
        return any(os.path.lexists(folder / name) for folder in (self.folder, self.skills_dir))

    def free_name(self, base: str) -> str:
        """`base`, or `base-2`, `base-3` … : the first name neither a draft nor an installed skill uses."""
        name, number = base, 1
        while self.taken(name):
            number += 1
            suffix = f"-{number}"
            name = base[:64 - len(suffix)].rstrip("-") + suffix
        return name

    def write(self, name: str, text: str) -> Draft:
        """Write a new draft `name` (atomically); SkillDraftError if the name is unsafe or taken, or the text
        would not load as a skill (nothing is left behind then)."""
        self._check_name(name)
        if self.taken(name):
            raise SkillDraftError(f"a skill or draft named {name!r} exists already")
        folder = self.folder / name
        folder.mkdir(parents=True)
        atomic_write(folder / SKILL_FILE, text)
        draft = self._read(name)
        if draft.skill is None:
            shutil.rmtree(folder)
            raise SkillDraftError(f"the draft {name!r} would not load: {draft.problem}")
        return draft

    def accept(self, name: str) -> Skill:
        """Move draft `name` into the skills folder, where the next turn's prompt lists it; SkillDraftError (and
        nothing moved) when the name is unsafe or unknown, a skill of that name is installed, or it would not load."""
        draft = self._existing(name)
        if draft.skill is None:
            raise SkillDraftError(f"draft {name!r} is broken and was not accepted: {draft.problem} "
                                  f"(fix {draft.folder / SKILL_FILE} or reject it)")
        target = self.skills_dir / name
        if os.path.lexists(target):
            raise SkillDraftError(f"a skill named {name!r} is installed already ({target}); reject the draft, or "
                                  "remove or rename the installed one first")
        # One rename on the same file system: the skill appears whole or not at all.
        os.rename(draft.folder, target)
        fsync_dir(self.skills_dir)
        log.info("skill draft %s accepted into %s", name, target)
        return parse_skill(target / SKILL_FILE)

    def reject(self, name: str) -> Path:
        """Delete draft `name`; its folder. SkillDraftError when the name is unsafe or unknown."""
        draft = self._existing(name)
        shutil.rmtree(draft.folder)
        log.info("skill draft %s rejected", name)
        return draft.folder

    def _check_name(self, name: str) -> None:
        # A skill's name is also a safe folder name: a name from the command line cannot leave the drafts folder.
        if not SKILL_NAME.fullmatch(name):
            raise SkillDraftError(f"{name!r} is not a skill name (lowercase letters, digits and hyphens, at most 64)")

    def _existing(self, name: str) -> Draft:
        self._check_name(name)
        folder = self.folder / name
        if folder.is_symlink() or not folder.is_dir():
            known = ", ".join(draft.name for draft in self.list()) or "none"
            raise SkillDraftError(f"no skill draft named {name!r} (drafts: {known})")
        return self._read(name)

    def _read(self, name: str) -> Draft:
        folder = self.folder / name
        path = folder / SKILL_FILE
        try:
            return Draft(name, folder, parse_skill(path))
        except FileNotFoundError:
            return Draft(name, folder, None, f"no {SKILL_FILE}")
        except (SkillFormatError, OSError, UnicodeError) as exc:
            return Draft(name, folder, None, str(exc))
