"""docs/configuration.md is what docs/generate_configuration.py writes from the config models, and names every key of
config.example.json."""

from __future__ import annotations

import importlib.util
import json
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from picoclaw.config import Config

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "configuration.md"
SCRIPT = ROOT / "docs" / "generate_configuration.py"


def _generator() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("generate_configuration", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_is_current() -> None:
    assert DOC.read_text(encoding="utf-8") == _generator().render(), (
        "docs/configuration.md is stale: run `python docs/generate_configuration.py` and commit the result")


def test_check_says_stale_in_one_line_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    generator = _generator()
    copy = tmp_path / "configuration.md"
    copy.write_text(DOC.read_text(encoding="utf-8").replace("| `memory.retrieve_limit` |", "| `memory.limit` |"),
                    encoding="utf-8")
    assert generator.main(["--check"], output=copy) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "stale" in out and "generate_configuration.py" in out

    assert generator.main([], output=copy) == 0  # rewritten…
    assert generator.main(["--check"], output=copy) == 0  # …and then current, silently
    assert capsys.readouterr().out == ""
    assert copy.read_text(encoding="utf-8") == DOC.read_text(encoding="utf-8")


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(the model a key holds, whether as the values of a free-form map), else (None, False)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [arg for arg in typing.get_args(annotation) if isinstance(arg, type) and issubclass(arg, BaseModel)]
        return (models[0], False) if models else (None, False)
    if typing.get_origin(annotation) is dict:
        value = typing.get_args(annotation)[1]
        return (value, True) if isinstance(value, type) and issubclass(value, BaseModel) else (None, False)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def _key_patterns(value: Any, model: type[BaseModel] | None, path: str = "", pattern: str = ""
                  ) -> Iterator[tuple[str, str]]:
    """(key path, the regex it must match in the doc) for every key of `value`; a key of a free-form map (a provider's
    name, a model's in a price table) may be written as any `<placeholder>`."""
    if not isinstance(value, dict):
        return
    for key, item in value.items():
        field = model.model_fields.get(key) if model is not None else None
        inner, is_map = _model_of(field.annotation) if field is not None else (None, False)
        key_path, key_pattern = path + key, pattern + re.escape(key)
        yield key_path, key_pattern
        if is_map and isinstance(item, dict):
            for name, entry in item.items():
                entry_path, entry_pattern = f"{key_path}.{name}", key_pattern + r"\.<[a-z_]+>"
                yield entry_path, entry_pattern
                yield from _key_patterns(entry, inner, entry_path + ".", entry_pattern + r"\.")
        else:
            yield from _key_patterns(item, inner, key_path + ".", key_pattern + r"\.")


def test_every_key_of_the_example_is_documented() -> None:
    example = json.loads((ROOT / "config.example.json").read_text(encoding="utf-8"))
    doc = DOC.read_text(encoding="utf-8")
    keys = list(_key_patterns(example, Config))
    assert len(keys) > 100 and ("providers.ollama.timeout", r"providers\.<[a-z_]+>\.timeout") in keys
    missing = [key for key, pattern in keys if not re.search(f"`{pattern}`", doc)]
    assert not missing, f"keys of config.example.json not in docs/configuration.md: {missing}"


def test_a_key_missing_from_the_doc_is_found() -> None:
    # The check above can fail: a key the doc lacks, in a section and inside a map entry.
    example = {"memory": {"retrieve_limit": 3, "no_such_key": 1}, "providers": {"x": {"no_such_field": 1}}}
    doc = DOC.read_text(encoding="utf-8")
    missing = [key for key, pattern in _key_patterns(example, Config) if not re.search(f"`{pattern}`", doc)]
    assert missing == ["memory.no_such_key", "providers.x.no_such_field"]
