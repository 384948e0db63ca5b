#!/usr/bin/env python3
"""Speed of memory retrieval over a large MEMORY.md: picoclaw's cached BM25 vs a per-turn substring scan.

What is measured
    A synthetic MEMORY.md of N ``## YYYY-MM-DD`` entries (default N = 1,000, 10,000 and 50,000; about
    half Chinese, half English, built from templates over a varied vocabulary: people, places, projects,
    tools, code identifiers, error codes, numbers; seeded, so the same file every run) is written through
    ``MemoryStore.rewrite_long_term`` into a temporary workspace. A fixed set of 20 queries (English,
    Chinese and mixed; most hit, some match nothing) is then timed with ``time.perf_counter``:

    * baseline: what PicoClaw does on every turn: read MEMORY.md, split it into blocks at ``## `` headings
      and blank lines, lower-case every block and count how many of the query's keywords it contains
      (``strings.Contains``), keep the best 10. Keywords: lower-cased ASCII words ``[a-z0-9]+`` of length
      >= 2 plus the query's whitespace-separated tokens that contain non-ASCII characters (a Chinese
      query without spaces is one keyword);
    * ours warm: ``KeywordSearch.search(q, 10)`` after one warm-up query built the cached index (the
      per-query cost on an unchanged MEMORY.md: one stat + BM25 scoring, in numpy arrays from 2,000 blocks
      on, as a file of that size searched again is: memory/search/array_scores.py);
    * ours cold: the first ``search`` of a fresh ``KeywordSearch``: read + split + index + score (the
      cost after MEMORY.md changed). The file is in the OS page cache in every case;
    * + standing: what a turn runs, ``RerankedSearch`` around the warm ``KeywordSearch`` at the default
      policy (30 candidates, each one-line entry tokenised to compare it with the others, priors);
    * ours after an append: the first search after one new entry was appended through
      ``MemoryStore.append_long_term`` (what a memory written in a turn leaves the next turn), on the warm
      ``KeywordSearch``; a new entry each of ``--reps`` times, median.

    Baseline, warm and + standing: the median over all queries of ``--reps`` repetitions of the query set (>= 5).
    Cold: the median over ``--reps`` fresh retrievers, each timed on one query of the set in turn.

    The optional memory index (``picoclaw.memory.index``, second table): the same generator writes
    N chunks (default 10,000 and 100,000) as daily notes of 100 entries each, so that "one changed file"
    means what it does for a user: one day's note. Timed, median over ``--reps`` runs of the query set:
    ``MemoryIndex.search_async(q, 10)`` (in one event loop, as a turn searches) keyword-only (FTS5) and
    hybrid, where the hybrid's vectors come from a deterministic hash embedder (384 dimensions, like
    all-MiniLM-L6-v2) so the numbers are the index's own cost (SQLite, numpy, the sync check before every
    search) and not a model's; a real model adds its own time to embed the query. Also timed: building the index
    from nothing (keyword-only, and hybrid with the hash embedder), and the sync after one entry is appended to
    one day's note through the store (median of ``--reps`` appends; the changed chunk is the only one embedded).

Run (from the repository root):
    python bench/retrieval.py
    python bench/retrieval.py --sizes 1000 10000 --reps 7 --show-queries
    python bench/retrieval.py --sizes 10000 --index-sizes 10000    # --index-sizes with no value: skip it
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import heapq
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python bench/retrieval.py` without installing picoclaw
    sys.path.insert(0, str(REPO))

from picoclaw.config import EmbeddingsConfig, IndexConfig  # noqa: E402
from picoclaw.memory.index import MemoryIndex  # noqa: E402
from picoclaw.memory.index.chunks import DEFAULT_LIMIT, TokenLimit  # noqa: E402
from picoclaw.memory.search import KeywordSearch, RerankedSearch  # noqa: E402
from picoclaw.memory.store import MemoryStore  # noqa: E402
from picoclaw.policy_schema import MemoryPolicy  # noqa: E402
from picoclaw.storage import FilesStorage  # noqa: E402

QUERIES: tuple[str, ...] = (
    # English, hitting
    "When is the deadline for project Silver Falcon?",
    "What did Priya recommend instead of Jenkins?",
    "handleWebSocketReconnect ECONNREFUSED",
    "dentist appointment on Thursday",
    "latency after the Kubernetes migration",
    "What is my dog called?",
    "flight to Lisbon",
    "budget for the marketing offsite",
    # English, no hit
    "quantum chromodynamics lattice simulation",
    "xylophone tuning competition",
    # Chinese, hitting
    "项目截止日期是哪天",
    "我的猫叫什么名字",
    "和王芳在哪里吃的火锅",
    "数据库 迁移 延迟",
    "牙医 预约",
    "去成都的高铁",
    # Chinese, no hit
    "火星殖民地",
    "量子色动力学",
    # mixed
    "PostgreSQL 连接池 配置",
    "Redis 缓存 超时",
)

EN_PEOPLE = """Alice Bob Carol David Priya Mateo Hannah Kenji Olga Samir Fatima Lucas Chloe Ethan Ingrid
Marcus Nadia Oliver Rosa Tomas Yusuf Zoe Liam Amara Felix Greta Hugo Iris Jonas Leila""".split()
ZH_PEOPLE = """张伟 王芳 李娜 刘洋 陈静 杨磊 赵敏 黄勇 周杰 吴霞 徐明 孙丽 马超 朱婷 胡斌 郭靖 林峰 何琳 高翔 罗兰
梁宇 宋佳 郑凯 谢晨 韩雪 唐亮 冯涛 董洁 萧然 程远""".split()
EN_PLACES = """Lisbon Tokyo Berlin Nairobi Montreal Oslo Seoul Lima Prague Dublin Austin Porto Kyoto Vienna
Melbourne Reykjavik Marrakesh Hanoi Zurich Denver""".split()
ZH_PLACES = """成都 杭州 西安 厦门 青岛 大理 苏州 南京 重庆 长沙
昆明 哈尔滨 桂林 拉萨 深圳 武汉 天津 三亚 丽江 洛阳""".split()
ADJ = """Silver Amber Crimson Quiet Rapid Hidden Northern Golden Iron Velvet Electric Frozen Lunar Copper Wild
Hollow Bright Misty Solar Cobalt""".split()
ANIMALS = """Falcon Otter Badger Heron Lynx Panda Marlin Raven Bison Gecko Puffin Walrus Jackal Moose Ibis
Koala Narwhal Osprey Tapir Yak""".split()
ZH_PROJECTS = """支付网关 会员系统 推荐引擎 数据中台 风控平台 客服机器人 搜索服务 日志平台
订单中心 消息队列 监控告警 报表系统 权限中心 营销活动 物流跟踪 库存管理 内容审核 用户画像 计费系统 灰度发布""".split()
TOOLS = """Jenkins GitLab Terraform Ansible Grafana Prometheus Kafka RabbitMQ PostgreSQL MySQL Redis MongoDB
Elasticsearch ClickHouse Airflow Docker Kubernetes Nginx Envoy Sentry Vault Consul Spark Flink Celery
FastAPI Django React Svelte Webpack""".split()
VERBS = "handle fetch parse render sync retry flush load save resolve build validate".split()
NOUNS = "WebSocket Session Token Cache Order Invoice Upload Config Payload Queue Schema Socket".split()
SUFFIXES = "Reconnect Timeout Error Request Batch Update State Handler".split()
ERRORS = """ECONNREFUSED ETIMEDOUT ECONNRESET ENOSPC EACCES OOMKilled HTTP_502 HTTP_429 DEADLOCK_DETECTED
SSL_ERROR_SYSCALL""".split()
EN_TOPICS = """the quarterly roadmap|hiring plans|the new pricing page|on-call rotation|the design review|
the customer churn numbers|the database migration|the mobile release|accessibility fixes|the security audit|
the onboarding flow|the marketing offsite|tax paperwork|the kitchen renovation|marathon training|
learning Portuguese|the wedding guest list|the school fundraiser|the garden layout|a used car"""
ZH_TOPICS = """季度规划 招聘计划 新定价页 值班安排 设计评审 用户流失 数据库迁移 移动端发版 无障碍改进 安全审计 新人引导
团建活动 报税材料 厨房装修 马拉松训练 学日语 婚礼名单 孩子的学校 阳台花园 二手车""".split()
EN_FOODS = "ramen tacos pho dumplings paella sushi curry pizza falafel bibimbap croissants risotto".split()
ZH_FOODS = "火锅 烤鸭 小笼包 麻辣烫 酸菜鱼 煎饼果子 兰州拉面 肠粉 烧烤 羊肉泡馍 螺蛳粉 担担面".split()
EN_PETS = ("dog", "cat", "parrot", "rabbit", "hamster", "tortoise")
ZH_PETS = ("狗", "猫", "鹦鹉", "兔子", "仓鼠", "乌龟")
PET_NAMES = "Bob Mochi Pepper Biscuit Luna Noodle Ziggy Olive Tofu Maple Pixel Waffle".split()
BOOKS = """Sapiens|Dune|The Pragmatic Programmer|Atomic Habits|Thinking, Fast and Slow|The Three-Body Problem|
Designing Data-Intensive Applications|Educated|The Overstory|Project Hail Mary|Deep Work|The Left Hand of Darkness"""
ZH_BOOKS = "三体 活着 围城 平凡的世界 百年孤独 人类简史 红楼梦 白夜行 置身事内 长安的荔枝".split()
ERRANDS_EN = """dentist appointment|renew the passport|pick up the dry cleaning|car inspection|vet visit for the {pet}|
parent-teacher meeting|haircut|return the library books|pay the electricity bill|yoga class"""
ERRANDS_ZH = "看牙医 办护照 取干洗的衣服 年检 带宠物打疫苗 家长会 理发 还图书馆的书 交电费 上瑜伽课".split()
WEEKDAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
ZH_WEEKDAYS = "周一 周二 周三 周四 周五 周六 周日".split()
OPINIONS = """worth rereading|slow in the middle but the ending is great|overrated|surprisingly practical|
too long by a third|the best thing I read this year"""
ZH_OPINIONS = "值得再读一遍 中间有点拖沓 名不副实 出乎意料地实用 篇幅太长 今年读过最好的书".split()
REASONS_EN = """it is cheaper to run|the team already knows it|it scales better|the docs are better|
it has fewer moving parts|the license is friendlier"""
REASONS_ZH = "运行成本更低 团队已经熟悉 扩展性更好 文档更完善 组件更少 许可证更友好".split()


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split("|")]


def _ident(rng: random.Random) -> str:
    return rng.choice(VERBS) + rng.choice(NOUNS) + rng.choice(SUFFIXES)


def _project(rng: random.Random) -> str:
    return f"{rng.choice(ADJ)} {rng.choice(ANIMALS)}"


def english_entry(rng: random.Random) -> str:
    p, q = rng.sample(EN_PEOPLE, 2)
    kind = rng.randrange(10)
    if kind == 0:
        return (f"The deadline for project {_project(rng)} is {rng.choice(WEEKDAYS)} {rng.randint(1, 28)} "
                f"{rng.choice(['March', 'April', 'May', 'June', 'September', 'October'])}; {p} owns the release notes.")
    if kind == 1:
        new, old = rng.sample(TOOLS, 2)
        return (f"{p} recommended {new} instead of {old} because "
                f"{rng.choice(_split(REASONS_EN))}.")
    if kind == 2:
        return (f"Fixed {_ident(rng)} not retrying on {rng.choice(ERRORS)}; see ticket "
                f"{rng.choice(['OPS', 'WEB', 'API', 'INFRA'])}-{rng.randint(100, 9999)}.")
    if kind == 3:
        errand = rng.choice(_split(ERRANDS_EN)).format(pet=rng.choice(EN_PETS))
        return f"Reminder: {errand} on {rng.choice(WEEKDAYS)} at {rng.randint(8, 18)}:{rng.choice(['00', '30'])}."
    if kind == 4:
        before = rng.randint(300, 1500)
        return (f"After the {rng.choice(TOOLS)} migration, p99 latency of {_project(rng)} went from {before} ms "
                f"to {before // rng.randint(2, 6)} ms.")
    if kind == 5:
        pet = rng.choice(EN_PETS)
        return f"My {pet} is called {rng.choice(PET_NAMES)}; {p} looks after the {pet} when I travel."
    if kind == 6:
        return (f"Booked a flight to {rng.choice(EN_PLACES)} with {p} for the {rng.choice(_split(EN_TOPICS))} trip, "
                f"seat {rng.randint(3, 40)}{rng.choice('ABCDEF')}.")
    if kind == 7:
        return (f"Had {rng.choice(EN_FOODS)} with {p} and {q} in {rng.choice(EN_PLACES)}; we talked about "
                f"{rng.choice(_split(EN_TOPICS))}.")
    if kind == 8:
        return f"Finished reading {rng.choice(_split(BOOKS))}: {rng.choice(_split(OPINIONS))}."
    return (f"Budget for {rng.choice(_split(EN_TOPICS))}: {rng.randint(2, 90) * 100} USD, approved by {p}; "
            f"{q} will track spending in {rng.choice(['a spreadsheet', 'Notion', 'the finance tool'])}.")


def chinese_entry(rng: random.Random) -> str:
    p, q = rng.sample(ZH_PEOPLE, 2)
    kind = rng.randrange(10)
    if kind == 0:
        return (f"{rng.choice(ZH_PROJECTS)}项目的截止日期是 {rng.randint(1, 12)} 月 {rng.randint(1, 28)} 日，"
                f"{p}负责发布说明。")
    if kind == 1:
        new, old = rng.sample(TOOLS, 2)
        return f"{p}建议用 {new} 替代 {old}，理由是{rng.choice(REASONS_ZH)}。"
    if kind == 2:
        return f"修复了 {_ident(rng)} 在 {rng.choice(ERRORS)} 时不重试的问题，工单 {rng.randint(100, 9999)}。"
    if kind == 3:
        return f"提醒：{rng.choice(ZH_WEEKDAYS)}下午 {rng.randint(1, 6)} 点{rng.choice(ERRANDS_ZH)}。"
    if kind == 4:
        before = rng.randint(300, 1500)
        return (f"{rng.choice(ZH_PROJECTS)}完成{rng.choice(['数据库', '缓存', '消息队列', '容器'])}迁移后，"
                f"延迟从 {before}ms 降到 {before // rng.randint(2, 6)}ms，{rng.choice(TOOLS)} 连接池配置也调整了。")
    if kind == 5:
        pet = rng.choice(ZH_PETS)
        return f"我的{pet}叫 {rng.choice(PET_NAMES)}，出差时由{p}帮忙照顾。"
    if kind == 6:
        return f"订了去{rng.choice(ZH_PLACES)}的高铁票，和{p}一起，{rng.choice(ZH_WEEKDAYS)}早上出发。"
    if kind == 7:
        return f"和{p}、{q}在{rng.choice(ZH_PLACES)}吃了{rng.choice(ZH_FOODS)}，聊到{rng.choice(ZH_TOPICS)}。"
    if kind == 8:
        return f"读完了《{rng.choice(ZH_BOOKS)}》，觉得{rng.choice(ZH_OPINIONS)}。"
    return (f"{rng.choice(ZH_TOPICS)}的预算是 {rng.randint(2, 90) * 1000} 元，{p}已批准，"
            f"{q}用{rng.choice(['表格', '记账软件', '财务系统'])}跟踪支出。")


def synthetic_memory(blocks: int, seed: int) -> str:
    """`blocks` entries in the store's MEMORY.md format, oldest first, deterministic for a seed."""
    rng = random.Random(f"{seed}:{blocks}")
    day = date(2020, 1, 1)
    entries = []
    for _ in range(blocks):
        day += timedelta(days=rng.choice((0, 0, 1, 1, 2)))
        text = chinese_entry(rng) if rng.random() < 0.5 else english_entry(rng)
        entries.append(f"## {day.isoformat()}\n{text}\n")
    return "\n".join(entries)


# -- the PicoClaw-style baseline -------------------------------------------------------------------

_BLOCK_SPLIT = re.compile(r"\n(?=## )|\n[ \t]*\n")
_ASCII_WORD = re.compile(r"[a-z0-9]+")
_EDGE = re.compile(r"^[\W_]+|[\W_]+$")


def picoclaw_keywords(query: str) -> list[str]:
    lowered = query.lower()
    words = [w for w in _ASCII_WORD.findall(lowered) if len(w) >= 2]
    others = [_EDGE.sub("", tok) for tok in lowered.split() if not tok.isascii()]
    return list(dict.fromkeys(words + [o for o in others if o]))


def baseline_search(path: Path, query: str, limit: int) -> list[str]:
    """Read, split, substring-score every block, best `limit` (ties in file order), score 0 dropped."""
    text = path.read_text(encoding="utf-8")
    blocks = [b for b in _BLOCK_SPLIT.split(text) if b.strip()]
    keywords = picoclaw_keywords(query)
    scored = []
    for number, block in enumerate(blocks):
        low = block.lower()
        score = sum(1 for kw in keywords if kw in low)
        if score:
            scored.append((score, -number))
    return [blocks[-n] for _, n in heapq.nlargest(limit, scored)]


# -- measurement -----------------------------------------------------------------------------------


def ms(seconds: float) -> float:
    return seconds * 1000.0


def measure(size: int, seed: int, reps: int, details: list[str] | None
            ) -> tuple[float, float, float, float, float, float, float]:
    """(file MB, baseline median ms, warm median ms, cold median ms, warm p95 ms, + standing median ms, after an
    append median ms) for one size.

    With `details`, appends one line per query: hits of ours and of the baseline, ours warm ms.
    """
    with tempfile.TemporaryDirectory(prefix="picoclaw-bench-") as tmp:
        store = MemoryStore(Path(tmp) / "workspace" / "memory", UTC, storage=FilesStorage(Path(tmp) / "workspace"))
        store.rewrite_long_term(synthetic_memory(size, seed))
        path = store.long_term_path
        megabytes = path.stat().st_size / 1e6

        cold: list[float] = []
        for rep in range(reps):
            retriever = KeywordSearch(store)
            q = QUERIES[rep % len(QUERIES)]
            t0 = time.perf_counter()
            retriever.search(q, 10)
            cold.append(time.perf_counter() - t0)

        retriever = KeywordSearch(store)
        retriever.search(QUERIES[0], 10)  # warm-up: builds the cached index
        standing = RerankedSearch(retriever, store, MemoryPolicy)
        # Baseline, warm and standing alternate query by query, so a busy moment of the machine hits all alike.
        baseline: list[float] = []
        warm: list[float] = []
        turn: list[float] = []
        for _ in range(reps):
            for q in QUERIES:
                t0 = time.perf_counter()
                baseline_search(path, q, 10)
                t1 = time.perf_counter()
                retriever.search(q, 10)
                t2 = time.perf_counter()
                standing.search(q, 10)
                t3 = time.perf_counter()
                baseline.append(t1 - t0)
                warm.append(t2 - t1)
                turn.append(t3 - t2)

        if details is not None:
            details.append(f"\n{size:,} blocks: hits in the top 10 (ours / baseline), ours warm ms, query")
            for q in QUERIES:
                t0 = time.perf_counter()
                ours = retriever.search(q, 10)
                took = time.perf_counter() - t0
                details.append(f"  {len(ours):>2} / {len(baseline_search(path, q, 10)):>2}  {ms(took):7.3f}  {q}")

        appended: list[float] = []
        rng = random.Random(seed + 1)  # entries of the same kinds as the file's, new ones
        for rep in range(reps):
            store.append_long_term((english_entry if rep % 2 else chinese_entry)(rng))
            t0 = time.perf_counter()
            retriever.search(QUERIES[rep % len(QUERIES)], 10)
            appended.append(time.perf_counter() - t0)

    warm_sorted = sorted(warm)
    p95 = warm_sorted[min(len(warm_sorted) - 1, int(0.95 * len(warm_sorted)))]
    return (megabytes, ms(statistics.median(baseline)), ms(statistics.median(warm)),
            ms(statistics.median(cold)), ms(p95), ms(statistics.median(turn)), ms(statistics.median(appended)))


class HashEmbedder:
    """Deterministic 384-dimension unit vectors from a text's hash: the index's cost without a model's."""

    key = label = "bench-hash-384"

    def token_limit(self) -> TokenLimit:
        return DEFAULT_LIMIT

    async def embed(self, texts: list[str], *, query: bool = False) -> np.ndarray:
        rows = [np.random.default_rng(int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest())
                                      ).standard_normal(384) for t in texts]
        matrix = np.asarray(rows, dtype=np.float32).reshape(len(texts), 384)
        return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)

    def close(self) -> None:
        pass


NOTE_ENTRIES = 100  # entries per daily note in the index bench


def write_notes(store: MemoryStore, chunks: int, seed: int) -> list[date]:
    """`chunks` synthetic entries as daily notes of NOTE_ENTRIES entries each; returns the days."""
    entries = synthetic_memory(chunks, seed).split("\n\n## ")
    days = []
    for n, start in enumerate(range(0, len(entries), NOTE_ENTRIES)):
        day = date(2020, 1, 1) + timedelta(days=n)
        # A note's entries are `## HH:MM` + text, as MemoryStore.append_note writes them.
        body = "\n".join(f"## {i // 60 % 24:02d}:{i % 60:02d}\n{e.split(chr(10), 1)[1].strip()}\n"
                          for i, e in enumerate(entries[start:start + NOTE_ENTRIES]))
        path = store.note_path(day)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {day.isoformat()}\n\n{body}", encoding="utf-8")
        # Notes written an hour ago, as a user's are: a file changed within the last moments is re-hashed
        # on every sync (its mtime cannot yet be trusted), which is not the steady state being measured.
        an_hour_ago = time.time() - 3600
        os.utime(path, (an_hour_ago, an_hour_ago))
        days.append(day)
    return days


async def timed_searches(index: MemoryIndex, reps: int) -> list[float]:
    """Seconds per search, each query `reps` times, in one event loop as the agent searches."""
    await index.search_async(QUERIES[0], 10)  # warm-up: loads the vectors
    times = []
    for _ in range(reps):
        for q in QUERIES:
            t0 = time.perf_counter()
            await index.search_async(q, 10)
            times.append(time.perf_counter() - t0)
    return times


def measure_index(chunks: int, seed: int, reps: int) -> dict[str, float]:
    """Milliseconds: build (keyword, hybrid), search median (keyword, hybrid), sync after one append."""
    result: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="picoclaw-bench-index-") as tmp:
        store = MemoryStore(Path(tmp) / "workspace" / "memory", UTC, storage=FilesStorage(Path(tmp) / "workspace"))
        store.long_term_path.parent.mkdir(parents=True, exist_ok=True)
        days = write_notes(store, chunks, seed)
        for mode, embedder in (("keyword", None), ("hybrid", HashEmbedder())):
            settings = IndexConfig(enabled=True, sources=["notes"],
                                   embeddings=EmbeddingsConfig(provider="local") if embedder else None)
            # As the product builds it: notes and MEMORY.md ranked on the keyword side by the keyword search.
            index = MemoryIndex(store, settings, embedder, sessions_dir=Path(tmp) / "workspace" / "sessions",
                                keywords=KeywordSearch(store))
            store.on_change(index.mark_changed)
            try:
                t0 = time.perf_counter()
                index.sync()
                result[f"build {mode}"] = ms(time.perf_counter() - t0)
                assert index.status().chunks == chunks, (index.status().chunks, chunks)
                times = asyncio.run(timed_searches(index, reps))
                result[f"search {mode}"] = ms(statistics.median(times))
                if embedder is not None:
                    syncs = []
                    for rep in range(reps):
                        at = datetime.combine(days[rep % len(days)], datetime.min.time(), UTC)
                        store.append_note(f"bench entry {rep}: 新的一条记录 number {rep}", at=at + timedelta(hours=23))
                        t0 = time.perf_counter()
                        report = index.sync()
                        syncs.append(time.perf_counter() - t0)
                        assert report.embedded == 1 and len(report.files_changed) == 1, report
                    result["sync one file"] = ms(statistics.median(syncs))
            finally:
                index.close()
            shutil.rmtree(store.memory_dir / "index")
    return result


def print_index_table(sizes: Sequence[int], seed: int, reps: int) -> None:
    print(f"\nMemoryIndex (optional) over daily notes of {NOTE_ENTRIES} entries, {len(QUERIES)} queries x {reps} reps;"
          " hybrid with a hash embedder (index cost only)")
    header = (f"| {'chunks':>7} | {'build keyword s':>15} | {'build hybrid s':>14} | {'search keyword ms':>17} | "
              f"{'search hybrid ms':>16} | {'sync one changed file ms':>24} |")
    print(header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    for size in sizes:
        r = measure_index(size, seed, reps)
        print(f"| {size:>7,} | {r['build keyword'] / 1000:>15.1f} | {r['build hybrid'] / 1000:>14.1f} | "
              f"{r['search keyword']:>17.2f} | {r['search hybrid']:>16.2f} | {r['sync one file']:>24.1f} |", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 50_000],
                        help="numbers of MEMORY.md blocks (default 1000 10000 50000)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of the query set (default 5, at least 5)")
    parser.add_argument("--seed", type=int, default=4, help="seed of the synthetic MEMORY.md (default 4)")
    parser.add_argument("--show-queries", action="store_true", help="print hits and time of each query")
    parser.add_argument("--index-sizes", type=int, nargs="*", default=[10_000, 100_000],
                        help="chunks for the optional index table (default 10000 100000; none: skip it)")
    args = parser.parse_args(argv)
    if args.reps < 5:
        parser.error("--reps must be at least 5")

    started = time.perf_counter()
    print(f"KeywordSearch.search(q, 10) on a synthetic MEMORY.md, {len(QUERIES)} queries x {args.reps} reps")
    header = (f"| {'blocks':>7} | {'MB':>5} | {'baseline median ms':>18} | {'ours warm median ms':>19} | "
              f"{'ours warm p95 ms':>16} | {'ours cold ms':>12} | {'baseline/warm':>13} | "
              f"{'+ standing median ms':>20} | {'ours after an append ms':>23} |")
    print(header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    details: list[str] | None = [] if args.show_queries else None
    for size in args.sizes:
        mb, base, warm, cold, p95, turn, after = measure(size, args.seed, args.reps, details)
        print(f"| {size:>7,} | {mb:>5.1f} | {base:>18.2f} | {warm:>19.3f} | {p95:>16.3f} | {cold:>12.1f} | "
              f"{base / warm:>12.0f}x | {turn:>20.3f} | {after:>23.1f} |", flush=True)
    if details:
        print("\n".join(details))
    if args.index_sizes:
        print_index_table(args.index_sizes, args.seed, args.reps)
    print(f"\ntotal {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
