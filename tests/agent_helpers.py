"""Helpers for the agent tests: a real AgentLoop, with the real provider, talking HTTP to the fake server.

Each helper call runs its own `asyncio.run`, creating and closing the provider inside that loop (the
client's connection pool belongs to one loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, TypeVar

import orjson
from freezegun import freeze_time
from freezegun.api import _freeze_time

from picoclaw.agent.loop import AgentLoop
from picoclaw.app import App
from picoclaw.curation.flush import FLUSH_INSTRUCTIONS, FLUSH_ROLE
from picoclaw.curation.lesson_drafting import LESSON_INSTRUCTIONS, LESSON_ROLE
from picoclaw.curation.session_summary import SUMMARY_INSTRUCTIONS, SUMMARY_TASK
from picoclaw.memory.workspace import Workspace
from picoclaw.providers.base import BETWEEN_TURNS
from picoclaw.providers.openai_compat import OpenAICompatProvider
from picoclaw.tools.registry import build_tools
from picoclaw.transcripts.session_store import session_filename
from tests.fakes import FakeOpenAIServer
from tests.homes import edit_config

T = TypeVar("T")

# 02:00 UTC is 10:00 in Asia/Shanghai, the test homes' timezone (tests/zones.py).
FROZEN = "2025-03-10 02:00:00"
TODAY = "2025-03-10"
API_KEY = "sk-agent-test-0123456789"
FAST_RETRY = {"retry-after-ms": "5"}  # the client honours it, so a scripted retry costs milliseconds
SESSION = "cli:test"

SUMMARY_EN = ("## Goal\nPick the user's usual coffee order.\n"
              "## Constraints and preferences\nOat-milk latte, large, no sugar.\n"
              "## Progress\nThe preference is stored in memory/MEMORY.md.\n"
              "## Key decisions\nOrder from the cafe on 5th Street.\n"
              "## Next steps\nAsk about snacks.\n"
              "## Key context\nBudget 30 USD; ticket CAF-42.")
SUMMARY_ZH = ("## Goal\n为用户确定常点的咖啡。\n"
              "## Constraints and preferences\n燕麦拿铁，大杯，无糖。\n"
              "## Progress\n偏好已存入 memory/MEMORY.md。\n"
              "## Key decisions\n在五号街的咖啡店下单。\n"
              "## Next steps\n问问要不要点心。\n"
              "## Key context\n预算 30 元；工单 CAF-42。")


def frozen(when: str = FROZEN) -> _freeze_time:
    """Frozen wall-clock time that still lets asyncio (and the fake server's delays) run in real time."""
    return freeze_time(when, real_asyncio=True)


def make_provider(workspace: Workspace, server: FakeOpenAIServer | None, *, max_retries: int = 0,
                  api_base: str | None = None, text_tool_calls: str = "auto") -> OpenAICompatProvider:
    """The real provider, pointed at the fake server (or at `api_base`); call inside the event loop.

    `text_tool_calls` is the provider entry's setting ("auto" reads tool calls written as text, "off" not)."""
    base = api_base if api_base is not None else (server.base_url if server else "")
    return OpenAICompatProvider(name="openai", api_base=base, api_key=API_KEY,
                                defaults=workspace.config.agents.defaults, timeout=5.0, max_retries=max_retries,
                                text_tool_calls=text_tool_calls)


@dataclass
class Notices:
    """What the loop told the user on the side (the REPL prints these), as (session key, text)."""

    sent: list[tuple[str, str]] = field(default_factory=list)

    async def __call__(self, key: str, text: str) -> None:
        self.sent.append((key, text))


def with_agent(workspace: Workspace, server: FakeOpenAIServer | None,
               body: Callable[[AgentLoop], Awaitable[T]], *, max_retries: int = 0, api_base: str | None = None,
               text_tool_calls: str = "auto", continue_background: bool = False) -> T:
    """Run `body(loop)` with a fresh AgentLoop in a fresh event loop; background work is awaited after.
    `continue_background`: background calls ask after the conversation's last request (a local server's way)."""
    async def main() -> T:
        async with make_provider(workspace, server, max_retries=max_retries, api_base=api_base,
                                 text_tool_calls=text_tool_calls) as provider:
            loop = AgentLoop(workspace, provider, build_tools(workspace), continue_background=continue_background)
            try:
                return await body(loop)
            finally:
                await loop.wait_background()
    return asyncio.run(main())


def chat(workspace: Workspace, server: FakeOpenAIServer | None, texts: list[str], key: str = SESSION, *,
         notices: Notices | None = None, max_retries: int = 0, api_base: str | None = None,
         text_tool_calls: str = "auto", continue_background: bool = False) -> list[str]:
    """Send `texts` one after the other to one session, waiting for background work after each turn."""
    async def body(loop: AgentLoop) -> list[str]:
        replies = []
        for text in texts:
            replies.append((await loop.handle(key, text, notify=notices)).text)
            await loop.wait_background()
        return replies
    return with_agent(workspace, server, body, max_retries=max_retries, api_base=api_base,
                      text_tool_calls=text_tool_calls, continue_background=continue_background)


def reopen(home: Path, **agent_defaults: Any) -> Workspace:
    """Change `agents.defaults` keys in config.json and open the workspace again."""
    with edit_config(home) as config:
        config["agents"]["defaults"].update(agent_defaults)
    return App.open(home).workspace


def set_policy(workspace: Workspace, **changes: Any) -> None:
    """Change policy keys the way `picoclaw policy set` does (the overrides layer)."""
    workspace.policy.set(changes, source="test", reason="agent test")


def write_memory(workspace: Workspace, blocks: list[str]) -> str:
    """MEMORY.md made of `blocks` (each a `## ` section), written directly; returns the text."""
    text = "# Long-term memory\n\n" + "\n\n".join(block.strip() for block in blocks) + "\n"
    workspace.store.long_term_path.write_text(text, encoding="utf-8")
    return text


# -- what the model was sent ---------------------------------------------------------------------------


def background_task(body: dict[str, Any]) -> str:
    """The instruction of a background request asked after the conversation (`PromptPrefix.then`), without its
    BETWEEN_TURNS line; "" for any other request."""
    last = str(body["messages"][-1].get("content") or "")
    head = f"{BETWEEN_TURNS}\n"
    return last[len(head):] if body["messages"][-1].get("role") == "user" and last.startswith(head) else ""


def is_summary_request(body: dict[str, Any]) -> bool:
    """The session summary, in its own prompt or asked after the conversation (curation/session_summary.py)."""
    return (body["messages"][0]["content"] == SUMMARY_INSTRUCTIONS
            or background_task(body).startswith(SUMMARY_TASK))


def is_flush_request(body: dict[str, Any]) -> bool:
    """The memory flush before a summary or /new (curation/flush.py), in either shape."""
    return body["messages"][0]["content"] == FLUSH_INSTRUCTIONS or background_task(body).startswith(FLUSH_ROLE)


def is_lesson_request(body: dict[str, Any]) -> bool:
    """The lesson review after a turn that taught something (curation/lesson_drafting.py), in either shape."""
    return body["messages"][0]["content"] == LESSON_INSTRUCTIONS or background_task(body).startswith(LESSON_ROLE)


def background_reading(body: dict[str, Any]) -> str:
    """What a background request gives the model to read: its user message in its own prompt, or the conversation's
    messages (each as `role: text`) and the instruction when asked after the conversation."""
    if not background_task(body):
        return str(body["messages"][1]["content"])
    return "\n".join(f"{m['role']}: {m.get('content') or ''}" for m in body["messages"][1:])


def is_continued(body: dict[str, Any]) -> bool:
    """A background request asked after the conversation's last request (agent/cache_prefix.py)."""
    return bool(background_task(body))


def turn_requests(server: FakeOpenAIServer) -> list[dict[str, Any]]:
    """Chat requests of turns (summary, memory-flush and lesson requests left out)."""
    return [body for body in server.chat_requests()
            if not (is_summary_request(body) or is_flush_request(body) or is_lesson_request(body))]


def system_prompt(body: dict[str, Any]) -> str:
    first = body["messages"][0]
    assert first["role"] == "system", first
    return str(first["content"])


def summary_sent(body: dict[str, Any]) -> str:
    """The session summary a turn's request carried: the <summary> block at the start of its first user message's
    data block ("" when there is none)."""
    first = next(str(m["content"]) for m in body["messages"] if m["role"] == "user")
    if not first.startswith("<context>\n<summary>\n"):
        return ""
    return first.removeprefix("<context>\n<summary>\n").split("\n</summary>\n", 1)[0]


def history(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages after the system prompt."""
    return list(body["messages"][1:])


def said(message: dict[str, Any]) -> str:
    """A message's text without the <context> data block picoclaw puts in front of a user's text."""
    text = str(message.get("content") or "")
    if message.get("role") == "user" and text.startswith("<context>\n"):
        return text.split("</context>\n\n", 1)[1]
    return text


def contents(messages: list[dict[str, Any]]) -> list[str]:
    """What each message says (user messages without their data block)."""
    return [said(m) for m in messages]


def turn_context(body: dict[str, Any]) -> str:
    """The data block in front of the request's last user message ("" when there is none)."""
    text = str([m for m in body["messages"] if m["role"] == "user"][-1]["content"])
    return text.split("\n</context>", 1)[0] + "\n</context>" if text.startswith("<context>\n") else ""


def memory_section(context: str) -> str:
    """The text inside <memory> … </memory> ("" when no memory was injected)."""
    if "<memory>" not in context:
        return ""
    return context.split("<memory>", 1)[1].split("</memory>", 1)[0]


def injected_blocks(context: str) -> list[str]:
    """The MEMORY.md blocks in a turn's data block, each as its text without the [file:lines] label."""
    parts = memory_section(context).split("\n[")[1:]
    return [part.split("]\n", 1)[1].strip() for part in parts]


# -- the session file ------------------------------------------------------------------------------------


def session_path(workspace: Workspace, key: str = SESSION) -> Path:
    return workspace.root / "sessions" / session_filename(key)


def session_records(workspace: Workspace, key: str = SESSION) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in session_path(workspace, key).read_bytes().splitlines() if line.strip()]


def records_of(workspace: Workspace, kind: str, key: str = SESSION) -> list[dict[str, Any]]:
    return [r for r in session_records(workspace, key) if r["type"] == kind]


def today_note(workspace: Workspace) -> str:
    """The daily note of the frozen day."""
    path = workspace.store.note_path(date.fromisoformat(TODAY))
    return path.read_text(encoding="utf-8") if path.exists() else ""
