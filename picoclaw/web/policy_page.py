"""The policy page: every key with its value in force, where it comes from, its bounds and meaning; setting a
value (validated as `picoclaw policy set` validates it); the history as a timeline with a rollback per change."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from picoclaw.web.render import APP_KEY, render, see_other


@dataclass(frozen=True)
class KeyView:
    """A policy key as the page shows it."""

    key: str
    value: str
    source: str
    low: Any
    high: Any
    meaning: str


def _json(value: Any) -> str:
    return orjson.dumps(value).decode("utf-8")


def parse_value(text: str) -> Any:
    """As `picoclaw policy set`: a JSON scalar (15, true, 0.5); anything else stays text and fails validation."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _keys(app: Any) -> list[KeyView]:
    from picoclaw.policy_schema import POLICY_KEYS, MemoryPolicy
    from picoclaw.pydantic_errors import bounds_of

    effective = app.workspace.policy.effective()
    return [KeyView(key, _json(getattr(effective.policy, key)), effective.sources[key], *bounds_of(MemoryPolicy, key),
                    MemoryPolicy.model_fields[key].description or "") for key in POLICY_KEYS]


async def policy_page(request: web.Request, *, error: str = "", status: int = 200) -> web.Response:
    """The keys and the history, newest change first (as stored now: another machine may have changed them)."""
    app = request.app[APP_KEY]
    policy = app.workspace.policy
    keys = await asyncio.to_thread(_keys, app)
    history = await asyncio.to_thread(policy.history)
    snapshots = {path.name for path in await asyncio.to_thread(policy.snapshots)}
    changes = [(change, change.snapshot in snapshots) for change in reversed(history)]
    return render(request, "policy.html", status=status, keys=keys, changes=changes, error=error,
                  notice=request.query.get("notice", ""), json=_json)


async def set_value(request: web.Request) -> web.Response:
    """Set one key from the form through PolicyManager.set (source "web"); a refused value changes nothing."""
    from picoclaw.memory import PolicyError

    form = await request.post()
    key, value = str(form.get("key", "")).strip(), str(form.get("value", "")).strip()
    reason = str(form.get("reason", "")).strip()[:500] or "set in the web console"
    policy = request.app[APP_KEY].workspace.policy
    try:
        await asyncio.to_thread(policy.set, {key: parse_value(value)}, source="web", reason=reason)
    except PolicyError as exc:
        return await policy_page(request, error=str(exc), status=400)
    return see_other("/policy?notice=policy_set")


async def rollback(request: web.Request) -> web.Response:
    """Undo the newest change not yet undone, or restore the snapshot a timeline entry names."""
    from picoclaw.memory import PolicyError

    form = await request.post()
    snapshot = str(form.get("snapshot", "")).strip() or None
    policy = request.app[APP_KEY].workspace.policy
    try:
        await asyncio.to_thread(policy.rollback, snapshot, source="web")
    except PolicyError as exc:
        return await policy_page(request, error=str(exc), status=400)
    return see_other("/policy?notice=policy_rolled_back")
