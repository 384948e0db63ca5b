"""The `picoclaw` command line. Every failure is one line on stderr and a non-zero exit."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import orjson

from picoclaw import __version__
from picoclaw.app import App
from picoclaw.cli.output import (
    PrintableFormatter,
    ProgressBar,
    echo,
    history_lines,
    job_lines,
    one_line_json,
    reindex_lines,
    status_lines,
)
from picoclaw.config import POLICY_KEYS, home_dir
from picoclaw.errors import PicoclawError
from picoclaw.onboard import onboard
from picoclaw.printable import has_controls, printable

if TYPE_CHECKING:
    from picoclaw.memory.index.index import MemoryIndex
    from picoclaw.memory.workspace import Workspace

log = logging.getLogger("picoclaw")


class UsageError(PicoclawError):
    """Bad command-line usage."""


class _Parser(argparse.ArgumentParser):
    # argparse prints usage plus the error over several lines; we want one clear line.
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


# -- onboard ---------------------------------------------------------------------------------------

def cmd_onboard(args: argparse.Namespace) -> int:
    home = home_dir()
    steps = onboard(home)
    for step in steps:
        note = {"created": "created", "unchanged": "already there, unchanged",
                "kept": "already there, left as you have it"}[step.outcome]
        print(f"{note:34} {step.path}")
    if all(step.outcome != "created" for step in steps):
        print("Nothing to do: picoclaw is already set up here; no file was changed.")
    else:
        print(f"Done. Add an API key to {home / 'config.json'} (or set OPENAI_API_KEY), then run `picoclaw chat`.")
    return 0


# -- opening the app ---------------------------------------------------------------------------------

_opened: list[App] = []


def _app() -> App:
    """The App of this command (closed by `main` when the command ends)."""
    app = App.open()
    _opened.append(app)
    return app


def _workspace() -> Workspace:
    return _app().workspace


def parse_cli_value(text: str) -> Any:
    """`policy set` values are JSON scalars (15, true); anything else stays a string and fails validation."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


# -- memory ----------------------------------------------------------------------------------------

def _bounded_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value

    parse.__name__ = "number"
    return parse


def cmd_memory_show(args: argparse.Namespace) -> int:
    ws = _workspace()
    text = ws.store.read_long_term()
    echo(text.rstrip("\n") if text.strip() else f"(MEMORY.md is empty: {ws.store.long_term_path})")
    return 0


def cmd_memory_search(args: argparse.Namespace) -> int:
    ws = _workspace()
    limit = args.limit or ws.policy.current().retrieve_limit
    hits = ws.searcher.search(args.query, limit, include_notes=True)
    if not hits:
        echo(f"no memory matches {args.query!r}")
        return 0
    for rank_number, hit in enumerate(hits, start=1):
        where = hit.block.path.relative_to(ws.root)
        echo(f"{rank_number}. score {hit.score:.3f}  {where}:{hit.block.start_line}-{hit.block.end_line}")
        for line in hit.block.text.splitlines():
            echo(f"   {line}")
    return 0


_INDEX_OFF = "the memory index is disabled (set memory.index.enabled to true in config.json to use it)"


def _memory_index(ws: Workspace) -> MemoryIndex | None:
    if not ws.config.memory.index.enabled:
        return None
    from picoclaw.memory.index.searcher import index_of  # numpy loads only when the index is used

    return index_of(ws.searcher)


def cmd_memory_status(args: argparse.Namespace) -> int:
    index = _memory_index(_workspace())
    if index is None:
        echo(f"{_INDEX_OFF}; searches read the memory files directly")
        return 0
    echo("\n".join(status_lines(index.status())))
    return 0


def cmd_memory_reindex(args: argparse.Namespace) -> int:
    index = _memory_index(_workspace())
    if index is None:
        raise PicoclawError(_INDEX_OFF)
    bar = ProgressBar()
    try:
        report = index.reindex(bar)
    finally:
        bar.close()
    echo("\n".join(reindex_lines(report, index.status())))
    return 0


def cmd_memory_append(args: argparse.Namespace) -> int:
    ws = _workspace()
    # Memory is printed again and again: escape sequences pasted into it must not be kept.
    text = printable(args.text)
    if args.today:
        path = ws.store.append_note(text)
        echo(f"appended to {path}")
    else:
        entry = ws.store.append_long_term(text)
        if entry.new:
            echo(f"appended to {ws.store.long_term_path}")
        else:
            echo(f"already stored: {ws.store.long_term_path}:{entry.line} under '{entry.heading}'; nothing was added")
    if has_controls(args.text):  # said after the append: a refused entry is one error line, nothing more
        echo("note: terminal control characters were removed from the text", file=sys.stderr)
    return 0


def cmd_memory_notes(args: argparse.Namespace) -> int:
    ws = _workspace()
    days = ws.policy.current().recent_days if args.days is None else args.days
    notes = ws.store.read_recent_notes(days)
    if not notes:
        echo(f"no daily notes in the last {days} day(s)")
    for note in notes:
        echo(f"==> {note.path.relative_to(ws.root)} <==")
        echo(note.text.rstrip("\n"))
    return 0


def cmd_memory_backups(args: argparse.Namespace) -> int:
    ws = _workspace()
    backups = ws.store.backups()
    if not backups:
        echo(f"no backups yet in {ws.store.backups_dir}")
    for path in reversed(backups):
        echo(f"{path.name}  {path.stat().st_size} bytes")
    return 0


def cmd_memory_restore(args: argparse.Namespace) -> int:
    ws = _workspace()
    saved = ws.store.restore_backup(args.backup)
    echo(f"restored {args.backup} into {ws.store.long_term_path}")
    if saved is not None:
        echo(f"the previous MEMORY.md was saved as {saved.name}")
    return 0


def cmd_memory_compress(args: argparse.Namespace) -> int:
    # The memory.compression module and the openai client load only for commands that talk to the model.
    from picoclaw.memory.compression import CompressionResult, LongTermCompressor, format_missing, why_not_due

    app = _app()
    store = app.workspace.store
    policy = app.workspace.policy.current()
    blocker = why_not_due(store, policy)
    if blocker is not None and not args.force:
        echo(f"not compressing: {blocker}; use --force to compress anyway")
        return 0

    async def run() -> CompressionResult | None:
        async with app:
            return await LongTermCompressor(store, app.provider()).run(policy, force=args.force, dry_run=args.dry_run)

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


# -- policy ----------------------------------------------------------------------------------------

def cmd_policy_show(args: argparse.Namespace) -> int:
    ws = _workspace()
    effective = ws.policy.effective()
    width = max(len(key) for key in POLICY_KEYS)
    for key in POLICY_KEYS:
        value = getattr(effective.policy, key)
        shown = str(value).lower() if isinstance(value, bool) else str(value)
        echo(f"{key:{width}}  {shown:>8}  ({effective.sources[key]})")
    return 0


def cmd_policy_set(args: argparse.Namespace) -> int:
    ws = _workspace()
    changes = {}
    for item in args.assignments:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"expected KEY=VALUE, got {item!r}")
        changes[key.strip()] = parse_cli_value(value.strip())
    snapshot = ws.policy.set(changes, source="cli", reason="picoclaw policy set")
    for key, value in changes.items():
        # JSON spelling (true, not True), the way the value is typed and the way `policy show` prints it.
        echo(f"{key} = {orjson.dumps(value).decode('utf-8')}")
    echo(f"previous overrides saved as {snapshot.name}")
    return 0


def cmd_policy_snapshots(args: argparse.Namespace) -> int:
    ws = _workspace()
    snapshots = ws.policy.snapshots()
    if not snapshots:
        echo(f"no snapshots yet in {ws.policy.snapshots_dir}")
    for path in reversed(snapshots):
        echo(f"{path.name}  {one_line_json(path.read_bytes())}")
    return 0


def cmd_policy_rollback(args: argparse.Namespace) -> int:
    ws = _workspace()
    restored = ws.policy.rollback(args.snapshot)
    echo(f"restored policy overrides from {restored.name} (the overrides before it were snapshotted too)")
    return 0


def cmd_policy_reset(args: argparse.Namespace) -> int:
    ws = _workspace()
    snapshot = ws.policy.reset()
    echo(f"policy overrides cleared; the previous ones are in {snapshot.name}")
    return 0


def cmd_policy_history(args: argparse.Namespace) -> int:
    ws = _workspace()
    changes = ws.policy.history()
    if not changes:
        echo(f"no policy changes yet ({ws.policy.history_path})")
    for change in changes:
        echo("\n".join(history_lines(change)))
    return 0


# -- chat ------------------------------------------------------------------------------------------

def cmd_chat(args: argparse.Namespace) -> int:
    from picoclaw.channels.repl import chat  # the agent stack loads only for commands that talk

    if args.message is not None and not args.message.strip():
        raise UsageError("the message given with -m is empty")
    if args.session is not None:
        from picoclaw.jobs import check_session_key

        # Checked before any model call: a key that cannot name a file would fail after the answer was shown.
        try:
            check_session_key(args.session if ":" in args.session else f"cli:{args.session}")
        except ValueError as exc:
            raise UsageError(f"--session: {exc}") from None
    app = _app()

    async def run() -> int:
        async with app:
            app.provider()  # a missing key or URL is reported before any MCP server starts
            await app.start_mcp()
            # The terminal is this session's channel while it is open: its reminders and heartbeat come here.
            return await chat(app.agent(), session_key=args.session, message=args.message,
                              scheduler=lambda deliver, key: app.scheduler(deliver, channels=(key,)))

    return asyncio.run(run())


def cmd_telegram(args: argparse.Namespace) -> int:
    from picoclaw.channels.telegram import TelegramChannel, make_bot, polling_lock
    from picoclaw.errors import ConfigError

    app = _app()
    settings = app.config.channels.telegram
    if not settings.enabled:  # the config's switch wins: a bot turned off must not answer anyone
        raise ConfigError("channels.telegram.enabled is false in config.json; set it to true to run the bot")

    async def run() -> None:
        bot = make_bot(settings, app.config.telegram_token())
        try:
            async with app:
                app.provider()  # a missing key or URL stops the bot now, not at the first message
                # Before anything talks to Telegram or starts: a second poller of this bot is refused at once.
                with polling_lock(app.workspace.layout.telegram_lock_path(bot.token)):
                    await app.start_mcp()  # the same MCP tools as in chat: one code path
                    channel = TelegramChannel(settings, bot, app.agent)
                    await channel.run(scheduler=app.scheduler(channel.deliver))
        finally:
            await bot.session.close()

    # A bot runs unattended: its log says which chat and user each turn came from, even without -v.
    picoclaw_log = logging.getLogger("picoclaw")
    level = picoclaw_log.level
    picoclaw_log.setLevel(logging.INFO)
    try:
        asyncio.run(run())
    finally:
        picoclaw_log.setLevel(level)
    return 0


# -- skills ----------------------------------------------------------------------------------------

def cmd_skills_list(args: argparse.Namespace) -> int:
    from picoclaw.tools.skills import SkillCatalog

    folder = _workspace().layout.skills_dir
    scan = SkillCatalog(folder).scan()
    if not scan.skills and not scan.problems:
        echo(f"no skills installed ({folder})")
    for skill in scan.skills:
        echo(f"{skill.name}: {skill.description}")
    for problem in scan.problems:
        echo(f"failed: {problem.path}: {problem.reason}")
    return 1 if scan.problems else 0


# -- mcp -------------------------------------------------------------------------------------------

def cmd_mcp_list(args: argparse.Namespace) -> int:
    app = _app()
    if not app.config.tools.mcp.servers:
        echo(f"no MCP servers configured (add them under tools.mcp.servers in {app.home / 'config.json'})")
        return 0

    async def run() -> tuple[list[str], bool]:
        async with app:  # the servers start as they do for chat and the bot, and stop when this ends
            servers = await app.start_mcp()
            lines = []
            for server in servers.servers:
                lines.append(f"{server.name}: {server.status()}  [{server.describe()}]")
                lines += [f"  {tool.name}  {tool.description.strip().split(chr(10), 1)[0]}".rstrip()
                          for tool in server.tools]
            return lines, any(server.state == "failed" for server in servers.servers)

    lines, failed = asyncio.run(run())
    echo("\n".join(lines))
    return 1 if failed else 0


# -- cron ------------------------------------------------------------------------------------------

def cmd_cron_list(args: argparse.Namespace) -> int:
    from picoclaw.jobs import job_problem

    app = _app()
    jobs = app.jobs()
    listed = jobs.load()
    if not listed:
        print(f"no scheduled jobs ({jobs.path})")
        return 0
    for job in listed:
        problem = job_problem(job, jobs.tz)
        if problem is not None:  # listed as off, saying why, rather than stopping the listing
            job = job.model_copy(update={"enabled": False, "last_outcome": f"cannot be scheduled: {problem}"})
        print("\n".join(job_lines([job], jobs.tz)))
    return 0


def cmd_cron_add(args: argparse.Namespace) -> int:
    from picoclaw.jobs import JobError, check_session_key, make_schedule, scope_for

    app = _app()
    jobs = app.jobs()
    try:
        check_session_key(args.session)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        schedule = make_schedule(at=args.at, in_=args.in_, every=args.every, cron=args.cron, tz=jobs.tz)
        scope = scope_for(args.session, app.config.channels.telegram.memory_scope)
        if args.message is not None:
            job = jobs.add(schedule, "message", args.message, args.session, created_by="cli", scope=scope)
        else:
            job = jobs.add(schedule, "agent", args.agent, args.session, created_by="cli", scope=scope)
    except JobError as exc:
        raise UsageError(str(exc)) from None
    print(f"added job {job.id}")
    print("\n".join(job_lines([job], jobs.tz)))
    if args.session.startswith("cli:"):
        echo(f"note: delivered while an interactive `picoclaw chat --session {args.session}` runs "
             "(`chat -m` does not wait for jobs; a job due while it is closed comes when it opens, marked late)")
    return 0


def cmd_cron_remove(args: argparse.Namespace) -> int:
    from picoclaw.jobs import JobError

    jobs = _app().jobs()
    try:
        job = jobs.remove(args.id)
    except JobError as exc:
        raise UsageError(str(exc)) from None
    print(f"removed job {job.id} ({job.schedule.describe(jobs.tz)} for {job.target})")
    return 0


# -- parser ----------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    """The whole command tree."""
    parser = _Parser(prog="picoclaw", description="A personal assistant with Markdown memory.")
    parser.add_argument("--version", action="version", version=f"picoclaw {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more detail to stderr")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    commands.add_parser("onboard", help="create ~/.picoclaw, config.json and the workspace").set_defaults(
        handler=cmd_onboard)

    chat = commands.add_parser("chat", help="talk to the assistant in this terminal")
    chat.add_argument("-m", "--message", help="send one message, print the answer and exit")
    chat.add_argument("--session", metavar="KEY", help="conversation to continue (default: cli:default)")
    chat.set_defaults(handler=cmd_chat)
    commands.add_parser("telegram", help="run the assistant as a Telegram bot (long polling; Ctrl-C stops)"
                        ).set_defaults(handler=cmd_telegram)

    memory = commands.add_parser("memory", help="read, search and write long-term memory and notes")
    memory_commands = memory.add_subparsers(dest="memory_command", metavar="ACTION", parser_class=_Parser)
    memory_commands.add_parser("show", help="print MEMORY.md").set_defaults(handler=cmd_memory_show)
    search = memory_commands.add_parser("search", help="search MEMORY.md and daily notes")
    search.add_argument("query")
    search.add_argument("--limit", type=_bounded_int(1, 1000), help="most hits (default: retrieve_limit)")
    search.set_defaults(handler=cmd_memory_search)
    memory_commands.add_parser("status", help="the optional index: files, chunks, vectors, last sync, stale files"
                               ).set_defaults(handler=cmd_memory_status)
    memory_commands.add_parser("reindex", help="rebuild the optional index from the memory files"
                               ).set_defaults(handler=cmd_memory_reindex)
    append = memory_commands.add_parser("append", help="add an entry to MEMORY.md (or today's note)")
    append.add_argument("text")
    append.add_argument("--today", action="store_true", help="append to today's daily note instead")
    append.set_defaults(handler=cmd_memory_append)
    notes = memory_commands.add_parser("notes", help="print the last days' daily notes")
    notes.add_argument("--days", type=_bounded_int(0, 3660), help="how many days (default: recent_days)")
    notes.set_defaults(handler=cmd_memory_notes)
    memory_commands.add_parser("backups", help="list MEMORY.md backups, newest first").set_defaults(
        handler=cmd_memory_backups)
    restore = memory_commands.add_parser("restore", help="restore MEMORY.md from a backup")
    restore.add_argument("backup", help="a file name from `picoclaw memory backups`")
    restore.set_defaults(handler=cmd_memory_restore)
    compress = memory_commands.add_parser(
        "compress", help="let the model rewrite MEMORY.md shorter (when over the threshold, once a day)")
    compress.add_argument("--force", action="store_true", help="ignore the threshold and the 24-hour gate")
    compress.add_argument("--dry-run", action="store_true",
                          help="print the rewrite and a diff summary; write nothing")
    compress.set_defaults(handler=cmd_memory_compress)

    cron = commands.add_parser("cron", help="reminders and recurring tasks that `picoclaw telegram` delivers")
    cron_commands = cron.add_subparsers(dest="cron_command", metavar="ACTION", parser_class=_Parser)
    cron_commands.add_parser("list", help="every job: id, schedule, next run, target, action, last outcome"
                             ).set_defaults(handler=cmd_cron_list)
    add = cron_commands.add_parser("add", help="schedule a message or an agent task for a chat")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--at", metavar="TIME", help="once, ISO 8601: 2026-12-01T09:00+08:00 (no offset: "
                                                   "the configured timezone)")
    when.add_argument("--in", dest="in_", metavar="DELAY", help="once, after a delay: '20 minutes', '2 hours'")
    when.add_argument("--every", type=_bounded_int(60, 366 * 86400), metavar="SECONDS",
                      help="repeatedly, every this many seconds (at least 60)")
    when.add_argument("--cron", metavar="EXPR", help="repeatedly, on a 5-field cron expression in the "
                                                     "configured timezone: '0 8 * * 1'")
    what = add.add_mutually_exclusive_group(required=True)
    what.add_argument("--message", metavar="TEXT", help="text sent to the chat as it is")
    what.add_argument("--agent", metavar="PROMPT", help="a prompt run as a turn of the session; the reply is sent")
    add.add_argument("--session", required=True, metavar="KEY",
                     help="target: telegram:<chat_id>[:<user_id>] or cli:<name> (at most 64 bytes)")
    add.set_defaults(handler=cmd_cron_add)
    remove = cron_commands.add_parser("remove", help="delete a job by id")
    remove.add_argument("id")
    remove.set_defaults(handler=cmd_cron_remove)

    skills = commands.add_parser("skills", help="the skills in workspace/skills/ that the model can load")
    skills_commands = skills.add_subparsers(dest="skills_command", metavar="ACTION", parser_class=_Parser)
    skills_commands.add_parser("list", help="installed skills (name: description) and any that failed to load"
                               ).set_defaults(handler=cmd_skills_list)

    mcp = commands.add_parser("mcp", help="the MCP servers of tools.mcp in config.json and their tools")
    mcp_commands = mcp.add_subparsers(dest="mcp_command", metavar="ACTION", parser_class=_Parser)
    mcp_commands.add_parser("list", help="start each server, show its state (ready / failed: why / disabled) "
                            "and its tools, stop it").set_defaults(handler=cmd_mcp_list)

    policy = commands.add_parser("policy", help="show and tune the memory policy")
    policy_commands = policy.add_subparsers(dest="policy_command", metavar="ACTION", parser_class=_Parser)
    policy_commands.add_parser("show", help="each key's value and where it comes from").set_defaults(
        handler=cmd_policy_show)
    set_ = policy_commands.add_parser("set", help="override keys: KEY=VALUE …")
    set_.add_argument("assignments", nargs="+", metavar="KEY=VALUE")
    set_.set_defaults(handler=cmd_policy_set)
    policy_commands.add_parser("snapshots", help="list override snapshots, newest first").set_defaults(
        handler=cmd_policy_snapshots)
    rollback = policy_commands.add_parser("rollback", help="restore a snapshot (default: the newest)")
    rollback.add_argument("snapshot", nargs="?")
    rollback.set_defaults(handler=cmd_policy_rollback)
    policy_commands.add_parser("reset", help="drop every override").set_defaults(handler=cmd_policy_reset)
    policy_commands.add_parser("history", help="every policy change, oldest first: who, old → new, why"
                               ).set_defaults(handler=cmd_policy_history)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `picoclaw` script; returns the exit code."""
    parser = build_parser()
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        # An argument that is not valid UTF-8 reaches Python as lone surrogates (surrogateescape): stored,
        # sent or printed it would crash a command half-way, so it is refused before any command runs.
        for argument in arguments:
            try:
                argument.encode("utf-8")
            except UnicodeEncodeError as exc:
                code = ord(argument[exc.start])
                what = f"the byte 0x{code - 0xDC00:02X}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
                try:  # the bytes as given, shown as \xNN
                    raw = argument.encode("utf-8", "surrogateescape")
                except UnicodeEncodeError:
                    raw = argument.encode("utf-8", "surrogatepass")
                shown = raw.decode("utf-8", "backslashreplace")
                raise UsageError(f"the argument '{shown}' is not valid UTF-8 ({what}): set the terminal to "
                                 "UTF-8 and try again; nothing was done") from None
        args = parser.parse_args(arguments)
        log_lines = logging.StreamHandler()
        log_lines.setFormatter(PrintableFormatter("picoclaw: %(levelname)s: %(message)s"))
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[log_lines])
        handler = getattr(args, "handler", None)
        if handler is None:
            sub = {"memory": "memory", "policy": "policy", "cron": "cron", "mcp": "mcp"}.get(args.command or "")
            what = "an action" if sub else "a command"
            raise UsageError(f"missing {what} (see `{' '.join(['picoclaw', *([sub] if sub else [])])} --help`)")
        try:
            return handler(args)
        finally:
            while _opened:
                _opened.pop().close()
    except PicoclawError as exc:  # errors quote what they refused: printable, like all the CLI shows
        echo(f"picoclaw: error: {exc}", file=sys.stderr)
        return 1 if not isinstance(exc, UsageError) else 2
    except KeyboardInterrupt:
        print("picoclaw: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        echo(f"picoclaw: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 1
    except UnicodeError as exc:  # a last line of defence: bad input is one line, never a traceback
        echo(f"picoclaw: error: text that is not valid UTF-8: {exc}", file=sys.stderr)
        return 1
