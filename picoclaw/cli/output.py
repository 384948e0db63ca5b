"""What the CLI prints: `echo` (text freed of terminal escapes), index status, a progress bar, policy history
and snapshots, jobs. (Its log lines: `picoclaw.cli.logs`.)"""

from __future__ import annotations

import sys

from picoclaw.printable import printable

# Types only: a group's `--help` imports this module, and loads neither the config nor the index (numpy), nor
# `typing` (type checkers read TYPE_CHECKING as true; see picoclaw/cli/command.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from datetime import tzinfo
    from typing import TextIO

    from picoclaw.jobs import Job
    from picoclaw.memory import IndexStatus, PolicyChange, SyncReport

BAR_WIDTH = 30
STALE_SHOWN = 5


def echo(text: str = "", *, file: TextIO | None = None) -> None:
    """Print `text` as `printable`: what the CLI shows comes from memory, models, tools, files and config,
    any of which may hold escape sequences that would drive the terminal."""
    print(printable(text), file=file or sys.stdout)


class ProgressBar:
    """`phase [#####.....] done/total` on a stream: redrawn in place on a terminal, one line per phase otherwise."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.interactive = self.stream.isatty()
        self._phase: str | None = None

    def __call__(self, phase: str, done: int, total: int) -> None:
        if phase != self._phase:
            self._end_line()
            self._phase = phase
        if self.interactive or done >= total:
            filled = BAR_WIDTH * done // total if total else BAR_WIDTH
            line = f"{phase:<10} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total}"
            self.stream.write(f"\r{line}" if self.interactive else f"{line}\n")
            self.stream.flush()
            if done >= total:
                self._phase = None

    def close(self) -> None:
        """End a line left open by an interrupted phase."""
        self._end_line()

    def _end_line(self) -> None:
        if self._phase is not None and self.interactive:
            self.stream.write("\n")
        self._phase = None


def status_lines(status: IndexStatus) -> list[str]:
    """The status as `name: value` lines."""
    lines = [f"memory index: enabled, {'built' if status.built else 'not built yet (it builds on the next search)'}",
             f"  file:       {status.path}",
             f"  sources:    {', '.join(status.sources)}",
             f"  embeddings: {status.model or 'none (keyword search only)'}",
             f"  files:      {status.files}",
             f"  chunks:     {status.chunks}"]
    if status.model:
        lines.append(f"  vectors:    {status.vectors}" + (
            f" ({status.chunks - status.vectors} chunks not embedded yet)" if status.vectors < status.chunks else ""))
    lines.append(f"  last sync:  {status.last_sync or 'never'}")
    if status.stale:
        shown = ", ".join(status.stale[:STALE_SHOWN]) + (" …" if len(status.stale) > STALE_SHOWN else "")
        lines.append(f"  stale:      {len(status.stale)} file(s) changed since the last sync, synced on the next "
                     f"search: {shown}")
    else:
        lines.append("  stale:      none")
    if status.warning:
        lines.append(f"  warning:    embeddings failed ({status.warning}); searches used keyword results only")
    return lines


def reindex_lines(report: SyncReport, status: IndexStatus) -> list[str]:
    """A summary of a rebuild."""
    lines = [f"reindexed {status.files} file(s) into {status.chunks} chunk(s) at {status.path}"]
    if status.model:
        cached = status.vectors - report.embedded
        lines.append(f"vectors: {status.vectors} ({report.embedded} embedded now, {max(cached, 0)} from the cache)")
    if report.embed_error:
        lines.append(f"warning: embeddings failed ({report.embed_error}); keyword search works, and the missing "
                     "vectors are made on a later search")
    return lines


def _json(value: object) -> str:
    import orjson  # here, not at the top: loading orjson alone costs `--help` twice a bare interpreter

    return orjson.dumps(value).decode("utf-8")


def history_lines(change: PolicyChange) -> list[str]:
    """One policy change: `time  who  key old → new  [before: snapshot]`, and the reason beneath."""
    shown = ", ".join(f"{key} {_json(value.old)} → {_json(value.new)}"
                      for key, value in change.effective.items()) or "no value in force changed"
    who = change.source + (f" (session {change.session})" if change.session else "")
    lines = [f"{change.time}  {who}  {shown}  [before: {change.snapshot}]"]
    if change.reason:
        lines.append(f"    reason: {change.reason}")
    return lines


def one_line_json(raw: bytes) -> str:
    """A snapshot on one line. Unparseable content is still shown (whitespace collapsed), not hidden."""
    import orjson  # see _json

    try:
        return orjson.dumps(orjson.loads(raw)).decode("utf-8")
    except orjson.JSONDecodeError:
        return " ".join(raw.decode("utf-8", "replace").split())


def job_lines(jobs: list[Job], tz: tzinfo) -> list[str]:
    """One line a job: id, schedule, next run (local time), target, action and text, last outcome."""
    from picoclaw.session_key import CLI, channel_of

    lines = []
    for job in jobs:
        if not job.enabled:
            when = "off"
        elif job.next_run is None:
            when = "done"
        else:
            when = f"next {job.next_run.astimezone(tz):%Y-%m-%d %H:%M %Z}"
        text = " ".join(printable(job.text).split())  # cut what will be seen, not escape sequences
        text = text if len(text) <= 60 else text[:59] + "…"
        last = job.last_outcome or "not run yet"
        if channel_of(job.target) == CLI and job.enabled and job.next_run is not None:
            # Only an open REPL delivers terminal jobs: `chat -m` runs none, so the user should know to open one.
            last += "; comes in an open `picoclaw chat`, not `chat -m`"
        # Printable here too, not only where printed: the cron commands print these lines themselves.
        lines.append(printable(f"{job.id}  {job.schedule.describe(tz)}  {when}  {job.target}  {job.action}: "
                               f"{text}  [{last}]"))
    return lines
