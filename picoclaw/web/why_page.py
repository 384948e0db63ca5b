"""Why this answer: every conversation, and for each user turn the memory it carried, what found it and with
which score, the policy values that decided, and the reply's prompt and cached tokens (a chart per conversation)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from aiohttp import web

from picoclaw.memory import FeedbackLedger, Reaction
from picoclaw.web.conversation_list import conversations, session_key, transcripts
from picoclaw.web.file_cache import FileCache
from picoclaw.web.model_saw import BAR_WIDTH, ModelSaw, config_secrets, masked_request, model_saw
from picoclaw.web.render import APP_KEY, page_number, render

if TYPE_CHECKING:
    from picoclaw.app import App


@dataclass(frozen=True)
class TurnView:
    """A user turn of a conversation with its record of why, and the reply's token counts."""

    id: int
    text: str
    why: dict[str, Any] | None
    prompt_tokens: int | None
    cached_tokens: int | None
    feedback: str = ""  # the reactions on its reply counted as feedback (memory/feedback.py), e.g. "👎 🔥"
    first_prompt: int | None = None  # the prompt tokens of the turn's first request (the one its record splits)
    steps: int = 0  # tool steps: requests after the first, each longer by the calls and their results
    saw: ModelSaw | None = None  # what the model saw (web/model_saw.py), for the turns a page shows
    request: str = ""  # the exact first request, secrets masked, when this console still holds it


@dataclass(frozen=True)
class Bar:
    """One reply's bars in the prompt-cache chart (SVG units)."""

    x: float
    prompt_height: float
    cached_height: float
    label: str
    turn: int


# A conversation's user turns, read once per version of its transcript (web/file_cache.py), and its message count.
TURNS_KEY: web.AppKey[FileCache[tuple[list[TurnView], int]]] = web.AppKey("picoclaw_turns")
CHART_WIDTH, CHART_HEIGHT = 600, 160
TURNS_PER_PAGE = 50


async def conversations_page(request: web.Request) -> web.Response:
    """Every conversation of the workspace (REPL, Telegram, web), newest first."""
    found = await asyncio.to_thread(conversations, request.app[APP_KEY])
    return render(request, "conversations.html", rows=[(one.name, one.key, one.archived) for one in found])


async def conversation_page(request: web.Request) -> web.Response:
    """One conversation's user turns, newest first, each with what memory it carried and why."""
    app = request.app[APP_KEY]
    name = request.query.get("name", "")
    found = await asyncio.to_thread(transcripts, app)
    if name not in found:  # only names the storage lists: no path from the request ever reaches the disk
        raise web.HTTPNotFound(text="No such conversation.\n")
    def read() -> tuple[list[TurnView], int]:
        session = app.workspace.sessions().read(found[name])
        return _turns(session.messages), len(session.messages)

    read_turns, count = await asyncio.to_thread(request.app[TURNS_KEY].get, name,
                                              lambda: app.workspace.sessions().log.marker(found[name]), read)
    ledger = FeedbackLedger(app.workspace.memory_dir, storage=app.workspace.storage)
    turns = _with_feedback(read_turns, await asyncio.to_thread(ledger.read), session_key(name))
    pages = max(1, -(-len(turns) // TURNS_PER_PAGE))
    number = page_number(request, pages)
    newest_first = turns[::-1]
    shown = _seen(newest_first[(number - 1) * TURNS_PER_PAGE:number * TURNS_PER_PAGE], app,
                  _kept_request(request, session_key(name)))
    return render(request, "conversation.html", name=name, key=session_key(name), turns=shown, page=number,
                  pages=pages, bars=_chart(turns), bar_width=BAR_WIDTH, chart_width=CHART_WIDTH,
                  chart_height=CHART_HEIGHT, top=_top(turns), messages=count)


def _turns(messages: list[Any]) -> list[TurnView]:
    """User messages paired with the token counts of the last reply before the next user message, the prompt
    tokens of the first, and the number of tool steps between."""
    turns: list[TurnView] = []
    for message in messages:
        role = message.message.get("role")
        if role == "user":
            turns.append(TurnView(message.id, str(message.message.get("content") or ""), _why(message.why), None,
                                  None))
        elif role == "assistant" and turns and message.prompt_tokens is not None:
            last = turns[-1]
            first = last.first_prompt if last.first_prompt is not None else message.prompt_tokens
            steps = last.steps + (1 if last.prompt_tokens is not None else 0)
            turns[-1] = replace(last, prompt_tokens=message.prompt_tokens, cached_tokens=message.cached_tokens,
                                first_prompt=first, steps=steps)
    return turns


def _seen(turns: list[TurnView], app: App, kept: Any) -> list[TurnView]:
    """`turns` (those a page shows) with what their model saw, and the exact request of the one `kept` is for."""
    secrets: list[str] | None = None
    shown = []
    for turn in turns:
        request = ""
        if kept is not None and kept.user_id == turn.id:
            secrets = config_secrets(app.config) if secrets is None else secrets
            request = masked_request(kept.prefix.messages, kept.prefix.tools, secrets)
        shown.append(replace(turn, saw=model_saw(turn.why) if turn.why is not None else None, request=request))
    return shown


def _kept_request(request: web.Request, key: str) -> Any:
    """The first request of session `key`'s last turn, as the console's chat agent sent it; None when it holds
    none (another process answered, or this console restarted since)."""
    from picoclaw.web.chat_page import CHANNEL_KEY

    channels = request.app[CHANNEL_KEY]
    return channels[0].agent.shown_requests.get(key) if channels else None


def _with_feedback(turns: list[TurnView], reactions: list[Reaction], key: str) -> list[TurnView]:
    """`turns` with the feedback on their replies: each user's newest reaction on each message of the reply."""
    newest: dict[tuple[int, int, int], Reaction] = {}
    for reaction in reactions:
        if reaction.session == key and reaction.turn is not None:
            newest[reaction.who_where] = reaction
    by_turn: dict[int, list[str]] = {}
    for reaction in newest.values():
        by_turn.setdefault(reaction.turn or 0, []).append(reaction.emoji)
    return [replace(turn, feedback=" ".join(by_turn.get(turn.id, []))) for turn in turns]


def _why(raw: dict[str, Any] | None) -> dict[str, Any] | None:
    """A turn's record of why, with every field the page reads (a hand-edited transcript may lack some)."""
    if raw is None:
        return None
    found = raw.get("items")
    items = [_item(item) for item in found if isinstance(item, dict)] if isinstance(found, list) else []
    policy = raw.get("policy")
    query = raw.get("query")
    left = raw.get("left_out")
    left_out = [_item(item) for item in left if isinstance(item, dict)] if isinstance(left, list) else None
    return {"search": str(raw.get("search", "")), "query": query if isinstance(query, str) else None,
            "items": items, "policy": policy if isinstance(policy, dict) else {}, "left_out": left_out,
            "split": raw.get("context") if isinstance(raw.get("context"), dict) else None}


def _item(item: dict[str, Any]) -> dict[str, Any]:
    """One block of a record, every field the page reads in its type (a hand edit may have broken any)."""
    lines = item.get("lines")
    score, tokens = item.get("score"), item.get("tokens")
    return {"found_by": str(item.get("found_by", "")), "path": str(item.get("path", "")),
            "score": float(score) if isinstance(score, int | float) else None,
            "lines": lines if isinstance(lines, list) and len(lines) == 2 else ["?", "?"],
            "text": str(item.get("text", "")), "tokens": tokens if isinstance(tokens, int) else None,
            "reason": str(item.get("reason") or "")}


def _top(turns: list[TurnView]) -> int:
    """The chart's highest prompt: what its axis goes up to."""
    measured = [turn for turn in turns if turn.prompt_tokens is not None][-100:]
    return max((turn.prompt_tokens or 0 for turn in measured), default=0)


def _chart(turns: list[TurnView]) -> list[Bar]:
    """Bars of prompt and cached tokens for the turns whose reply reported them (the newest 100)."""
    measured = [turn for turn in turns if turn.prompt_tokens is not None][-100:]
    top = max((turn.prompt_tokens or 0 for turn in measured), default=0) or 1
    step = CHART_WIDTH / max(len(measured), 1)
    return [Bar(round(n * step, 1), round((turn.prompt_tokens or 0) / top * (CHART_HEIGHT - 10), 1),
                round((turn.cached_tokens or 0) / top * (CHART_HEIGHT - 10), 1),
                f"#{turn.id}: {turn.prompt_tokens} / {turn.cached_tokens or 0}", turn.id)
            for n, turn in enumerate(measured)]
