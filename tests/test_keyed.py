"""KeyedLocks and LruCache: per-key state that stays bounded in a long-running process."""

from __future__ import annotations

import asyncio

import pytest

from picoclaw.per_key import KeyedLocks, LruCache


def test_keyed_locks_serve_one_key_in_arrival_order_and_vanish_when_idle() -> None:
    locks: KeyedLocks[str] = KeyedLocks()
    order: list[str] = []

    async def turn(key: str, name: str, gate: asyncio.Event | None = None) -> None:
        async with locks.hold(key):
            order.append(f"{name} in")
            if gate is not None:
                await gate.wait()
            order.append(f"{name} out")

    async def main() -> tuple[int, bool, bool]:
        gate = asyncio.Event()
        first = asyncio.create_task(turn("聊天:1", "a", gate))
        await asyncio.sleep(0)
        queued = [asyncio.create_task(turn("聊天:1", name)) for name in ("b", "c")]
        other = asyncio.create_task(turn("chat:2", "x"))
        await other  # another key is not held up by the first
        during = len(locks)
        busy = locks.busy("聊天:1") and not locks.busy("chat:2")
        gate.set()
        await asyncio.gather(first, *queued)
        return during, busy, locks.busy("聊天:1")

    during, busy, still_busy = asyncio.run(main())
    assert order == ["a in", "x in", "x out", "a out", "b in", "b out", "c in", "c out"]
    assert (during, busy, still_busy, len(locks)) == (1, True, False, 0)


def test_keyed_locks_are_released_when_the_holder_fails() -> None:
    locks: KeyedLocks[int] = KeyedLocks()

    async def main() -> int:
        with pytest.raises(ValueError):
            async with locks.hold(1):
                raise ValueError("boom")
        async with locks.hold(1):  # would wait forever if the lock were still held
            pass
        return len(locks)

    assert asyncio.run(main()) == 0


def test_lru_cache_evicts_the_least_recently_used_unless_pinned() -> None:
    evicted: list[tuple[str, int]] = []
    pinned = {"a"}
    cache: LruCache[str, int] = LruCache(2, keep=lambda key: key in pinned,
                                         on_evict=lambda key, value: evicted.append((key, value)))
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)  # "a" is older but pinned: "b" goes
    assert (list(cache), evicted) == (["a", "c"], [("b", 2)])
    pinned.clear()
    assert cache.get("a") == 1  # now the most recently used
    cache.put("d", 4)
    assert (list(cache), evicted[-1]) == (["a", "d"], ("c", 3))
    assert cache.pop("a") == 1 and cache.get("a") is None and len(cache) == 1
    with pytest.raises(ValueError):
        LruCache(0)
