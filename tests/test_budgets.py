"""Budgets: every model call claimed against the day's budget before it is made and settled with the usage
the fake server reports (streams too); what happens at the caps; the heartbeat that costs nothing when idle; the
two-process claim race on both backends; `picoclaw usage` and /status; bad input."""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import re
from collections.abc import Awaitable, Callable
from datetime import date, timedelta
from pathlib import Path
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import pytest
from freezegun import freeze_time
from pydantic import ValidationError

from picoclaw.agent.allowance import Allowance, MeteredProvider, OverBudget
from picoclaw.agent.loop import AgentLoop
from picoclaw.app import App
from picoclaw.cli import main
from picoclaw.config import BudgetConfig, Config
from picoclaw.curation import DeferredFlushes
from picoclaw.memory import SpendLedger, Spent, Workspace
from picoclaw.memory.spend import SPEND_FILE
from picoclaw.storage import Storage
from picoclaw.tools.registry import build_tools
from tests.agent_helpers import SESSION, make_provider, set_policy
from tests.fakes import FakeOpenAIServer
from tests.homes import edit_config
from tests.test_scheduler import Delivered, enable_heartbeat, open_app
from tests.test_storage_documents import Backend, backend  # noqa: F401 - the fixture, on both backends

T = TypeVar("T")
TZ = ZoneInfo("Asia/Shanghai")
CTX = multiprocessing.get_context("spawn")
# 02:00 UTC is 10:00 in Shanghai, the test homes' zone; 16:30 UTC is 00:30 the next day there.
MORNING = "2025-03-10 02:00:00"
AFTER_MIDNIGHT = "2025-03-10 16:30:00"
DAY1, DAY2 = date(2025, 3, 10), date(2025, 3, 11)


def set_budget(home: Path, **budget: Any) -> None:
    with edit_config(home) as config:
        config["budget"] = budget


def ledger_of(workspace: Workspace) -> SpendLedger:
    return SpendLedger(workspace.layout.shared_memory_dir, storage=workspace.storage)


def spend(workspace: Workspace, day: date, purpose: str, tokens: int) -> None:
    """What earlier calls of the day used, written into the ledger as they would have."""
    ledger_of(workspace).change(day, lambda d: d.add(purpose, Spent(1, tokens, 0, 0)))


def agent_run(workspace: Workspace, server: FakeOpenAIServer, body: Callable[[AgentLoop], Awaitable[T]],
              allowance: Allowance | None = None) -> T:
    async def main() -> T:
        async with make_provider(workspace, server) as provider:
            loop = AgentLoop(workspace, provider, build_tools(workspace), allowance=allowance)
            try:
                return await body(loop)
            finally:
                await loop.wait_background()
    return asyncio.run(main())


def turns(workspace: Workspace, server: FakeOpenAIServer, texts: list[str],
          allowance: Allowance | None = None) -> list[str]:
    async def body(loop: AgentLoop) -> list[str]:
        replies = []
        for text in texts:
            replies.append((await loop.handle(SESSION, text)).text)
            await loop.wait_background()
        return replies
    return agent_run(workspace, server, body, allowance)


def by_purpose(workspace: Workspace, day: date = DAY1) -> dict[str, Spent]:
    return ledger_of(workspace).read()[day.isoformat()].spent


# -- config ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [{"background_tokens_per_day": -1}, {"chat_tokens_per_day": 10**11},
                                    {"usd_per_day": -0.5}, {"background_tokens_per_day": "200000"},
                                    {"prices": {"gpt-4o-mini": {"input": -1, "output": 0.6}}},
                                    {"prices": {"gpt-4o-mini": {"input": 0.15}}}, {"daily": 5}])
def test_bad_budget_values_are_refused_naming_the_key(budget: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as raised:
        Config.model_validate({"budget": budget})
    assert "budget" in str(raised.value)


def test_the_example_config_budget_validates() -> None:
    example = json.loads((Path(__file__).parents[1] / "config.example.json").read_text(encoding="utf-8"))
    budget = Config.model_validate(example).budget
    assert budget.background_tokens_per_day > 0 and budget.prices


def test_a_bad_budget_in_config_json_is_one_line(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    set_budget(home, background_tokens_per_day=-5)
    before = (home / "config.json").read_bytes()
    code = main(["usage"])
    out, err = capsys.readouterr()
    assert code != 0 and out == "" and err.count("\n") == 1 and "budget.background_tokens_per_day" in err
    assert (home / "config.json").read_bytes() == before


# -- claims and settlement ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["What is the capital of France?", "法国的首都是哪里？"])
def test_chat_turns_count_what_the_server_reported_streamed_or_not(workspace: Workspace,
                                                                   fake_openai: FakeOpenAIServer, text: str) -> None:
    fake_openai.reply_text("Paris. 巴黎。", usage={"prompt_tokens": 900, "completion_tokens": 7},
                           cached_tokens=600)
    fake_openai.reply_text("Still Paris.", usage={"prompt_tokens": 950, "completion_tokens": 4})

    async def body(loop: AgentLoop) -> None:
        shown: list[str] = []

        async def sink(piece: str) -> None:
            shown.append(piece)

        await loop.handle(SESSION, text)
        await loop.handle(SESSION, text, on_text=sink)  # streamed: usage from the stream's last chunk
        assert "".join(shown) == "Still Paris."
    with freeze_time(MORNING, real_asyncio=True):
        agent_run(workspace, fake_openai, body)
    chat = by_purpose(workspace)["chat"]
    assert (chat.calls, chat.prompt, chat.cached, chat.completion, chat.estimated) == (2, 1850, 600, 11, 0)


def test_a_call_without_usage_is_counted_by_estimate(workspace: Workspace, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.reply_text("", usage=False)  # a turn that replies nothing still counts
    fake_openai.reply_text("", usage=False)
    fake_openai.reply_text("", usage=False)
    with freeze_time(MORNING, real_asyncio=True):
        turns(workspace, fake_openai, ["hello"])
    chat = by_purpose(workspace)["chat"]
    assert chat.calls == len(fake_openai.chat_requests()) and chat.estimated == chat.calls and chat.prompt > 0


def test_an_unknown_model_price_is_reported_once_and_its_tokens_still_count(
        home: Path, fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    set_budget(home, prices={"some-other-model": {"input": 1.0, "output": 2.0}})
    workspace = App.open(home).workspace
    with freeze_time(MORNING, real_asyncio=True), caplog.at_level(logging.WARNING):
        turns(workspace, fake_openai, ["one", "二"])
    warned = [r.getMessage() for r in caplog.records if "cost is unknown" in r.getMessage()]
    assert len(warned) == 1
    chat = by_purpose(workspace)["chat"]
    assert chat.calls == 2 and chat.unpriced == 2 and chat.tokens > 0 and chat.micro_usd == 0


def test_a_priced_model_costs_its_price(home: Path, fake_openai: FakeOpenAIServer) -> None:
    set_budget(home, prices={"gpt-4o-mini": {"input": 0.15, "cached_input": 0.075, "output": 0.6}})
    workspace = App.open(home).workspace
    fake_openai.reply_text("ok", usage={"prompt_tokens": 1_000_000, "completion_tokens": 1_000_000},
                           cached_tokens=400_000)
    with freeze_time(MORNING, real_asyncio=True):
        turns(workspace, fake_openai, ["hi"])
    assert by_purpose(workspace)["chat"].micro_usd == round(600_000 * 0.15 + 400_000 * 0.075 + 1_000_000 * 0.6)


class CountedLedger(SpendLedger):
    """The real ledger, counting its writes."""

    writes = 0

    def change(self, day: date, edit: Callable[[Any], T]) -> T:
        self.writes += 1
        return super().change(day, edit)


@pytest.mark.parametrize("text", ["Count me.", "把我记上。"])
def test_uncapped_calls_share_one_ledger_write_which_drain_makes_at_once(
        workspace: Workspace, fake_openai: FakeOpenAIServer, text: str) -> None:
    ledger = CountedLedger(workspace.layout.shared_memory_dir, storage=workspace.storage)
    allowance = Allowance(workspace.config.budget, ledger, TZ, settle_after=3600.0)  # only `drain` writes
    for n in range(5):
        fake_openai.reply_text(f"{text} {n}", usage={"prompt_tokens": 100 + n, "completion_tokens": 2})

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with make_provider(workspace, fake_openai) as inner:
            metered = MeteredProvider(inner, allowance, "chat", 256)
            for _ in range(5):
                await metered.chat([{"role": "user", "content": text}])
            before = ledger.read()
            await allowance.drain()
            return before, ledger.read()
    with freeze_time(MORNING, real_asyncio=True):
        before, after = asyncio.run(main())
    assert before == {} and ledger.writes == 1  # nothing written while the replies went out; then one write
    chat = after[DAY1.isoformat()].spent["chat"]
    assert (chat.calls, chat.prompt, chat.completion) == (5, 510, 10)


def test_uncapped_counts_land_by_themselves_after_settle_after(workspace: Workspace,
                                                                fake_openai: FakeOpenAIServer) -> None:
    ledger = CountedLedger(workspace.layout.shared_memory_dir, storage=workspace.storage)
    allowance = Allowance(workspace.config.budget, ledger, TZ, settle_after=0.0)
    fake_openai.reply_text("ok 好", usage={"prompt_tokens": 40, "completion_tokens": 3})

    async def main() -> None:
        async with make_provider(workspace, fake_openai) as inner:
            await MeteredProvider(inner, allowance, "chat", 256).chat([{"role": "user", "content": "你好 hi"}])
            for _ in range(2000):  # no drain: the writer's own timer writes it
                if ledger.read():
                    return
                await asyncio.sleep(0.01)
    asyncio.run(main())
    [day] = ledger.read().values()
    assert day.spent["chat"].calls == 1 and day.spent["chat"].prompt == 40 and ledger.writes == 1


# -- the background cap -------------------------------------------------------------------------------------------


LONG = [f"Message {n}: I am planning a trip, item {n}. 第{n}条：我在计划旅行。" for n in range(14)]


def _long_conversation(home: Path, server: FakeOpenAIServer, cap: int, when: str) -> tuple[list[str], int]:
    """The LONG conversation on day `when` under a background cap of `cap`; its replies and background calls."""
    set_budget(home, background_tokens_per_day=cap)
    workspace = App.open(home).workspace
    set_policy(workspace, session_summary_message_threshold=4, session_summary_keep_count=2)
    asked = len(server.chat_requests())
    with freeze_time(when, real_asyncio=True):
        replies = turns(workspace, server, LONG)
    return replies, len(server.chat_requests()) - asked - len(LONG)


def test_a_small_background_cap_holds_and_without_it_the_same_conversation_makes_more_calls(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    cap = 2_000  # each background call is claimed at its prompt and max_tokens, about 1,300 here
    replies, capped = _long_conversation(home, fake_openai, cap, MORNING)
    assert replies == ["ok"] * len(LONG)  # every chat turn answered
    workspace = App.open(home).workspace
    spent = by_purpose(workspace)
    assert sum(s.tokens for p, s in spent.items() if p != "chat") <= cap
    assert sum(s.calls for s in spent.values()) == len(fake_openai.chat_requests())  # every request was counted
    assert sum(s.calls for p, s in spent.items() if p != "chat") == capped
    (workspace.layout.sessions_dir / "cli_test.jsonl").unlink(missing_ok=True)
    for path in workspace.layout.sessions_dir.glob("*.jsonl"):
        path.unlink()
    replies, free = _long_conversation(home, fake_openai, 0, AFTER_MIDNIGHT)  # the same, the next day, no cap
    assert replies == ["ok"] * len(LONG) and free > capped


def test_at_the_cap_background_waits_the_owner_is_told_once_a_day_and_deferred_flushes_run_after_midnight(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    set_budget(home, background_tokens_per_day=50_000)
    workspace = App.open(home).workspace
    allowance = Allowance.of(workspace)
    told: list[str] = []

    async def owner(text: str) -> None:
        told.append(text)

    allowance.owner = owner
    spend(workspace, DAY1, "summary", 50_000)  # the day's background budget is spent already
    with freeze_time(MORNING, real_asyncio=True) as frozen:
        assert turns(workspace, fake_openai, ["My dog is called Biscuit.", "我的猫叫年糕。", "/new"],
                     allowance)[:2] == ["ok", "ok"]
        asked = len(fake_openai.chat_requests())
        assert asked == 2  # the two chat turns; no flush, no lesson, no summary
        assert len(told) == 1 and "budget.background_tokens_per_day" in told[0] and "50,000" in told[0]
        pending = DeferredFlushes(workspace.memory_dir, storage=workspace.storage).pending()
        assert len(pending) == 1 and "Biscuit" in json.dumps(pending[0].messages, ensure_ascii=False)
        turns(workspace, fake_openai, ["still there?"], allowance)  # refused again: no second notice today
        assert len(told) == 1
        frozen.move_to(AFTER_MIDNIGHT)  # a new day in Shanghai: the budget is back
        fake_openai.reply_text("ok")
        fake_openai.reply_text("- The user's dog is called Biscuit.\n- 用户的猫叫年糕。")
        turns(workspace, fake_openai, ["good morning"], allowance)
    assert DeferredFlushes(workspace.memory_dir, storage=workspace.storage).pending() == []
    memory = workspace.store.read_long_term()
    assert "Biscuit" in memory and "年糕" in memory
    assert by_purpose(workspace, DAY2)["flush"].calls >= 1


@pytest.mark.parametrize(("text", "needle"), [("Summarise this please", "Today's background budget is spent"),
                                              ("请帮我总结一下这段对话的内容", "今天的后台预算已用完")])
def test_the_notice_is_in_the_language_of_the_refused_request(workspace: Workspace, text: str, needle: str) -> None:
    allowance = Allowance(BudgetConfig(background_tokens_per_day=10), ledger_of(workspace), TZ)
    told: list[str] = []

    async def owner(notice: str) -> None:
        told.append(notice)

    allowance.owner = owner

    async def body() -> None:
        for _ in range(2):  # refused twice: told once
            with pytest.raises(OverBudget):
                await MeteredProvider(_Never(), allowance, "summary", 100).chat([{"role": "user", "content": text}])
    with freeze_time(MORNING, real_asyncio=True):
        asyncio.run(body())
    assert len(told) == 1 and needle in told[0] and "budget.background_tokens_per_day" in told[0]


class _Never:
    """A provider that must not be called: the budget refuses first."""

    name = "never"
    model = "never"
    text_tool_calls = "off"

    async def chat(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the call must not be made")

    async def sees_images(self) -> bool:
        return False


@pytest.mark.parametrize(("text", "needle"), [("Hello there", "Today's chat budget is spent"),
                                              ("你好，在吗？", "今天的聊天预算已用完")])
def test_at_the_chat_cap_a_turn_gets_one_clear_line_and_no_model_call(home: Path, fake_openai: FakeOpenAIServer,
                                                                     text: str, needle: str) -> None:
    set_budget(home, chat_tokens_per_day=1_000)
    workspace = App.open(home).workspace
    spend(workspace, DAY1, "chat", 1_000)
    with freeze_time(MORNING, real_asyncio=True):
        [reply] = turns(workspace, fake_openai, [text])
    assert needle in reply and "budget.chat_tokens_per_day" in reply and "\n" not in reply
    assert fake_openai.chat_requests() == []


def test_a_damaged_ledger_counts_as_the_days_cap_and_says_so(home: Path, fake_openai: FakeOpenAIServer,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    set_budget(home, background_tokens_per_day=100_000)
    workspace = App.open(home).workspace
    path = workspace.layout.shared_memory_dir / SPEND_FILE
    path.write_text("{not json", encoding="utf-8")
    code = main(["usage"])
    out, err = capsys.readouterr()
    assert code != 0 and out == "" and err.count("\n") == 1 and "today counts as spent" in err
    allowance = Allowance.of(workspace)

    async def body() -> str:
        with pytest.raises(OverBudget) as refused:
            await MeteredProvider(_Never(), allowance, "summary", 100).chat([{"role": "user", "content": "x"}])
        return str(refused.value)
    with freeze_time(MORNING, real_asyncio=True):
        assert "damaged" in asyncio.run(body())
        assert ledger_of(workspace).read()[DAY1.isoformat()].damaged
        code = main(["usage"])
    out, _ = capsys.readouterr()
    assert code == 0 and "damaged on 2025-03-10" in out
    with freeze_time(MORNING, real_asyncio=True):
        assert turns(workspace, fake_openai, ["chat goes on"]) == ["ok"]  # chat has no cap: it goes on


# -- two processes at once ----------------------------------------------------------------------------------------


CAP, ESTIMATE, TRIES = 1_000, 100, 15


def _claim_many(kind: str, root: str, dsn: str, go: Any, granted: Any) -> None:
    from tests.test_storage_documents import _open

    storage: Storage = _open(kind, Path(root), dsn)
    try:
        allowance = Allowance(BudgetConfig(background_tokens_per_day=CAP), SpendLedger(Path(root) / "memory",
                                                                                       storage=storage), TZ)
        go.wait()

        async def claims() -> int:
            count = 0
            for _ in range(TRIES):
                try:
                    await allowance.claim("summary", "m", ESTIMATE - 10, 10)
                    count += 1
                except OverBudget:
                    pass
            return count
        with freeze_time(MORNING, real_asyncio=True):
            got = asyncio.run(claims())
        with granted.get_lock():
            granted.value += got
    finally:
        storage.close()


@pytest.mark.slow
def test_two_processes_claiming_at_once_never_exceed_the_cap(backend: Backend) -> None:  # noqa: F811
    go = CTX.Event()
    granted = CTX.Value("i", 0)
    workers = [CTX.Process(target=_claim_many, args=(backend.kind, str(backend.folder(n)), backend.dsn, go, granted))
               for n in (1, 2)]
    for worker in workers:
        worker.start()
    go.set()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    assert granted.value == CAP // ESTIMATE  # every token of the cap was given, none twice
    storage = backend.storage
    day = SpendLedger(backend.root / "memory", storage=storage).read()[DAY1.isoformat()]
    assert day.tokens(lambda purpose: True) == CAP and len(day.held) == CAP // ESTIMATE


# -- the heartbeat ------------------------------------------------------------------------------------------------


def _beats(home: Path, model: FakeOpenAIServer, count: int, every: timedelta, start: str = MORNING) -> list[str]:
    app = open_app(home, model)
    delivered = Delivered()
    said: list[str] = []

    async def body(frozen: Any) -> None:
        async with app:
            scheduler = app.scheduler(delivered)
            for _ in range(count):
                answer = await scheduler.beat()
                if answer:
                    said.append(answer)
                frozen.tick(every)
    with freeze_time(start, real_asyncio=True) as frozen:
        asyncio.run(body(frozen))
    app.close()
    return said


@pytest.mark.parametrize("content", ["", "# Heartbeat\n<!-- - [daily 09:00] nothing yet\n- 还没有任务 -->\n"])
def test_an_idle_heartbeat_makes_no_call_over_a_simulated_day(home: Path, fake_openai: FakeOpenAIServer,
                                                              content: str) -> None:
    enable_heartbeat(home)
    (home / "workspace" / "HEARTBEAT.md").write_text(content, encoding="utf-8")
    _beats(home, fake_openai, 48, timedelta(minutes=30))
    assert fake_openai.chat_requests() == []


def test_a_heartbeat_task_runs_when_new_then_when_due(home: Path, fake_openai: FakeOpenAIServer) -> None:
    enable_heartbeat(home)
    heartbeat = home / "workspace" / "HEARTBEAT.md"
    heartbeat.write_text("# Heartbeat\n- [daily 09:00] Read today's note and list my to-dos.\n", encoding="utf-8")
    _beats(home, fake_openai, 48, timedelta(minutes=30))  # 10:00 to 09:30 the next day
    asked = [json.dumps(r["messages"][-1], ensure_ascii=False) for r in fake_openai.chat_requests()]
    assert len(asked) == 2  # new at 10:00, due again at 09:00 the next day
    heartbeat.write_text("# Heartbeat\n- [daily 09:00] Read today's note and list my to-dos.\n"
                         "- [每2小时] 看看有没有新邮件。\n", encoding="utf-8")
    _beats(home, fake_openai, 8, timedelta(minutes=30), start="2025-03-11 02:00:00")  # 10:00 to 13:30
    later = [r["messages"][-1]["content"] for r in fake_openai.chat_requests()[2:]]
    assert len(later) == 2 and all("看看有没有新邮件" in text and "to-dos" not in text for text in later)


def test_the_heartbeat_skips_at_the_background_cap_and_its_tokens_count_as_heartbeat(
        home: Path, fake_openai: FakeOpenAIServer) -> None:
    enable_heartbeat(home)
    (home / "workspace" / "HEARTBEAT.md").write_text("- Check the calendar. 看看日历。\n", encoding="utf-8")
    _beats(home, fake_openai, 1, timedelta(minutes=30))
    workspace = App.open(home).workspace
    assert by_purpose(workspace)["heartbeat"].calls == 1  # a quiet beat ("ok" is not delivered) still counts
    set_budget(home, background_tokens_per_day=1_000)
    spend(workspace, DAY1, "summary", 1_000)
    _beats(home, fake_openai, 2, timedelta(minutes=30), start="2025-03-10 03:00:00")
    assert len(fake_openai.chat_requests()) == 1


# -- seeing it ----------------------------------------------------------------------------------------------------


def test_usage_and_status_show_today_the_month_and_the_caps(home: Path, fake_openai: FakeOpenAIServer,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    set_budget(home, background_tokens_per_day=200_000, usd_per_day=1.0,
               prices={"gpt-4o-mini": {"input": 0.15, "cached_input": 0.075, "output": 0.6}})
    workspace = App.open(home).workspace
    spend(workspace, DAY1 - timedelta(days=3), "summary", 5_000)
    fake_openai.reply_text("ok", usage={"prompt_tokens": 1_000, "completion_tokens": 50}, cached_tokens=800)
    with freeze_time(MORNING, real_asyncio=True):
        [status] = turns(workspace, fake_openai, ["/status"])
        assert turns(workspace, fake_openai, ["hi 你好"]) == ["ok"]
        code_en = main(["usage"])
        out_en, _ = capsys.readouterr()
        code_zh = main(["usage", "--lang", "zh"])
        out_zh, _ = capsys.readouterr()
    assert "spent today: background 0 of 200,000 tokens (0%), chat 0 tokens, $0.00 of $1.00 background" in status
    assert code_en == code_zh == 0
    assert "Model use today (2025-03-10)" in out_en and "Last 30 days (2025-02-09 to 2025-03-10)" in out_en
    assert "chat" in out_en and "200" in out_en and "800" in out_en and "summary" in out_en
    assert re.search(r"background: [\d,]+ of 200,000 tokens \(\d+%\)", out_en) and "background share: " in out_en
    assert "今天的模型用量" in out_zh and "最近 30 天" in out_zh and "摘要" in out_zh and "后台占全部 tokens" in out_zh


@pytest.mark.parametrize("said", ["I live in Hangzhou and cycle to work.", "我住在杭州，每天骑车上班。"])
def test_background_calls_go_to_agents_background_and_chat_stays_on_its_model(
        home: Path, fake_openai: FakeOpenAIServer, capsys: pytest.CaptureFixture[str], said: str) -> None:
    from tests.agent_helpers import is_flush_request, is_summary_request

    with FakeOpenAIServer() as cheap:
        with edit_config(home) as config:
            config["providers"]["openai"] = {"api_key": "sk-test-0123456789abc", "api_base": fake_openai.base_url}
            config["providers"]["local"] = {"api_key": "sk-local", "api_base": cheap.base_url}
            config["agents"]["background"] = {"provider": "local", "model": "qwen-small"}
        fake_openai.responder = lambda body: "Noted. / 记下了。"
        cheap.responder = lambda body: "The user told where they live. / 用户说了住处。" if is_summary_request(body) \
            else "NONE"
        for n in range(6):
            assert main(["chat", "--session", "cli:bg", "-m", f"{said} ({n})"]) == 0
        assert main(["chat", "--session", "cli:bg", "-m", "/compact"]) == 0
        capsys.readouterr()
        background = cheap.chat_requests()
    assert background and {body["model"] for body in background} == {"qwen-small"}
    assert any(is_summary_request(body) for body in background)
    assert any(is_flush_request(body) for body in background)
    chat = fake_openai.chat_requests()
    assert len(chat) == 6 and not any(is_summary_request(b) or is_flush_request(b) for b in chat)
