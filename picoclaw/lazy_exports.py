"""Package roots that say once what a layer offers, and import none of it until asked (PEP 562).

Importing any submodule runs its package's `__init__` first, so a root that imported every name it offers
would make `import picoclaw.memory.store` load the index, pydantic and numpy. A root instead declares its names
as the imports of its `if TYPE_CHECKING:` block, which mypy reads as they are; at run time that block does not
run, and `lazy_exports` reads it from the root's source on the first name asked for, then imports each name's
home module when that name is first used. `__all__` is the list of those names (tests/test_layers.py checks
that each one is its home module's object).
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any


def offered(source: str) -> dict[str, str]:
    """The names a root's source offers, each with its home module: the picoclaw imports of its `if
    TYPE_CHECKING:` block, and any it makes at once (the providers root imports the provider interface so)."""
    homes: dict[str, str] = {}
    for node in ast.parse(source).body:
        lazy = isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for statement in node.body if isinstance(node, ast.If) and lazy else [node]:
            if (isinstance(statement, ast.ImportFrom) and (statement.module or "").startswith("picoclaw.")
                    and statement.module != __name__ and not statement.level):
                for alias in statement.names:
                    homes[alias.asname or alias.name] = statement.module or ""
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
