"""Shared fixtures: a temporary PICOCLAW_HOME, onboarded, and the workspace opened from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from picoclaw.app import App
from picoclaw.memory.workspace import Workspace
from picoclaw.onboard import onboard
from tests.fakes.fixtures import fake_openai, fake_telegram  # noqa: F401  (fixtures, used by name)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An onboarded picoclaw home in a temp folder, set as PICOCLAW_HOME for the test."""
    path = tmp_path / "home"
    monkeypatch.setenv("PICOCLAW_HOME", str(path))
    for name in ("OPENAI_API_KEY", "TELEGRAM_BOT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    onboard(path)
    return path


@pytest.fixture
def workspace(home: Path) -> Workspace:
    """The workspace of `home`, opened from its config.json."""
    return App.open(home).workspace
