"""What the views remember about journals: one cache, one eviction policy, one size limit.

Every fact the views keep between requests -- whether a SOURCE file is a journal, whether a
directory holds any, a journal's record index and records.jsonl layout, batches of decoded
records -- is an entry here, charged by its approximate size in bytes. Least recently used
entries go first once the budget is exceeded. Entries are keyed ``(kind, rel, ...)`` so that
everything known about one SOURCE path can be dropped at once when it changes.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable

#: Default budget: indexes of ~60M records' checkpoints, or a few dozen decoded batches.
DEFAULT_BUDGET = 64 << 20
#: What one entry costs beyond its own value: the key, the dict slot, the tuple. Charged so
#: that many small entries (one per name ever seen) are bounded in number too.
ENTRY_OVERHEAD = 256
#: And at most this many entries whatever their cost (the costs are estimates; one entry's
#: real footprint is a few KiB): bob's 100,000 names cannot each keep one.
MAX_ENTRIES = 32_768


class Catalog:
    """A thread-safe LRU map whose entries each cost a number of bytes."""

    def __init__(self, budget: int = DEFAULT_BUDGET, entry_overhead: int = ENTRY_OVERHEAD,
                 max_entries: int = MAX_ENTRIES):
        self.budget = budget
        self.entry_overhead = entry_overhead
        self.max_entries = max_entries
        self.used = 0
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()  # held for dict operations only, never across I/O

    def get(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return default
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: Hashable, value: Any, cost: int) -> None:
        """Remember ``value``; an entry larger than the whole budget is not kept."""
        cost = max(1, int(cost)) + self.entry_overhead
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.used -= old[1]
            if cost > self.budget:
                return
            self._items[key] = (value, cost)
            self.used += cost
            while self.used > self.budget or len(self._items) > self.max_entries:
                _, (_, dropped) = self._items.popitem(last=False)
                self.used -= dropped

    def discard(self, key: Hashable) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.used -= old[1]

    def discard_where(self, keep_out: Callable[[Hashable], bool]) -> None:
        """Drop every entry whose key ``keep_out`` selects."""
        with self._lock:
            for key in [k for k in self._items if keep_out(k)]:
                self.used -= self._items.pop(key)[1]

    def values_of(self, kind: str) -> list[tuple[Hashable, Any]]:
        with self._lock:
            return [(k, v[0]) for k, v in self._items.items() if k[0] == kind]

    def __len__(self) -> int:
        return len(self._items)


__all__ = ["Catalog", "DEFAULT_BUDGET"]
