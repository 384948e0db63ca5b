"""The Channel contract: what every way of talking to the assistant (the terminal, Telegram, a web console) is.

A channel turns the events of its world into messages, each made a turn in message_turn.py. What the user did
not just ask for (a scheduled job's result, the heartbeat's) goes out through the channel's `deliver`, which is
all the job runner needs of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from picoclaw.jobs import Scheduler


class Channel(Protocol):
    """A way of talking to the assistant. Implementations do not inherit from this: mypy checks that they
    conform where a Channel is expected (`App.scheduler`)."""

    @property
    def name(self) -> str:
        """The channel's name, as its session keys begin ("telegram", "cli")."""

    async def run(self, *, scheduler: Scheduler | None = None) -> int | None:
        """Serve until the channel ends (end of input, a signal) or `stop()`, running `scheduler` (made for this
        channel, see `App.scheduler`) beside it; an exit code where the channel has one."""

    async def stop(self) -> None:
        """Make `run()` return; an answer under way is finished first."""

    async def deliver(self, session_key: str, markdown: str) -> None:
        """Text the user did not just ask for (a scheduled job's result, the heartbeat's) to the conversation
        of `session_key`; raises when it did not arrive, so that the job's outcome says so."""
