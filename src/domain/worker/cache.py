"""A bounded LRU result cache (R-PERF-3). Pure: keys and values are opaque to it.

Bounded twice: by entries (`--result-cache-entries`) and, optionally, by the total weight of
the values (the adapter weighs an entry by its encoded size). An entry heavier than
`max_entry_weight` is never stored. Capacity 0 turns the cache off.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V")


@dataclass(slots=True)
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class LruCache(Generic[V]):
    def __init__(self, capacity: int, *, max_weight: int | None = None, max_entry_weight: int | None = None) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        if max_weight is not None and max_weight < 1:
            raise ValueError("max_weight must be >= 1")
        self.capacity = capacity
        self.max_weight = max_weight
        self.max_entry_weight = max_entry_weight if max_entry_weight is not None else max_weight
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self.weight = 0
        self.stats = CacheStats()

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def get(self, key: Hashable) -> V | None:
        """The value (now the most recently used), or None; counts a hit or a miss."""
        if not self.enabled:
            return None
        found = self._entries.get(key)
        if found is None:
            self.stats.misses += 1
            return None
        self._entries.move_to_end(key)
        self.stats.hits += 1
        return found[0]

    def put(self, key: Hashable, value: V, weight: int = 1) -> bool:
        """Store VALUE; evict least recently used entries past a bound. False: not stored."""
        if not self.enabled or weight < 0:
            return False
        if self.max_entry_weight is not None and weight > self.max_entry_weight:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.weight -= old[1]
        self._entries[key] = (value, weight)
        self.weight += weight
        while len(self._entries) > self.capacity or (self.max_weight is not None and self.weight > self.max_weight):
            _, (_, dropped) = self._entries.popitem(last=False)
            self.weight -= dropped
            self.stats.evictions += 1
        return key in self._entries

    def weights(self) -> list[tuple[Hashable, int]]:
        """(key, weight) of every entry, least recently used first (a snapshot)."""
        return [(key, weight) for key, (_, weight) in self._entries.items()]

    def clear(self) -> None:
        self._entries.clear()
        self.weight = 0
