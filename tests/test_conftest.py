"""What conftest.py promises every test, whatever the order tests run in or how the run was started."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import copy_home
from tests.homes import CONFIG_FILE
from tests.zones import onboard_in_shanghai

REPO = Path(__file__).resolve().parents[1]
HANDLER_OF_SIGINT = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"


@pytest.mark.slow
@pytest.mark.parametrize("ignored", [False, True])
def test_a_process_a_test_starts_stops_at_ctrl_c(ignored: bool) -> None:
    # A run started in the background of a script ignores SIGINT, and its processes inherit that: a `picoclaw web`
    # that a test ends with Ctrl-C hung for its 120 s bound (three such failures in one run on 4 xdist workers).
    # Here a test process is started either way, configured as conftest.py configures one, and starts another.
    disposition = "SIG_IGN" if ignored else "SIG_DFL"
    run = "; ".join([
        f"import signal, subprocess, sys; signal.signal(signal.SIGINT, signal.{disposition})",
        "from tests.conftest import pytest_configure; pytest_configure(None)",
        f"child = subprocess.run([sys.executable, '-c', {HANDLER_OF_SIGINT!r}], capture_output=True, text=True)",
        "print(child.stdout, end='')",
    ])
    done = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, timeout=120, check=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout == "True\n", done.stderr


@pytest.mark.parametrize("where", ["home", "家 home"])
def test_the_home_a_test_gets_is_what_onboarding_writes_there(home: Path, tmp_path: Path, where: str) -> None:
    # `home` is a copy of a home onboarded once per process: it must not differ from onboarding's own, file for
    # file, byte for byte, permissions included, and name its own workspace.
    fresh = tmp_path / "elsewhere" / where / "fresh"
    onboard_in_shanghai(fresh)
    copied = tmp_path / "elsewhere" / where / "copied"
    copy_home(home, copied)

    def files(root: Path) -> dict[str, tuple[bytes, int]]:
        return {str(path.relative_to(root)): (path.read_bytes(), stat.S_IMODE(path.stat().st_mode))
                for path in sorted(root.rglob("*")) if path.is_file()}

    expected = files(fresh)
    got = files(copied)
    assert got.keys() == expected.keys() and len(got) >= 9
    config_text, config_mode = got.pop(CONFIG_FILE)
    config = json.loads(config_text)
    assert config["workspace"] == str(copied / "workspace") and config["timezone"] == "Asia/Shanghai"
    assert got == {name: value for name, value in expected.items() if name != CONFIG_FILE}
    assert config_text == expected[CONFIG_FILE][0].replace(
        json.dumps(str(fresh / "workspace"), ensure_ascii=False).encode(),
        json.dumps(str(copied / "workspace"), ensure_ascii=False).encode())
    assert config_mode == expected[CONFIG_FILE][1] == 0o600
