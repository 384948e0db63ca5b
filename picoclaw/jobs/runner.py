"""The job runner (`Scheduler`): runs due jobs of `workspace/cron/jobs.json`, and the heartbeat, beside a channel.

It sleeps until the next job is due, waking every `poll_interval` seconds to see whether jobs.json changed
(another process, `picoclaw cron add`, may have written it). A job is claimed before it runs: its next run
(none, for a one-time job) and last run are written first, by `JobStore.claim` (under the file lock, or a
row lock taken with SKIP LOCKED on PostgreSQL), so a crash or a second scheduler, on this machine or
another, never runs it twice. A job whose time passed while nothing ran is run once, marked "late"; a
recurring one then continues from now, the missed runs not made up. A job that fails is logged and its
outcome recorded; the others run on, each session's due jobs in a task of its own (a slow one holds up
no other chat's).
A job that can never run (a next run the timezone cannot show, a cron expression that matches no date, a
target no channel reaches; jobs.json can be edited by hand) is skipped with one warning, the file unchanged.
A scheduler serves some sessions (`picoclaw telegram` every telegram: one, `picoclaw chat` its own);
a job for another is left untouched for the process that serves it.

Agent jobs and the heartbeat go through the agent's `handle` (an AgentLoop's, handed in by the composition
root as `SessionAgent`), so they queue behind a chat's turn (the same per-session lock) and are kept in that
session's history.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from picoclaw import clock
from picoclaw.jobs.heartbeat_due import HeartbeatRuns, HeartbeatTask, read_tasks
from picoclaw.jobs.model import Job, JobError, JobsFileError
from picoclaw.jobs.schedule import following_run, job_problem
from picoclaw.jobs.store import JobStore
from picoclaw.session_key import TELEGRAM, SessionKey, channel_of
from picoclaw.storage import Storage, StorageError, local_file
from picoclaw.workspace_text import strip_comments

if TYPE_CHECKING:  # its settings are only read here: the config models are not built for the job runner
    from picoclaw.config import HeartbeatConfig

log = logging.getLogger(__name__)


class TurnReply(Protocol):
    """An agent's answer to one text: `error` is set when the text is an apology, the model having failed."""

    @property
    def text(self) -> str: ...

    @property
    def error(self) -> Exception | None: ...


class SessionAgent(Protocol):
    """What runs agent jobs and the heartbeat: handles a text as a turn of a session (AgentLoop does); with
    `ask_again` False an empty answer is not asked again but comes back as "", its error of kind EMPTY_ANSWER_KIND.
    `purpose` names the budget the turn's model calls count against ("heartbeat", "agent_job")."""

    async def handle(self, key: str, text: str, /, *, ask_again: bool = True, purpose: str = ...) -> TurnReply: ...


class Outbox(Protocol):
    """Where the scheduler hands what is due: a channel (`picoclaw.channels.Channel` is one)."""

    async def deliver(self, session_key: str, markdown: str) -> None:
        """`markdown` to the conversation of `session_key`; raises when it did not arrive."""


AgentFor = Callable[[str | None], SessionAgent]  # the agent of the shared memory (None) or of a user key
Sleep = Callable[[float], Awaitable[None]]

POLL_INTERVAL = 3.0  # seconds between looks at jobs.json: a job added by another process starts this late
LATE_AFTER = timedelta(minutes=1)  # a run this long after its time is "late" (the bot was down, or busy)
OUTCOME_CHARS = 200
MAX_PARALLEL_JOBS = 4  # due jobs run at once: enough that one slow agent job delays no reminder
RUNNING = "running"
INTERRUPTED = "interrupted: the bot stopped while it ran; not run again"
# The heartbeat's reply when there is nothing to tell; an empty answer is quiet too (the frame asks for silence).
HEARTBEAT_QUIET = "HEARTBEAT_OK"
# The kind of the error (a ProviderError's) of a reply the model left empty: providers/base.py's ErrorKind.
EMPTY_ANSWER_KIND = "empty_answer"
OVER_BUDGET_KIND = "over_budget"  # the day's budget had no room: no call was made (agent/allowance.py)
HEARTBEAT_PURPOSE = "heartbeat"
AGENT_JOB_PURPOSE = "agent_job"
HEARTBEAT_WORK = "heartbeat"  # the name several workers claim the heartbeat's interval under (storage/work.py)
HEARTBEAT_SLACK = 0.9  # share of the interval that must have passed since any worker's last beat
HEARTBEAT_FRAME = (
    "Periodic check ({now}). These are your standing tasks from HEARTBEAT.md:\n\n{tasks}\n\n"
    "Do what they ask now. Reply only if something needs the user's attention; if nothing does, "
    f"reply with exactly {HEARTBEAT_QUIET}."
)
# A small model given a bare task narrates it ("stood up and stretched."): the frame says whom the answer is
# for and what it must be, a message the user reads now.
AGENT_FRAME = ("[Scheduled task {id}, set by {by}. The user is not typing this now. Do the task below and answer "
               "with the message the user should read now, written to them.]\n{text}")


def heartbeat_tasks(text: str) -> str:
    """What HEARTBEAT.md asks for: the file without HTML comments, headings and blank lines ("" = nothing)."""
    lines = [line for line in strip_comments(text).splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    return "\n".join(lines).strip()


@dataclass(frozen=True)
class Ran:
    """One job the scheduler ran, and how it went."""

    job_id: str
    outcome: str


class Scheduler:
    """Runs due jobs and the heartbeat until `stop()`; `run_due()` is one pass, for a step-by-step test."""

    def __init__(self, store: JobStore, agent_for: AgentFor, outbox: Outbox, *, storage: Storage,
                 memory_scope: str = "shared", channels: tuple[str, ...] = (TELEGRAM,),
                 heartbeat: HeartbeatConfig | None = None, heartbeat_path: Path | None = None,
                 heartbeat_runs: Path | None = None, poll_interval: float = POLL_INTERVAL, sleep: Sleep | None = None):
        self.store = store
        self.storage = storage  # where the heartbeat's interval is claimed, across workers
        self.agent_for = agent_for
        self.outbox = outbox
        self.memory_scope = memory_scope
        self.channels = channels  # channels ("telegram") or session keys ("cli:default") the outbox reaches
        self.heartbeat = heartbeat if heartbeat is not None and heartbeat.enabled else None
        self.heartbeat_path = heartbeat_path
        # When each heartbeat task last ran (jobs/heartbeat_due.py); None: every task is due at every beat.
        self.heartbeat_runs = HeartbeatRuns(heartbeat_runs, storage) if heartbeat_runs is not None else None
        self.poll_interval = poll_interval
        self._sleep = sleep
        self._jobs: list[Job] = []  # the last good state of the file
        self._seen: Hashable | None = None
        self._bad: str | None = None  # the error of a malformed file, logged once per version of it
        self._wake = asyncio.Event()
        self._stopping = False
        self._unserved_logged: set[str] = set()
        self._skipped: set[str] = set()  # ids of jobs that can never run, in the file's last good state
        self._warned: set[tuple[str, str]] = set()  # (job id or "heartbeat", problem): each warned about once
        self.next_heartbeat: datetime | None = None
        self.task: asyncio.Task[None] | None = None

    # -- life cycle -------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run jobs as they fall due until `stop()`."""
        self.task = asyncio.current_task()
        self._stopping = False
        await asyncio.to_thread(self._mark_interrupted)
        if self.heartbeat is not None:
            self.next_heartbeat = clock.now() + timedelta(minutes=self.heartbeat.interval_minutes)
        log.info("scheduler: started (%s)", self.store.path)
        while not self._stopping:
            await self.run_due()
            if self.heartbeat is not None and self.next_heartbeat is not None and clock.now() >= self.next_heartbeat:
                self.next_heartbeat = clock.now() + timedelta(minutes=self.heartbeat.interval_minutes)
                await self.beat()
            if self._stopping:
                break
            await self._pause(self._seconds_to_wait())
        log.info("scheduler: stopped")

    async def stop(self, timeout: float = 30.0) -> None:
        """Stop after the job under way (given at most `timeout` seconds, then cancelled)."""
        self._stopping = True
        self._wake.set()
        task = self.task
        if task is None or task is asyncio.current_task() or task.done():
            return
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            log.warning("scheduler: a job still ran after %.0f s; stopping it", timeout)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def poke(self) -> None:
        """Look at jobs.json now (a job was added in this process)."""
        self._wake.set()

    def _seconds_to_wait(self) -> float:
        now = clock.now()
        wait = self.poll_interval
        upcoming = [job.next_run for job in self._jobs if not job.done and job.next_run is not None
                    and self.serves(job.target) and job.id not in self._skipped]
        if self.next_heartbeat is not None:
            upcoming.append(self.next_heartbeat)
        if upcoming:
            wait = min(wait, (min(upcoming) - now).total_seconds())
        return max(wait, 0.0)

    async def _pause(self, seconds: float) -> None:
        if self._sleep is not None:
            await self._sleep(seconds)
            return
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        except TimeoutError:
            pass
        self._wake.clear()

    def _mark_interrupted(self) -> None:
        """A job left "running" by a process that died: it is not run again (it may have been delivered). Only
        this scheduler's sessions: a job of another channel may be running in its process right now."""
        try:
            stuck = [job.id for job in self.store.load() if job.last_outcome == RUNNING and self.serves(job.target)]
        except JobsFileError:
            return
        for job_id in stuck:
            self.store.update(job_id, lambda job: _set(job, last_outcome=INTERRUPTED))

    # -- jobs -------------------------------------------------------------------------------------------

    def _refresh(self) -> None:
        """Take in jobs.json if it changed; a malformed file keeps the last good state (logged once)."""
        try:
            key = self.store.stamp()
            if key == self._seen and key is not None:
                return
            self._jobs = self.store.load()
        except JobsFileError as exc:
            if str(exc) != self._bad:
                log.error("scheduler: %s (no job runs until it is fixed)", exc)
                self._bad = str(exc)
            return
        self._seen, self._bad = key, None
        self._skipped = set()
        for job in self._jobs:
            problem = job_problem(job, self.store.tz) if self.serves(job.target) else None
            if problem is not None:
                self._skip(job, problem)

    def _skip(self, job: Job, problem: str) -> None:
        """Leave a job that can never run out of every pass (warned once), rather than fail on it each time."""
        self._skipped.add(job.id)
        if (job.id, problem) not in self._warned:
            self._warned.add((job.id, problem))
            log.warning("scheduler: job %s cannot be scheduled, skipped until it is fixed or removed: %s",
                        job.id, problem)

    def serves(self, session_key: str) -> bool:
        """Whether this scheduler's outbox reaches `session_key` (its channel's, or the very key it serves)."""
        return any(session_key == served or channel_of(session_key) == served for served in self.channels)

    def due(self) -> list[Job]:
        """The jobs this scheduler serves that are due now, in the file's last good state."""
        now = clock.now()
        due = [job for job in self._jobs if not job.done and job.next_run is not None and job.next_run <= now
               and job.id not in self._skipped]
        for job in due:
            if not self.serves(job.target) and job.id not in self._unserved_logged:
                self._unserved_logged.add(job.id)
                log.info("scheduler: job %s is for %s, which this process does not serve; left for one that does",
                         job.id, job.target)
        return [job for job in due if self.serves(job.target)]

    async def run_due(self) -> list[Ran]:
        """Run every job due now: one session's jobs in the file's order, sessions side by side (at most
        MAX_PARALLEL_JOBS at once); what ran and how it went."""
        await asyncio.to_thread(self._refresh)
        if self._bad is not None:
            return []  # claiming would mean rewriting a file the user is fixing
        by_session: dict[str, list[Job]] = {}
        for job in self.due():
            by_session.setdefault(job.target, []).append(job)
        parallel = asyncio.Semaphore(MAX_PARALLEL_JOBS)

        async def run_in_order(jobs: list[Job]) -> list[Ran]:
            async with parallel:
                outcomes = [(job.id, await self._run_one(job)) for job in jobs]
            return [Ran(job_id, outcome) for job_id, outcome in outcomes if outcome is not None]

        ran = [one for session in await asyncio.gather(*map(run_in_order, by_session.values())) for one in session]
        if ran:
            await asyncio.to_thread(self._refresh)
        return ran

    async def _run_one(self, job: Job) -> str | None:
        now = clock.now()
        assert job.next_run is not None
        late = now - job.next_run > LATE_AFTER
        claimed = await asyncio.to_thread(self._claim, job, now)
        if claimed is None:
            return None  # removed, changed or claimed by someone else meanwhile
        outcome = "late" if late else "ok"
        try:
            if job.action == "message":
                await self.outbox.deliver(job.target, job.text)
            else:
                agent = self.agent_for(job.scope)
                prompt = AGENT_FRAME.format(id=job.id, by=job.created_by, text=job.text)
                reply = await agent.handle(job.target, prompt, purpose=AGENT_JOB_PURPOSE)
                await self.outbox.deliver(job.target, reply.text)
                if reply.error is not None:
                    outcome = f"error: {reply.error}"
        except Exception as exc:  # one job's failure must never stop the others
            log.exception("scheduler: job %s failed", job.id)
            outcome = f"error: {type(exc).__name__}: {exc}"
        outcome = " ".join(outcome.split())[:OUTCOME_CHARS]
        log.info("scheduler: job %s (%s for %s): %s", job.id, job.action, job.target, outcome)
        try:
            await asyncio.to_thread(self.store.update, job.id, lambda stored: _set(stored, last_outcome=outcome))
        except Exception:  # the run is claimed already: a failure to record its outcome only loses the word
            log.exception("scheduler: could not record the outcome of job %s", job.id)
        return outcome

    def _claim(self, seen: Job, now: datetime) -> Job | None:
        """Move the job's next run on (off, for a one-time job) before it runs: it is never run twice."""
        try:
            following = following_run(seen, now, self.store.tz)
        except JobError as exc:  # no run after this one (a date past 9999): not run, so as not to repeat it
            self._skip(seen, str(exc))
            return None

        def claim(job: Job) -> bool:
            if job.done or job.next_run != seen.next_run:
                return False
            _set(job, next_run=following, last_run=now, last_outcome=RUNNING)
            return True

        try:
            return self.store.claim(seen.id, claim)
        except JobsFileError as exc:
            log.error("scheduler: %s", exc)
            return None

    # -- heartbeat --------------------------------------------------------------------------------------

    async def _heartbeat_is_ours(self, interval_minutes: float) -> bool:
        """Whether this process beats now: of several workers serving the heartbeat's session whose heartbeat
        falls due, one per interval does. Asked only by a scheduler that would beat, so one that does not serve
        that session (a terminal chat's) never takes the interval from one that does.

        A tenth of the interval is forgiven, so workers' timers drifting apart never skip an interval.
        """
        seconds = interval_minutes * 60 * HEARTBEAT_SLACK
        try:
            ours = await asyncio.to_thread(self.storage.claim_interval, HEARTBEAT_WORK, seconds)
        except StorageError as exc:
            log.error("scheduler: heartbeat skipped: %s", exc)
            return False
        if not ours:
            log.info("scheduler: heartbeat: another worker beat in this interval")
        return ours

    async def beat(self) -> str | None:
        """One heartbeat: run HEARTBEAT.md's tasks as a turn of the owner's session; what was delivered."""
        if self.heartbeat is None or self.heartbeat_path is None:
            return None
        try:
            # Through the storage: on PostgreSQL the row, not the workspace folder's file.
            file = await asyncio.to_thread(local_file, self.storage, self.heartbeat_path)
            text = await asyncio.to_thread(file.read_text, encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, StorageError) as exc:
            log.error("scheduler: cannot read %s: %s", self.heartbeat_path, exc)
            return None
        tasks = heartbeat_tasks(text)
        if not tasks:
            return None  # nothing to do: no model call at all
        listed = read_tasks(tasks)
        now = clock.now(self.store.tz)
        last = await asyncio.to_thread(self.heartbeat_runs.last_runs) if self.heartbeat_runs is not None else {}
        due = [task for task in listed if task.due(last.get(task.key), now, self.store.tz)]
        if not due:
            log.info("scheduler: heartbeat: no task is due and none changed; no model call")
            return None
        session = self.heartbeat.session
        if not self.serves(session):
            return None  # the process that serves that session beats for it: no model call here
        try:
            scope = SessionKey.parse(session).scope(self.memory_scope)
        except ValueError as exc:  # a key older versions accepted, which no channel delivers to: as for a job
            if ("heartbeat", str(exc)) not in self._warned:
                self._warned.add(("heartbeat", str(exc)))
                log.error("scheduler: heartbeat: no turn runs until heartbeat.session is fixed: %s", exc)
            return None
        if not await self._heartbeat_is_ours(self.heartbeat.interval_minutes):
            return None
        try:
            agent = self.agent_for(scope)
            # Not asked again when empty: told to stay quiet when nothing is due, an empty answer says just that.
            frame = HEARTBEAT_FRAME.format(now=f"{now:%Y-%m-%d %H:%M %Z}", tasks="\n".join(t.line for t in due))
            reply = await agent.handle(session, frame, ask_again=False, purpose=HEARTBEAT_PURPOSE)
            answer = reply.text.strip()
            kind = getattr(reply.error, "kind", None)
            if kind == OVER_BUDGET_KIND:  # the owner was told once today; the tasks stay due for tomorrow
                log.info("scheduler: heartbeat skipped: %s", reply.error)
                return None
            if reply.error is not None and kind != EMPTY_ANSWER_KIND:
                log.error("scheduler: heartbeat: the model could not answer: %s", reply.error)
                return None
            await self._ran(listed, due, now, last)
            if reply.error is not None or not answer or answer == HEARTBEAT_QUIET or answer.endswith(HEARTBEAT_QUIET):
                log.info("scheduler: heartbeat: nothing to report")
                return None
            await self.outbox.deliver(session, answer)
            return answer
        except Exception:
            log.exception("scheduler: heartbeat failed")
            return None


    async def _ran(self, listed: list[HeartbeatTask], due: list[HeartbeatTask], now: datetime,
                   last: dict[str, datetime]) -> None:
        if self.heartbeat_runs is None:
            return
        try:
            await asyncio.to_thread(self.heartbeat_runs.record, listed, due, now, last)
        except (OSError, StorageError) as exc:  # the tasks run again at the next beat: a call more, nothing lost
            log.warning("scheduler: heartbeat: cannot record which tasks ran: %s", exc)


def _set(job: Job, **values: object) -> bool:
    for name, value in values.items():
        setattr(job, name, value)
    return True
