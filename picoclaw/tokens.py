"""The one token counter.

Uses tiktoken's `o200k_base` encoding when it can be loaded (it is downloaded once and cached by
tiktoken; set TIKTOKEN_CACHE_DIR to a folder holding it for offline machines). When it cannot be
loaded, falls back to an estimate and logs that once, at INFO (`-v` shows it; /status says it every
time): a machine without the encoding is without it for every command, and a warning each time is
noise. The failure is remembered for a day by a marker file beside tiktoken's cache, so the processes
after it (every `chat -m`, every bot restart) neither try the network again nor log it; the encoding
put into the cache by hand is used at once, marker or not. The estimate counts each CJK character as
one token (that is what BPE tokenizers roughly do for Chinese) and every other run of text as one token
per four characters, so Chinese prompts are not under-counted fourfold.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from picoclaw.cjk import count_cjk

log = logging.getLogger(__name__)

ENCODING_NAME = "o200k_base"
# Where tiktoken downloads the encoding from; its cache file is named by this URL's SHA-1 (tiktoken/load.py).
ENCODING_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
UNAVAILABLE_MARKER = f"picoclaw-{ENCODING_NAME}.unavailable"
RETRY_AFTER = 24 * 3600.0  # seconds a remembered failure holds before a process tries the download again

_lock = threading.Lock()
_encoder: Callable[[str], int] | None = None

# Every turn counts some texts again byte for byte (the system message, the skills list, the standing lessons): their
# counts are kept, by the exact text and the counter that made them. Bounded in entries, and a text longer than
# CACHED_CHARS (a memory file, a long tool result) is counted afresh rather than held.
CACHED_COUNTS = 1_024  # a long session's history (a tool step counts each message again) and the prompt's parts
CACHED_CHARS = 8_000


def estimate_tokens(text: str) -> int:
    """Offline estimate: one token per CJK character plus one per four other characters."""
    if not text:
        return 0
    cjk = count_cjk(text)  # CJK punctuation and full-width forms count as one token each too
    other = len(text) - cjk
    return cjk + math.ceil(other / 4)


def tiktoken_cache_dir() -> Path | None:
    """The folder tiktoken caches encodings in (its own rule); None when caching is switched off ("")."""
    for name in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if name in os.environ:
            return Path(os.environ[name]) if os.environ[name] else None
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def _remembered_failure(cache: Path | None) -> bool:
    """Whether a process failed to load the encoding less than RETRY_AFTER ago, and it is still not cached."""
    if cache is None or (cache / hashlib.sha1(ENCODING_URL.encode()).hexdigest()).exists():
        return False
    try:
        marker = (cache / UNAVAILABLE_MARKER).lstat()  # a link is not our marker: the next failure replaces it
    except OSError:
        return False
    # A marker dated ahead of the clock (the clock went back) holds no longer than a day's marker would.
    return stat.S_ISREG(marker.st_mode) and 0 <= time.time() - marker.st_mtime < RETRY_AFTER


def _remember(cache: Path | None, failed: bool) -> None:
    """Leave (or clear) the marker; a folder that cannot be written only means the next process tries again."""
    if cache is None:
        return
    marker = cache / UNAVAILABLE_MARKER
    try:
        if failed:
            cache.mkdir(parents=True, exist_ok=True)
            # Made anew, never through a link: the default cache (/tmp/data-gym-cache) may belong to another
            # user, whose link there would otherwise have us overwrite whatever it points at.
            marker.unlink(missing_ok=True)
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")
        else:
            marker.unlink(missing_ok=True)
    except OSError as exc:
        log.debug("cannot remember the tiktoken encoding's state in %s: %s", cache, exc)


def _load_encoder() -> Callable[[str], int]:
    cache = tiktoken_cache_dir()
    if _remembered_failure(cache):
        # Already said by the process that tried (and /status says it): trying again would reach for the network.
        log.debug("tiktoken encoding %s was not available at the last try (%s); estimating", ENCODING_NAME,
                  cache / UNAVAILABLE_MARKER if cache else "")
        return estimate_tokens
    try:
        import tiktoken

        encoding = tiktoken.get_encoding(ENCODING_NAME)
    except Exception as exc:  # offline, blocked, or a broken cache: any of them means "estimate"
        log.info(
            "tiktoken encoding %s is not available (%s); token counts are estimated "
            "(1 per CJK character, 1 per 4 other characters); not tried again for a day",
            ENCODING_NAME,
            type(exc).__name__,
        )
        _remember(cache, failed=True)
        return estimate_tokens
    _remember(cache, failed=False)
    return lambda text: len(encoding.encode(text, disallowed_special=()))


def count_tokens(text: str) -> int:
    """Number of tokens in `text` (exact with tiktoken, estimated without it)."""
    global _encoder
    if _encoder is None:
        with _lock:
            if _encoder is None:
                _encoder = _load_encoder()
    return _encoder(text) if len(text) > CACHED_CHARS else _cached_count(_encoder, text)


@functools.lru_cache(maxsize=CACHED_COUNTS)
def _cached_count(encoder: Callable[[str], int], text: str) -> int:
    """`encoder(text)`, kept; keyed by the encoder too, so counts of an estimate never stand for tiktoken's."""
    return encoder(text)


def is_exact() -> bool:
    """True when counts come from tiktoken rather than the estimate."""
    count_tokens("")
    return _encoder is not estimate_tokens
