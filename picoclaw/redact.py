"""Keeping secrets (API keys, bot tokens) out of text that came from outside: errors, pages, logs.

Every excerpt of foreign text is made by `excerpt`, which redacts *before* it cuts: a cut secret no longer
matches, so redacting afterwards would let most of it through. What survives a cut at the end of an
excerpt is checked too: a trailing piece that is the start of a secret is removed with the rest.
"""

from __future__ import annotations

from collections.abc import Iterable

MASK = "***"
# Shorter "secrets" are placeholders ("ollama", "x", "sk-"): replacing them would garble ordinary words.
SECRET_MIN_LENGTH = 12


def _usable(secrets: Iterable[str]) -> list[str]:
    # Longest first, so a secret that contains another is replaced whole.
    return sorted({s for s in secrets if s and len(s) >= SECRET_MIN_LENGTH}, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret of at least SECRET_MIN_LENGTH characters replaced by the mask."""
    for secret in _usable(secrets):
        text = text.replace(secret, MASK)
    return text


def excerpt(text: str, limit: int, secrets: Iterable[str] = ()) -> str:
    """`text` on one line, secrets redacted, then cut to `limit` characters (an ellipsis marks a cut).

    A cut can leave the first characters of a secret that began near the limit but did not fit; any such
    tail of SECRET_MIN_LENGTH characters or more is masked too, as is any tail of 4+ characters that starts
    a secret (a short tail still narrows the search for the rest). Reading the whole secret needs no cut.
    """
    usable = _usable(secrets)
    flat = redact(" ".join(text.split()), usable)
    if len(flat) <= limit:
        return flat
    cut = flat[: max(limit - 1, 0)]
    return _mask_trailing_prefix(cut, usable) + "…"


def _mask_trailing_prefix(text: str, secrets: list[str]) -> str:
    """`text` with a tail that is the beginning of one of `secrets` replaced by the mask."""
    for secret in secrets:
        for size in range(min(len(secret) - 1, len(text)), 3, -1):
            if text.endswith(secret[:size]):
                return text[:-size] + MASK
    return text
