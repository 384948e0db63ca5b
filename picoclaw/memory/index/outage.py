"""Backing off from a failing embedder, so that a model or endpoint known to be down costs no turn its wait.

After a failure the embedder is not asked again for BACKOFF_FIRST seconds, twice as long after each further
failure, at most BACKOFF_MAX; meanwhile searches answer from keywords at once. When a pause ends, one caller
tries again (the others still answer from keywords); a success ends the outage. The outage is logged once
when it starts and once when it ends, not once per turn. One record per embedder, shared by every index
using it: a bot's per-user scopes share one embedder, so they learn of the outage together. Times come from
the one clock (`picoclaw.clock`), so tests move them with freezegun.
"""

from __future__ import annotations

import logging
import threading
import weakref
from datetime import datetime, timedelta

from picoclaw.clock import now

log = logging.getLogger(__name__)

BACKOFF_FIRST = 30.0  # seconds without asking after the first failure
BACKOFF_MAX = 600.0  # the longest pause, however long the outage lasts


class Outage:
    """Whether an embedder may be asked now; safe to share between threads."""

    def __init__(self, first: float = BACKOFF_FIRST, most: float = BACKOFF_MAX):
        self.first = first
        self.most = most
        self.since: datetime | None = None  # when the current outage began; None while the embedder works
        self.reason = ""  # the last failure of the current outage
        self._failures = 0
        self._retry_at: datetime | None = None
        self._lock = threading.Lock()

    def refusal(self, *, probe: bool = True) -> str | None:
        """Why the embedder must not be asked now, or None when it may. At the end of a pause, one caller
        gets None and the pause is held for the others while that caller tries (`probe`: the caller will
        learn whether the embedder works again; otherwise nothing is held)."""
        with self._lock:
            if self._retry_at is None:
                return None
            current = now()
            if current >= self._retry_at:
                if probe:
                    self._retry_at = current + timedelta(seconds=self._pause())
                return None
            left = (self._retry_at - current).total_seconds()
            return f"embeddings are paused after a failure, next try in {left:.0f} s: {self.reason}"

    def failed(self, reason: str) -> None:
        """Record a failure: pause, and say so in the log if the embedder worked until now."""
        with self._lock:
            self._failures += 1
            pause = self._pause()
            started = self.since is None
            self.since = self.since or now()
            self.reason = reason
            self._retry_at = now() + timedelta(seconds=pause)
        if started:
            log.warning("memory index: embeddings unavailable, searching with keywords only (next try in %g s, "
                        "then less often while it fails): %s", pause, reason)
        else:
            log.info("memory index: embeddings still unavailable, next try in %g s: %s", pause, reason)

    def succeeded(self) -> None:
        """Record that the embedder answered: the outage, if any, is over."""
        with self._lock:
            since, self.since, self.reason, self._failures, self._retry_at = self.since, None, "", 0, None
        if since is not None:
            log.warning("memory index: embeddings work again (unavailable since %s)",
                        since.isoformat(timespec="seconds"))

    def _pause(self) -> float:
        return min(self.first * 2.0 ** min(self._failures - 1, 32), self.most)


_outages: weakref.WeakKeyDictionary[object, Outage] = weakref.WeakKeyDictionary()
_outages_lock = threading.Lock()


def outage_of(embedder: object) -> Outage:
    """The outage record of `embedder`, the same for every index using it (forgotten with the embedder)."""
    with _outages_lock:
        outage = _outages.get(embedder)
        if outage is None:
            outage = _outages[embedder] = Outage()
        return outage
