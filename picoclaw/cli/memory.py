"""`picoclaw memory`: read, search and write long-term memory and daily notes; the optional index.

Handlers import what they use: building this group's parser (for `--help`) loads no config and no memory code.
"""

from __future__ import annotations

import argparse
import sys

from picoclaw.cli import memory_eval
from picoclaw.cli.command import Parser, bounded_int, opened_app
from picoclaw.cli.output import ProgressBar, echo, reindex_lines, stats_lines, status_lines
from picoclaw.errors import PicoclawError
from picoclaw.printable import has_controls, printable

TYPE_CHECKING = False  # read as true by type checkers; `typing` is not loaded for it (see cli/command.py)
if TYPE_CHECKING:
    from pathlib import Path

    from picoclaw.curation import CompressionResult
    from picoclaw.memory import Hit, MemoryIndex, Workspace

_INDEX_OFF = "the memory index is disabled (set memory.index.enabled to true in config.json to use it)"


def register(parser: argparse.ArgumentParser) -> None:
    """Fill in the `memory` group's parser: one action a subcommand."""
    actions = parser.add_subparsers(dest="memory_command", metavar="ACTION", parser_class=Parser)
    actions.add_parser("show", help="print MEMORY.md").set_defaults(handler=cmd_memory_show)
    search = actions.add_parser("search", help="search MEMORY.md, daily notes and lessons")
    search.add_argument("query")
    search.add_argument("--limit", type=bounded_int(1, 1000), help="most hits (default: retrieve_limit)")
    search.set_defaults(handler=cmd_memory_search)
    actions.add_parser("status", help="the optional index: files, chunks, vectors, last sync, stale files"
                       ).set_defaults(handler=cmd_memory_status)
    actions.add_parser("reindex", help="rebuild the optional index from the memory files"
                       ).set_defaults(handler=cmd_memory_reindex)
    stats = actions.add_parser("stats", help="entries, tokens, use, retrieval time, prompt cache, background "
                                             "model use, last compression and reflection")
    stats.add_argument("--json", action="store_true", help="the same numbers as JSON (null: not known)")
    stats.set_defaults(handler=cmd_memory_stats)
    append = actions.add_parser("append", help="add an entry to MEMORY.md (or today's note, or a lesson)")
    append.add_argument("text")
    where = append.add_mutually_exclusive_group()
    where.add_argument("--today", action="store_true", help="append to today's daily note instead")
    where.add_argument("--learning", action="store_true",
                       help="store a lesson in LEARNINGS.md instead (when it applies, what to do)")
    append.set_defaults(handler=cmd_memory_append)
    export = actions.add_parser("export", help="write the workspace's memory, sessions, jobs and policy files "
                                               "into a new folder, in the files layout (any backend)")
    export.add_argument("folder", help="a new or empty folder")
    export.set_defaults(handler=cmd_memory_export)
    load = actions.add_parser("import", help="load a files workspace (e.g. an export) into the configured "
                                             "storage backend")
    load.add_argument("folder", help="a workspace folder, or a folder `picoclaw memory export` wrote")
    load.add_argument("--replace", action="store_true",
                      help="replace memory, sessions and jobs of the target that the import would overwrite or remove")
    load.set_defaults(handler=cmd_memory_import)
    edit = actions.add_parser("edit", help="open a memory document in $EDITOR and save it back, unless it changed "
                                           "meanwhile (for PostgreSQL, where the folder is only a copy)")
    edit.add_argument("document", nargs="?", default="MEMORY.md",
                      help="MEMORY.md (default), LEARNINGS.md, a bootstrap file such as USER.md, or a note "
                           "(memory/YYYYMM/YYYYMMDD.md, or its date YYYY-MM-DD)")
    edit.set_defaults(handler=cmd_memory_edit)
    notes = actions.add_parser("notes", help="print the last days' daily notes")
    notes.add_argument("--days", type=bounded_int(0, 3660), help="how many days (default: recent_days)")
    notes.set_defaults(handler=cmd_memory_notes)
    actions.add_parser("backups", help="list MEMORY.md backups, newest first").set_defaults(
        handler=cmd_memory_backups)
    restore = actions.add_parser("restore", help="restore MEMORY.md from a backup")
    restore.add_argument("backup", help="a file name from `picoclaw memory backups`")
    restore.set_defaults(handler=cmd_memory_restore)
    compress = actions.add_parser(
        "compress", help="let the model rewrite MEMORY.md shorter (when over the threshold, once a day)")
    compress.add_argument("--force", action="store_true", help="ignore the threshold and the 24-hour gate")
    compress.add_argument("--dry-run", action="store_true",
                          help="print the rewrite and a diff summary; write nothing")
    compress.set_defaults(handler=cmd_memory_compress)
    memory_eval.register(actions)


def cmd_memory_show(args: argparse.Namespace) -> int:
    with opened_app() as app:
        store = app.workspace.store
        text = store.read_long_term()
        echo(text.rstrip("\n") if text.strip() else f"(MEMORY.md is empty: {store.long_term_path})")
    return 0


def cmd_memory_search(args: argparse.Namespace) -> int:
    from picoclaw.memory import retrieve

    with opened_app() as app:
        ws = app.workspace
        limit = args.limit or ws.policy.current().retrieve_limit
        # The search `memory eval` scores: the two agree for the same question and limit.
        found = retrieve(ws.searcher, args.query, limit)
        hits, lessons = found.facts, found.lessons
        if not hits and not lessons:
            echo(f"no memory matches {args.query!r}")
            return 0
        for rank_number, hit in enumerate(hits, start=1):
            _echo_hit(f"{rank_number}.", hit, ws.root)
        if lessons:
            echo("lessons:" if hits else f"no facts match {args.query!r}; lessons:")
        for rank_number, hit in enumerate(lessons, start=1):
            _echo_hit(f"L{rank_number}.", hit, ws.root)
    return 0


def _echo_hit(label: str, hit: Hit, root: Path) -> None:
    where = hit.block.path.relative_to(root)
    echo(f"{label} score {hit.score:.3f}  {where}:{hit.block.start_line}-{hit.block.end_line}")
    for line in hit.block.text.splitlines():
        echo(f"   {line}")


def _memory_index(ws: Workspace) -> MemoryIndex | None:
    if not ws.config.memory.index.enabled:
        return None
    from picoclaw.memory import index_of

    return index_of(ws.searcher)


def cmd_memory_status(args: argparse.Namespace) -> int:
    with opened_app() as app:
        index = _memory_index(app.workspace)
        if index is None:
            echo(f"{_INDEX_OFF}; searches read the memory files directly")
            return 0
        echo("\n".join(status_lines(index.status())))
    return 0


def cmd_memory_reindex(args: argparse.Namespace) -> int:
    with opened_app() as app:
        index = _memory_index(app.workspace)
        if index is None:
            raise PicoclawError(_INDEX_OFF)
        bar = ProgressBar()
        try:
            report = index.reindex(bar)
        finally:
            bar.close()
        echo("\n".join(reindex_lines(report, index.status())))
    return 0


def cmd_memory_stats(args: argparse.Namespace) -> int:
    from picoclaw.jsonio import dumps_pretty
    from picoclaw.memory import memory_stats

    with opened_app() as app:
        stats = memory_stats(app.workspace)
    for problem in stats.warnings.values():  # before the numbers, so no one reads an unknown as measured
        echo(f"warning: {problem}", file=sys.stderr)
    echo(dumps_pretty(stats.to_json()).decode("utf-8").rstrip("\n") if args.json else "\n".join(stats_lines(stats)))
    return 0


def cmd_memory_export(args: argparse.Namespace) -> int:
    from contextlib import ExitStack
    from pathlib import Path

    from picoclaw.storage import export_workspace

    with opened_app() as app, ExitStack() as held:
        # Under each memory scope's lock, as every reader of MEMORY.md: an append under way is waited for, and one
        # a killed writer cut off is undone (memory/in_place_append.py), before the bytes are copied. The files
        # backend copies the files as they are, so without it an export could hold half an entry.
        ws = app.workspace
        held.enter_context(ws.store.locked())
        users = ws.layout.users_dir
        keys = sorted(folder.name for folder in users.iterdir() if (folder / "memory").is_dir()) \
            if users.is_dir() else []
        for key in keys:
            if all(c.isalnum() or c in "-_" for c in key):  # a folder picoclaw made for a user
                scope = ws.for_user(key)
                held.callback(scope.close)
                held.enter_context(scope.store.locked())
        moved = export_workspace(app.storage, Path(args.folder).expanduser())
        echo(f"exported {moved.files} files ({moved.size} bytes) from the {app.storage.backend} storage "
             f"to {args.folder}")
    return 0


def cmd_memory_import(args: argparse.Namespace) -> int:
    from pathlib import Path

    from picoclaw.config import home_dir, load_config
    from picoclaw.layout import WorkspaceLayout
    from picoclaw.storage import import_workspace, open_storage

    # Only the storage is opened, not the App: the import needs nothing else, and the App's start-up warning about
    # a folder the database lacks would only announce what this command is doing.
    home = home_dir()
    config = load_config(home)
    storage = open_storage(config, WorkspaceLayout.of(config, home).root)
    try:
        moved = import_workspace(storage, Path(args.folder).expanduser(), replace=args.replace)
    finally:
        storage.close()
    if not moved.changed:
        echo(f"the {storage.backend} storage already holds the {moved.files} files of {args.folder}; "
             "nothing was changed")
    else:
        echo(f"imported {moved.files} files ({moved.size} bytes) from {args.folder} into the "
             f"{storage.backend} storage")
    return 0


def cmd_memory_append(args: argparse.Namespace) -> int:
    with opened_app() as app:
        store = app.workspace.store
        # Memory is printed again and again: escape sequences pasted into it must not be kept.
        text = printable(args.text)
        if args.today:
            path = store.append_note(text)
            echo(f"appended to {path}")
        elif args.learning:
            lesson = store.append_learning(text, "picoclaw memory append --learning")
            path = store.learnings_path
            if lesson.outcome == "known":
                echo(f"already stored: {path}:{lesson.entry.line} under '{lesson.entry.heading}'; nothing was added")
            elif lesson.outcome == "updated":
                echo(f"updated the lesson at {path}:{lesson.entry.line}, which said the same thing "
                     f"(it was: {' '.join(lesson.replaced.split())[:120]})")
            else:
                echo(f"appended a lesson to {path}")
        else:
            entry = store.append_long_term(text)
            if entry.new:
                echo(f"appended to {store.long_term_path}")
            else:
                echo(f"already stored: {store.long_term_path}:{entry.line} under '{entry.heading}'; nothing was added")
    if has_controls(args.text):  # said after the append: a refused entry is one error line, nothing more
        echo("note: terminal control characters were removed from the text", file=sys.stderr)
    return 0


def cmd_memory_notes(args: argparse.Namespace) -> int:
    with opened_app() as app:
        ws = app.workspace
        days = ws.policy.current().recent_days if args.days is None else args.days
        notes = ws.store.read_recent_notes(days)
        if not notes:
            echo(f"no daily notes in the last {days} day(s)")
        for note in notes:
            echo(f"==> {note.path.relative_to(ws.root)} <==")
            echo(note.text.rstrip("\n"))
    return 0


def cmd_memory_backups(args: argparse.Namespace) -> int:
    with opened_app() as app:
        store = app.workspace.store
        backups = store.backup_sizes()
        if not backups:
            echo(f"no backups yet in {store.backups_dir}")
        for name, size in reversed(backups):
            echo(f"{name}  {size} bytes")
    return 0


def cmd_memory_restore(args: argparse.Namespace) -> int:
    with opened_app() as app:
        store = app.workspace.store
        saved = store.restore_backup(args.backup)
        echo(f"restored {args.backup} into {store.long_term_path}")
        if saved is not None:
            echo(f"the previous MEMORY.md was saved as {saved.name}")
    return 0


def cmd_memory_compress(args: argparse.Namespace) -> int:
    # The memory.compression module and the openai client load only for commands that talk to the model.
    import asyncio

    from picoclaw.agent import WindowedProvider
    from picoclaw.curation import LongTermCompressor, format_missing, why_not_due

    with opened_app() as app:
        store = app.workspace.store
        policy = app.workspace.policy.current()
        blocker = why_not_due(store, policy)
        if blocker is not None and not args.force:
            echo(f"not compressing: {blocker}; use --force to compress anyway")
            return 0

        async def run() -> CompressionResult | None:
            async with app:
                # Each rewrite's max_tokens fitted to the window, as the agent's own compression does.
                provider = WindowedProvider(app.provider(), app.windows())
                return await LongTermCompressor(store, provider).run(policy, force=args.force, dry_run=args.dry_run)

        result = asyncio.run(run())
        if result is None:  # another process compressed it between the check and the claim
            echo(f"not compressing: {why_not_due(store, policy)}")
            return 0
        several = len(result.groups) > 1
        if args.dry_run:
            if result.after:  # what would be written, or what the model proposed, to see why it was refused
                echo(result.after.rstrip("\n"))
            if several or result.missing:  # what the real run would do with each group, and why
                echo("\n".join(f"--- {line}" for line in result.group_report()))
        if result.status in ("refused", "failed"):
            lines = [f"compression {result.status}: {result.detail}; MEMORY.md was left unchanged"]
            if not args.dry_run and several:
                lines += result.kept_report()
            elif not args.dry_run and result.missing:
                lines.append(f"missing: {format_missing(result.missing)}")
            raise PicoclawError("\n".join(lines))
        if result.status == "dry_run":
            echo(f"--- dry run, nothing written: {result.detail}")
            return 0
        echo(f"compressed {store.long_term_path}: {result.detail}")
        for line in result.kept_report():
            echo(line)
        if result.backup is not None:
            echo(f"the previous version was saved as {result.backup.name} (`picoclaw memory restore` undoes this)")
        if result.carried_over:
            echo(f"kept what was appended meanwhile: {' '.join(result.carried_over.split())[:200]}")
    return 0


def cmd_memory_edit(args: argparse.Namespace) -> int:
    from picoclaw.cli.editing import edit_in_editor, editable_name, keep_rejected_edit
    from picoclaw.storage import StaleRevision

    with opened_app() as app:
        store = app.workspace.store
        name = editable_name(store.documents, args.document)
        found = store.documents.read(name)
        if found.data is None:
            raise PicoclawError(f"{name} does not exist yet; nothing to edit")
        edited = edit_in_editor(found.data, name)
        if edited == found.data:
            echo(f"{name} unchanged; nothing was written")
            return 0
        try:
            edited.decode("utf-8")
        except UnicodeDecodeError as exc:
            kept = keep_rejected_edit(app.home, name, edited)
            raise PicoclawError(f"the edited {name} is not valid UTF-8 (byte {exc.start}), so nothing was written; "
                                f"your edited text is in {kept}") from None
        try:
            backup = store.replace_document(store.documents.path(name), edited, found.revision)
        except StaleRevision:
            kept = keep_rejected_edit(app.home, name, edited)
            raise PicoclawError(f"{name} was changed while it was being edited, so nothing was written; your "
                                f"edited text is in {kept}") from None
        echo(f"saved {name}" + (f" (the previous version was kept as {backup.name})" if backup else ""))
    return 0
