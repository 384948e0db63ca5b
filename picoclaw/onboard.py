"""`picoclaw onboard`: create the home folder, config.json and the workspace from the templates."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import picoclaw
from picoclaw.clock import resolve_timezone
from picoclaw.config import CONFIG_FILE, parse_config
from picoclaw.disk.atomic import atomic_write
from picoclaw.jsonio import dumps_pretty, read_json_object
from picoclaw.layout import WorkspaceLayout
from picoclaw.memory import MemoryStore
from picoclaw.storage import Storage, document_of, is_stored_document, open_storage, write_file


def template_paths() -> tuple[Path, Path]:
    """(workspace template folder, example config): inside the wheel, or at the top of a source checkout."""
    package = Path(picoclaw.__file__).resolve().parent
    bundled = package / "_template"
    if (bundled / "workspace").is_dir():
        return bundled / "workspace", bundled / "config.example.json"
    return package.parent / "workspace_template", package.parent / "config.example.json"


@dataclass(frozen=True)
class OnboardStep:
    """What onboarding did with one file: created, kept as it was, or kept although it differs."""

    path: Path
    outcome: str  # "created" | "unchanged" | "kept" | "updated"


# Changes config.json's data (the model the user chose); it gets a copy, so it may change it in place.
Configure = Callable[[dict[str, Any]], dict[str, Any]]


def onboard(home: Path, configure: Configure | None = None) -> list[OnboardStep]:
    """Create what is missing; never touch a file that exists (the user may have edited it), except
    config.json when `configure` changes it (the user asked for that change)."""
    template_dir, example = template_paths()
    steps: list[OnboardStep] = []
    home.mkdir(parents=True, exist_ok=True)
    config_path = home / CONFIG_FILE
    if config_path.exists():
        data = read_json_object(config_path)
        config = parse_config(data, config_path)
        changed = configure(copy.deepcopy(data)) if configure is not None else data
        if changed != data:
            config = parse_config(changed, config_path)
            atomic_write(config_path, dumps_pretty(changed), mode=0o600)  # it holds API keys
        steps.append(OnboardStep(config_path, "updated" if changed != data else "kept"))
    else:
        data = read_json_object(example)
        default_home = Path("~/.picoclaw").expanduser()
        data["workspace"] = "~/.picoclaw/workspace" if home == default_home else str(home / "workspace")
        if configure is not None:
            data = configure(data)
        config = parse_config(data, example)
        atomic_write(config_path, dumps_pretty(data), mode=0o600)
        steps.append(OnboardStep(config_path, "created"))
    layout = WorkspaceLayout.of(config, home)
    # The configured storage: what it holds already counts as existing and is kept (on PostgreSQL the rows, not
    # the folder); what onboarding writes goes through it.
    storage = open_storage(config, layout.root)
    try:
        store = MemoryStore(layout.memory_dir, resolve_timezone(config.timezone), storage=storage)
        for source in sorted(p for p in template_dir.rglob("*") if p.is_file()):
            target = layout.root / source.relative_to(template_dir)
            held = _stored(storage, target)
            if held is None:
                if target == store.long_term_path:  # the store is the only writer of memory documents
                    store.create_long_term(source.read_text(encoding="utf-8"))
                elif target == store.learnings_path:
                    store.create_learnings(source.read_text(encoding="utf-8"))
                else:
                    write_file(storage, target, source.read_bytes())
                steps.append(OnboardStep(target, "created"))
            else:
                steps.append(OnboardStep(target, "unchanged" if held == source.read_bytes() else "kept"))
    finally:
        storage.close()
    return steps


def _stored(storage: Storage, target: Path) -> bytes | None:
    """What the workspace holds at `target` (None: nothing): a stored document as the storage has it. One the
    folder holds but the storage lacks (a folder whose config moved to PostgreSQL) is stored as it is first, so
    what onboarding reports as kept is what the assistant then reads."""
    if not is_stored_document(storage, target):
        return target.read_bytes() if target.is_file() else None
    documents, name = document_of(storage, target)
    held = documents.read(name).data
    if held is None and target.is_file():
        held = target.read_bytes()
        documents.create(name, held)
    return held
