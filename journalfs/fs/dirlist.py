"""Directory listings kept between changes, for readdir of mirrored directories.

A listing (``caches.Listing``: every name's lstat and the attributes built from it) of a
directory the SOURCE watcher covers stays valid until something changes in it: every change
made through the mount marks the names it touched (``attrs_changed``/``names_changed``, the
hooks the passthrough already calls for its short-lived snapshots), and the watcher reports
every change made behind the mount's back through the same hooks. A later ``ls`` then costs
no scan and no per-entry attribute building: only the names marked since are stat'ed again.

A kept listing belongs to one directory *inode object*: when the kernel forgets the directory,
its watch ends and the inode object goes, so a listing can never outlive the watch that keeps
it exact. Without a watch (limit reached, JOURNALFS_WATCH=off, a filesystem that cannot be
watched) listings live for the snapshot TTL only, as before.
"""
from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass

import pyfuse3

from .caches import UNKNOWN, DirSnapshots, Listing
from .inodes import Inode

#: st_blksize reported for every directory, mirrored or view (files keep SOURCE's): glibc
#: sizes its getdents64 buffer from it (max(st_blksize, 32 KiB), at most 1 MiB) and the kernel
#: sizes each READDIRPLUS request from that buffer, so 1 MiB brings ~5,000 entries per reply
#: instead of ~200 (measured on 6.18, docs/posix.md).
DIR_BLKSIZE = 1 << 20
#: Kept listings at most, and entries in them at most (about 1 KiB each: lstat, attributes,
#: inode); a bigger directory is scanned at each opendir, as before.
MAX_KEPT = 64
MAX_KEPT_ENTRIES = 200_000
#: Names marked changed above which a listing is scanned again rather than patched.
PATCH_MAX = 256
#: Listings bigger than this get :class:`LazyRows` (no O(n) list built on the request
#: thread; rows of 100k names took ~200 ms on a busy machine).
EAGER_ROWS_MAX = 8192


@dataclass(eq=False, slots=True)
class KeptListing:
    """A listing kept for one directory inode object."""
    directory: Inode                  # the inode object it was taken for
    listing: Listing
    rows: list[tuple] | None = None   # its rows once every one is built (see ListingCache.rows)


class ListingCache(DirSnapshots):
    """The passthrough's snapshots, plus listings kept for as long as nothing changes."""

    def __init__(self, ttl: float, **kwargs):
        super().__init__(ttl, **kwargs)
        self._kept: dict[bytes, KeptListing] = {}  # directory path -> its kept listing

    def kept(self, dir_rel: bytes, directory) -> Listing | None:
        """The listing kept for ``dir_rel`` when it was taken for this very inode object."""
        entry = self._kept.get(dir_rel)
        if entry is None or entry.directory is not directory or not self.enabled:
            return None
        return entry.listing

    def keep(self, dir_rel: bytes, directory, started_generation: int, listing: Listing) -> None:
        """Keep ``listing`` of ``directory`` (watched) unless something changed since the scan
        started."""
        self._kept.pop(dir_rel, None)
        if started_generation != self.generation or not self.enabled \
                or len(listing.stats) > MAX_KEPT_ENTRIES:
            return
        self._kept[dir_rel] = KeptListing(directory, listing)
        entries = sum(len(kept.listing.stats) for kept in self._kept.values())
        while len(self._kept) > MAX_KEPT or entries > MAX_KEPT_ENTRIES:
            oldest = self._kept.pop(next(iter(self._kept)))
            entries -= len(oldest.listing.stats)

    def rows(self, dir_rel: bytes, listing: Listing) -> list | None:
        """:func:`rows` of the kept ``listing``, remembered once every row holds attributes
        built for its current lstat: later opendirs reuse them. None if not kept."""
        entry = self._kept.get(dir_rel)
        if entry is None or entry.listing is not listing or len(listing.stats) > EAGER_ROWS_MAX:
            return None
        if entry.rows is None:
            built = rows(listing)
            if all(attrs is not None and attrs[0] is st for _, st, attrs in built):
                entry.rows = built
            return built
        return entry.rows

    def rows_stale(self, dir_rel: bytes) -> None:
        """A row of ``dir_rel``'s kept listing named an inode no longer in use: build the
        rows again at the next opendir."""
        entry = self._kept.get(dir_rel)
        if entry is not None:
            entry.rows = None

    # every change reaches the kept listings the way it reaches the snapshots
    def attrs_changed(self, *rels: bytes) -> None:
        super().attrs_changed(*rels)
        for rel in rels:
            self._kept_unknown(rel)

    def names_changed(self, *rels: bytes) -> None:
        super().names_changed(*rels)
        for rel in rels:
            self._kept_unknown(rel)
            self._kept_unknown(rel.rpartition(b"/")[0])
            below = rel + b"/"
            for gone in [d for d in self._kept if d == rel or d.startswith(below)]:
                del self._kept[gone]

    def _kept_unknown(self, rel: bytes) -> None:
        if rel == b"":
            return
        directory, _, name = rel.rpartition(b"/")
        entry = self._kept.get(directory)
        if entry is not None:
            entry.listing.mark_unknown(name)


def rows(listing: Listing) -> list[tuple]:
    """``(name, lstat, (lstat, inode, EntryAttributes) or None)`` of every name of
    ``listing`` in readdir order: what readdir needs per entry, without a lookup per entry."""
    names = listing.names
    return list(zip(names, map(listing.stats.__getitem__, names), map(listing.attrs.get, names)))


class LazyRows:
    """:func:`rows` of a big listing, each row made when readdir reads it."""

    __slots__ = ("names", "stats", "attrs")

    def __init__(self, listing: Listing):
        self.names, self.stats, self.attrs = listing.names, listing.stats, listing.attrs

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int | slice) -> tuple | list[tuple]:
        if isinstance(i, slice):  # a reply's worth of rows, made in C (zip, map)
            names = self.names[i]
            return list(zip(names, map(self.stats.__getitem__, names), map(self.attrs.get, names)))
        name = self.names[i]
        return name, self.stats[name], self.attrs.get(name)


def listing_rows(listing: Listing) -> list[tuple] | LazyRows:
    """:func:`rows`, or :class:`LazyRows` for a big listing."""
    return rows(listing) if len(listing.stats) <= EAGER_ROWS_MAX else LazyRows(listing)


def patched(dir_fd: int, copy: Listing, skip: bytes | None) -> Listing | None:
    """``copy`` (a ``Listing.frozen()`` copy, taken on the trio thread: this may run in a
    worker thread while the original is marked) with its UNKNOWN names stat'ed again in the
    SOURCE directory ``dir_fd`` (O_PATH; lstat relative to it), vanished names and ``skip``
    left out. None when too many names changed: scan again."""
    unknown = [name for name, st in copy.stats.items() if st is UNKNOWN]
    if len(unknown) > PATCH_MAX:
        return None
    stats = dict(copy.stats)  # the copy shares its dict with the listing (copy on write)
    gone = False
    for name in unknown:
        try:
            if name == skip:
                raise FileNotFoundError(name)
            stats[name] = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            del stats[name]
            gone = True
    # names stay sorted in this thread too (no sort of a big listing on the request thread)
    names = [name for name in copy.names if name in stats] if gone else copy.names
    return Listing(stats, copy.taken, copy.attrs, 0, names, _shared=names is copy.names)


def _node_id_offsets() -> tuple[int, int] | None:
    """Where a ``pyfuse3.EntryAttributes`` keeps the node id it sends (libfuse's
    ``fuse_entry_param.ino``) and the inode number of its ``struct stat``, found by looking
    at a probe object: None unless the layout is exactly the expected one."""
    probe = pyfuse3.EntryAttributes()
    magic = 0x6A66732D6E616D65
    probe.st_ino = magic
    raw = ctypes.string_at(id(probe), sys.getsizeof(probe))
    needle = magic.to_bytes(8, sys.byteorder)
    found = [i for i in range(len(raw) - 7) if raw[i:i + 8] == needle]
    # fuse_entry_param: ino, generation, then struct stat: st_dev, st_ino, ...
    if len(found) != 2 or found[1] - found[0] != 24:
        return None
    ctypes.c_uint64.from_address(id(probe) + found[0]).value = 0
    if probe.st_ino != 0 or ctypes.string_at(id(probe) + found[1], 8) != needle:
        return None
    return found[0], found[1]


#: The writes into pyfuse3's objects (here and in direntries.py): "all" (default); "names"
#: (NameOnlyEntry only: no reply blocks); "off" (neither: entries carry attributes, one
#: readdir_reply each). A switch for comparing (bench/listing.py --struct-writes) and for a
#: pyfuse3 whose layout passes the probes yet misbehaves; tests/test_fs_cstructs.py fails on
#: a probe that stops matching.
STRUCT_WRITES = os.environ.get("JOURNALFS_STRUCT_WRITES", "all")
_OFFSETS = _node_id_offsets() if STRUCT_WRITES in ("all", "names") else None


class NameOnlyEntry:
    """Directory entries that carry a name, a type and an inode number, and no attributes:
    their node id is 0, so the kernel links no inode for them, counts no lookup and will send
    no FORGET (``fuse_direntplus_link`` skips such entries). That is a plain READDIR entry
    inside a READDIRPLUS reply, which pyfuse3 3.5 has no other way to send: its ``st_ino``
    setter writes node id and inode number together, so the node id is cleared in the
    object's memory at the offset :func:`_node_id_offsets` verified at import.

    One object serves a whole listing: set ``ino.value`` (the inode number the entry
    shows) before each ``readdir_reply`` of :attr:`attrs`."""

    available = _OFFSETS is not None

    def __init__(self, mode: int):
        if _OFFSETS is None:
            raise RuntimeError("pyfuse3.EntryAttributes has an unexpected layout")
        self.attrs = pyfuse3.EntryAttributes()
        self.attrs.st_mode = mode
        self.attrs.st_ino = 0
        self.ino = ctypes.c_uint64.from_address(id(self.attrs) + _OFFSETS[1])
