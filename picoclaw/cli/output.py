"""What the CLI prints: `echo` (text freed of terminal escapes), index status, a progress bar, policy history
and snapshots, memory stats. (Its log lines: `picoclaw.cli.logs`.)"""

from __future__ import annotations

import sys

from picoclaw.printable import printable

# Types only: a group's `--help` imports this module, and loads neither the config nor the index (numpy), nor
# `typing` (type checkers read TYPE_CHECKING as true; see picoclaw/cli/command.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TextIO

    from picoclaw.memory import EvalRun, IndexStatus, JobOutcome, MemoryStats, PolicyChange, SyncReport

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
    """One policy change: `time  who  key old → new  [before: snapshot]`, the reason beneath, and the eval's figures
    when the change was checked; a refused change: `time  who  refused: key old → new`, and why."""
    who = change.source + (f" (session {change.session})" if change.session else "")
    if change.refused is not None:
        proposed = ", ".join(f"{key} {_json(value.old)} → {_json(value.new)}"
                             for key, value in (change.proposed or {}).items())
        lines = [f"{change.time}  {who}  refused: {proposed or 'a change'}", f"    why: {change.refused}"]
    else:
        shown = ", ".join(f"{key} {_json(value.old)} → {_json(value.new)}"
                          for key, value in change.effective.items()) or "no value in force changed"
        lines = [f"{change.time}  {who}  {shown}  [before: {change.snapshot}]"]
        if change.reason:
            lines.append(f"    reason: {change.reason}")
    if change.check is not None and change.refused is None:
        lines.append(f"    checked by the eval: {check_text(change.check)}")
    return lines


def check_text(check: dict[str, object]) -> str:
    """The eval's figures of a policy change as its history line keeps them: `recall@10 0.850 → recall@5 0.700 on
    20 eval cases`."""
    before, after = check.get("before"), check.get("after")
    if not isinstance(before, dict) or not isinstance(after, dict):
        return "figures unreadable"

    def recall(side: dict[str, object]) -> str:
        value = side.get("recall")
        return f"recall@{side.get('k')} {value:.3f}" if isinstance(value, float | int) else f"recall@{side.get('k')} ?"

    return f"{recall(before)} → {recall(after)} on {check.get('cases')} eval cases"


def one_line_json(raw: bytes) -> str:
    """A snapshot on one line. Unparseable content is still shown (whitespace collapsed), not hidden."""
    import orjson  # see _json

    try:
        return orjson.dumps(orjson.loads(raw)).decode("utf-8")
    except orjson.JSONDecodeError:
        return " ".join(raw.decode("utf-8", "replace").split())


# -- memory stats ----------------------------------------------------------------------------------------

_STATS_COLUMNS = ("document", "files", "entries", "characters", "tokens", "superseded", "not injected in 30 days")
_LABEL = 18  # the width of the "name:" column of the lines under the table


def stats_lines(stats: MemoryStats) -> list[str]:
    """`picoclaw memory stats` as a person reads it: a table of the documents, then one line a measure.
    A number not known says so (not measured yet, unknown): it is never shown as 0."""
    rows = [_STATS_COLUMNS] + [
        (doc.name, str(doc.files), f"{doc.entries:,}", f"{doc.characters:,}", f"{doc.tokens:,}", f"{doc.superseded:,}",
         "unknown" if doc.not_injected_30d is None else f"{doc.not_injected_30d:,}")
        for doc in stats.documents]
    from picoclaw.clock import describe_timezone  # here: `--help` imports this module, and needs no zoneinfo

    widths = [max(len(row[n]) for row in rows) for n in range(len(_STATS_COLUMNS))]
    lines = [f"memory: {stats.memory_dir} (today {stats.today}, {describe_timezone(stats.timezone)})", ""]
    lines += ["  ".join([row[0].ljust(widths[0]), *(cell.rjust(width) for cell, width in zip(row[1:], widths[1:]))])
              for row in rows]
    lines += ["", *_most_injected_lines(stats), ""]
    lines.append(_labelled("retrieval", _retrieval_text(stats)))
    lines.append(_labelled("prompt cache", _cache_text(stats)))
    lines.append("background model use (last 30 days; today):")
    for purpose in stats.background:
        off = " (learning_enabled is false)" if purpose == "learning" and not stats.learning_enabled else ""
        lines.append(_labelled(f"  {purpose}", _background_text(stats, purpose) + off))
    lines.append(_labelled("memory flush", _flush_text(stats)
                           + ("" if stats.flush_enabled else " (memory_flush_enabled is false)")))
    lines.append(_labelled("feedback", f"{stats.feedback.positive:,} 👍, {stats.feedback.negative:,} 👎 "
                                       "(reactions on replies in Telegram)"))
    lines.append(_labelled("last compression", _outcome_text(
        stats.last_compression, "last_compression" in stats.warnings,
        "" if stats.compression_enabled else "compression is off: long_term_compress_char_threshold is 0")))
    lines.append(_labelled("last reflection", _outcome_text(
        stats.last_reflection, "last_reflection" in stats.warnings,
        "" if stats.evolution_enabled else "reflection is off: evolution_enabled is false")))
    lines.append(_labelled("last eval", eval_text(stats.eval_runs)))
    return lines


def eval_text(runs: list[EvalRun] | None) -> str:
    """The last `memory eval` run and the trend of recall@K over the newest runs, in one line."""
    if runs is None:
        return "unknown (its run log cannot be read)"
    if not runs:
        return "none yet (`picoclaw memory eval` measures how well memory finds your answers)"
    last = runs[-1]
    text = (f"recall@{last.k} {last.recall:.3f} ({last.found}/{last.scored} cases"
            + (f", {last.gone} answer gone" if last.gone else "") + f") on {last.time[:16].replace('T', ' ')}")
    if len(runs) > 1:
        text += f"; trend over {len(runs)} runs: " + " → ".join(f"{run.recall:.2f}" for run in runs)
    return text


def _labelled(label: str, text: str) -> str:
    return f"{label + ':':<{_LABEL}}{text}"


def _most_injected_lines(stats: MemoryStats) -> list[str]:
    if any(doc.most_injected is None for doc in stats.documents):
        return ["most injected: unknown (the injection counts cannot be read)"]
    used = [use for doc in stats.documents for use in doc.most_injected or ()]
    if not used:
        return ["most injected: none yet (no entry has been injected into a prompt)"]
    lines = ["most injected (times a prompt carried it, the last day it did):"]
    width = max(len(f"{use.file}:{use.line}") for use in used)
    for use in used:
        where = f"{use.file}:{use.line}"
        lines.append(f"  {where:<{width}}  {use.injected:>4}×  {use.last_injected}  {use.preview}")
    return lines


def _retrieval_text(stats: MemoryStats) -> str:
    retrieval = stats.retrieval
    if retrieval.turns is None:
        return "unknown (its record cannot be read)"
    if retrieval.p50_ms is None or retrieval.p99_ms is None:
        return "not measured yet (no turn has run since it is recorded)"
    return (f"p50 {retrieval.p50_ms:.1f} ms, p99 {retrieval.p99_ms:.1f} ms over the last {retrieval.turns} "
            f"turn{'s' if retrieval.turns != 1 else ''}")


def _cache_text(stats: MemoryStats) -> str:
    cache = stats.prompt_cache
    if cache.share is None:
        if cache.unreported:
            return (f"unknown: the provider reported no cached tokens for the last {cache.unreported} "
                    f"model repl{'ies' if cache.unreported != 1 else 'y'}")
        return "not measured yet (no model reply with a token report)"
    text = (f"{cache.share:.0%} of prompt tokens cached ({cache.cached_tokens:,} of {cache.prompt_tokens:,}) over "
            f"the last {cache.replies} model repl{'ies' if cache.replies != 1 else 'y'}")
    if cache.unreported:
        text += f"; {cache.unreported} more reported no cached part"
    return text


def _background_text(stats: MemoryStats, purpose: str) -> str:
    use = stats.background[purpose]
    if use.last_30d is None or use.today is None:
        return "unknown (its ledger cannot be read)" if "background" in stats.warnings else "none recorded yet"
    spent = [f"{usage.calls} call{'s' if usage.calls != 1 else ''}, {usage.prompt_tokens:,} prompt + "
             f"{usage.completion_tokens:,} completion tokens"
             if usage.calls or usage.prompt_tokens or usage.completion_tokens else "no calls"
             for usage in (use.last_30d, use.today)]
    return f"{spent[0]}; today {spent[1]}"


def _flush_text(stats: MemoryStats) -> str:
    """The flush's facts over the window: proposed, written, already known, rejected by reason."""
    flush = stats.flush
    if flush is None:
        return "unknown (its counts cannot be read)"
    if not flush.runs:
        return "none recorded in the last 30 days"
    reasons = ", ".join(f"{count} {reason}" for reason, count in sorted(flush.rejected.items(),
                                                                         key=lambda item: (-item[1], item[0])))
    runs = f"{flush.runs} run{'s' if flush.runs != 1 else ''}"
    return (f"{flush.proposed} fact{'s' if flush.proposed != 1 else ''} proposed over {runs} (last 30 days): "
            f"{flush.written} written, {flush.known} already known, {flush.refused} rejected"
            + (f" ({reasons})" if reasons else ""))


def _outcome_text(outcome: JobOutcome | None, damaged: bool, off: str) -> str:
    if outcome is None:
        text = "unknown (its record cannot be read)" if damaged else "none recorded yet"
    else:
        text = f"{outcome.time.replace('T', ' ')[:16]} {outcome.status}: {outcome.detail}"
    return f"{text} ({off})" if off else text
