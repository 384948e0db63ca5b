"""The web console (`picoclaw web`): the memory and the policy in a browser, behind a one-time login."""

from __future__ import annotations

from picoclaw.web.security import Gate
from picoclaw.web.server import make_console, serve

__all__ = ["Gate", "make_console", "serve"]
