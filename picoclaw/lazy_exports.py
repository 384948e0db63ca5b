"""Package roots that say once what a layer offers, and import none of it until asked (PEP 562).

Importing any submodule runs its package's `__init__` first, so a root that imported every name it offers
would make `import picoclaw.memory.store` load the index, pydantic and numpy. A root instead declares its names
as the imports of its `if TYPE_CHECKING:` block, which mypy reads as they are; at run time that block does not
run, and `lazy_exports` reads it from the root's source on the first name asked for, then imports each name's
home module when that name is first used. `__all__` is the list of those names (tests/test_layers.py checks
that each one is its home module's object).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

# `from picoclaw.x import a, b` or `from picoclaw.x import (\n a,\n b,\n)`, at the start of a line (indented
# inside the TYPE_CHECKING block). Read with a pattern rather than the `ast` module, whose import alone costs a
# short command more than this; tests/test_layers.py checks every root against an `ast` reading.
_IMPORT = re.compile(r"^[ ]*from (picoclaw\.[\w.]+) import (\([^)]*\)|[^\n]*)", re.MULTILINE)
_ALIAS = re.compile(r"(\w+)(?:\s+as\s+(\w+))?")
_COMMENT = re.compile(r"#[^\n]*")


def offered(source: str) -> dict[str, str]:
    """The names a root's source offers, each with its home module: the picoclaw imports of its `if
    TYPE_CHECKING:` block, and any it makes at once (the providers root imports the provider interface so)."""
    homes: dict[str, str] = {}
    for module, names in _IMPORT.findall(source):
        if module == __name__:
            continue
        for name, alias in _ALIAS.findall(_COMMENT.sub("", names)):
            homes[alias or name] = module
    return homes


def lazy_exports(package: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for the root `package` (call it from the root, after its TYPE_CHECKING block)."""
    namespace = importlib.import_module(package).__dict__
    found: dict[str, str] = {}

    def homes() -> dict[str, str]:
        if not found:
            found.update(offered(Path(namespace["__file__"]).read_text(encoding="utf-8")))
        return found

    def __getattr__(name: str) -> Any:
        if name == "__all__":
            value: Any = sorted(homes())
        elif name.startswith("__") or name not in homes():
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        else:
            value = getattr(importlib.import_module(homes()[name]), name)
        namespace[name] = value  # the next look-up finds it without this function
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes()})

    return __getattr__, __dir__
