"""The status page: the process, the storage and the model it talks to (keys masked), the memory index, the
skills (loaded, or failed and why) with the drafts waiting to be accepted or rejected, and the MCP servers as
configured, with the state and tools of those `picoclaw web` started for the chat (as the terminal's chat starts
them). Read-only but for the drafts: no page starts, stops or reconfigures a program."""

from __future__ import annotations

import asyncio
import re
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from aiohttp import web

from picoclaw import __version__
from picoclaw.clock import describe_timezone
from picoclaw.web.render import APP_KEY, render, see_other

if TYPE_CHECKING:
    from picoclaw.app import App
    from picoclaw.tools import McpServers

# The MCP servers `serve` started for the chat's agent (empty until it has): their state and tools, shown here.
MCP_KEY: web.AppKey[list[McpServers]] = web.AppKey("picoclaw_mcp", list)

STARTED = time.time()
MASK = "••••••"  # every secret the page would show: whether one is set is all a screen needs


def _status(app: App, mcp: McpServers | None) -> dict[str, Any]:
    from picoclaw.tools import SkillCatalog, SkillDrafts

    config = app.config
    agent = config.agents.defaults
    provider = config.providers.get(agent.provider)
    skills_dir = app.workspace.layout.skills_dir
    scan = SkillCatalog(skills_dir).scan()
    running = {server.name: server for server in mcp.servers} if mcp is not None else {}
    servers = []
    for name, server in config.tools.mcp.servers.items():
        live = running.get(name)
        servers.append({"name": name, "enabled": server.enabled,
                        "runs": (" ".join(_masked_command(server.command)) if server.command
                                 else _masked_url(server.url)),
                        "env": {key: MASK for key in server.env}, "headers": {key: MASK for key in server.headers},
                        "tools": ", ".join(server.tools) if server.tools is not None else "",
                        # as the chat's agent sees it: started with the console, or not started here
                        "state": live.status() if live is not None else "",
                        "offered": [tool.name for tool in live.tools] if live is not None else []})
    return {
        "version": __version__,
        "uptime": int(time.time() - STARTED),
        "workspace": str(app.workspace.root),
        "backend": config.storage.backend,
        "provider": agent.provider,
        "model": agent.model,
        "api_base": _masked_url(provider.api_base) if provider is not None else "",
        "api_key": MASK if provider is not None and provider.api_key else "",
        "index": config.memory.index.enabled,
        "timezone": describe_timezone(config.timezone),  # "local (Europe/Berlin)": the zone dates follow
        "skills": [(skill.name, skill.description) for skill in scan.skills],
        "failed": [(str(problem.path.relative_to(app.workspace.root)) if problem.path.is_relative_to(
            app.workspace.root) else problem.path.name, problem.reason) for problem in scan.problems],
        "drafts": [(draft.name, draft.skill.description if draft.skill else "", draft.problem or "")
                   for draft in SkillDrafts(skills_dir).list()],
        "mcp": servers,
    }


SECRET_WORDS = re.compile(r"token|key|secret|passw|auth|credential", re.IGNORECASE)


def _masked_url(url: str | None) -> str:
    """`url` with its user, password and query values masked: a key may ride in any of them."""
    if not url:
        return ""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = (f"{MASK}@" if parts.username or parts.password else "") + (f"[{host}]" if ":" in host else host)
    if parts.port is not None:
        netloc += f":{parts.port}"
    query = "&".join(f"{name}={MASK}" for name, _ in parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _masked_command(command: list[str]) -> list[str]:
    """A server's command line with the value after a secret-looking flag (`--token X`, `--api-key=X`) masked,
    and any URL in it as `_masked_url` shows it."""
    shown: list[str] = []
    for argument in command:
        flag, equals, _ = argument.partition("=")
        if shown and shown[-1].startswith("-") and "=" not in shown[-1] and SECRET_WORDS.search(shown[-1]):
            shown.append(MASK)
        elif equals and flag.startswith("-") and SECRET_WORDS.search(flag):
            shown.append(f"{flag}={MASK}")
        elif "://" in argument:
            shown.append(_masked_url(argument))
        else:
            shown.append(argument)
    return shown


async def status_page(request: web.Request, *, error: str = "", status: int = 200) -> web.Response:
    """The process, its model and storage, skills and drafts, MCP servers."""
    found = await asyncio.to_thread(_status, request.app[APP_KEY], request.app[MCP_KEY][0] if request.app[MCP_KEY]
                                    else None)
    return render(request, "status.html", status=status, s=found, error=error,
                  notice=request.query.get("notice", ""))


async def decide_draft(request: web.Request) -> web.Response:
    """Accept a skill draft (it moves into skills/) or reject it (it is deleted), as `picoclaw skills` does."""
    from picoclaw.tools import SkillDraftError, SkillDrafts

    form = await request.post()
    name, decision = str(form.get("name", "")), str(form.get("decision", ""))
    drafts = SkillDrafts(request.app[APP_KEY].workspace.layout.skills_dir)
    try:
        if decision == "accept":
            await asyncio.to_thread(drafts.accept, name)
        elif decision == "reject":
            await asyncio.to_thread(drafts.reject, name)
        else:
            return await status_page(request, error="accept or reject?", status=400)
    except SkillDraftError as exc:
        return await status_page(request, error=str(exc), status=400)
    return see_other(f"/status?notice=draft_{decision}ed")
