"""The text of a workspace file as the model sees it: the notes left for the person editing it removed."""

from __future__ import annotations

import re

_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)


def strip_comments(text: str) -> str:
    """`text` without HTML comments: notes to the person editing a workspace file, not to the model."""
    return _COMMENT.sub("", text)


def bootstrap_text(text: str) -> str:
    """What of a bootstrap file goes into the prompt: no comments, and nothing if only headings are left
    (the template's USER.md before the user writes in it)."""
    text = strip_comments(text).strip()
    has_content = any(line.strip() and not line.lstrip().startswith("#") for line in text.splitlines())
    return re.sub(r"\n{3,}", "\n\n", text) if has_content else ""
