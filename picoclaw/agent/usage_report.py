"""What the spend ledger says, for people: today's and the last 30 days' tokens and cost by purpose (cached and
uncached input apart), how close each cap is, and the days for a chart; in English or Chinese (`picoclaw usage`,
the console's stats page)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta

from picoclaw.agent.allowance import PURPOSES, is_background, is_chat
from picoclaw.cjk import letters
from picoclaw.config import BudgetConfig
from picoclaw.memory import Day, Spent

REPORT_DAYS = 30


@dataclass(frozen=True)
class Period:
    """A stretch of days: what each purpose spent in it."""

    first: date
    last: date
    spent: dict[str, Spent]
    damaged: tuple[str, ...] = ()  # days the ledger was found damaged on

    def total(self, background: bool | None = None) -> Spent:
        found = Spent()
        for purpose, spent in self.spent.items():
            if background is None or is_background(purpose) == background:
                found = found + spent
        return found


@dataclass(frozen=True)
class SpendReport:
    """Today, the last REPORT_DAYS days, and each of those days' background and chat tokens (oldest first)."""

    today: Period
    month: Period
    daily: list[tuple[date, int, int]]
    budget: BudgetConfig


def spend_report(days: dict[str, Day], budget: BudgetConfig, today: date) -> SpendReport:
    """The report of the ledger's `days` (SpendLedger.read) as of `today`."""
    first = today - timedelta(days=REPORT_DAYS - 1)
    daily = []
    for offset in range(REPORT_DAYS):
        day = days.get((first + timedelta(days=offset)).isoformat()) or Day()
        daily.append((first + timedelta(days=offset), day.total(is_background).tokens, day.total(is_chat).tokens))
    return SpendReport(_period(days, today, today), _period(days, first, today), daily, budget)


def _period(days: dict[str, Day], first: date, last: date) -> Period:
    spent: dict[str, Spent] = {}
    damaged = []
    for name, day in sorted(days.items()):
        if not first.isoformat() <= name <= last.isoformat():
            continue
        if day.damaged:
            damaged.append(name)
        for purpose, used in day.spent.items():
            spent[purpose] = spent.get(purpose, Spent()) + used
    return Period(first, last, spent, tuple(damaged))


_WORDS = {
    "en": {
        "today": "Model use today ({day})", "month": "Last {n} days ({first} to {last})",
        "head": ("purpose", "calls", "input", "cached input", "output", "cost"),
        "total": "total", "none": "  no model calls", "background": "background", "chat": "chat",
        "of": "{used} of {cap} tokens ({share}%)", "no_cap": "{used} tokens (no cap)",
        "usd": "background cost: {used} of {cap} ({share}%)", "share": "background share: {share}% of all tokens",
        "unknown": "cost unknown for {n} call(s): their model has no price in budget.prices",
        "no_prices": "cost: not counted (budget.prices lists no model)",
        "estimated": "{n} call(s) reported no usage: their tokens are picoclaw's estimate",
        "damaged": "the spend ledger was found damaged on {days}: those days count as spent",
    },
    "zh": {
        "today": "今天的模型用量（{day}）", "month": "最近 {n} 天（{first} 至 {last}）",
        "head": ("用途", "调用", "输入", "缓存输入", "输出", "费用"),
        "total": "合计", "none": "  没有模型调用", "background": "后台", "chat": "聊天",
        "of": "{used} / {cap} tokens（{share}%）", "no_cap": "{used} tokens（无上限）",
        "usd": "后台费用：{used} / {cap}（{share}%）", "share": "后台占全部 tokens 的 {share}%",
        "unknown": "{n} 次调用费用未知：budget.prices 里没有它们的模型价格",
        "no_prices": "费用：未统计（budget.prices 没有列出模型）",
        "estimated": "{n} 次调用没有报告用量：其 tokens 是 picoclaw 的估算",
        "damaged": "用量账本在 {days} 被发现损坏：这些天按预算已用完计算",
    },
}

PURPOSE_NAMES = {
    "zh": {"chat": "聊天", "heartbeat": "心跳", "agent_job": "定时任务", "summary": "摘要", "flush": "记忆整理",
           "compression": "长期记忆压缩", "reflection": "反思", "query_rewrite": "查询改写", "lesson": "经验总结",
           "eval": "记忆评测"},
}


def purpose_name(purpose: str, lang: str) -> str:
    return PURPOSE_NAMES.get(lang, {}).get(purpose, purpose)


def usd(micro: int) -> str:
    return f"${micro / 1_000_000:,.4f}"


def report_lines(report: SpendReport, lang: str = "en") -> list[str]:
    """The report as text lines (`lang` "en" or "zh")."""
    words = _WORDS.get(lang, _WORDS["en"])
    lines = [str(words["today"]).format(day=report.today.last.isoformat())]
    lines += _table(report.today, report.budget, lang) + _caps(report.today, report.budget, lang)
    lines += ["", str(words["month"]).format(n=REPORT_DAYS, first=report.month.first.isoformat(),
                                             last=report.month.last.isoformat())]
    lines += _table(report.month, report.budget, lang)
    total = report.month.total()
    if total.tokens:
        share = report.month.total(background=True).tokens * 100 // total.tokens
        lines.append("  " + str(words["share"]).format(share=share))
    lines += _notes(report.month, report.budget, lang)
    return lines


def _table(period: Period, budget: BudgetConfig, lang: str) -> list[str]:
    words = _WORDS.get(lang, _WORDS["en"])
    if not period.spent:
        return [str(words["none"])]
    known = [p for p in PURPOSES if p in period.spent] + sorted(set(period.spent) - set(PURPOSES))
    rows = [tuple(words["head"])]
    for purpose in known:
        rows.append(_row(purpose_name(purpose, lang), period.spent[purpose], budget))
    rows.append(_row(str(words["total"]), period.total(), budget))
    widths = [max(_width(row[i]) for row in rows) for i in range(len(rows[0]))]

    def cell(text: str, i: int) -> str:
        pad = " " * (widths[i] - _width(text))
        return text + pad if i == 0 else pad + text

    return ["  " + "  ".join(cell(text, i) for i, text in enumerate(row)) for row in rows]


def _width(text: str) -> int:
    """Columns `text` takes in a terminal: a CJK letter takes two."""
    return len(text) + len(letters(text))


def _row(name: str, spent: Spent, budget: BudgetConfig) -> tuple[str, ...]:
    cost = usd(spent.micro_usd) + ("+?" if spent.unpriced and spent.micro_usd else "") if budget.prices else "-"
    if budget.prices and spent.unpriced and not spent.micro_usd:
        cost = "?"
    return (name, f"{spent.calls:,}", f"{spent.uncached:,}", f"{spent.cached:,}", f"{spent.completion:,}", cost)


def _caps(period: Period, budget: BudgetConfig, lang: str) -> list[str]:
    words = _WORDS.get(lang, _WORDS["en"])
    lines = []
    for name, background, cap in (("background", True, budget.background_tokens_per_day),
                                  ("chat", False, budget.chat_tokens_per_day)):
        used = period.total(background=background).tokens
        said = (str(words["of"]).format(used=f"{used:,}", cap=f"{cap:,}", share=used * 100 // cap) if cap else
                str(words["no_cap"]).format(used=f"{used:,}"))
        key = "background_tokens_per_day" if background else "chat_tokens_per_day"
        lines.append(f"  {words[name]}: {said}" + (f"  (budget.{key})" if cap else ""))
    if budget.usd_per_day:
        cap = round(budget.usd_per_day * 1_000_000)
        used = period.total(background=True).micro_usd
        lines.append("  " + str(words["usd"]).format(used=usd(used), cap=usd(cap), share=used * 100 // cap)
                     + "  (budget.usd_per_day)")
    return lines + _notes(period, budget, lang, caps=True)


def _notes(period: Period, budget: BudgetConfig, lang: str, *, caps: bool = False) -> list[str]:
    words = _WORDS.get(lang, _WORDS["en"])
    total = period.total()
    lines = []
    if period.damaged:
        lines.append("  " + str(words["damaged"]).format(days=", ".join(period.damaged)))
    if caps:
        return lines
    if not budget.prices and total.calls:
        lines.append("  " + str(words["no_prices"]))
    elif total.unpriced:
        lines.append("  " + str(words["unknown"]).format(n=total.unpriced))
    if total.estimated:
        lines.append("  " + str(words["estimated"]).format(n=total.estimated))
    return lines
