"""Every request fits the model's window (agent/budget.py): the pure split on small and large windows, the policy's
shares and their bounds, the tools' short form, the user's message never cut, and real turns against a 4096-token
window through the AgentLoop and the fake OpenAI server."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest
from pydantic import BaseModel, Field, ValidationError

from picoclaw.agent.budget import (
    REPLY_FLOOR,
    PromptSplit,
    Shares,
    fit_request,
    json_tokens,
    memory_cap,
    refusal,
    reply_reserve,
    short_description,
    short_schemas,
    short_tools_needed,
    stored_tokens,
    usable,
)
from picoclaw.agent.context import ContextBuilder, RequestShape
from picoclaw.agent.loop import SET_ASIDE_NOTICE, SUMMARISED_NOTICE, AgentLoop
from picoclaw.app import App
from picoclaw.errors import ConfigError
from picoclaw.memory.workspace import Workspace
from picoclaw.policy_schema import TUNABLE_KEYS, MemoryPolicy
from picoclaw.providers.base import ContextWindow, FixedWindow
from picoclaw.tokens import count_tokens
from picoclaw.tools.base import Tool
from picoclaw.tools.cron import Cron
from picoclaw.tools.exec import Exec
from picoclaw.tools.registry import build_tools
from picoclaw.transcripts import Session, StoredMessage
from tests.agent_helpers import (
    SESSION,
    SUMMARY_EN,
    SUMMARY_ZH,
    is_flush_request,
    is_summary_request,
    make_provider,
    records_of,
    said,
    set_policy,
    turn_requests,
    write_memory,
)
from tests.fakes import Error, FakeOpenAIServer
from tests.homes import edit_config

SMALL = ContextWindow(4096, "server", "llama.cpp /props")
DEFAULT_SHARES = Shares.of(MemoryPolicy())


# -- the pure budget ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [4096, 8192, 128_000])
def test_a_request_fits_its_window_with_room_for_the_reply(window: int) -> None:
    reserve = reply_reserve(window, 4096, DEFAULT_SHARES)
    history = [300] * 500  # far more than any of these windows holds
    memory = [150] * 5  # within memory's cap on each of them
    fit = fit_request(window, fixed=1500, memory=memory, history=history, max_tokens=4096, reserve=reserve)
    assert fit.fits
    assert fit.prompt + fit.max_tokens <= usable(window) <= window
    assert fit.max_tokens >= reserve  # the reply keeps its share
    kept = sum(history[fit.history_start:]) + sum(memory[:fit.memory_keep])
    assert fit.prompt == 1500 + kept
    # The newest history is what stays: a contiguous tail.
    assert 0 < fit.history_start < len(history)


def test_the_reply_share_depends_on_the_window() -> None:
    assert reply_reserve(4096, 4096, DEFAULT_SHARES) == 1024  # 25 % of a small window
    assert reply_reserve(8192, 4096, DEFAULT_SHARES) == 2048
    assert reply_reserve(128_000, 4096, DEFAULT_SHARES) == 4096  # config's max_tokens, as before


def test_on_a_large_window_nothing_shrinks() -> None:
    fit = fit_request(128_000, fixed=2000, memory=[200] * 10, history=[300] * 40, max_tokens=4096,
                      reserve=reply_reserve(128_000, 4096, DEFAULT_SHARES))
    assert (fit.history_start, fit.memory_keep, fit.max_tokens) == (0, 10, 4096)


def test_memory_cap_is_the_smaller_of_budget_and_share() -> None:
    assert memory_cap(4096, 2000, DEFAULT_SHARES) == 819  # 20 % of 4096
    assert memory_cap(8192, 2000, DEFAULT_SHARES) == 1638
    assert memory_cap(128_000, 2000, DEFAULT_SHARES) == 2000


def test_memory_gives_way_before_the_reply_and_the_message() -> None:
    # Fixed parts leave 4096·0.95 − 2500 − 1024 = 367 tokens: memory takes at most half (one 150-token piece),
    # the history the rest; cut once, it keeps what fills half its room (one 100-token message, the newest), so
    # the next turn fits without another cut.
    fit = fit_request(4096, fixed=2500, memory=[150] * 5, history=[100] * 5, max_tokens=4096, reserve=1024)
    assert fit.memory_keep == 1 and fit.history_start == 4
    assert fit.prompt + fit.max_tokens <= 4096
    following = fit_request(4096, fixed=2500, memory=[150] * 5, history=[100] * 2, max_tokens=4096, reserve=1024)
    assert following.history_start == 0
    # A history that fits is not cut.
    short = fit_request(4096, fixed=2500, memory=[150] * 5, history=[50, 50], max_tokens=4096, reserve=1024)
    assert short.memory_keep == 1 and short.history_start == 0


def test_a_message_that_alone_leaves_no_room_for_a_reply_does_not_fit() -> None:
    fit = fit_request(4096, fixed=3800, memory=[100], history=[100], max_tokens=4096, reserve=1024)
    assert not fit.fits
    # Squeezed, but still a reply: the request is sent with a lowered max_tokens and nothing else.
    squeezed = fit_request(4096, fixed=3300, memory=[100], history=[100], max_tokens=4096, reserve=1024)
    assert squeezed.fits and squeezed.memory_keep == 0 and squeezed.history_start == 1
    assert REPLY_FLOOR <= squeezed.max_tokens < 1024 and squeezed.prompt + squeezed.max_tokens <= 4096


# -- shares and their bounds -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "value"), [("prompt_tools_percent", 4), ("prompt_tools_percent", 61),
                                            ("prompt_memory_percent", 0), ("prompt_memory_percent", 51),
                                            ("prompt_reply_percent", 4), ("prompt_reply_percent", 99)])
def test_shares_out_of_bounds_are_refused(key: str, value: int) -> None:
    with pytest.raises(ValidationError, match=key):
        MemoryPolicy(**{key: value})


def test_shares_together_leave_room_for_the_rest() -> None:
    with pytest.raises(ValidationError, match="at most 80"):
        MemoryPolicy(prompt_tools_percent=40, prompt_memory_percent=30, prompt_reply_percent=20)
    assert MemoryPolicy(prompt_tools_percent=40, prompt_memory_percent=20, prompt_reply_percent=20)


def test_a_bad_share_in_config_json_names_the_key(home: Path) -> None:
    with edit_config(home) as config:
        config["memory"]["prompt_reply_percent"] = "25"  # strict: text is not a number
    with pytest.raises(ConfigError, match="prompt_reply_percent"):
        App.open(home)


def test_a_bad_share_in_the_overrides_is_ignored_key_by_key(workspace: Workspace,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    overrides = workspace.memory_dir / "policy_overrides.json"
    overrides.write_text(json.dumps({"prompt_tools_percent": 500, "prompt_memory_percent": 10}), encoding="utf-8")
    policy = workspace.policy.current()
    assert policy.prompt_tools_percent == 25 and policy.prompt_memory_percent == 10
    assert "prompt_tools_percent" in caplog.text


# -- the tools' short form ------------------------------------------------------------------------------------


LONG = ("Looks up the thing in the remote catalogue. It supports pagination, filtering by many fields, fuzzy "
        "matching, and it returns JSON with every field documented below. 它还支持中文查询与模糊匹配。") * 3


class _Args(BaseModel):
    query: str = Field(description="what to look for; " + LONG)
    limit: int = Field(5, description="how many results " + LONG)
    description: str = Field("", description="a parameter that happens to be called description")


def _tool(index: int) -> Tool:
    class Catalogue(Tool):
        name: ClassVar[str] = f"catalogue_{index:02d}"
        description: ClassVar[str] = LONG
        Args: ClassVar[type[BaseModel]] = _Args

        async def run(self, args: Any) -> str:
            return "nothing found"
    return Catalogue()


MANY_TOOLS = [_tool(n) for n in range(6)]


def test_short_form_keeps_names_and_parameters_and_drops_long_descriptions() -> None:
    full = [tool.schema() for tool in MANY_TOOLS]
    short = short_schemas(full)
    assert [s["function"]["name"] for s in short] == [s["function"]["name"] for s in full]
    first = short[0]["function"]
    assert first["description"].startswith("Looks up the thing in the remote catalogue. It supports pagination")
    assert len(first["description"]) <= 200 and first["description"].endswith(("。", "."))
    assert set(first["parameters"]["properties"]) == {"query", "limit", "description"}  # a parameter's *name* stays
    assert len(first["parameters"]["properties"]["query"]["description"]) <= 40
    assert first["parameters"]["required"] == ["query"]
    assert json_tokens(short) * 3 < json_tokens(full)
    # The same input gives the same bytes: a session's prefix stays cached.
    assert orjson.dumps(short_schemas(full)) == orjson.dumps(short)


def test_the_short_form_is_chosen_by_the_tools_size_alone() -> None:
    full = json_tokens([tool.schema() for tool in MANY_TOOLS])
    assert short_tools_needed(full, 4096, DEFAULT_SHARES)
    assert not short_tools_needed(full, 128_000, DEFAULT_SHARES)


# -- real turns on a 4096 window ------------------------------------------------------------------------------


def run_small(workspace: Workspace, server: FakeOpenAIServer, texts: list[str], *, window: ContextWindow = SMALL,
              tools: list[Tool] | None = None, key: str = SESSION) -> list[str]:
    """Send `texts` to one session of an AgentLoop whose model has `window`, waiting for background work."""
    async def main() -> list[str]:
        async with make_provider(workspace, server) as provider:
            loop = AgentLoop(workspace, provider, build_tools(workspace, tools or []), windows=FixedWindow(window))
            replies = []
            for text in texts:
                replies.append((await loop.handle(key, text)).text)
                await loop.wait_background()
            return replies
    return asyncio.run(main())


def request_tokens(body: dict[str, Any]) -> int:
    """What a request holds, counted on its own: every message and the tools as the JSON sent, and max_tokens."""
    messages = sum(count_tokens(json.dumps(m, ensure_ascii=False, separators=(",", ":"))) for m in body["messages"])
    tools = count_tokens(json.dumps(body.get("tools") or [], ensure_ascii=False, separators=(",", ":")))
    return messages + (tools if body.get("tools") else 0) + int(body["max_tokens"])


def big_memory(workspace: Workspace) -> None:
    write_memory(workspace, [f"## 2025-03-0{1 + n % 9}\nProject {n}: the deploy of service {n} runs on Thursdays; "
                             f"项目 {n} 的负责人是王{n}，预算 {n * 1000} 元。" + " Details follow." * 30
                             for n in range(40)])


def answering(server: FakeOpenAIServer) -> None:
    """Every request answered by kind: the flush stores nothing, a summary is a valid one, a turn a short text."""
    def respond(body: dict[str, Any]) -> str:
        if is_flush_request(body):
            return "NONE"
        if is_summary_request(body):
            return ("## Goal\nTalk about the projects.\n## Progress\nMany questions answered.\n"
                    "## Next steps\nMore questions.\n## Key context\n项目与预算。")
        return "Thursday. 周四。"
    server.responder = respond


def test_every_request_stays_within_a_4096_window(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    big_memory(workspace)
    answering(fake_openai)
    questions = [f"Question {n}: when is the deploy of project {n}, and who owns 项目 {n}? " + "Please be brief. " * 20
                 for n in range(14)]

    replies = run_small(workspace, fake_openai, questions, tools=MANY_TOOLS)

    assert all("Thursday" in reply for reply in replies)
    requests = fake_openai.chat_requests()
    turns = turn_requests(fake_openai)
    assert len(turns) == len(questions) and len(requests) >= len(turns)
    # the background calls (flush, summary) are shaped in curation/session_summary.py, curation/flush.py
    for body in turns:
        assert request_tokens(body) <= SMALL.tokens, request_tokens(body)
    # Each turn's own words arrived whole, and the reply was given less than config's 4096.
    for question, body in zip(questions, turns, strict=True):
        assert said(body["messages"][-1]) == question
        assert body["max_tokens"] < 4096
    # The tools went in their short form, the same bytes in every turn (the prompt cache keeps them).
    assert len({orjson.dumps(body["tools"]) for body in turns}) == 1
    assert len(turns[0]["tools"]) == len(build_tools(workspace, MANY_TOOLS).schemas())  # every tool offered
    assert all(len(t["function"]["parameters"]["properties"]["query"]["description"]) <= 40
               for t in turns[0]["tools"] if t["function"]["name"].startswith("catalogue_"))
    # History over its room was summarised on record, never dropped without a trace.
    assert records_of(workspace, "compaction")
    # The split went into each turn's record.
    user_records = [r for r in records_of(workspace, "message") if r["message"]["role"] == "user"]
    split = user_records[-1]["why"]["context"]
    assert split["window"] == 4096 and split["source"] == "server" and split["detail"] == "llama.cpp /props"
    assert split["tools_short"] is True
    assert sum(split["parts"].values()) <= 4096


def test_a_long_message_is_never_cut(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    answering(fake_openai)
    english = "Here is my long story. " * 250  # ~1250 tokens
    chinese = "这是我很长的一段话，请你完整地读完它。" * 100  # ~1900 tokens
    earlier = [f"earlier message {n} " + "words " * 150 for n in range(6)]

    replies = run_small(workspace, fake_openai, [*earlier, english, chinese])

    assert all(reply.endswith("周四。") for reply in replies)
    turns = turn_requests(fake_openai)
    assert said(turns[-2]["messages"][-1]) == english
    assert said(turns[-1]["messages"][-1]) == chinese
    for body in turns:
        assert request_tokens(body) <= SMALL.tokens


@pytest.mark.parametrize("message", ["Read all of this. " * 900, "请完整阅读下面的内容。" * 400])
def test_a_message_too_long_for_the_window_is_refused_in_one_line(workspace: Workspace,
                                                                   fake_openai: FakeOpenAIServer, message: str) -> None:
    [reply] = run_small(workspace, fake_openai, [message])

    assert fake_openai.chat_requests() == []  # nothing over-long was sent
    assert "\n" not in reply and "leaves no room for an answer" in reply and "4,096" in reply
    assert not (workspace.root / "sessions").exists() or records_of(workspace, "message") == []


def test_a_large_window_sends_what_it_did_before(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    big_memory(workspace)
    set_policy(workspace, memory_token_budget=2000)
    answering(fake_openai)
    run_small(workspace, fake_openai, ["when is the deploy of project 3?"], tools=MANY_TOOLS,
              window=ContextWindow(128_000, "config"))
    [body] = turn_requests(fake_openai)
    assert body["max_tokens"] == 4096
    assert body["tools"] == [tool.schema() for tool in [*build_tools(workspace).tools.values(), *MANY_TOOLS]]


def test_reflection_cannot_tune_the_prompt_shares() -> None:
    # A tuned tools share would flip the tools between full and short form mid-session (and lose the prompt cache).
    for key in ("prompt_tools_percent", "prompt_memory_percent", "prompt_reply_percent"):
        assert key not in TUNABLE_KEYS


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_history_is_cut_at_a_turn_start_never_on_a_reply(workspace: Workspace, lang: str) -> None:
    # The oldest turn's question is too long to keep: the cut landed on its answer, sent without its question.
    long = ("Tell me everything about the garden. " * 300 if lang == "en" else "告诉我花园的一切。" * 900)
    said_ = ([long, "Short answer.", "And the fence?", "Fix it before the rain."] if lang == "en"
             else [long, "简短的回答。", "篱笆呢？", "下雨前修好。"])
    messages = [{"role": "user" if n % 2 == 0 else "assistant", "content": text} for n, text in enumerate(said_)]
    session = Session(SESSION, Path("unused.jsonl"), [StoredMessage(n + 1, m) for n, m in enumerate(messages)])
    built = asyncio.run(ContextBuilder(workspace).build(
        workspace.policy.current(), session, "hi", datetime(2025, 3, 1, 9, 0), count_use=False,
        shape=RequestShape(SMALL, [], 4096)))
    sent = built.messages[1:-1]
    assert sent == messages[2:]  # from the next user message on
    assert built.cut_through == 2  # the reply goes with its question


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_summary_too_big_for_the_window_never_refuses_a_short_message(workspace: Workspace, lang: str) -> None:
    # The refusal "your message alone … leaves no room" was given for "hi" once the summary had grown too big.
    summary = ("## Goal\n" + "The garden, the fence, the tomatoes and the rain. " * 400 if lang == "en"
               else "## 目标\n" + "花园、篱笆、西红柿和雨。" * 400)
    session = Session(SESSION, Path("unused.jsonl"), [], summary=summary)
    text = "hi" if lang == "en" else "你好"
    built = asyncio.run(ContextBuilder(workspace).build(
        workspace.policy.current(), session, text, datetime(2025, 3, 1, 9, 0), count_use=False,
        shape=RequestShape(SMALL, [], 4096)))
    assert built.fits
    assert summary not in built.messages[0]["content"]
    assert built.split is not None and sum(built.split.parts.values()) <= SMALL.tokens


def test_the_refusal_names_the_part_that_is_too_big() -> None:
    window = ContextWindow(4096, "server", "llama.cpp /props")
    message = refusal(PromptSplit(window, {"system": 400, "tools": 600, "user": 3500, "reply": 0}))
    assert message.startswith("your message alone (3,500 tokens)")
    standing = refusal(PromptSplit(window, {"system": 1500, "tools": 2400, "user": 2, "reply": 0}))
    assert "your message" not in standing and "(3,900 tokens)" in standing and "4,096" in standing


def test_the_short_form_keeps_what_the_model_needs_to_call_a_tool() -> None:
    # cron's description became "This chat's reminders." and its "at" lost "e.g. 2026-12-01T09:00"; exec was cut
    # mid-word.
    tools = {tool["function"]["name"]: tool["function"] for tool in short_schemas(
        [{"type": "function", "function": {"name": name, "description": described.description,
                                           "parameters": described.Args.model_json_schema()}}
         for name, described in (("cron", Cron), ("exec", Exec))])}
    assert tools["cron"]["description"] == " ".join(Cron.description.split())  # whole: under 200 characters
    assert "remove: by id" in tools["cron"]["description"]
    assert tools["cron"]["parameters"]["properties"]["at"]["description"] == "e.g. 2026-12-01T09:00"
    assert tools["exec"]["description"].endswith(".") and len(tools["exec"]["description"]) <= 200
    assert "return its exit code and output" in tools["exec"]["description"]


@pytest.mark.parametrize(("text", "expected"), [
    ("Finds a thing, e.g. a book. " + "It pages, filters and sorts the results for you. " * 6,
     "Finds a thing, e.g. a book. It pages, filters and sorts the results for you."),
    ("查找东西，例如一本书。" + "它支持分页、过滤和排序。" * 20, "查找东西，例如一本书。它支持分页、过滤和排序。"),
])
def test_a_long_description_keeps_whole_sentences(text: str, expected: str) -> None:
    assert short_description(text, 80).startswith(expected)
    assert len(short_description(text, 80)) <= 80
    # One sentence longer than the limit: cut at a word (or a character in Chinese), marked.
    assert short_description("word " * 40, 40).endswith("word…")
    assert len(short_description("很长的句子" * 20, 40)) == 40



def small_window_turns(workspace: Workspace, server: FakeOpenAIServer, texts: list[str]) -> tuple[list[str], list[str]]:
    """`texts` as turns of one session on the small window, background work awaited after each; the replies, and the
    receipts of the memory writes shown."""
    shown: list[str] = []

    async def remembered(key: str, write: Any) -> None:
        shown.append(write.notice)

    async def main() -> list[str]:
        async with make_provider(workspace, server) as provider:
            loop = AgentLoop(workspace, provider, build_tools(workspace, []), windows=FixedWindow(SMALL))
            replies = []
            for text in texts:
                replies.append((await loop.handle(SESSION, text, remembered=remembered)).text)
                await loop.wait_background()
            return replies
    return asyncio.run(main()), shown


def without_a_background_summary(workspace: Workspace, monkeypatch: pytest.MonkeyPatch, lang: str) -> tuple[str, str]:
    """No background summary (as when it failed): the turn itself must make the history fit. A fact, and the filler
    that makes each message long, in `lang`."""
    monkeypatch.setattr(AgentLoop, "needs_summary", lambda self, session, policy: False)
    set_policy(workspace, session_summary_message_threshold=1000, session_summary_token_percent=95,
               session_summary_keep_count=8)
    fact = "My sister Lin lives in Hangzhou." if lang == "en" else "我妹妹林住在杭州。"
    filler = ("Here is more about my week, the garden and the fence that needs fixing. " * 14 if lang == "en"
              else "这是关于我这一周、花园和需要修理的篱笆的更多内容。" * 14)
    return fact, filler


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_history_over_the_window_is_summarised_in_the_turn_and_its_flush_is_shown(
        workspace: Workspace, fake_openai: FakeOpenAIServer, lang: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The in-turn summary kept session_summary_keep_count messages, so the history rarely fitted and the rest was
    # set aside without a summary or a flush; the flush it did run was never shown (an empty Receipts()).
    # No background summary here (as when it failed): the turn itself must make the history fit.
    fact, filler = without_a_background_summary(workspace, monkeypatch, lang)
    texts = [f"{fact} {filler}"] + [f"{n}. {filler}" for n in range(1, 12)]
    summary = SUMMARY_EN if lang == "en" else SUMMARY_ZH

    def respond(body: dict[str, Any]) -> str:
        if is_flush_request(body):
            return f"- {fact}" if fact in json.dumps(body, ensure_ascii=False) else "NONE"
        if is_summary_request(body):
            return summary
        return "Noted." if lang == "en" else "记下了。"
    fake_openai.responder = respond
    replies, shown = small_window_turns(workspace, fake_openai, texts)
    assert any(SUMMARISED_NOTICE in reply for reply in replies), replies
    assert not any(SET_ASIDE_NOTICE in reply for reply in replies)
    assert any(("Lin" if lang == "en" else "林") in notice for notice in shown), shown
    assert records_of(workspace, "compaction")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_on_a_small_window_the_summary_comes_before_the_budget_cuts(workspace: Workspace,
                                                                     fake_openai: FakeOpenAIServer, lang: str) -> None:
    # With max_tokens at 25 % of a 4096 window the largest prompt is about 70 % of it, and the trigger was 75 %:
    # the history was always cut in the turn (or set aside) before a background summary could fire.
    answering(fake_openai)
    piece = ("Notes on the garden: water the tomatoes, shade the basil, fix the north fence. " if lang == "en"
             else "花园笔记：给西红柿浇水，把罗勒放在阴凉处，修好北边的篱笆。")
    texts = [f"{n}. " + piece * (12 if lang == "en" else 8) for n in range(10)]
    replies = run_small(workspace, fake_openai, texts)
    assert any(is_summary_request(body) for body in fake_openai.chat_requests())
    assert not any(SUMMARISED_NOTICE in reply or SET_ASIDE_NOTICE in reply for reply in replies), replies
    records = records_of(workspace, "compaction")
    assert records and all(r.get("reason") == "summary" for r in records)


def test_each_history_message_is_counted_once_and_again_only_when_it_changes(workspace: Workspace) -> None:
    # The counts were kept in an lru_cache keyed on each message's whole JSON: cold with many sessions, and a copy of
    # every message. Now each stored message keeps its own count.
    messages = [{"role": "user", "content": "哪天部署？"}, {"role": "assistant", "content": "Thursday."}]
    session = Session(SESSION, Path("unused.jsonl"), [StoredMessage(n + 1, m) for n, m in enumerate(messages)])
    asyncio.run(ContextBuilder(workspace).build(workspace.policy.current(), session, "hi", datetime(2025, 3, 1, 9, 0),
                                                count_use=False, shape=RequestShape(SMALL, [], 4096)))
    counted = [m.tokens for m in session.active()]
    assert all(counted) and counted == [stored_tokens(m) for m in session.active()]
    reply = session.active()[1]
    reply.mark_undelivered("the chat was closed")
    assert reply.tokens is None and stored_tokens(reply) > counted[1]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_tool_results_that_fill_the_window_leave_the_tools_out_of_the_next_request(
        workspace: Workspace, fake_openai: FakeOpenAIServer, lang: str) -> None:
    line = "Entry {i}: the invoice was paid late.\n" if lang == "en" else "第{i}条：发票付款晚了。\n"
    for name in ("a.txt", "b.txt", "c.txt"):
        (workspace.root / name).write_text("".join(line.format(i=i) for i in range(1500)), encoding="utf-8")
    fake_openai.reply_tool_calls([("read_file", {"path": name}) for name in ("a.txt", "b.txt", "c.txt")])
    fake_openai.reply_text("Paid late." if lang == "en" else "付款晚了。")
    [reply] = run_small(workspace, fake_openai, ["Read a, b and c." if lang == "en" else "读一下 a、b 和 c。"])
    assert reply in ("Paid late.", "付款晚了。")
    first, after = fake_openai.chat_requests()[:2]
    assert first.get("tools") and not after.get("tools")  # no room left for them: the model answers from the results
    results = [m["content"] for m in after["messages"] if m["role"] == "tool"]
    assert len(results) == 3 and all("cut to fit the model's window" in text for text in results)
    assert all(request_tokens(body) <= SMALL.tokens for body in fake_openai.chat_requests()[:2])


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_failed_flush_before_a_failed_summary_is_flushed_again_when_set_aside(
        workspace: Workspace, fake_openai: FakeOpenAIServer, lang: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The in-turn summary marked its range flushed even when the flush's call failed; when the summary failed too,
    # the range was set aside and its facts never reached memory. A failed summary also backs off: the next turns
    # over the budget set aside without asking for a summary again each time.
    fact, filler = without_a_background_summary(workspace, monkeypatch, lang)
    texts = [f"{fact} {filler}"] + [f"{n}. {filler}" for n in range(1, 16)]
    flushes: list[bool] = []

    def respond(body: dict[str, Any]) -> str | Error:
        if is_flush_request(body):
            flushes.append(True)
            if len(flushes) == 1:
                return Error(500, "the server is busy")
            return f"- {fact}" if fact in json.dumps(body, ensure_ascii=False) else "NONE"
        if is_summary_request(body):
            return "not a summary"
        return "Noted." if lang == "en" else "记下了。"
    fake_openai.responder = respond
    replies, shown = small_window_turns(workspace, fake_openai, texts)
    set_aside = sum(SET_ASIDE_NOTICE in reply for reply in replies)
    summaries = sum(is_summary_request(body) for body in fake_openai.chat_requests())
    assert set_aside >= 2, replies
    assert any(("Lin" if lang == "en" else "林") in notice for notice in shown), (flushes, shown)
    assert summaries < set_aside, (summaries, set_aside)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_range_too_long_for_one_flush_is_flushed_in_window_sized_pieces(
        workspace: Workspace, fake_openai: FakeOpenAIServer, lang: str) -> None:
    # The flush of a range set aside on a small window was one request over the window: refused before it was
    # sent, the range's facts were never read.
    from picoclaw.agent.receipt_delivery import Receipts

    fact = "My sister Lin lives in Hangzhou." if lang == "en" else "我妹妹林住在杭州。"
    filler = ("Here is more about my week, the garden and the fence that needs fixing. " * 30 if lang == "en"
              else "这是关于我这一周、花园和需要修理的篱笆的更多内容。" * 30)
    messages: list[dict[str, Any]] = []
    for n in range(8):
        messages += [{"role": "user", "content": f"{fact if n == 0 else n} {filler}"},
                     {"role": "assistant", "content": "Noted." if lang == "en" else "记下了。"}]

    def respond(body: dict[str, Any]) -> str:
        if is_flush_request(body):
            return f"- {fact}" if fact in json.dumps(body, ensure_ascii=False) else "NONE"
        return "ok"
    fake_openai.responder = respond

    async def main() -> bool:
        async with make_provider(workspace, fake_openai) as provider:
            loop = AgentLoop(workspace, provider, build_tools(workspace, []), windows=FixedWindow(SMALL))
            return await loop._flush(SESSION, messages, Receipts(), collect=[])
    assert asyncio.run(main())
    flushes = [body for body in fake_openai.chat_requests() if is_flush_request(body)]
    assert len(flushes) >= 2 and all(request_tokens(body) <= SMALL.tokens for body in flushes)
    assert fact in json.dumps(flushes[-1], ensure_ascii=False)  # newest first: the oldest piece last
    assert fact in workspace.store.read_long_term()
