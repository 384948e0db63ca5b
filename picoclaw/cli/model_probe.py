"""What `picoclaw onboard` asks model servers: which local ones answer (GET /v1/models on the usual ports, all at
once, briefly), and whether a chosen endpoint takes its key and offers its model. One small request each."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx2

from picoclaw.hosts import is_local_host
from picoclaw.printable import printable
from picoclaw.redact import excerpt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalServer:
    """Where a kind of local server usually listens, and the `providers` entry it becomes."""

    label: str  # "Ollama"
    provider: str  # "ollama"
    port: int


# The ports these servers take out of the box; onboarding looks at all of them at once.
LOCAL_SERVERS: tuple[LocalServer, ...] = (
    LocalServer("Ollama", "ollama", 11434),
    LocalServer("llama.cpp", "llamacpp", 8080),
    LocalServer("llama.cpp", "llamacpp", 8765),
    LocalServer("LM Studio", "lmstudio", 1234),
)
PROBE_HOST = "127.0.0.1"
PROBE_TIMEOUT = 1.0  # seconds: a server on this machine answers its model list at once, even while it works
CHECK_TIMEOUT = 20.0  # seconds: a hosted API across the world, or a local server busy loading a model
MAX_LIST_BYTES = 1 << 20  # a model list is a few KiB; whatever answers with more is not one
MAX_MODEL_NAME = 200


@dataclass(frozen=True)
class FoundServer:
    """A local server that answered with a model list (possibly empty: nothing pulled yet)."""

    server: LocalServer
    api_base: str  # http://127.0.0.1:PORT/v1
    models: tuple[str, ...]


@dataclass(frozen=True)
class Check:
    """What one request to a chosen endpoint showed: ok, or the problem in one line."""

    ok: bool
    problem: str = ""
    models: tuple[str, ...] = ()


def model_ids(body: bytes) -> tuple[str, ...] | None:
    """The model names of an OpenAI-style list ({"data": [{"id": …}, …]}); None when `body` is not one.

    Names that could not be shown or written as they are (control characters, far too long) are left out."""
    try:
        parsed: Any = json.loads(body)
    except (ValueError, UnicodeError):
        return None
    data = parsed.get("data") if isinstance(parsed, dict) else None
    if not isinstance(data, list):
        return None
    names: dict[str, None] = {}  # in the server's order, once each
    for item in data:
        name = item.get("id") if isinstance(item, dict) else None
        if isinstance(name, str) and name.strip() and len(name) <= MAX_MODEL_NAME and printable(name) == name:
            names[name] = None
    return tuple(names)


def find_local_servers(servers: Sequence[LocalServer] | None = None, host: str = PROBE_HOST,
                       timeout: float = PROBE_TIMEOUT) -> list[FoundServer]:
    """The servers of `servers` (default LOCAL_SERVERS) that answer on `host` with a model list, asked at once."""
    wanted = LOCAL_SERVERS if servers is None else tuple(servers)
    return asyncio.run(_find(wanted, host, timeout))


async def _find(servers: Sequence[LocalServer], host: str, timeout: float) -> list[FoundServer]:
    # trust_env=False: a proxy from the environment must not stand between us and this machine.
    async with httpx2.AsyncClient(timeout=timeout, trust_env=False) as client:
        answers = await asyncio.gather(*(_ask(client, server, host) for server in servers))
    return [found for found in answers if found is not None]


async def _ask(client: httpx2.AsyncClient, server: LocalServer, host: str) -> FoundServer | None:
    api_base = f"http://{host}:{server.port}/v1"
    try:
        async with client.stream("GET", f"{api_base}/models") as response:
            body = await _bounded_body(response.aiter_bytes())
            status = response.status_code
    except (httpx2.HTTPError, OSError) as exc:
        log.debug("nothing usable on port %d: %s", server.port, exc)
        return None
    models = model_ids(body) if status == 200 and body is not None else None
    if models is None:  # something else listens there (another web app): not a model server
        log.debug("port %d answered %d without a model list", server.port, status)
        return None
    return FoundServer(server, api_base, models)


async def _bounded_body(chunks: Any) -> bytes | None:
    body = b""
    async for chunk in chunks:
        body += chunk
        if len(body) > MAX_LIST_BYTES:
            return None
    return body


def check_endpoint(api_base: str, api_key: str, model: str, timeout: float = CHECK_TIMEOUT) -> Check:
    """Ask `api_base` for its model list with `api_key`: does it answer, take the key, offer `model`?"""
    url = f"{api_base.rstrip('/')}/models"
    local = is_local_host(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        # A hosted API may need the environment's proxy; this machine and its network never do.
        with httpx2.Client(timeout=timeout, trust_env=not local) as client, \
                client.stream("GET", url, headers=headers) as response:
            status = response.status_code
            body = b""
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_LIST_BYTES:
                    break
    except httpx2.TimeoutException:
        return Check(False, f"{api_base} did not answer within {timeout:g} s")
    except (httpx2.HTTPError, OSError, ValueError) as exc:
        return Check(False, f"cannot reach {api_base} ({excerpt(str(exc) or type(exc).__name__, 120, [api_key])})")
    log.debug("model list from %s: HTTP %d", api_base, status)
    if status in (401, 403):
        return Check(False, f"the server refused the API key (HTTP {status})")
    if status == 404:
        return Check(False, f"{url} was not found (HTTP 404): is the address right?")
    if status != 200:
        return Check(False, f"the server answered HTTP {status}: {_error_text(body, api_key)}")
    models = model_ids(body)
    if models is None:
        return Check(False, f"{api_base} did not answer with an OpenAI-compatible model list: is the address right?")
    if models and model not in models:
        shown = ", ".join(models[:5]) + (" …" if len(models) > 5 else "")
        return Check(False, f"the server does not offer the model {model!r} (it has: {shown})", models)
    return Check(True, models=models)


def _error_text(body: bytes, api_key: str) -> str:
    """The server's own message, short and without the key (some servers echo part of it)."""
    try:
        parsed: Any = json.loads(body)
        message = parsed["error"]["message"] if isinstance(parsed.get("error"), dict) else parsed.get("error")
    except (ValueError, UnicodeError, AttributeError, KeyError, TypeError):
        message = None
    text = message if isinstance(message, str) and message.strip() else body.decode("utf-8", "replace")
    return printable(excerpt(text, 160, [api_key])) or "(no message)"
