"""Package roots that list what a layer offers without importing the layer (PEP 562).

Importing any submodule runs its package's `__init__` first, so a root that imported every name it offers
would make `import picoclaw.memory.store` load the index, pydantic and numpy. A root instead maps each name
to its home module and imports it on first use; its `if TYPE_CHECKING:` block repeats the imports for mypy
(tests/test_layers.py checks that both agree with the root's `__all__`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, homes: Mapping[str, tuple[str, ...]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for the root `package`, whose lazy names live in `homes` (module → names)."""
    home_of = {name: module for module, names in homes.items() for name in names}
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        module = home_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # the next look-up finds it without this function
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *home_of})

    return __getattr__, __dir__
