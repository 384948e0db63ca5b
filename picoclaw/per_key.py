"""Per-key state that stays bounded in a process that runs for months: locks dropped when idle, an LRU map.

A bot serves every chat it ever saw; keeping a lock or a loaded session per chat forever grows without
end. `KeyedLocks` holds a lock only while someone holds or waits for it; `LruCache` keeps the most recently
used values up to a size and forgets the rest (their owner can always rebuild them).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Hashable, Iterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    import asyncio

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class KeyedLocks(Generic[K]):
    """One asyncio lock per key, in order of arrival, existing only while in use."""

    def __init__(self) -> None:
        self._locks: dict[K, asyncio.Lock] = {}
        self._users: dict[K, int] = {}  # holders and waiters of each key's lock

    @asynccontextmanager
    async def hold(self, key: K) -> AsyncIterator[None]:
        """Hold `key`'s lock for the block; callers for the same key run one at a time, first come first."""
        import asyncio  # not at the top: the App's LruCache is here too, and short commands run no event loop

        lock = self._locks.setdefault(key, asyncio.Lock())
        self._users[key] = self._users.get(key, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._users[key] -= 1
            if not self._users[key]:
                del self._users[key], self._locks[key]

    def busy(self, key: K) -> bool:
        """Whether someone holds or waits for `key`'s lock."""
        return key in self._users

    def __len__(self) -> int:
        return len(self._locks)


class LruCache(Generic[K, V]):
    """At most `size` values; adding one more evicts the least recently used that `keep` does not pin.

    `on_evict(key, value)` hears of each eviction (to close the value or drop what goes with it).
    """

    def __init__(self, size: int, *, keep: Callable[[K], bool] = lambda key: False,
                 on_evict: Callable[[K, V], None] = lambda key, value: None):
        if size < 1:
            raise ValueError("an LRU cache needs room for at least one value")
        self.size = size
        self.keep = keep
        self.on_evict = on_evict
        self._values: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value for `key` (now the most recently used), or None."""
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
        return value

    def peek(self, key: K) -> V | None:
        """The value for `key` without making it recently used (for `keep`, which runs while evicting)."""
        return self._values.get(key)

    def put(self, key: K, value: V) -> None:
        """Store `value` as the most recently used, then evict down to `size` (pinned values stay)."""
        self._values[key] = value
        self._values.move_to_end(key)
        excess = len(self._values) - self.size
        if excess <= 0:
            return
        victims: list[K] = []
        for old in self._values:  # oldest first; stops as soon as enough are found
            if len(victims) == excess:
                break
            if old != key and not self.keep(old):
                victims.append(old)
        for old in victims:
            self.on_evict(old, self._values.pop(old))

    def pop(self, key: K) -> V | None:
        return self._values.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._values))

    def values(self) -> list[V]:
        return list(self._values.values())
