"""The memory layer's root (`picoclaw.memory`) and its search package: what they offer, and that importing
them stays cheap (the index and numpy load only when the index is enabled)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import picoclaw.memory as memory

ROOT_FILE = Path(memory.__file__)


def _loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code` (a fresh one: this process has them all)."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'MemoryRetriever'"):
        memory.MemoryRetriever  # the old name of the keyword search is gone


@pytest.mark.slow
def test_importing_a_memory_module_does_not_bring_the_layer_or_the_index() -> None:
    loaded = _loaded_after("import picoclaw.memory.store")
    assert "picoclaw.memory.store" in loaded
    assert not {"numpy", "picoclaw.memory.index", "picoclaw.memory.workspace", "picoclaw.config"} & loaded


@pytest.mark.slow
def test_the_search_package_does_not_import_the_index() -> None:
    loaded = _loaded_after("from picoclaw.memory.search import IndexedSearch, KeywordSearch, open_search, index_of")
    assert "picoclaw.memory.search.keyword" in loaded
    assert not {"numpy", "picoclaw.memory.index", "picoclaw.memory.index.memory_index"} & loaded


@pytest.mark.slow
def test_a_search_without_the_index_loads_no_numpy(home: Path) -> None:
    # `picoclaw memory search` with the default config (no index): English and Chinese alike.
    code = f"""
from pathlib import Path
from picoclaw.app import App
ws = App.open(Path({str(home)!r})).workspace
ws.store.append_long_term("My dog is called Bob. 我的狗叫 Bob。")
for query in ("dog", "狗"):
    assert "我的狗叫 Bob" in ws.searcher.search(query, 3)[0].block.text, query
"""
    loaded = _loaded_after(code)
    assert "picoclaw.memory.search.keyword" in loaded and "numpy" not in loaded
