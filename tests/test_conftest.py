"""What conftest.py promises every test, whatever the order tests run in or how the run was started."""

from __future__ import annotations

import subprocess
import sys

HANDLER_OF_SIGINT = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"


def test_a_process_a_test_starts_stops_at_ctrl_c() -> None:
    # A run started in the background of a script ignores SIGINT, and its processes inherit that: a `picoclaw web`
    # that a test ends with Ctrl-C hung for its 120 s bound (three such failures in one run on 4 xdist workers).
    done = subprocess.run([sys.executable, "-c", HANDLER_OF_SIGINT], capture_output=True, text=True, timeout=60,
                          check=True)
    assert done.stdout == "True\n"
