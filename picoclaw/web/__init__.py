"""The web console (`picoclaw web`): the memory and the policy in a browser, behind one-time login links."""

from __future__ import annotations

from picoclaw.web.security import Gate
from picoclaw.web.server import make_console, make_runner, serve

__all__ = ["Gate", "make_console", "make_runner", "serve"]
