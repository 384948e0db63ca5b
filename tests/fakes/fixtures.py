"""pytest fixtures for the fakes; conftest.py imports them so every test module can ask for them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.telegram_server import FakeTelegramServer


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAIServer]:
    """A fresh OpenAI-compatible server for one test: nothing scripted, nothing recorded."""
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
def fake_telegram() -> Iterator[FakeTelegramServer]:
    """A fresh Telegram Bot API server for one test: no updates queued, no calls recorded."""
    with FakeTelegramServer() as server:
        yield server
