"""The one token counter.

Uses tiktoken's `o200k_base` encoding when it can be loaded (it is downloaded once and cached by
tiktoken; set TIKTOKEN_CACHE_DIR to a folder holding it for offline machines). When it cannot be
loaded, falls back to an estimate and logs that once, at INFO (`-v` shows it; /status says it every
time): a machine without the encoding is without it for every command, and a warning each time is
noise. The estimate counts each CJK character as one token (that is what BPE tokenizers roughly do
for Chinese) and every other run of text as one token per four characters, so Chinese prompts are
not under-counted fourfold.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable

from picoclaw.cjk import count_cjk

log = logging.getLogger(__name__)

ENCODING_NAME = "o200k_base"

_lock = threading.Lock()
_encoder: Callable[[str], int] | None = None


def estimate_tokens(text: str) -> int:
    """Offline estimate: one token per CJK character plus one per four other characters."""
    if not text:
        return 0
    cjk = count_cjk(text)  # CJK punctuation and full-width forms count as one token each too
    other = len(text) - cjk
    return cjk + math.ceil(other / 4)


def _load_encoder() -> Callable[[str], int]:
    try:
        import tiktoken

        encoding = tiktoken.get_encoding(ENCODING_NAME)
    except Exception as exc:  # offline, blocked, or a broken cache: any of them means "estimate"
        log.info(
            "tiktoken encoding %s is not available (%s); token counts are estimated "
            "(1 per CJK character, 1 per 4 other characters)",
            ENCODING_NAME,
            type(exc).__name__,
        )
        return estimate_tokens
    return lambda text: len(encoding.encode(text, disallowed_special=()))


def count_tokens(text: str) -> int:
    """Number of tokens in `text` (exact with tiktoken, estimated without it)."""
    global _encoder
    if _encoder is None:
        with _lock:
            if _encoder is None:
                _encoder = _load_encoder()
    return _encoder(text)


def is_exact() -> bool:
    """True when counts come from tiktoken rather than the estimate."""
    count_tokens("")
    return _encoder is not estimate_tokens
