"""A test home's config.json changed in place: read, edited by the test, written back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.json"


@contextmanager
def edit_config(home: Path) -> Iterator[dict[str, Any]]:
    """`<home>/config.json` as a dict: what the `with` block changes in it is written back when the block ends
    (nothing is written when it raises)."""
    path = home / CONFIG_FILE
    config = json.loads(path.read_text(encoding="utf-8"))
    yield config
    path.write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
