"""Feedback on the assistant's replies: a reaction of an allowed user on one of the bot's replies.

The file (`memory/.feedback.jsonl`) holds one JSON line per reaction counted: its time, the session and turn (the
stored id of its user message) the reply answered, the chat and message id of the reply, the user, the emoji and its
verdict ("positive" or "negative", FEEDBACK_EMOJI). The same user's same emoji on the same reply is counted once
(Telegram may send an update again, a user may take a reaction back and give it again); a user who changes their
mind is counted by their newest verdict. Appends take a file lock; past TRIM_BYTES the file is trimmed to its newest
KEEP_ENTRIES lines. It is soft state: a damaged line is skipped, and no turn or reaction ever fails for it.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from picoclaw.disk.bounded_read import FileTooLargeError, read_bounded
from picoclaw.disk.links import NotAFileError
from picoclaw.storage import Storage, StorageError, document_of

log = logging.getLogger(__name__)

FEEDBACK_FILE = ".feedback.jsonl"
POSITIVE, NEGATIVE = "positive", "negative"
# The reactions that count as feedback (Telegram sends the heart as "❤" without a variation selector); any other
# reaction is the user's own business and is not recorded.
FEEDBACK_EMOJI = {"👍": POSITIVE, "❤": POSITIVE, "❤️": POSITIVE, "🔥": POSITIVE, "👎": NEGATIVE}
KEEP_ENTRIES = 2000
TRIM_BYTES = 512 * 1024  # a line is about 150 bytes
READ_LIMIT = 1 << 20
LOCK_WAIT_SECONDS = 0.5


@dataclass(frozen=True)
class Reaction:
    """One reaction counted as feedback."""

    time: str  # ISO 8601
    session: str
    chat_id: int
    message_id: int
    user_id: int
    emoji: str
    verdict: str  # POSITIVE or NEGATIVE
    turn: int | None = None  # the stored id of the turn's user message (None: unknown, as in older lines)

    @property
    def who_where(self) -> tuple[int, int, int]:
        return self.chat_id, self.message_id, self.user_id


@dataclass(frozen=True)
class FeedbackCounts:
    """Replies judged, by each judge's newest verdict."""

    positive: int = 0
    negative: int = 0

    def to_json(self) -> dict[str, int]:
        return {"positive": self.positive, "negative": self.negative}


def verdict_of(emoji: str) -> str | None:
    """POSITIVE, NEGATIVE, or None for a reaction that is no feedback."""
    return FEEDBACK_EMOJI.get(emoji)


class FeedbackLedger:
    """The feedback of one memory folder."""

    def __init__(self, memory_dir: Path, *, storage: Storage, lock_wait: float = LOCK_WAIT_SECONDS):
        self.path = Path(memory_dir) / FEEDBACK_FILE
        self._lock = storage.lock(Path(memory_dir) / ".feedback.lock", timeout=lock_wait)
        self.documents, self.name = document_of(storage, self.path)

    def record(self, reaction: Reaction) -> bool:
        """Add `reaction` unless this user's same emoji on this reply is there already; whether it was added.
        Problems are logged, never raised (False)."""
        try:
            with self._lock:
                known = self._read()
                if any(r.who_where == reaction.who_where and r.emoji == reaction.emoji for r in known):
                    return False
                if self.documents.append_records(self.name, [asdict(reaction)], durable=False) > TRIM_BYTES:
                    kept = [orjson.dumps(asdict(r)) + b"\n" for r in [*known, reaction][-KEEP_ENTRIES:]]
                    self.documents.replace(self.name, b"".join(kept), durable=False)
                return True
        except (OSError, StorageError) as exc:
            log.warning("feedback: cannot update %s (%s); the reaction is not counted", self.path, exc)
            return False

    def first_dislike(self, reaction: Reaction) -> bool:
        """Whether `reaction` (kept) is the first negative verdict kept on its turn: a turn's 👎 is a correction
        signal once, however many users or parts of the reply got one."""
        if reaction.verdict != NEGATIVE or reaction.turn is None:
            return False
        first = next((r for r in self.read() if r.verdict == NEGATIVE and r.session == reaction.session
                      and r.turn == reaction.turn), None)
        return first is not None and first.who_where == reaction.who_where and first.emoji == reaction.emoji

    def read(self) -> list[Reaction]:
        """Every reaction kept, oldest first (nothing when the file is missing or unreadable)."""
        try:
            return self._read()
        except (OSError, StorageError):
            return []

    def counts(self) -> FeedbackCounts:
        """Replies judged positive and negative, each user's newest verdict on a reply counting once."""
        newest: dict[tuple[int, int, int], str] = {}
        for reaction in self.read():
            newest[reaction.who_where] = reaction.verdict
        verdicts = list(newest.values())
        return FeedbackCounts(verdicts.count(POSITIVE), verdicts.count(NEGATIVE))

    def _read(self) -> list[Reaction]:
        try:
            raw = read_bounded(self.documents.local(self.name), READ_LIMIT)
        except FileNotFoundError:
            return []
        except (FileTooLargeError, NotAFileError):
            return []
        reactions: list[Reaction] = []
        for line in raw.split(b"\n"):
            if not line.strip():
                continue
            try:
                fields = orjson.loads(line)
                reaction = Reaction(str(fields["time"]), str(fields["session"]), int(fields["chat_id"]),
                                    int(fields["message_id"]), int(fields["user_id"]), str(fields["emoji"]),
                                    str(fields["verdict"]), _turn(fields.get("turn")))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
            if reaction.verdict in (POSITIVE, NEGATIVE):
                reactions.append(reaction)
        return reactions


def _turn(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
