"""Sessions: each conversation a transcript of JSON records (`sessions/<key>.jsonl` in the files layout).

Records are messages (numbered), compactions ("messages up to id N are covered by this summary"),
reflections, and marks of replies a channel could not deliver. Compacted messages stay in the transcript;
the counters that drive summaries and reflection are derived from the records, so they survive restarts.
The storage backend keeps the records (`picoclaw.storage.SessionLog`: JSONL files, or rows of PostgreSQL's
`messages` table); a torn last line of a file (a crash mid-append) is ignored when read and cut off before
the next append. This module alone knows the record format: the index reads transcripts through
`said_lines`; a record of the wrong shape is skipped with a warning, so one bad line never makes every turn
of its session fail.

One writer at a time, across processes (an open `chat` and a `chat -m` on the same session, the bot and
the CLI): every append happens under the backend's lock on the sessions folder (a file lock, or an advisory
lock on PostgreSQL), after reading what other processes appended since this one last read the transcript.
Ids are assigned under that lock, so they stay unique and increasing, and the in-memory Session includes the
other process's messages too. On PostgreSQL an append whose statement finds the lock free and the transcript
unchanged since it was read is as good as one under the lock, and takes none (`SessionLog.append_unchanged`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson

from picoclaw import clock
from picoclaw.storage import (
    ARCHIVE_DIR,
    LOCK_FILE,
    SUFFIX,
    SessionLog,
    Storage,
    transcript_files,
)

if TYPE_CHECKING:
    from picoclaw.providers.base import Message

log = logging.getLogger(__name__)

__all__ = ["ARCHIVE_DIR", "KEPT_COMPACTED", "LOCK_FILE", "SUFFIX", "Session", "SessionStore", "StoredMessage",
           "said_lines", "session_filename", "summary_of", "transcript_files",
           "with_summary"]
# Compacted messages kept in memory: reflection reads the newest of them; the file keeps them all. Without
# a bound, a chat of a year would hold every message it ever had in a process that runs for months.
KEPT_COMPACTED = 50


class _BadRecord(ValueError):
    """A record of the wrong shape; the message says what is wrong with it."""


@dataclass
class StoredMessage:
    """A message of the history, its number, and what came with it.

    A user message keeps the data block that was sent in front of its text (`context`: retrieved memory,
    notes, the time) and the keys of the memory blocks in it, so the history is sent again byte for byte
    (providers' prompt caches match it) and a block already in the context is not injected twice. An
    assistant reply keeps the prompt size the provider reported, and how much of it the provider had cached.
    A reply the channel could not deliver carries why (`undelivered`), and a note saying so at the end of its
    text: the model, its summaries and the memory flush all read it as a reply the user never saw.
    """

    id: int
    message: Message
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    context: str | None = None
    blocks: tuple[str, ...] = ()
    undelivered: str | None = None
    why: dict[str, Any] | None = None  # a user message: what memory it carried and why (InjectedMemory.explained)
    # Its tokens as sent, counted once by the prompt budget (agent/budget.py); never stored in the file.
    tokens: int | None = field(default=None, repr=False, compare=False)
    # `as_sent` of a message with a data block, with the message and block it was made of: every turn sends the
    # whole history again, and joining each block to its text anew copied it all.
    _sent: tuple[Message, str, Message] | None = field(default=None, init=False, repr=False, compare=False)

    def mark_undelivered(self, reason: str) -> None:
        """Note in this message that it never reached the user (its record in the file stays as it was)."""
        if self.undelivered is not None:
            return
        self.undelivered = reason
        self.tokens = None  # the note changes what is sent
        content = str(self.message.get("content") or "").rstrip()
        note = undelivered_note(reason)
        self.message = {**self.message, "content": f"{content}\n\n{note}" if content else note}

    def as_sent(self) -> Message:
        """The message as the model is sent it: a user message with its data block in front of the text."""
        if self.context:
            made = self._sent
            if made is not None and made[0] is self.message and made[1] is self.context:
                return made[2]
            sent = {**self.message, "content": with_context(self.context, str(self.message.get("content") or ""))}
            self._sent = (self.message, self.context, sent)
            return sent
        if self.message.get("content") is None:
            return {**self.message, "content": ""}  # older files; llama.cpp's server refuses null content
        return self.message

    def record(self) -> dict[str, Any]:
        """The JSONL record of this message (optional fields only when set)."""
        extras = {"prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                  "context": self.context, "blocks": list(self.blocks) or None, "why": self.why}
        return {"type": "message", "id": self.id, "time": clock.now().isoformat(), "message": self.message,
                **{key: value for key, value in extras.items() if value is not None}}


def with_context(context: str, text: str) -> str:
    """A user message's text with its data block in front: the one way the two are joined."""
    return f"{context}\n\n{text}"


CONTEXT_OPEN = "<context>\n"  # how a data block begins (agent/context.py writes it)
SUMMARY_OPEN, SUMMARY_CLOSE = "<summary>\n", "\n</summary>\n"  # the summary's section at the start of that block


def with_summary(message: Message, summary: str) -> Message:
    """`message` (the request's first user message, as sent) with the session's summary at the start of its data
    block: after the system prompt and the tools, which a summary then leaves as they were in the server's cache."""
    # Model-written from chat text: a closing tag in it must not end the block early (and make the rest read as
    # what the user typed, to the model and to `user_texts`).
    section = SUMMARY_OPEN + summary.strip().replace("</", "<\\/") + SUMMARY_CLOSE
    content = str(message.get("content") or "")
    if content.startswith(CONTEXT_OPEN):
        content = CONTEXT_OPEN + section + content[len(CONTEXT_OPEN):]
    else:
        content = with_context(f"{CONTEXT_OPEN}{section}</context>", content)
    return {**message, "content": content}


def summary_of(message: Message) -> str | None:
    """The summary `with_summary` put in `message` (as it put it, escaped), or None."""
    content = str(message.get("content") or "")
    head = CONTEXT_OPEN + SUMMARY_OPEN
    if not content.startswith(head):
        return None
    end = content.find(SUMMARY_CLOSE, len(head))
    return None if end < 0 else content[len(head):end]


# How the mark after a reply that never reached the user begins (`undelivered_note`); curation/session_summary.py
# finds it.
UNDELIVERED = "(not delivered: "


def undelivered_note(reason: str) -> str:
    """What follows the text of a reply that did not reach the user: the one wording of it.

    Derived from the session's records alone, so the history is sent byte for byte the same on every turn.
    """
    return f"{UNDELIVERED}{' '.join(reason.split())})"


@dataclass
class Session:
    """A session's history as loaded from its file."""

    key: str
    path: Path
    messages: list[StoredMessage] = field(default_factory=list)
    summary: str | None = None
    compacted_through: int = 0
    reflected_through: int = 0
    # The transcript's marker as this Session last read or wrote it: another process changed it when it differs.
    synced: Hashable | None = field(default=None, repr=False)
    # Held by every read and write of the store on this session: they run in worker threads (off the event
    # loop), and a turn's append must not interleave with a background summary's compaction record.
    guard: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)
    # `active()` and `injected_blocks()` as last worked out, with what they were worked out from: a turn asks for
    # them several times, and the history is only ever appended to (its length changes) or replaced (a new list).
    _active: _ActiveHistory | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def last_id(self) -> int:
        return self.messages[-1].id if self.messages else 0

    def active(self) -> list[StoredMessage]:
        """Messages not covered by a compaction, oldest first (a list of the caller's own)."""
        return list(self._active_history().messages)

    def _active_history(self) -> _ActiveHistory:
        messages, through = self.messages, self.compacted_through
        made = self._active
        if made is None or made.source is not messages or made.length != len(messages) or made.through != through:
            made = self._active = _ActiveHistory(messages, len(messages), through,
                                                 tuple(m for m in messages if m.id > through))
        return made

    def active_messages(self) -> list[Message]:
        """The active history as it is sent to the model (user messages with their data blocks)."""
        return [m.as_sent() for m in self._active_history().messages]

    def injected_blocks(self) -> frozenset[str]:
        """Keys of the memory blocks the active history already carries."""
        made = self._active_history()
        if made.blocks is None:
            made.blocks = frozenset(key for m in made.messages for key in m.blocks)
        return made.blocks

    def last_usage(self) -> StoredMessage | None:
        """The newest active reply for which the provider reported the prompt size."""
        return next(reported_usage(self._active_history().messages), None)

    def last_prompt_tokens(self) -> int | None:
        """Prompt tokens the provider reported for the newest active reply, if any."""
        stored = self.last_usage()
        return stored.prompt_tokens if stored is not None else None

    def messages_since_reflection(self) -> int:
        # From the ids, which count every message (the oldest compacted ones are not kept in memory).
        return max(0, self.last_id - self.reflected_through)

    def last_reply(self, text: str) -> StoredMessage | None:
        """The assistant message of the newest turn whose text `text` (a channel's reply) ends with, if any."""
        sent = text.strip()
        for stored in reversed(self.messages):
            role, content = stored.message.get("role"), stored.message.get("content")
            if role == "user":
                return None
            if role == "assistant" and isinstance(content, str) and content.strip() and sent.endswith(content.strip()):
                return stored
        return None

    def forget_compacted(self) -> None:
        """Drop all but the newest KEPT_COMPACTED compacted messages from memory (ids keep increasing)."""
        compacted = sum(1 for m in self.messages if m.id <= self.compacted_through)
        if compacted > KEPT_COMPACTED:
            # A new list, not a deletion in place: a reader on another thread keeps a consistent one.
            self.messages = self.messages[compacted - KEPT_COMPACTED:]


@dataclass(eq=False)
class _ActiveHistory:
    """A session's active messages, and the history list, its length and the compaction point they came from."""

    source: list[StoredMessage]
    length: int
    through: int
    messages: tuple[StoredMessage, ...]
    blocks: frozenset[str] | None = None  # their memory blocks' keys, once asked for


def reported_usage(messages: Sequence[StoredMessage]) -> Iterator[StoredMessage]:
    """The replies among `messages` for which the provider reported the prompt size, newest first."""
    return (m for m in reversed(messages) if m.prompt_tokens is not None)


def session_filename(key: str) -> str:
    """A file name for any session key (`telegram:42` → `telegram%3A42.jsonl`), safe on every OS."""
    return quote(key, safe="-_.@") + SUFFIX


class SessionStore:
    """Loads and appends the transcripts of one sessions folder, kept by the storage backend that holds it."""

    def __init__(self, folder: Path, *, storage: Storage, moved_from: Path | None = None,
                 lock_path: Path | None = None):
        self.folder = Path(folder)
        # Files backend: the lock file outside the sessions folder, which holds transcripts only (the workspace
        # passes the memory folder's lock-file place); by default a dot file next to the folder.
        self.log: SessionLog = storage.session_log(self.folder, lock_path=lock_path)
        # Per-user scopes keep transcripts in their own folder; older versions kept them all in the
        # workspace's sessions/, so a transcript still there is moved over when its session is first loaded.
        self.moved_from = moved_from

    def path_for(self, key: str) -> Path:
        return self.folder / session_filename(key)

    def load(self, key: str) -> Session:
        """Read a session (an empty one when the file does not exist)."""
        path = self.path_for(key)
        self._move_old_transcript(key, path)
        session = Session(key, path)
        self._read(session)
        return session

    def read(self, path: Path) -> Session:
        """The transcript at `path` (this folder's, or an archived one) as it is now, for a reader: nothing is
        moved, nothing cached."""
        session = Session(path.stem, path)
        self._read(session)
        return session

    def changed(self, session: Session) -> bool:
        """Whether `session`'s file changed since it was read or written here (`refresh` reads it again)."""
        return self.log.marker(session.path) != session.synced

    def refresh(self, session: Session) -> bool:
        """Read `session`'s file again if it changed since (another process appended or archived it)."""
        with session.guard:
            if not self.changed(session):
                return False
            self._read(session)
            return True

    def _read(self, session: Session) -> None:
        """Rebuild `session` from its file, in place (the object stays the one the loop holds)."""
        fresh = Session(session.key, session.path)  # filled apart, then swapped in: no half-read state shows
        self._parse(fresh)
        session.messages, session.summary = fresh.messages, fresh.summary
        session.compacted_through, session.reflected_through = fresh.compacted_through, fresh.reflected_through
        session.synced = fresh.synced

    def _parse(self, session: Session) -> None:
        transcript = self.log.read(session.path)
        for number, line in enumerate(transcript.lines, start=1):
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
                if not isinstance(record, dict):
                    raise _BadRecord("not a JSON object")
                self._apply(session, record)
            except _BadRecord as exc:
                log.warning("%s:%d: skipping a record: %s", session.path, number, exc)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                log.warning("%s:%d: skipping an unreadable record", session.path, number)
        session.forget_compacted()
        session.synced = transcript.marker

    @staticmethod
    def _apply(session: Session, record: dict[str, Any]) -> None:
        kind = record["type"]
        if kind == "message":
            message = record["message"]
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise _BadRecord("its message is not a message object with a role")
            blocks = record.get("blocks") or ()
            context = record.get("context")
            why = record.get("why")
            session.messages.append(StoredMessage(
                int(record["id"]), dict(message), record.get("prompt_tokens"), record.get("cached_tokens"),
                context if isinstance(context, str) else None, tuple(str(key) for key in blocks),
                why=why if isinstance(why, dict) else None))
        elif kind == "compaction":
            summary = record.get("summary")
            if summary is not None and not isinstance(summary, str):
                # Skipped whole: without its summary, the messages it covers stay in the history instead.
                raise _BadRecord(f"the compaction's summary is not text ({type(summary).__name__})")
            session.compacted_through = max(session.compacted_through, int(record["through"]))
            if summary:
                session.summary = summary
        elif kind == "reflection":
            session.reflected_through = max(session.reflected_through, int(record["through"]))
        elif kind == "undelivered":
            reason = record.get("reason")
            if not isinstance(reason, str):
                raise _BadRecord("the undelivered mark has no reason")
            message_id = int(record["id"])
            stored = next((m for m in reversed(session.messages) if m.id == message_id), None)
            if stored is not None:  # else compacted long ago and no longer kept: nothing to mark
                stored.mark_undelivered(reason)

    def lock(self) -> AbstractContextManager[object]:
        """The cross-process lock every writer of this folder's sessions holds while it appends or archives (an
        append that finds it free and the session unchanged holds it only for its one write)."""
        return self.log.lock()

    def transcripts(self) -> list[Path]:
        """Every transcript of this folder, archived ones included, sorted by path."""
        return self.log.transcripts()

    def modified(self, path: Path) -> float:
        """When the transcript at `path` last changed (seconds since the epoch; 0 when unknown)."""
        return self.log.modified(path)

    def append_messages(self, session: Session, messages: list[StoredMessage]) -> None:
        """Number and append messages (one write, fsynced) and add them to `session`.

        Under the lock, after taking in what another process appended meanwhile: the ids follow its. Where the
        storage can tell in the same write that no one holds the lock and nothing changed since `session` was
        read (PostgreSQL), without taking it: the ids follow `session`'s.
        """
        with session.guard:
            stored = self._numbered(session, messages)
            records = [message.record() for message in stored]
            if session.synced is not None:
                marker = self.log.append_unchanged(session.path, records, session.synced)
                if marker is not None:
                    session.synced = marker
                    session.messages.extend(stored)
                    return
            with self.lock():
                if self._catch_up(session):  # numbered again after what the other process appended
                    stored = self._numbered(session, messages)
                    records = [message.record() for message in stored]
                self._locked_append(session, records)
                session.messages.extend(stored)

    @staticmethod
    def _numbered(session: Session, messages: list[StoredMessage]) -> list[StoredMessage]:
        """`messages` with the ids that follow `session`'s last."""
        return [replace(message, id=session.last_id + 1 + offset) for offset, message in enumerate(messages)]

    def add_compaction(self, session: Session, through: int, summary: str | None, reason: str) -> None:
        """Mark messages up to `through` as compacted, with the summary that replaces them (if any)."""
        with session.guard, self.lock():
            self._catch_up(session)
            self._locked_append(session, [{"type": "compaction", "time": clock.now().isoformat(),
                                           "through": through, "summary": summary, "reason": reason}])
            session.compacted_through = max(session.compacted_through, through)
            if summary:
                session.summary = summary
            session.forget_compacted()

    def add_reflection(self, session: Session, through: int) -> None:
        """Record that reflection has seen the messages up to `through`."""
        with session.guard, self.lock():
            self._catch_up(session)
            self._locked_append(session, [{"type": "reflection", "time": clock.now().isoformat(),
                                           "through": through}])
            session.reflected_through = max(session.reflected_through, through)

    def mark_undelivered(self, session: Session, message_id: int, reason: str) -> None:
        """Record that message `message_id` (a reply) never reached the user, and why.

        A record of its own, appended like the others: the message's line is never rewritten, and older
        versions, which pass over record types they do not know, read the file as before.
        """
        with session.guard, self.lock():
            self._catch_up(session)
            self._locked_append(session, [{"type": "undelivered", "time": clock.now().isoformat(),
                                           "id": message_id, "reason": reason}])
            stored = next((m for m in reversed(session.messages) if m.id == message_id), None)
            if stored is not None:
                stored.mark_undelivered(reason)

    def archive(self, key: str) -> Path | None:
        """Move a session file into `archive/` (for /new); returns where it went."""
        path = self.path_for(key)
        with self.lock():  # not while another process appends to it
            self._move_old_transcript(key, path)  # else the old transcript would come back on the next load
            return self.log.archive(path, clock.stamp(clock.now()))

    def rename(self, old_key: str, new_key: str) -> bool:
        """Give the transcript of `old_key` to `new_key`, unless `new_key` has one already; whether it moved."""
        old, new = self.path_for(old_key), self.path_for(new_key)
        with self.lock():
            if not self.log.move(old, new):
                return False
        log.info("session %s is now %s (transcript %s → %s)", old_key, new_key, old.name, new.name)
        return True

    def _move_old_transcript(self, key: str, path: Path) -> None:
        if self.moved_from is None or self.log.exists(path):
            return
        old = self.moved_from / session_filename(key)
        if self.log.move(old, path):
            log.info("session %s: moved its transcript from %s to %s", key, old, path)

    def _catch_up(self, session: Session) -> bool:
        """Take in what another process wrote since `session` last read its file (call under the lock); whether
        there was any."""
        if self.refresh(session):
            log.info("session %s: took in what another process wrote to %s", session.key, session.path)
            return True
        return False

    def _locked_append(self, session: Session, records: list[dict[str, Any]]) -> None:
        """Append records to the session's transcript (under the lock)."""
        session.synced = self.log.append(session.path, records)


def said_lines(text: str) -> Iterator[tuple[int, str, str]]:
    """(line number, role, text) of each user or assistant message with text in a session file's content.

    Damaged lines are passed over, as the loader skips them.
    """
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        message = record.get("message") if isinstance(record, dict) and record.get("type") == "message" else None
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            continue
        content = message.get("content")
        if isinstance(content, str) and content.strip():
            yield number, str(message["role"]), content.strip()
