"""A folder's entries, for listings that must not fail on a folder that is missing or cannot be read."""

from __future__ import annotations

import os
from pathlib import Path


def folder_entries(folder: str | Path) -> list[os.DirEntry[str]]:
    """What `folder` holds; nothing when it cannot be listed (missing, not a folder, not readable). Each entry
    says whether it is a file or a folder without a stat of its own (for all but links)."""
    try:
        with os.scandir(folder) as listed:
            return list(listed)
    except OSError:
        return []
