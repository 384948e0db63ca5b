"""Architecture test: picoclaw's own imports follow the layers, and no import cycle hides anywhere.

The layers, outermost first:

    face (cli, web, app, onboard, __main__) -> channels -> agent -> curation -> tools -> memory / providers / jobs
    -> transcripts -> storage -> base

(jobs is beside memory and providers: channels, agent and tools may import it, memory and providers not.)

- base (the `picoclaw` package itself and every top-level module that is not a face: config, disk, clock,
  tokens, errors, jsonio, layout, ...) imports only base. A new top-level module is base until said otherwise,
  so it starts in the strictest layer.
- storage (`picoclaw.storage`: the storage contract, the files backend, the PostgreSQL backend) imports base
  and storage. memory and jobs keep their bytes through it; nothing above it knows which backend runs.
- transcripts (`picoclaw.transcripts`: each chat's session and its messages) imports base, storage, transcripts and
  `picoclaw.providers.base` (a message is the provider interface's `Message`).
- jobs (`picoclaw.jobs`: the job model, schedules, the jobs file and the runner) imports base, storage and jobs. The
  runner needs an agent only as "handle this text in this session", a Protocol of its own, so it does not
  import the agent layer.
- providers import base and providers.
- memory (the store, the policy, retrieval, the eval) imports base, storage, transcripts, memory, and
  `picoclaw.providers.base`, the provider interface (the eval and the embedders are handed a client).
- tools import base, storage, transcripts, tools, memory, jobs, and `picoclaw.providers.base`.
- curation (everything that calls a model to keep memory: summaries, flush, compression, turn review, lessons,
  skill drafts, reflection, policy suggestions) imports base, storage, transcripts, memory, tools, jobs, curation
  and `picoclaw.providers.base`: it is handed a provider, it never builds one.
- agent imports base, storage, transcripts, agent, curation, memory, tools, jobs, and `picoclaw.providers.base`.
- channels import base, storage, transcripts, channels, agent, memory, and jobs; nothing from providers or tools
  (the face wires those in).
- face imports anything: it is where the pieces are put together.

Every layer's package (ROOT_ONLY) is imported from outside it through its root only (`from picoclaw.memory
import MemoryStore`, never `picoclaw.memory.store`): its `__init__` declares what it offers once, as the imports
of its `if TYPE_CHECKING:` block (picoclaw/lazy_exports.py serves them, and `__all__`, from that block), and the
rest may move freely. The deliberate exceptions are listed, each with its reason, in PAST_THE_ROOT, and
nowhere else. Each root offers exactly what it imports, and each name it offers is its home module's object.

Every import counts, wherever it sits: module level, inside a function, or under `if TYPE_CHECKING:`. A
function-level import only postpones the dependency, it does not remove it. Only picoclaw's own modules are
checked; the standard library and third-party packages are not.

The checker is plain functions over a folder, so the self-tests at the bottom run it on small fake packages.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "picoclaw"
PACKAGE_ROOT = Path(__file__).resolve().parents[1] / PACKAGE

FACE_MODULES = frozenset({"picoclaw.app", "picoclaw.onboard", "picoclaw.__main__"})
PROVIDER_INTERFACE = "picoclaw.providers.base"
ANY = frozenset({"base", "storage", "transcripts", "jobs", "providers", "memory", "tools", "curation", "agent",
                 "channels", "face"})
# Packages whose modules the rest of picoclaw imports through the package root only: every layer's package.
ROOT_ONLY = frozenset({f"{PACKAGE}.{layer}" for layer in ("storage", "transcripts", "jobs", "providers", "memory",
                                                                  "tools", "curation", "agent", "channels")})
# The deliberate exceptions to ROOT_ONLY, the only ones: (importing layer, module imported past its root) → why.
PAST_THE_ROOT: dict[tuple[str, str], str] = {
    (layer, PROVIDER_INTERFACE): "the provider interface, by name: the providers root also offers the OpenAI "
                                 "provider, which memory, tools and agent are handed and never build"
    for layer in ("transcripts", "memory", "tools", "curation", "agent")
}

# The layers each layer may import, plus single modules allowed across a layer line.
ALLOWED_LAYERS: dict[str, frozenset[str]] = {
    "base": frozenset({"base"}),
    "storage": frozenset({"base", "storage"}),
    "transcripts": frozenset({"base", "storage", "transcripts"}),
    "jobs": frozenset({"base", "storage", "jobs"}),
    "providers": frozenset({"base", "providers"}),
    "memory": frozenset({"base", "storage", "transcripts", "memory"}),
    "tools": frozenset({"base", "storage", "transcripts", "tools", "memory", "jobs"}),
    "curation": frozenset({"base", "storage", "transcripts", "curation", "memory", "tools", "jobs"}),
    "agent": frozenset({"base", "storage", "transcripts", "agent", "curation", "memory", "tools", "jobs"}),
    "channels": frozenset({"base", "storage", "transcripts", "channels", "agent", "memory", "jobs"}),
    "face": ANY,
}
ALLOWED_MODULES: dict[str, frozenset[str]] = {
    "transcripts": frozenset({PROVIDER_INTERFACE}),
    "memory": frozenset({PROVIDER_INTERFACE}),
    "tools": frozenset({PROVIDER_INTERFACE}),
    "curation": frozenset({PROVIDER_INTERFACE}),
    "agent": frozenset({PROVIDER_INTERFACE}),
}


@dataclass(frozen=True)
class Import:
    """One import statement's dependency of one picoclaw module on another."""

    path: str  # the importing file, relative to the folder holding the package, e.g. picoclaw/memory/store.py
    line: int
    source_module: str
    target_module: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def module_name(file: Path, root: Path) -> str:
    """The dotted module name of `file` inside the package folder `root` (`__init__.py` names the package)."""
    parts = list(file.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_files(root: Path) -> dict[str, Path]:
    """Every module of the package folder `root`, by dotted name."""
    return {module_name(file, root): file for file in sorted(root.rglob("*.py"))}


def layer_of(module: str) -> str:
    """The layer of a picoclaw module, from its dotted name."""
    parts = module.split(".")
    sub = parts[1] if len(parts) > 1 else ""
    if sub in ("cli", "app", "web") or module in FACE_MODULES:
        return "face"
    if sub in ("storage", "transcripts", "jobs", "providers", "memory", "tools", "curation", "agent", "channels"):
        return sub
    return "base"


def _resolve(name: str, modules: set[str]) -> str | None:
    """The module that importing `name` depends on: the longest prefix of it that is a module of the tree."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _targets(node: ast.Import | ast.ImportFrom, source: str, is_package: bool, modules: set[str]) -> list[str]:
    """The picoclaw modules one import statement in module `source` depends on."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            # A relative import counts from the importing module's package (a package's __init__ is its own).
            package = source.split(".") if is_package else source.split(".")[:-1]
            if node.level - 1 >= len(package):
                return []  # climbs above the top package; Python itself would refuse it
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        # `from a import b` depends on a.b when b is a submodule, else on a (b is a name defined in a).
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    targets: list[str] = []
    for name in names:
        target = _resolve(name, modules)
        if target is not None and target not in targets:
            targets.append(target)
    return targets


def collect_imports(root: Path) -> list[Import]:
    """Every dependency on a picoclaw module in the package folder `root`, from anywhere in each file."""
    files = package_files(root)
    modules = set(files)
    imports: list[Import] = []
    for source, file in files.items():
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
        path = file.relative_to(root.parent).as_posix()
        is_package = file.name == "__init__.py"
        # ast.walk reaches function bodies and `if TYPE_CHECKING:` blocks alike, which is the point.
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _targets(node, source, is_package, modules):
                    imports.append(Import(path, node.lineno, source, target))
    return sorted(imports, key=lambda i: (i.path, i.line, i.target_module))


def layer_violations(imports: list[Import]) -> list[str]:
    """One line per import that crosses a layer line the wrong way."""
    violations = []
    for imp in imports:
        layer, target_layer = layer_of(imp.source_module), layer_of(imp.target_module)
        if target_layer in ALLOWED_LAYERS[layer] or imp.target_module in ALLOWED_MODULES.get(layer, ()):
            continue
        violations.append(f"{imp.where}: {layer} may not import {imp.target_module} ({target_layer})")
    return violations


def root_violations(imports: list[Import], packages: frozenset[str] = ROOT_ONLY,
                    allowed: dict[tuple[str, str], str] = PAST_THE_ROOT) -> list[str]:
    """One line per import, from outside a package of `packages`, of a module inside it other than its root
    (unless `allowed` lists that module for the importing layer)."""
    violations = []
    for imp in imports:
        if (layer_of(imp.source_module), imp.target_module) in allowed:
            continue
        for package in packages:
            inside = imp.target_module.startswith(f"{package}.")
            if inside and not (imp.source_module == package or imp.source_module.startswith(f"{package}.")):
                violations.append(f"{imp.where}: {imp.target_module} is inside {package}: import from {package}")
    return violations


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of `graph`."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def import_cycles(imports: list[Import]) -> list[str]:
    """One line per import cycle, naming every import statement inside it as file:line."""
    # Edges go to the imported module only: importing a.b also runs a/__init__.py, but counting that would
    # make every package __init__ that imports one of its submodules look like a cycle.
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in imports:
        graph[imp.source_module].add(imp.target_module)
    cycles = []
    for component in _strongly_connected(graph):
        members = set(component)
        if len(component) == 1 and component[0] not in graph[component[0]]:
            continue
        edges = [i for i in imports if i.source_module in members and i.target_module in members]
        listed = ", ".join(f"{i.where} imports {i.target_module}" for i in edges)
        cycles.append(f"import cycle among {', '.join(component)}: {listed}")
    return cycles


# -- the real tree -------------------------------------------------------------------------------------------


def test_imports_follow_the_layers() -> None:
    imports = collect_imports(PACKAGE_ROOT)
    # Guard against passing vacuously (a wrong root, or a collector that stopped seeing imports).
    assert len(package_files(PACKAGE_ROOT)) > 30
    assert len(imports) > 80
    violations = layer_violations(imports)
    assert not violations, "imports across layers:\n" + "\n".join(violations)


def test_packages_are_imported_through_their_roots() -> None:
    imports = collect_imports(PACKAGE_ROOT)
    # Not vacuous: the package exists and is imported from outside it.
    assert any(imp.target_module == "picoclaw.jobs" and layer_of(imp.source_module) != "jobs" for imp in imports)
    violations = root_violations(imports)
    assert not violations, "imports past a package root:\n" + "\n".join(violations)


def _root_names(root_file: Path) -> dict[str, str]:
    """The names a package root imports (at once or under `if TYPE_CHECKING:`), each with its home module."""
    names: dict[str, str] = {}
    for node in ast.parse(root_file.read_text(encoding="utf-8")).body:
        statements = node.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING" else [node]
        for statement in statements:
            if isinstance(statement, ast.ImportFrom) and (statement.module or "").startswith(f"{PACKAGE}."):
                names.update({alias.asname or alias.name: statement.module or "" for alias in statement.names})
    names.pop("lazy_exports", None)  # the helper that makes a root lazy, not a name it offers
    return names


def test_each_root_offers_exactly_its_imports_and_each_name_is_its_home_modules_object() -> None:
    import importlib

    for package in sorted(ROOT_ONLY):
        root = importlib.import_module(package)
        names = _root_names(Path(root.__file__ or ""))
        assert names, package
        assert sorted(root.__all__) == sorted(names), package
        # A submodule of the same name would replace the offered name on the package once it is imported.
        submodules = {file.stem for file in Path(root.__file__ or "").parent.iterdir() if file.suffix == ".py"}
        assert not submodules & set(names), package
        for name, home in names.items():
            assert getattr(root, name) is getattr(importlib.import_module(home), name), f"{package}.{name}"


def test_no_import_cycles() -> None:
    imports = collect_imports(PACKAGE_ROOT)
    assert len(imports) > 80
    cycles = import_cycles(imports)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


# -- the checker itself, on fake packages --------------------------------------------------------------------


def make_package(tmp_path: Path, files: dict[str, str]) -> Path:
    """A fake picoclaw package under tmp_path from {relative path: source}; returns its folder."""
    root = tmp_path / PACKAGE
    root.mkdir()
    for rel, source in files.items():
        file = root / rel
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(source, encoding="utf-8")
    for folder in [root, *(path for path in root.rglob("*") if path.is_dir())]:
        (folder / "__init__.py").touch()
    return root


def test_layer_of() -> None:
    assert layer_of("picoclaw") == "base"
    assert layer_of("picoclaw.config") == "base"
    assert layer_of("picoclaw.something_new") == "base"
    assert layer_of("picoclaw.memory") == "memory"
    assert layer_of("picoclaw.memory.index.embedders") == "memory"
    assert layer_of("picoclaw.cli") == "face"
    assert layer_of("picoclaw.cli.main") == "face"
    assert layer_of("picoclaw.app") == "face"
    assert layer_of("picoclaw.onboard") == "face"
    assert layer_of("picoclaw.__main__") == "face"
    assert layer_of("picoclaw.channels.telegram") == "channels"
    assert layer_of("picoclaw.jobs") == "jobs"
    assert layer_of("picoclaw.jobs.runner") == "jobs"


def test_a_forbidden_import_is_reported_with_file_and_line(tmp_path: Path) -> None:
    root = make_package(
        tmp_path,
        {
            "agent/loop.py": "class AgentLoop: ...\n",
            "memory/x.py": "import json\n\nfrom picoclaw.agent.loop import AgentLoop\n",
        },
    )
    assert layer_violations(collect_imports(root)) == [
        "picoclaw/memory/x.py:3: memory may not import picoclaw.agent.loop (agent)"
    ]


def test_function_level_and_type_checking_imports_are_caught(tmp_path: Path) -> None:
    root = make_package(
        tmp_path,
        {
            "agent/loop.py": "class AgentLoop: ...\n",
            "agent/session.py": "class Session: ...\n",
            "memory/x.py": (
                "from typing import TYPE_CHECKING\n"
                "\n"
                "if TYPE_CHECKING:\n"
                "    from picoclaw.agent.session import Session\n"
                "\n"
                "\n"
                "def run() -> None:\n"
                "    from picoclaw.agent.loop import AgentLoop\n"
                "\n"
                "\n"
                "class Job:\n"
                "    def go(self) -> None:\n"
                "        import picoclaw.agent.session\n"
            ),
        },
    )
    assert layer_violations(collect_imports(root)) == [
        "picoclaw/memory/x.py:4: memory may not import picoclaw.agent.session (agent)",
        "picoclaw/memory/x.py:8: memory may not import picoclaw.agent.loop (agent)",
        "picoclaw/memory/x.py:13: memory may not import picoclaw.agent.session (agent)",
    ]


def test_channels_may_not_import_providers_or_tools(tmp_path: Path) -> None:
    root = make_package(
        tmp_path,
        {
            "providers/base.py": "class Provider: ...\n",
            "providers/openai_compat.py": "class OpenAICompat: ...\n",
            "tools/registry.py": "class ToolRegistry: ...\n",
            "agent/loop.py": "class AgentLoop: ...\n",
            "memory/store.py": "class Store: ...\n",
            "channels/repl.py": (
                "from picoclaw.agent.loop import AgentLoop\n"
                "from picoclaw.memory.store import Store\n"
                "from picoclaw.providers.openai_compat import OpenAICompat\n"
                "from picoclaw.tools.registry import ToolRegistry\n"
                "from picoclaw.providers.base import Provider\n"
            ),
        },
    )
    assert layer_violations(collect_imports(root)) == [
        "picoclaw/channels/repl.py:3: channels may not import picoclaw.providers.openai_compat (providers)",
        "picoclaw/channels/repl.py:4: channels may not import picoclaw.tools.registry (tools)",
        "picoclaw/channels/repl.py:5: channels may not import picoclaw.providers.base (providers)",
    ]


def test_memory_may_import_the_provider_interface_only(tmp_path: Path) -> None:
    root = make_package(
        tmp_path,
        {
            "providers/base.py": "class Provider: ...\n",
            "providers/openai_compat.py": "class OpenAICompat: ...\n",
            "memory/index/embedders.py": (
                "from picoclaw.providers.base import Provider\n"
                "from picoclaw.providers import base\n"
                "from picoclaw.providers.openai_compat import OpenAICompat\n"
                "from picoclaw.providers import openai_compat\n"
            ),
        },
    )
    assert layer_violations(collect_imports(root)) == [
        "picoclaw/memory/index/embedders.py:3: memory may not import picoclaw.providers.openai_compat (providers)",
        "picoclaw/memory/index/embedders.py:4: memory may not import picoclaw.providers.openai_compat (providers)",
    ]


def test_base_may_not_import_memory(tmp_path: Path) -> None:
    root = make_package(
        tmp_path,
        {
            "memory/policy.py": "class MemoryPolicy: ...\n",
            "clock.py": "",
            "config.py": "from picoclaw import clock\nfrom picoclaw.memory.policy import MemoryPolicy\n",
        },
    )
    imports = collect_imports(root)
    assert [(i.source_module, i.target_module) for i in imports] == [
        ("picoclaw.config", "picoclaw.clock"),
        ("picoclaw.config", "picoclaw.memory.policy"),
    ]
    assert layer_violations(imports) == ["picoclaw/config.py:2: base may not import picoclaw.memory.policy (memory)"]


def test_jobs_may_not_import_the_agent_and_only_the_outer_layers_import_jobs(tmp_path: Path) -> None:
    root = make_package(
        tmp_path,
        {
            "agent/loop.py": "class AgentLoop: ...\n",
            "memory/store.py": "class MemoryStore: ...\n",
            "clock.py": "",
            "jobs/__init__.py": "from picoclaw.jobs.runner import Scheduler\n",
            "jobs/runner.py": (
                "from picoclaw import clock\n"
                "from picoclaw.agent.loop import AgentLoop\n"
                "from picoclaw.memory.store import MemoryStore\n"
            ),
            "tools/cron.py": "from picoclaw.jobs import Scheduler\n",
            "channels/repl.py": "from picoclaw.jobs import Scheduler\n",
            "memory/x.py": "from picoclaw.jobs import Scheduler\n",
            "config.py": "from picoclaw.jobs import Scheduler\n",
        },
    )
    assert layer_violations(collect_imports(root)) == [
        "picoclaw/config.py:1: base may not import picoclaw.jobs (jobs)",
        "picoclaw/jobs/runner.py:2: jobs may not import picoclaw.agent.loop (agent)",
        "picoclaw/jobs/runner.py:3: jobs may not import picoclaw.memory.store (memory)",
        "picoclaw/memory/x.py:1: memory may not import picoclaw.jobs (jobs)",
    ]


def test_a_module_inside_a_root_only_package_is_reported(tmp_path: Path) -> None:
    root = make_package(
        tmp_path,
        {
            "jobs/__init__.py": "from picoclaw.jobs.store import JobStore\n",
            "jobs/store.py": "from picoclaw.jobs.model import Job\n",
            "jobs/model.py": "",
            "tools/cron.py": "from picoclaw.jobs import JobStore\nfrom picoclaw.jobs.store import JobStore\n",
            "cli/cron.py": "import picoclaw.jobs.model\n",
        },
    )
    assert root_violations(collect_imports(root)) == [
        "picoclaw/cli/cron.py:1: picoclaw.jobs.model is inside picoclaw.jobs: import from picoclaw.jobs",
        "picoclaw/tools/cron.py:2: picoclaw.jobs.store is inside picoclaw.jobs: import from picoclaw.jobs",
    ]


def test_every_layer_is_imported_through_its_root_but_for_the_listed_exceptions(tmp_path: Path) -> None:
    root = make_package(
        tmp_path,
        {
            "memory/__init__.py": "",
            "memory/store.py": "from picoclaw.providers.base import ChatProvider\n",
            "providers/__init__.py": "",
            "providers/base.py": "",
            "agent/loop.py": "from picoclaw.memory import MemoryStore\nfrom picoclaw.memory.store import MemoryStore\n"
                             "from picoclaw.providers.base import ChatProvider\n",
            "channels/repl.py": "from picoclaw.agent.loop import AgentLoop\n",
        },
    )
    assert root_violations(collect_imports(root)) == [
        "picoclaw/agent/loop.py:2: picoclaw.memory.store is inside picoclaw.memory: import from picoclaw.memory",
        "picoclaw/channels/repl.py:1: picoclaw.agent.loop is inside picoclaw.agent: import from picoclaw.agent",
    ]


def test_a_new_top_level_module_is_base(tmp_path: Path) -> None:
    root = make_package(tmp_path, {"tools/registry.py": "", "layout.py": "import picoclaw.tools.registry\n"})
    assert layer_violations(collect_imports(root)) == [
        "picoclaw/layout.py:1: base may not import picoclaw.tools.registry (tools)"
    ]


def test_the_face_may_import_anything(tmp_path: Path) -> None:
    root = make_package(
        tmp_path,
        {
            "providers/openai_compat.py": "",
            "tools/registry.py": "",
            "channels/repl.py": "",
            "cli.py": (
                "from picoclaw.providers.openai_compat import x\n"
                "from picoclaw.tools import registry\n"
                "from picoclaw.channels.repl import run\n"
            ),
            "onboard.py": "from picoclaw.tools.registry import x\n",
        },
    )
    imports = collect_imports(root)
    assert len(imports) == 4
    assert layer_violations(imports) == []


def test_relative_imports_are_resolved(tmp_path: Path) -> None:
    root = make_package(
        tmp_path,
        {
            "agent/loop.py": "",
            "memory/store.py": "",
            "memory/index/__init__.py": "from . import chunks\nfrom .. import store\n",
            "memory/index/chunks.py": "from .schema import Row\nfrom ...agent import loop\nfrom ... import clock\n",
            "memory/index/schema.py": "",
            "clock.py": "",
        },
    )
    imports = collect_imports(root)
    assert [(i.path, i.line, i.target_module) for i in imports] == [
        ("picoclaw/memory/index/__init__.py", 1, "picoclaw.memory.index.chunks"),
        ("picoclaw/memory/index/__init__.py", 2, "picoclaw.memory.store"),
        ("picoclaw/memory/index/chunks.py", 1, "picoclaw.memory.index.schema"),
        ("picoclaw/memory/index/chunks.py", 2, "picoclaw.agent.loop"),
        ("picoclaw/memory/index/chunks.py", 3, "picoclaw.clock"),
    ]
    assert layer_violations(imports) == [
        "picoclaw/memory/index/chunks.py:2: memory may not import picoclaw.agent.loop (agent)"
    ]


def test_a_two_module_cycle_is_reported(tmp_path: Path) -> None:
    root = make_package(
        tmp_path,
        {
            "agent/commands.py": "def run() -> None:\n    from picoclaw.agent.loop import AgentLoop\n",
            "agent/loop.py": "from picoclaw.agent.commands import run\n",
            "agent/session.py": "from picoclaw.agent.loop import AgentLoop\n",
        },
    )
    imports = collect_imports(root)
    assert layer_violations(imports) == []
    assert import_cycles(imports) == [
        (
            "import cycle among picoclaw.agent.commands, picoclaw.agent.loop: "
            "picoclaw/agent/commands.py:2 imports picoclaw.agent.loop, "
            "picoclaw/agent/loop.py:1 imports picoclaw.agent.commands"
        )
    ]


def test_a_longer_cycle_and_a_self_import_are_reported(tmp_path: Path) -> None:
    root = make_package(
        tmp_path,
        {
            "a.py": "import picoclaw.b\n",
            "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from picoclaw.c import x\n",
            "c.py": "from picoclaw import a\n",
            "d.py": "def f() -> None:\n    import picoclaw.d\n",
            "e.py": "import picoclaw.a\n",
        },
    )
    assert import_cycles(collect_imports(root)) == [
        (
            "import cycle among picoclaw.a, picoclaw.b, picoclaw.c: picoclaw/a.py:1 imports picoclaw.b, "
            "picoclaw/b.py:3 imports picoclaw.c, picoclaw/c.py:1 imports picoclaw.a"
        ),
        "import cycle among picoclaw.d: picoclaw/d.py:2 imports picoclaw.d",
    ]


def test_a_package_importing_its_submodule_is_no_cycle(tmp_path: Path) -> None:
    root = make_package(
        tmp_path,
        {"memory/__init__.py": "from picoclaw.memory.store import Store\n", "memory/store.py": "import picoclaw\n"},
    )
    imports = collect_imports(root)
    assert len(imports) == 2
    assert import_cycles(imports) == []
