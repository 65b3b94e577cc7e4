"""Memory caches that let the trio thread answer lookups and metadata reads without a
worker-thread hop (each hop costs ~50-100 µs, more than the answer itself).

Both caches follow one rule against races with worker threads: a result computed in a thread
is stored only if nothing was invalidated since the computation started (a generation
counter), and invalidation happens *after* a change has landed in SOURCE / the store.
"""
from __future__ import annotations

import bisect
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field


#: In a listing: a name changed through the mount since the scan; ask SOURCE about it.
UNKNOWN = None


@dataclass(eq=False)
class Listing:
    """One complete scan of a directory: ``{name: lstat or UNKNOWN}``, its names sorted (for
    stable readdir cursors) and the attributes built for each stat, shared by lookups and
    listings: ``{name: (stat, inode, EntryAttributes)}``, valid while ``stat`` is current.

    ``stats`` and ``names`` are copied on write: :meth:`frozen` shares them (O(1) on the
    request thread, whatever the directory's size) and the first later change copies them
    (``_shared``). Nothing else may change them in place."""
    stats: dict[bytes, os.stat_result | None]
    taken: float = field(default_factory=time.monotonic)
    attrs: dict = field(default_factory=dict)
    unknown: int = 0
    _names: list[bytes] | None = None
    _shared: bool = False

    @property
    def names(self) -> list[bytes]:
        if self._names is None:  # scans of more than SCAN_INLINE names come sorted
            self._names = sorted(self.stats)
        return self._names

    def mark_unknown(self, name: bytes) -> None:
        stats = self.stats
        if stats.get(name, 0) is UNKNOWN:  # 0: absent
            return
        if self._shared:
            self.stats = stats = dict(stats)
            if self._names is not None:
                self._names = self._names.copy()
            self._shared = False
        if name not in stats and self._names is not None:
            bisect.insort(self._names, name)  # a memmove, not a sort of the whole listing
        stats[name] = UNKNOWN
        self.unknown += 1

    def frozen(self) -> Listing:
        """A copy for one open directory handle, unaffected by later changes (stats are
        only ever replaced, never mutated, so sharing ``attrs`` stays exact)."""
        self._shared = True
        return Listing(self.stats, self.taken, self.attrs, self.unknown, self.names, True)


class DirSnapshots:
    """Complete ``{name: lstat}`` listings of recently busy SOURCE directories.

    A directory is scanned (one thread call, ``os.scandir``) once ``min_lookups`` lookups
    missed in it; lookups are then answered from the listing, absent names as ENOENT, until
    ``ttl`` seconds pass. A name journalfs changes (created, removed, renamed, written,
    chmod...) becomes UNKNOWN in its listing; a directory that is removed or renamed loses
    its listings (and those below it).
    """

    def __init__(self, ttl: float, *, min_lookups: int = 32, max_dirs: int = 8,
                 max_entries: int = 500_000):
        self.ttl = ttl
        self.min_lookups = min_lookups
        self.max_dirs = max_dirs
        self.max_entries = max_entries
        self.generation = 0
        self._listings: OrderedDict[bytes, Listing] = OrderedDict()
        self._misses: dict[bytes, int] = {}

    @property
    def enabled(self) -> bool:
        return self.ttl > 0

    def listing(self, dir_rel: bytes) -> Listing | None:
        """The fresh listing of ``dir_rel``, or None."""
        entry = self._listings.get(dir_rel)
        if entry is None:
            return None
        if time.monotonic() - entry.taken > self.ttl:
            del self._listings[dir_rel]
            return None
        return entry

    def worth_scanning(self, dir_rel: bytes) -> bool:
        """Count one lookup that missed; True when the directory is busy enough to scan."""
        if not self.enabled:
            return False
        count = self._misses.get(dir_rel, 0) + 1
        if len(self._misses) > 4096:  # only recent directories matter
            self._misses.clear()
        self._misses[dir_rel] = count
        return count >= self.min_lookups

    def store(self, dir_rel: bytes, started_generation: int, listing: Listing | None) -> None:
        if listing is None:  # too big to list for lookups: retry only after as many misses
            self._misses[dir_rel] = -self.max_entries
            return
        self._misses.pop(dir_rel, None)
        if not self.enabled or started_generation != self.generation:
            return  # something changed while scanning: the listing may be stale
        self._listings[dir_rel] = listing
        self._listings.move_to_end(dir_rel)
        while len(self._listings) > self.max_dirs:
            self._listings.popitem(last=False)

    def scan(self, dir_fd: int, skip: bytes | None = None, limit: bool = True) -> Listing | None:
        """The listing of the SOURCE directory ``dir_fd`` (an O_PATH fd of it: opened again
        for reading, no path walk); None when too big. All at once: see :class:`Scan` for
        a scan in parts."""
        scan = Scan(dir_fd, skip, self.max_entries if limit else None)
        try:
            scan.step(None)
            return scan.result()
        finally:
            scan.close()

    def attrs_changed(self, *rels: bytes) -> None:
        """The objects at ``rels`` changed (call after the change has landed)."""
        self.generation += 1
        for rel in rels:
            self._mark_unknown(rel)

    def names_changed(self, *rels: bytes) -> None:
        """Names were created, removed or renamed at ``rels`` (after the change landed)."""
        self.generation += 1
        for rel in rels:
            self._mark_unknown(rel)
            self._mark_unknown(rel.rpartition(b"/")[0])  # its directory's mtime and nlink
            below = rel + b"/"
            for gone in [d for d in self._listings if d == rel or d.startswith(below)]:
                del self._listings[gone]

    def _mark_unknown(self, rel: bytes) -> None:
        if rel == b"":
            return  # the root is in no listing
        directory, _, name = rel.rpartition(b"/")
        listing = self._listings.get(directory)
        if listing is not None:
            listing.mark_unknown(name)


class Scan:
    """A directory scan in parts: :meth:`step` lists at most ``n`` more entries (lstat each)
    and says whether the directory is done, so the trio thread can take a small directory
    whole and hand the rest of a big one to a worker thread (one part at a time, never two
    threads at once). ``max_entries``: give up (result None) beyond that many."""

    def __init__(self, dir_fd: int, skip: bytes | None = None, max_entries: int | None = None):
        self.skip, self.max_entries = skip, max_entries
        self.stats: dict[bytes, os.stat_result] = {}
        self.done = self.too_big = False
        self.names: list[bytes] | None = None  # sorted, when sorted in a worker thread
        self._fd = os.open(b".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            self._it = os.scandir(self._fd)
        except BaseException:
            os.close(self._fd)
            raise

    def step(self, n: int | None) -> bool:
        """List up to ``n`` more entries (None: all); True once the directory is done."""
        stats, skip, cap = self.stats, self.skip, self.max_entries
        for count, entry in enumerate(self._it, 1):
            name = os.fsencode(entry.name)
            if name != skip:
                try:
                    stats[name] = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    pass  # vanished while listing
                if cap is not None and len(stats) > cap:
                    self.too_big = self.done = True
                    return True
            if n is not None and count >= n:
                return False
        self.done = True
        return True

    def result(self) -> Listing | None:
        return None if self.too_big else Listing(self.stats, _names=self.names)

    def close(self) -> None:
        if self._fd is not None:
            self._it.close()
            os.close(self._fd)
            self._fd = None


class MetaCache:
    """``{store path: {key: value}}`` of recently read paths, for a store only this mount
    writes (MetaStore holds the store's lock file; never for the shared gvfsd backend).
    Writes through the mount update or drop entries after the store accepted them."""

    def __init__(self, max_paths: int = 100_000):
        self.max_paths = max_paths
        self.generation = 0
        self._values: OrderedDict[str, dict] = OrderedDict()
        # store paths written through the mount, whose files' attributes the kernel has
        # invalidated (a setxattr changes ctime): dirops.py's readdir sends them attributes
        self.written_paths: set[str] = set()

    def get_all(self, path: str) -> dict | None:
        """A copy-free view of the cached keys of ``path``, or None when not cached."""
        return self._values.get(path)

    def store(self, path: str, started_generation: int, values: dict) -> None:
        if started_generation != self.generation:
            return  # a write raced with the read: it may be stale
        self._values[path] = dict(values)
        if len(self._values) > self.max_paths:
            self._values.popitem(last=False)

    def written(self, path: str, key: str, value) -> None:
        """``key`` of ``path`` is now ``value`` (None: unset)."""
        self.generation += 1
        if len(self.written_paths) >= self.max_paths:
            self.written_paths.clear()  # a hint only: the kernel then asks a GETATTR
        self.written_paths.add(path)
        values = self._values.get(path)
        if values is None:
            return
        if value is None:
            values.pop(key, None)
        else:
            values[key] = value

    def forget(self, path: str) -> None:
        self.generation += 1
        self._values.pop(path, None)

    def moved_or_removed(self) -> None:
        """A subtree moved or vanished in the store: too wide to track, start over."""
        self.generation += 1
        self._values.clear()
