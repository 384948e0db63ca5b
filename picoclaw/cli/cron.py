"""`picoclaw cron`: list, add and remove the reminders and recurring tasks that `picoclaw telegram` delivers.

Handlers import what they use: building this group's parser (for `--help`) loads no config and no jobs code.
"""

from __future__ import annotations

import argparse

from picoclaw.cli.command import Parser, UsageError, bounded_int, opened_app
from picoclaw.cli.output import echo


def register(parser: argparse.ArgumentParser) -> None:
    """Fill in the `cron` group's parser: one action a subcommand."""
    actions = parser.add_subparsers(dest="cron_command", metavar="ACTION", parser_class=Parser)
    actions.add_parser("list", help="every job: id, schedule, next run, target, action, last outcome"
                       ).set_defaults(handler=cmd_cron_list)
    add = actions.add_parser("add", help="schedule a message or an agent task for a chat")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--at", metavar="TIME", help="once, ISO 8601: 2026-12-01T09:00+08:00 (no offset: "
                                                   "the configured timezone)")
    when.add_argument("--in", dest="in_", metavar="DELAY", help="once, after a delay: '20 minutes', '2 hours'")
    when.add_argument("--every", type=bounded_int(60, 366 * 86400), metavar="SECONDS",
                      help="repeatedly, every this many seconds (at least 60)")
    when.add_argument("--cron", metavar="EXPR", help="repeatedly, on a 5-field cron expression in the "
                                                     "configured timezone: '0 8 * * 1'")
    what = add.add_mutually_exclusive_group(required=True)
    what.add_argument("--message", metavar="TEXT", help="text sent to the chat as it is")
    what.add_argument("--agent", metavar="PROMPT", help="a prompt run as a turn of the session; the reply is sent")
    add.add_argument("--session", required=True, metavar="KEY",
                     help="target: telegram:<chat_id>[:<user_id>], cli:<name> or web:<name> (at most 64 bytes)")
    add.set_defaults(handler=cmd_cron_add)
    remove = actions.add_parser("remove", help="delete a job by id")
    remove.add_argument("id")
    remove.set_defaults(handler=cmd_cron_remove)


def cmd_cron_list(args: argparse.Namespace) -> int:
    from picoclaw.jobs import job_line

    with opened_app() as app:
        jobs = app.jobs()
        listed = jobs.load()
        if not listed:
            print(f"no scheduled jobs ({jobs.path})")
            return 0
        for job in listed:  # one that cannot be scheduled is listed as off, saying why, not stopping the listing
            print(job_line(job, jobs.tz))
    return 0


def cmd_cron_add(args: argparse.Namespace) -> int:
    from picoclaw.jobs import JobError, add_session_job, job_line
    from picoclaw.session_key import CLI, channel_of

    with opened_app() as app:
        jobs = app.jobs()
        try:
            job = add_session_job(jobs, args.session, memory_scope=app.config.channels.telegram.memory_scope,
                                  at=args.at, in_=args.in_, every=args.every, cron=args.cron,
                                  action="message" if args.message is not None else "agent",
                                  text=args.message if args.message is not None else args.agent, created_by="cli")
        except JobError as exc:
            raise UsageError(str(exc)) from None
        print(f"added job {job.id}")
        print(job_line(job, jobs.tz))
    if channel_of(args.session) == CLI:
        echo(f"note: delivered while an interactive `picoclaw chat --session {args.session}` runs "
             "(`chat -m` does not wait for jobs; a job due while it is closed comes when it opens, marked late)")
    return 0


def cmd_cron_remove(args: argparse.Namespace) -> int:
    from picoclaw.jobs import JobError

    with opened_app() as app:
        jobs = app.jobs()
        try:
            job = jobs.remove(args.id)
        except JobError as exc:
            raise UsageError(str(exc)) from None
        print(f"removed job {job.id} ({job.schedule.describe(jobs.tz)} for {job.target})")
    return 0
