"""When a failed request to an OpenAI-compatible endpoint is sent again, and how long to wait first.

Retries are the provider's, not the client's (its `max_retries` is 0). The client re-sends a request that
timed out, and a slow local server (llama.cpp on a small CPU: minutes per turn) is then still working on
the first copy while the second queues behind it. So 408/409/429/500/502/503/504 and connection errors
are retried with exponential backoff (honouring `retry-after-ms`/`retry-after`), but a timeout only when
the user set `max_retries` for that provider in config.json. Other statuses will not change on retry.
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from collections.abc import Mapping

import openai

__all__ = ["BACKOFF_FIRST", "BACKOFF_MAX", "RETRY_AFTER_MAX", "RETRY_STATUSES", "retry_delay"]

# What a later attempt may fix: request timeout, lock conflict, rate limit, and the server-side failures
# that are usually transient. 501 (not implemented), 4xx client errors and the like never change.
RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
BACKOFF_FIRST = 0.5  # seconds before the first retry; doubled for each further one
BACKOFF_MAX = 8.0
RETRY_AFTER_MAX = 60.0  # a server's own retry hint is honoured up to this; a longer one is cut to it


def retry_delay(exc: Exception, retries: int, *, retry_timeouts: bool) -> float | None:
    """Seconds to wait before re-sending after `exc` (`retries` re-sends so far), or None when re-sending
    will not help. A timed-out request is re-sent only with `retry_timeouts`."""
    if isinstance(exc, openai.APITimeoutError):  # before APIConnectionError, its base class
        return _backoff(retries) if retry_timeouts else None
    if isinstance(exc, openai.APIConnectionError):
        return _backoff(retries)
    if not isinstance(exc, openai.APIStatusError) or exc.status_code not in RETRY_STATUSES:
        return None
    headers = exc.response.headers
    # OpenAI's own hint (it says "false" for an exhausted quota, which waiting does not refill).
    if headers.get("x-should-retry") == "false" or exc.code == "insufficient_quota":
        return None
    hinted = _retry_after(headers)
    return min(hinted, RETRY_AFTER_MAX) if hinted is not None else _backoff(retries)


def _backoff(retries: int) -> float:
    """0.5 s, 1 s, 2 s … up to 8 s, less up to a fifth so clients that failed together spread out."""
    return min(BACKOFF_FIRST * 2.0 ** min(retries, 32), BACKOFF_MAX) * random.uniform(0.8, 1.0)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """The server's wait hint in seconds: `retry-after-ms`, else `retry-after` (seconds or an HTTP date)."""
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            continue
        return max(seconds, 0.0) if not math.isnan(seconds) else None
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(when.timestamp() - time.time(), 0.0)
