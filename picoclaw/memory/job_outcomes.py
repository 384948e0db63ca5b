"""What the last run of a background memory job did, kept beside the memory files for `picoclaw memory stats`.

Compression and reflection each write their outcome where they end: `memory/.last_compression.json` and
`memory/.last_reflection.json` (in the folder of the policy, which reflection tunes), one small JSON object
replaced atomically. A run that changed nothing, or whose rewrite was refused, is recorded too: that is
what the files are for (a change leaves its own traces, a backup or a policy history line). Soft state: a
write that fails is logged and the job's own result stands; a damaged file reads as unknown.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from picoclaw import clock
from picoclaw.errors import ConfigError
from picoclaw.jsonio import read_json_object
from picoclaw.storage import Documents, StorageError

if TYPE_CHECKING:
    from picoclaw.memory.store import MemoryStore

log = logging.getLogger(__name__)

COMPRESSION = "compression"
REFLECTION = "reflection"
# When a compression last started (an ISO time in the memory folder): what makes the next one due.
GATE_FILE = ".last_longterm_compress"
MAX_DETAIL_CHARS = 500


@dataclass(frozen=True)
class JobOutcome:
    """One run of a job: when it ended (ISO 8601, UTC), its status word and one line of detail."""

    job: str
    time: str
    status: str  # compression: compressed, refused, failed; reflection: changed, unchanged, refused, failed
    detail: str


def outcome_path(memory_dir: Path, job: str) -> Path:
    """Where `job`'s last outcome is kept."""
    return Path(memory_dir) / f".last_{job}.json"


def record_outcome(documents: Documents, memory_dir: Path, job: str, status: str, detail: str) -> None:
    """Keep what `job` did just now as its last outcome, in `documents` (the scope's); a failure is logged,
    never raised (the job's work is done)."""
    detail = " ".join(detail.split())
    if len(detail) > MAX_DETAIL_CHARS:
        detail = detail[:MAX_DETAIL_CHARS - 1] + "…"
    outcome = JobOutcome(job, clock.now().isoformat(timespec="seconds"), status, detail)
    path = outcome_path(memory_dir, job)
    try:
        documents.replace(documents.name(path), orjson.dumps(asdict(outcome)) + b"\n")
    except (OSError, StorageError) as exc:
        log.warning("cannot record the %s outcome in %s: %s", job, path, exc)


def last_outcome(documents: Documents, memory_dir: Path, job: str) -> JobOutcome | None:
    """`job`'s last recorded outcome, in `documents` (the scope's); None when none was recorded. A damaged file
    raises ConfigError."""
    path = documents.local(documents.name(outcome_path(memory_dir, job)))
    if not (path.exists() or path.is_symlink()):
        return None
    raw = read_json_object(path)  # ConfigError naming the file when it is not a JSON object
    fields = {name: raw.get(name) for name in ("time", "status", "detail")}
    if not all(isinstance(value, str) for value in fields.values()):
        raise ConfigError(f"{path}: not an outcome record (time, status and detail must be text)")
    return JobOutcome(job, str(fields["time"]), str(fields["status"]), str(fields["detail"]))


def last_compression(store: MemoryStore) -> datetime | None:
    """When a compression of this store last started (None: never, or the gate file is unreadable)."""
    gate = store.memory_dir / GATE_FILE
    try:
        last = datetime.fromisoformat(store.local(gate).read_text(encoding="utf-8").strip())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s: unreadable (%s); treating compression as never run", gate, exc)
        return None
    # A hand-written time without an offset is local time, like every other time picoclaw shows.
    return last if last.tzinfo is not None else last.replace(tzinfo=store.tz)
