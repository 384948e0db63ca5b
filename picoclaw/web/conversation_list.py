"""The workspace's conversations as the console lists them: each transcript by its name under the sessions folder
(archived ones as archive/…), its session key, and when it was last written, newest first."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

if TYPE_CHECKING:
    from picoclaw.app import App


@dataclass(frozen=True)
class Conversation:
    """One transcript: `name` under the sessions folder, its session `key`, whether it is archived."""

    name: str
    key: str
    archived: bool
    modified: float

    @property
    def web_name(self) -> str | None:
        """The console's name for a current `web:` conversation (what /chat?name= takes); None for the others."""
        channel, _, rest = self.key.partition(":")
        return rest if channel == "web" and not self.archived else None


def transcripts(app: App) -> dict[str, Path]:
    """The workspace's transcripts by their name under the sessions folder (archived ones as archive/…)."""
    sessions = app.workspace.sessions()
    folder = sessions.folder
    return {path.relative_to(folder).as_posix(): path for path in sessions.log.transcripts()}


def session_key(name: str) -> str:
    """The session key of the transcript called `name`."""
    return unquote(name.rsplit("/", 1)[-1].removesuffix(".jsonl"))


def conversations(app: App) -> list[Conversation]:
    """Every conversation of the workspace, newest first (reads the storage: call from a worker thread)."""
    sessions = app.workspace.sessions()
    found = [Conversation(name, session_key(name), name.startswith("archive/"), sessions.modified(path))
             for name, path in transcripts(app).items()]
    return sorted(found, key=lambda one: (one.modified, one.name), reverse=True)
