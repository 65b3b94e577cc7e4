"""What the views remember about journals: one cache, one eviction policy, one size limit.

Every fact the views keep between requests -- whether a SOURCE file is a journal, whether a
directory holds any, a journal's record index and records.jsonl layout, batches of decoded
records -- is an entry here, charged by its approximate size in bytes. Least recently used
entries go first once the budget is exceeded. Entries are keyed ``(kind, rel, ...)`` so that
everything known about one SOURCE path can be dropped at once when it changes. An entry
about a journal is charged to the journal's owner too, and one owner's entries take at most
``owner_budget`` (his own least recently used go first): bob's huge journals never push
another user's indexes out.
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
#: What one owner's entries may take of the default budget.
DEFAULT_OWNER_BUDGET = DEFAULT_BUDGET // 4
#: And at most this many entries whatever their cost (the costs are estimates; one entry's
#: real footprint is a few KiB): bob's 100,000 names cannot each keep one.
MAX_ENTRIES = 32_768


class Catalog:
    """A thread-safe LRU map whose entries each cost a number of bytes."""

    def __init__(self, budget: int = DEFAULT_BUDGET, entry_overhead: int = ENTRY_OVERHEAD,
                 max_entries: int = MAX_ENTRIES, owner_budget: int | None = None):
        self.budget = budget
        self.owner_budget = budget // 4 if owner_budget is None else owner_budget
        self.entry_overhead = entry_overhead
        self.max_entries = max_entries
        self.used = 0
        # key -> (value, cost, owner or None)
        self._items: OrderedDict[Hashable, tuple[Any, int, int | None]] = OrderedDict()
        # owner -> [bytes charged, his keys least recently used first]
        self._owners: dict[int, list] = {}
        self._lock = threading.Lock()  # held for dict operations only, never across I/O

    def get(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return default
            self._items.move_to_end(key)
            if item[2] is not None:
                self._owners[item[2]][1].move_to_end(key)
            return item[0]

    def put(self, key: Hashable, value: Any, cost: int, owner: int | None = None) -> None:
        """Remember ``value`` (about a journal of ``owner``'s); an entry larger than the whole
        budget, or than one owner's share for an owner's, is not kept."""
        cost = max(1, int(cost)) + self.entry_overhead
        with self._lock:
            self._pop(key)
            if cost > (self.budget if owner is None else min(self.budget, self.owner_budget)):
                return
            self._items[key] = (value, cost, owner)
            self.used += cost
            if owner is not None:
                mine = self._owners.get(owner)
                if mine is None:
                    mine = self._owners[owner] = [0, OrderedDict()]
                mine[0] += cost
                mine[1][key] = None
                while mine[0] > self.owner_budget:  # his own oldest first, never the new one
                    self._pop(next(iter(mine[1])))
            while self.used > self.budget or len(self._items) > self.max_entries:
                self._pop(next(iter(self._items)))

    def _pop(self, key: Hashable) -> None:
        old = self._items.pop(key, None)
        if old is None:
            return
        self.used -= old[1]
        if old[2] is not None:
            mine = self._owners[old[2]]
            mine[0] -= old[1]
            del mine[1][key]
            if not mine[1]:
                del self._owners[old[2]]

    def owner_used(self, owner: int) -> int:
        """Bytes charged to ``owner``'s entries."""
        with self._lock:
            mine = self._owners.get(owner)
            return mine[0] if mine is not None else 0

    def discard(self, key: Hashable) -> None:
        with self._lock:
            self._pop(key)

    def discard_where(self, keep_out: Callable[[Hashable], bool]) -> None:
        """Drop every entry whose key ``keep_out`` selects."""
        with self._lock:
            for key in [k for k in self._items if keep_out(k)]:
                self._pop(key)

    def values_of(self, kind: str) -> list[tuple[Hashable, Any]]:
        with self._lock:
            return [(k, v[0]) for k, v in self._items.items() if k[0] == kind]

    def __len__(self) -> int:
        return len(self._items)


__all__ = ["Catalog", "DEFAULT_BUDGET", "DEFAULT_OWNER_BUDGET"]
