"""gvfs metadata tree (``\\xda\\x1ameta``): mapped lookups, a merge overlay, a streaming writer.

Byte layout: specs/gvfs-metadata.md. Three pieces:

* :class:`TreeView` reads a mapped tree in place: binary search per path level and per key,
  every offset and count checked against the buffer, no whole-tree load.
* :class:`MergedTree` is a tree as an overlay over an optional base :class:`TreeView`; journal
  entries are applied to it exactly as gvfs compacts (SET/SETV/UNSET/COPY/REMOVE). Only the
  nodes the journal touches become Python objects; the rest stays in the mapped base.
* :func:`write_tree` streams a :class:`MergedTree` into a file breadth-first, one directory at a
  time; a directory the journal did not touch is copied with numpy and byte-region slices
  (:class:`_DirectoryCopier`), so a million-path store is rewritten without a Python object
  per node.
"""
from __future__ import annotations

import contextlib
import io
import itertools
import mmap
import operator
import random
import struct
from array import array
from typing import Any, BinaryIO, Iterator, Sequence

import numpy as np

from .base import SCAN_ROWS, Codec, ColumnMap, Columns, Finding, FormatError, Record
from . import tree_columns
from . import samples
from .gvfs_journal import GvfsJournal, decode_str, journal_name
from .tree_columns import DIRENT_SIZE, LIST_FLAG  # the layout facts both walks share

MAGIC = b"\xda\x1ameta"
HEADER_SIZE = 32
ROTATED_OFFSET = 8
MAX_RAW_TIME = 0xFFFFFFFF
DIR_CACHE_NAMES = 1_500_000  # at most this many cached child names per tree view
MAX_REGION = 16 << 20       # bulk string reads of larger regions go one string at a time
PATH_TEXT_FACTOR = 64       # a walk yields at most this many bytes of path text per byte of tree

_HEADER = struct.Struct(">6sBBIIIIq")
_U32 = struct.Struct(">I")
_DIRENT = struct.Struct(">IIII")
_PAIR = struct.Struct(">II")
_u32_from = _U32.unpack_from  # bound once: the lookup hot path calls them per get
_pair_from = _PAIR.unpack_from
_count_pair_from = struct.Struct(">III").unpack_from  # a metadata block's count + first pair
_KID_MASK = ~LIST_FLAG  # a metadata pair's keyword id without the list flag

Value = Any  # str | list[str]


def key_bytes(key: str) -> bytes:
    return key.encode("utf-8", "surrogateescape")


def header_tag(head: bytes) -> int | None:
    """The random tag in a tree's first 16 bytes ``head`` (its journal's name carries it as
    8 hex digits); None when ``head`` is not the start of a tree."""
    if len(head) < 16 or bytes(head[:len(MAGIC)]) != MAGIC:
        return None
    return struct.unpack_from(">I", head, 12)[0]


def split_path(path: str) -> list[bytes]:
    """Canonical gvfs path -> name components as bytes ("/" -> [])."""
    return [p for p in path.encode("utf-8", "surrogateescape").split(b"/") if p]


def join_path(parent: str, name: bytes) -> str:
    return ("" if parent == "/" else parent) + "/" + decode_str(name)


# ------------------------------------------------------------------------------------------
# Reading a mapped tree
# ------------------------------------------------------------------------------------------
def _find_nul(buf, off: int) -> int:
    pos = bytes(buf[off:]).find(b"\0")
    return pos + off if pos >= 0 else -1


class TreeView:
    """Random access to one tree buffer (bytes or mmap) without loading it."""

    def __init__(self, buf, source: str):
        self.buf = buf
        self.source = source
        self.size = len(buf)
        if self.size < HEADER_SIZE:
            raise FormatError(source, 0, f"tree header needs {HEADER_SIZE} bytes, file has {self.size}")
        magic, major, _minor, _rot, self.tag, root, keywords, self.time_base = \
            _HEADER.unpack_from(buf, 0)
        if magic != MAGIC:
            raise FormatError(source, 0, "not a gvfs metadata tree (bad magic)")
        if major != 1:
            raise FormatError(source, 6, f"unsupported tree major version {major}")
        self.root = root
        self._check_dirent(root, 16)
        n = self._u32(keywords, 20)
        if n > (self.size - keywords - 4) // 4:
            raise FormatError(source, keywords, f"keyword count {n} larger than the file")
        self.keywords: list[str] = [decode_str(self.cstr(o, keywords + 4 + 4 * i))
                                    for i, o in enumerate(struct.unpack_from(f">{n}I", buf, keywords + 4))]
        self.key_ids = {k: i for i, k in enumerate(self.keywords)}
        # directories' child names -> dirent offsets, decoded once, so a lookup is a dict probe; by
        # first child dirent and by path (bounded together: DIR_CACHE_NAMES names at most)
        self._dir_names: dict[int, dict[str, int]] = {}
        self._dir_paths: dict[str, dict[str, int]] = {}
        self._cached_names = 0
        self._find = getattr(buf, "find", None)  # mmap/bytes: C-level NUL search

    def over(self, buf) -> "TreeView":
        """The same tree read from ``buf`` (a private copy of this one's bytes)."""
        return self if buf is self.buf else TreeView(buf, self.source)

    # -- primitives ------------------------------------------------------------------------
    @property
    def rotated(self) -> int:
        return _U32.unpack_from(self.buf, ROTATED_OFFSET)[0]

    def _u32(self, off: int, where: int) -> int:
        if off % 4 or off < 0 or off + 4 > self.size:
            raise FormatError(self.source, where, f"offset {off} outside the file or unaligned")
        return _U32.unpack_from(self.buf, off)[0]

    def _check_dirent(self, off: int, where: int) -> None:
        if off % 4 or off < HEADER_SIZE or off + DIRENT_SIZE > self.size:
            raise FormatError(self.source, where, f"dirent offset {off} outside the file")

    def cstr(self, off: int, where: int) -> bytes:
        if off <= 0 or off >= self.size:
            raise FormatError(self.source, where, f"string offset {off} outside the file")
        end = self.buf.find(b"\0", off) if hasattr(self.buf, "find") else _find_nul(self.buf, off)
        if end < 0:
            raise FormatError(self.source, off, "string runs past the end of the file")
        return bytes(self.buf[off:end])

    def dirent(self, off: int) -> tuple[int, int, int, int]:
        return _DIRENT.unpack_from(self.buf, off)

    def time(self, off: int) -> int:
        raw = _DIRENT.unpack_from(self.buf, off)[3]
        return 0 if raw == 0 else raw + self.time_base

    def name(self, off: int) -> bytes:
        return self.cstr(_DIRENT.unpack_from(self.buf, off)[0], off)

    def _children_block(self, off: int) -> tuple[int, int]:
        """(count, offset of first child dirent) of the node at dirent ``off``."""
        block = _DIRENT.unpack_from(self.buf, off)[1]
        if block == 0:
            return 0, 0
        n = self._u32(block, off + 4)
        if n > (self.size - block - 4) // DIRENT_SIZE:
            raise FormatError(self.source, block, f"child count {n} larger than the file")
        return n, block + 4

    def child_count(self, off: int) -> int:
        return self._children_block(off)[0]

    def child_rows(self, off: int) -> list[tuple[bytes, int, int, list, int]]:
        """Every child of dirent ``off`` in one pass, for the writer: (name, dirent offset,
        its child count, its raw metadata, its raw time)."""
        n, first = self._children_block(off)
        if not n:
            return []
        fields = struct.unpack_from(f">{4 * n}I", self.buf, first)
        rows = []
        limit = self.size
        for i in range(n):
            name_off, children, meta, raw_time = fields[4 * i:4 * i + 4]
            child = first + DIRENT_SIZE * i
            kids = 0
            if children:
                kids = self._u32(children, child + 4)
                if kids > (limit - children - 4) // DIRENT_SIZE:
                    raise FormatError(self.source, children, f"child count {kids} larger than the file")
            rows.append((self.cstr(name_off, child), child, kids,
                         self._raw_metadata_at(*self._metadata_block_at(meta, child + 8)), raw_time))
        return rows

    def children(self, off: int) -> Iterator[tuple[bytes, int]]:
        n, first = self._children_block(off)
        for i in range(n):
            child = first + DIRENT_SIZE * i
            yield self.name(child), child

    def find_child(self, off: int, name: bytes) -> int | None:
        return self._directory(off).get(decode_str(name))

    def _directory(self, off: int) -> dict[str, int]:
        """{child name: child dirent offset} of dirent ``off``, decoded once per directory.
        Names are decoded with surrogateescape, so str equality is byte equality; the first of
        duplicate names (hostile) wins."""
        n, first = self._children_block(off)
        cached = self._dir_names.get(first)
        if cached is not None:
            return cached
        names = self._consecutive_names(first, n)
        if names is None:
            names = decode_str(b"\0".join(self.child_names(first, n))).split("\0") if n else []
        offsets = dict(zip(names, range(first, first + DIRENT_SIZE * n, DIRENT_SIZE)))
        if len(offsets) < n:
            offsets = dict(zip(reversed(names), range(first + DIRENT_SIZE * (n - 1), first - 1, -DIRENT_SIZE)))
        self._cached_names += n
        if self._cached_names > DIR_CACHE_NAMES:  # bounded memory: start over
            self._dir_names.clear()
            self._dir_paths.clear()
            self._cached_names = n
        self._dir_names[first] = offsets
        return offsets

    def _consecutive_names(self, first: int, n: int) -> list[str] | None:
        """Decoded names of the ``n`` dirents from ``first`` when they are consecutive strings
        in child order (as gvfs and we write them): one slice, one decode, one split, checked
        by comparing the region's NUL positions with the name offsets. Else None."""
        if not n:
            return None
        name_offs = np.frombuffer(self.buf, dtype=">u4", count=4 * n, offset=first)[0::4]
        lo, hi = int(name_offs[0]), int(name_offs[-1])
        if lo <= 0 or hi >= self.size or hi < lo:
            return None
        end = self.buf.find(b"\0", hi, min(self.size, hi + MAX_REGION)) if self._find else -1
        if end < 0 or end - lo > MAX_REGION + 64 * n:
            return None
        region = self.buf[lo:end + 1]
        nuls = np.flatnonzero(np.frombuffer(region, dtype=np.uint8) == 0)
        if len(nuls) != n or nuls[-1] != end - lo or \
                (n > 1 and not np.array_equal(nuls[:-1], name_offs[1:].astype(np.int64) - lo - 1)):
            return None
        return decode_str(region[:-1]).split("\0")

    def child_names(self, first: int, n: int) -> list[bytes]:
        """Names of the ``n`` dirents from ``first``: one slice + split when the names lie in
        one compact string region (as gvfs and we write them), else one by one."""
        if not n:
            return []
        name_offs = np.frombuffer(self.buf, dtype=">u4", count=4 * n, offset=first)[0::4]
        strings = self.strings_at(name_offs)
        if strings is not None:
            return strings
        return [self.cstr(int(o), first + DIRENT_SIZE * i) for i, o in enumerate(name_offs)]

    def string_region(self, offsets: np.ndarray) -> tuple[int, bytes] | None:
        """(start, bytes) from the lowest offset to the NUL ending the string at the highest:
        every string at ``offsets`` lies inside. None when an offset is outside the file, the
        last string is unterminated or the region is implausibly large (callers then go one
        string at a time, which names the bad offset)."""
        lo, hi = int(offsets.min()), int(offsets.max())
        if lo <= 0 or hi >= self.size:
            return None
        end = self.buf.find(b"\0", hi, min(self.size, hi + MAX_REGION)) \
            if hasattr(self.buf, "find") else _find_nul(self.buf, hi)
        if end < 0 or end - lo > MAX_REGION + 64 * len(offsets):
            return None
        return lo, bytes(self.buf[lo:end + 1])

    def strings_at(self, offsets: np.ndarray) -> list[bytes] | None:
        """The NUL-terminated strings at ``offsets`` (bulk), or None if they do not each
        start a piece of one compact region."""
        found = self.string_region(offsets)
        if found is None:
            return None
        lo, region = found
        pieces = region.split(b"\0")
        starts = np.zeros(len(pieces), dtype=np.int64)
        np.cumsum(np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))[:-1] + 1,
                  out=starts[1:])
        rel = offsets.astype(np.int64) - lo
        which = np.searchsorted(starts, rel)
        if (which >= len(pieces)).any() or (starts[np.minimum(which, len(pieces) - 1)] != rel).any():
            return None
        if len(which) == len(pieces) - 1 and (np.diff(which) == 1).all():
            pieces.pop()  # the common case: the region is exactly these strings, in order
            return pieces
        return [pieces[i] for i in which.tolist()]

    def lookup(self, path: str) -> int | None:
        """Dirent of ``path`` (canonical) or None: the parent directory's children are
        cached by path, so a lookup is two dict probes."""
        if path == "/":
            return self.root
        parent, _, name = path.rpartition("/")
        directory = self._dir_paths.get(parent)
        if directory is None:
            parent_off = self.root if not parent else self.lookup(parent)
            if parent_off is None:
                return None
            directory = self._dir_paths[parent] = self._directory(parent_off)
        return directory.get(name)

    # -- metadata --------------------------------------------------------------------------
    def _metadata_block(self, off: int) -> tuple[int, int]:
        return self._metadata_block_at(_DIRENT.unpack_from(self.buf, off)[2], off + 8)

    def _metadata_block_at(self, block: int, where: int) -> tuple[int, int]:
        if block == 0:
            return 0, 0
        n = self._u32(block, where)
        if n > (self.size - block - 4) // 8:
            raise FormatError(self.source, block, f"metadata count {n} larger than the file")
        return n, block + 4

    def _value(self, key_field: int, value_off: int, where: int) -> Value:
        if not key_field & LIST_FLAG:
            return decode_str(self.cstr(value_off, where))
        count = self._u32(value_off, where)
        if count > (self.size - value_off - 4) // 4:
            raise FormatError(self.source, value_off, f"list count {count} larger than the file")
        offs = struct.unpack_from(f">{count}I", self.buf, value_off + 4)
        return [decode_str(self.cstr(o, value_off + 4 + 4 * i)) for i, o in enumerate(offs)]

    def raw_metadata(self, off: int) -> list[tuple[int, bytes | list[bytes]]]:
        """(keyword id, value bytes or list of bytes) in block order, undecoded."""
        return self._raw_metadata_at(*self._metadata_block(off))

    def _raw_metadata_at(self, n: int, first: int) -> list[tuple[int, bytes | list[bytes]]]:
        if not n:
            return []
        pairs = struct.unpack_from(f">{2 * n}I", self.buf, first)
        n_keywords = len(self.keywords)
        out = []
        for i in range(0, 2 * n, 2):
            key_field, value_off = pairs[i], pairs[i + 1]
            kid = key_field & ~LIST_FLAG
            where = first + 4 * i
            if kid >= n_keywords:
                raise FormatError(self.source, where, f"keyword id {kid} not in the keyword table")
            if key_field & LIST_FLAG:
                count = self._u32(value_off, where + 4)
                if count > (self.size - value_off - 4) // 4:
                    raise FormatError(self.source, value_off, f"list count {count} larger than the file")
                offs = struct.unpack_from(f">{count}I", self.buf, value_off + 4)
                out.append((kid, [self.cstr(o, value_off + 4) for o in offs]))
            else:
                out.append((kid, self.cstr(value_off, where + 4)))
        return out

    def metadata(self, off: int) -> dict[str, Value]:
        """Decoded {key: value} of dirent ``off`` (the lookup hot path: plain values are
        decoded straight from the buffer; lists and anything odd take the checked path)."""
        buf, size = self.buf, self.size
        block = _U32.unpack_from(buf, off + 8)[0]
        if not block:
            return {}
        find = self._find
        if block % 4 or block + 4 > size or find is None:
            return self._metadata_checked(off)
        n = _U32.unpack_from(buf, block)[0]
        if n > (size - block - 4) // 8:
            return self._metadata_checked(off)
        keywords = self.keywords
        out = {}
        for pair in range(block + 4, block + 4 + 8 * n, 8):
            key_field, value_off = _PAIR.unpack_from(buf, pair)
            if key_field >= len(keywords) or not 0 < value_off < size:
                return self._metadata_checked(off)
            end = find(b"\0", value_off)
            if end < 0:
                return self._metadata_checked(off)
            out[keywords[key_field]] = buf[value_off:end].decode("utf-8", "surrogateescape")
        return out

    def _metadata_checked(self, off: int) -> dict[str, Value]:
        keywords = self.keywords
        return {keywords[kid]: ([decode_str(x) for x in v] if isinstance(v, list) else decode_str(v))
                for kid, v in self.raw_metadata(off)}

    def has_metadata(self, off: int) -> bool:
        return self._metadata_block(off)[0] > 0

    def get(self, off: int, key: str) -> Value | None:
        """The value of ``key`` at dirent ``off`` (binary search of its sorted block)."""
        kid = self.key_ids.get(key)
        return None if kid is None else self._get_kid(off, kid)

    def value(self, path: str, key: str) -> Value | None:
        """``get(lookup(path), key)`` in one call, the store's lookup hot path: a key that is
        not in the keyword table is absent everywhere, so no path walk is needed for it."""
        kid = self.key_ids.get(key)
        if kid is None:
            return None
        cut = path.rfind("/")
        directory = self._dir_paths.get(path[:cut])
        off = self.lookup(path) if directory is None or cut == len(path) - 1 else \
            directory.get(path[cut + 1:])
        return None if off is None else self._get_kid(off, kid)

    def _get_kid(self, off: int, kid: int) -> Value | None:
        buf = self.buf
        block = _u32_from(buf, off + 8)[0]
        if not block:
            return None
        size = self.size
        if block % 4 or block + 4 > size:
            self._metadata_block_at(block, off + 8)  # raises, naming the offset
        if block + 12 <= size:  # the count and the first pair in one read (one key: done)
            n, key_field, value_off = _count_pair_from(buf, block)
            if key_field == kid and n and n <= (size - block - 4) >> 3 and 0 < value_off < size:
                end = self._find(b"\0", value_off) if self._find is not None else -1
                if end >= 0:
                    return buf[value_off:end].decode("utf-8", "surrogateescape")
        n = _u32_from(buf, block)[0]
        if n > (size - block - 4) >> 3:
            self._metadata_block_at(block, off + 8)
        first = block + 4
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) >> 1
            key_field, value_off = _pair_from(buf, first + 8 * mid)
            if key_field == kid:  # a plain string (LIST_FLAG clear): the hot path
                find = self._find
                if find is not None and 0 < value_off < size:
                    end = find(b"\0", value_off)
                    if end >= 0:
                        return buf[value_off:end].decode("utf-8", "surrogateescape")
                return self._value(key_field, value_off, first + 8 * mid + 4)
            here = key_field & _KID_MASK
            if here == kid:
                return self._value(key_field, value_off, first + 8 * mid + 4)
            if here < kid:
                lo = mid + 1
            else:
                hi = mid
        return None

    # -- traversal -------------------------------------------------------------------------
    def walk(self) -> Iterator[tuple[str, int]]:
        """(path, dirent offset) of every node, breadth-first. Bounded for hostile files: a
        loop of children offsets is found before the first node (:meth:`find_loop`) and
        raised when the walk reaches it, after every node before it; blocks shared by several
        parents (which could multiply the walk) are bounded by visits -- a tree holds at most
        size/16 dirents -- and by the path text produced."""
        looping = self.find_loop()
        yield from self.walk_levels([("/", self.root)], looping, self.node_budget(),
                                    self.text_budget())

    def node_budget(self) -> int:
        """Nodes a walk may visit: a tree holds at most size/16 dirents."""
        return self.size // DIRENT_SIZE + 1

    def text_budget(self) -> int:
        """Characters of path text a walk may produce."""
        return PATH_TEXT_FACTOR * self.size + (1 << 20)

    def walk_levels(self, level: list[tuple[str, int]], looping: tuple[int, int] | None,
                    budget: int, text_budget: int, found: Sequence[tuple[str, int]] = ()
                    ) -> Iterator[tuple[str, int]]:
        """:meth:`walk` from nodes ``level`` of a breadth-first level on, with what is left
        of its budgets, :meth:`find_loop`'s answer and ``found``, the next level's nodes
        that nodes of that level before ``level`` have: where a column decoder hands over to
        the exact walk."""
        loop_at = None
        while level:
            nxt, found = list(found), ()
            for path, off in level:
                budget -= 1
                text_budget -= len(path)
                if budget < 0 or text_budget < 0:
                    raise FormatError(self.source, off, "children blocks are shared by several "
                                      "directories (more nodes or path text than the file can hold)")
                yield path, off
                if looping is not None and off == looping[0]:
                    loop_at = off  # the rest of this level is still valid
                    continue
                for name, child in self.children(off):
                    nxt.append((join_path(path, name), child))
            if loop_at is not None:
                raise FormatError(self.source, loop_at + 4, "children offsets form a cycle: "
                                  f"dirent {loop_at} points back to block {looping[1]}, which "
                                  "is on its own path from the root")
            level = nxt

    def find_loop(self, pace=None) -> tuple[int, int] | None:
        """(dirent, block) where children offsets first loop back to a block on the path from
        the root, or None. Depth-first over children blocks, each expanded once: a block met
        again while still on the current path is a loop; met again elsewhere it is sharing
        (healthy trees share the one empty block). Distinct blocks that hold more dirents in
        total than the file has room for must overlap: FormatError, so the work is bounded by
        the file's size. ``pace`` is called every 64 blocks read (the pages read so
        far are not needed again)."""
        on_path, done = 1, 2
        state: dict[int, int] = {}
        dirents_left = self.size // DIRENT_SIZE + 1
        reads = 0  # children blocks' counts read
        buf = self.buf

        def child_blocks(dirent: int) -> tuple[int, list[tuple[int, int]]]:
            """(children block of ``dirent``, [(child dirent, its children block)] of the
            children that have a non-empty block)."""
            nonlocal dirents_left, reads
            n, first = self._children_block(dirent)
            if not n:
                return 0, []
            dirents_left -= n
            if dirents_left < 0:
                raise FormatError(self.source, first - 4, "children blocks overlap (more dirents "
                                  "than the file can hold)")
            fields = struct.unpack_from(f">{4 * n}I", buf, first)[1::4]
            out = []
            for i, block in enumerate(fields):
                if block:
                    child = first + DIRENT_SIZE * i
                    if self._u32(block, child + 4):
                        out.append((child, block))
                    reads += 1
                    if pace is not None and not reads & 63:
                        pace()  # the counts of blocks all over the file: keep few pages
            return _u32_from(buf, dirent + 4)[0], out

        root_block, kids = child_blocks(self.root)
        if not root_block:
            return None
        state[root_block] = on_path
        stack = [(root_block, iter(kids))]
        while stack:
            block, pending = stack[-1]
            for child, child_block in pending:
                seen = state.get(child_block)
                if seen == on_path:
                    return child, child_block
                if seen is None:
                    _, grandkids = child_blocks(child)
                    state[child_block] = on_path
                    stack.append((child_block, iter(grandkids)))
                    break
            else:
                state[block] = done
                stack.pop()
        return None


# ------------------------------------------------------------------------------------------
# The merge overlay: a tree = base tree + changes
# ------------------------------------------------------------------------------------------
class Node:
    """A node the journal touched. ``base`` is the dirent in the base tree whose data and
    children it starts from (0: none); ``children``/``meta`` override that (None = deleted);
    ``forced`` is a copy's mtime, given to every base-only descendant too."""

    __slots__ = ("base", "children", "meta", "mtime", "forced")

    def __init__(self, base: int = 0, mtime: int | None = None, forced: int | None = None):
        self.base = base
        self.children: dict[bytes, Node | None] = {}
        self.meta: dict[str, Value | None] = {}
        self.mtime = mtime
        self.forced = forced


class MergedTree:
    """gvfs's compaction state: a base tree (may be None) with journal entries applied."""

    def __init__(self, base: TreeView | None = None):
        self.base = base
        self.root = Node(base.root if base else 0)
        self.keys: set[str] = set(base.keywords) if base else set()
        self.min_time: int | None = None
        self.max_time: int | None = None

    # -- navigation ------------------------------------------------------------------------
    def _child(self, node: Node, name: bytes, create: bool, mtime: int | None = None) -> Node | None:
        if name in node.children:
            child = node.children[name]
            if child is None and create:
                child = node.children[name] = Node(0, 0)
            return child
        base_child = self.base.find_child(node.base, name) if (self.base and node.base) else None
        if base_child is None and not create:
            return None
        child = Node(base_child or 0, node.forced if base_child else 0, node.forced)
        node.children[name] = child
        return child

    def node(self, path: str, create: bool = False) -> Node | None:
        node = self.root
        for name in split_path(path):
            node = self._child(node, name, create)
            if node is None:
                return None
        return node

    def _parent_and_name(self, path: str, create: bool) -> tuple[Node | None, bytes | None]:
        names = split_path(path)
        if not names:
            return None, None
        parent = self.root
        for name in names[:-1]:
            parent = self._child(parent, name, create)
            if parent is None:
                return None, None
        return parent, names[-1]

    def _clone(self, node: Node, mtime: int) -> Node:
        copy = Node(node.base, mtime, mtime)
        copy.meta = dict(node.meta)
        copy.children = {k: (None if c is None else self._clone(c, mtime)) for k, c in node.children.items()}
        return copy

    def _note_time(self, mtime: int) -> None:
        if mtime:
            if self.min_time is None or mtime < self.min_time:
                self.min_time = mtime
            if self.max_time is None or mtime > self.max_time:
                self.max_time = mtime

    # -- changes (gvfs compaction semantics) -----------------------------------------------
    def set(self, path: str, key: str, value: Value, mtime: int) -> None:
        node = self.node(path, create=True)
        node.meta[key] = list(value) if isinstance(value, (list, tuple)) else value
        node.mtime = mtime
        self.keys.add(key)
        self._note_time(mtime)

    def unset(self, path: str, key: str, mtime: int) -> None:
        node = self.node(path)
        if node is not None:
            node.meta[key] = None
            node.mtime = mtime
            self._note_time(mtime)

    def remove(self, path: str) -> None:
        if not split_path(path):  # "/" itself: everything goes
            self.root = Node(0, 0)
            return
        parent, name = self._parent_and_name(path, create=False)
        if parent is None:
            return
        parent.children[name] = None

    def copy(self, source: str, dest: str, mtime: int) -> None:
        src = self.node(source)
        clone = None if src is None else self._clone(src, mtime)
        self.remove(dest)
        if clone is None:
            return
        self._note_time(mtime)
        if not split_path(dest):
            self.root = clone
            return
        parent, name = self._parent_and_name(dest, create=True)
        parent.children[name] = clone

    def apply(self, rec: dict) -> None:
        """Apply one journal record (as :mod:`gvfs_journal` decodes it)."""
        kind = rec["kind"]
        if kind in ("set", "setv"):
            self.set(rec["path"], rec["key"], rec["value"], rec["mtime"])
        elif kind == "unset":
            self.unset(rec["path"], rec["key"], rec["mtime"])
        elif kind == "remove":
            self.remove(rec["path"])
        elif kind == "copy":
            self.copy(rec["source"], rec["path"], rec["mtime"])

    # -- reading the merged state ----------------------------------------------------------
    # An "item" is a Node, or an int: a dirent of the base tree nobody touched.
    def children_of(self, item, forced: int | None) -> list[tuple[bytes, Any, int | None]]:
        """Sorted (name, item, forced) of the item's live children."""
        if isinstance(item, Node):
            out = {}
            if self.base and item.base:
                for name, child in self.base.children(item.base):
                    out[name] = (child, item.forced)
            for name, child in item.children.items():
                if child is None:
                    out.pop(name, None)
                else:
                    out[name] = (child, child.forced)
            return [(n, c, f) for n, (c, f) in sorted(out.items())]
        return [(name, child, forced) for name, child in sorted(self.base.children(item))]

    def has_children(self, item) -> bool:
        if isinstance(item, Node):
            if any(c is not None for c in item.children.values()):
                return True
            if not (self.base and item.base):
                return False
            return any(name not in item.children for name, _ in self.base.children(item.base))
        return self.base.child_count(item) > 0

    def metadata_of(self, item) -> dict[str, Value]:
        if isinstance(item, Node):
            meta = self.base.metadata(item.base) if (self.base and item.base) else {}
            for k, v in item.meta.items():
                if v is None:
                    meta.pop(k, None)
                else:
                    meta[k] = v
            return meta
        return self.base.metadata(item)

    def encoded_metadata(self, item, key_ids: dict[str, int], kid_map: list[int]) -> list:
        """Sorted (new keyword id, value bytes or list of bytes) of an item, for the writer:
        base values are carried as bytes, never decoded."""
        if isinstance(item, Node):
            raw = self.base.raw_metadata(item.base) if (self.base and item.base) else ()
            entries = {kid_map[kid]: v for kid, v in raw}
            for k, v in item.meta.items():
                if v is None:  # an unset key may never have been set anywhere
                    if k in key_ids:
                        entries.pop(key_ids[k], None)
                elif isinstance(v, list):
                    entries[key_ids[k]] = [x.encode("utf-8", "surrogateescape") for x in v]
                else:
                    entries[key_ids[k]] = v.encode("utf-8", "surrogateescape")
            return sorted(entries.items())
        raw = self.base.raw_metadata(item)
        if len(raw) < 2:
            return [(kid_map[kid], v) for kid, v in raw]
        return sorted({kid_map[kid]: v for kid, v in raw}.items())

    def writer_rows(self, item, forced: int | None, key_ids: dict[str, int], kid_map: list[int]):
        """Sorted (name, child item, forced, has children, encoded metadata, time) of an
        item's live children: one bulk pass over the base tree for untouched directories."""
        if isinstance(item, Node):
            return [(name, child, f, self.has_children(child),
                     self.encoded_metadata(child, key_ids, kid_map), self.time_of(child, f))
                    for name, child, f in self.children_of(item, forced)]
        base_time = self.base.time_base
        rows = []
        for name, child, kids, raw, raw_time in self.base.child_rows(item):
            if len(raw) < 2:
                entries = [(kid_map[kid], v) for kid, v in raw]
            else:
                entries = sorted({kid_map[kid]: v for kid, v in raw}.items())
            t = forced if forced is not None else (raw_time + base_time if raw_time else 0)
            rows.append((name, child, forced, kids > 0, entries, t))
        if any(a[0] >= b[0] for a, b in zip(rows, rows[1:])):  # hostile order: sort it
            rows.sort(key=lambda r: r[0])
        return rows

    def time_of(self, item, forced: int | None) -> int:
        if isinstance(item, Node):
            if item.mtime is not None:
                return item.mtime
            return self.base.time(item.base) if (self.base and item.base) else 0
        return forced if forced is not None else self.base.time(item)

    def walk(self) -> Iterator[tuple[str, Any, int | None]]:
        """(path, item, forced) of every node, breadth-first. A base whose children offsets
        loop is refused up front (naming the offset); the visit budget of
        :meth:`cycle_guard` bounds shared blocks."""
        if self.base is not None:
            looping = self.base.find_loop()
            if looping is not None:
                raise FormatError(self.base.source, looping[0] + 4, "children offsets form a "
                                  f"cycle: dirent {looping[0]} points back to block {looping[1]}, "
                                  "which is on its own path from the root")
        level = [("/", self.root, self.root.forced)]
        guard = self.cycle_guard()
        while level:
            nxt = []
            for path, item, forced in level:
                guard(item)
                yield path, item, forced
                for name, child, f in self.children_of(item, forced):
                    nxt.append((join_path(path, name), child, f))
            level = nxt

    def cycle_guard(self):
        """A callable, given every item of a breadth-first walk, that raises FormatError when
        children offsets of the base form a cycle. Base dirents (ints) are reached only below
        Nodes that start from a base dirent, and below each such Node an acyclic base holds at
        most size/16 of them; a COPY's clones legitimately visit a base subtree again, so each
        such Node adds that much to the budget."""
        per_root = self.base.size // DIRENT_SIZE + 1 if self.base else 0
        budget = [0]

        def visit(item) -> None:
            if isinstance(item, int):
                budget[0] -= 1
                if budget[0] < 0:
                    raise FormatError(self.base.source, item, "children offsets form a cycle")
            elif item.base:
                budget[0] += per_root
        return visit

    def items(self) -> Iterator[tuple[str, dict[str, Value], int]]:
        """(path, metadata, mtime) of every node that has metadata, breadth-first."""
        for path, item, forced in self.walk():
            meta = self.metadata_of(item)
            if meta:
                yield path, meta, self.time_of(item, forced)


# ------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------
class _Out:
    """Sequential writer with our own position counter and a buffered tail."""

    def __init__(self, f: BinaryIO):
        self.f = f
        self.pos = 0
        self.tail = bytearray()

    def write(self, data) -> int:
        at = self.pos
        self.tail += data
        self.pos += len(data)
        if len(self.tail) >= 1 << 22:
            self.flush()
        return at

    def pad4(self) -> None:
        if self.pos % 4:
            self.write(b"\0" * (-self.pos % 4))

    def flush(self) -> None:
        self.f.write(self.tail)
        self.tail.clear()


def _string_block(strings: dict[bytes, int], start: int) -> bytes:
    """Assign offsets (from ``start``) to each distinct string; returns the block bytes."""
    out = bytearray()
    for s in strings:
        strings[s] = start + len(out)
        out += s + b"\0"
    out += b"\0" * (-len(out) % 4)
    return bytes(out)


def _meta_region(blocks: list[list[tuple[int, bytes | list[bytes]]]], start: int) -> tuple[bytes, list[int]]:
    """gvfs's per-directory metadata layout from ``start``: every node's block (entries sorted
    by keyword id), then the list tables, then one shared string block. Returns (bytes, block
    offset per node; 0 = no metadata)."""
    pos = start
    offsets = []
    strings: dict[bytes, int] = {}
    for entries in blocks:
        offsets.append(pos if entries else 0)
        if entries:
            pos += 4 + 8 * len(entries)
    tables_start = pos
    for entries in blocks:
        for _, v in entries:
            if isinstance(v, list):
                pos += 4 + 4 * len(v)
                for x in v:
                    strings.setdefault(x, 0)
            else:
                strings.setdefault(v, 0)
    string_bytes = _string_block(strings, pos)
    out = bytearray()
    tables = bytearray()
    table_pos = tables_start
    for entries in blocks:
        if not entries:
            continue
        out += _U32.pack(len(entries))
        for kid, v in entries:
            if isinstance(v, list):
                out += _PAIR.pack(kid | LIST_FLAG, table_pos)
                table = struct.pack(f">{len(v) + 1}I", len(v), *[strings[x] for x in v])
                tables += table
                table_pos += len(table)
            else:
                out += _PAIR.pack(kid, strings[v])
    out += tables
    out += string_bytes
    return bytes(out), offsets


def _time_base(merged: MergedTree) -> int:
    candidates = []
    base = merged.base
    if base is not None and (base.child_count(base.root) or base.has_metadata(base.root)):
        candidates.append(base.time_base)
    if merged.min_time is not None:
        candidates.append(merged.min_time - 1)
    base_time = min(candidates) if candidates else 0
    if merged.max_time is not None and merged.max_time - base_time > MAX_RAW_TIME:
        base_time = merged.max_time - MAX_RAW_TIME  # gvfs: keep the newest times exact
    return base_time


def _raw_time(t: int, base: int) -> int:
    if t == 0:
        return 0
    return min(max(t - base, 1), MAX_RAW_TIME)


class _DirectoryCopier:
    """Rewrites an untouched base directory's children block with numpy: dirents, names and
    metadata are moved as arrays and byte regions, never as a Python object per child.

    :meth:`directory` returns None whenever the directory is not the plain case (names or keys
    out of order, any offset or count that does not check out): the caller then
    takes the per-row path, which sorts what is unsorted and raises FormatError with the
    offending offset.
    """

    def __init__(self, base: TreeView | None, kid_map: list[int], empty: int, time_base: int):
        self.base = base
        self.empty = empty
        self.time_base = time_base
        self.words = None
        self.kid_map = np.array(kid_map, dtype=np.int64)
        usable = base is not None and base.size % 4 == 0 and abs(base.time_base) < 1 << 62 \
            and abs(time_base) < 1 << 62 and all(np.diff(self.kid_map) > 0)
        if usable:
            self.words = np.frombuffer(base.buf, dtype=">u4")

    def close(self) -> None:
        self.words = None  # release the export of the (mapped) base buffer

    def directory(self, off: int, forced: int | None, block_at: int):
        """(block bytes for a children block written at ``block_at``, [(child index, base
        dirent, forced time) of children that have children]) or None."""
        if self.words is None:
            return None
        base, words = self.base, self.words
        n, first = base._children_block(off)
        if n == 0:
            return None
        dirents = words[first // 4:first // 4 + 4 * n].reshape(n, 4).astype(np.int64)
        name_off, kids_off, meta_off, raw_time = dirents.T
        names = base.string_region(name_off)
        if names is None or not self._sorted_names(name_off):
            return None
        subdirs = self._subdirs(kids_off)
        if subdirs is None:
            return None
        names_start = block_at + 4 + DIRENT_SIZE * n
        name_block = names[1] + bytes(-len(names[1]) % 4)
        meta = self._metadata(meta_off, names_start + len(name_block))
        if meta is None:
            return None
        region, new_meta = meta
        out = np.empty((n, 4), dtype=">u4")
        out[:, 0] = name_off - names[0] + names_start
        out[:, 1] = self.empty
        out[:, 2] = new_meta
        out[:, 3] = self._times(raw_time, forced)
        data = b"".join((_U32.pack(n), out.tobytes(), name_block, region))
        return data, [(i, first + DIRENT_SIZE * i, forced) for i in subdirs.tolist()]

    def _sorted_names(self, name_off: np.ndarray) -> bool:
        """Names strictly increasing (what readers bisect), each starting a region piece."""
        found = self.base.strings_at(name_off)
        return found is not None and not any(map(operator.ge, found, itertools.islice(found, 1, None)))

    def _subdirs(self, kids_off: np.ndarray):
        size, words = self.base.size, self.words
        has = np.flatnonzero(kids_off)
        if not len(has):
            return has
        blocks = kids_off[has]
        if ((blocks % 4) | (blocks < 0) | (blocks + 4 > size)).any():
            return None
        counts = words[blocks // 4].astype(np.int64)
        if (counts > (size - blocks - 4) // DIRENT_SIZE).any():
            return None
        return has[counts > 0]

    def _metadata(self, meta_off: np.ndarray, start: int):
        """(region bytes: every child's block then the value strings, new block offset per
        child -- ``empty`` for none) or None."""
        size, words = self.base.size, self.words
        new_offs = np.full(len(meta_off), self.empty, dtype=np.int64)
        has = np.flatnonzero(meta_off)
        if not len(has):
            return b"", new_offs
        blocks = meta_off[has]
        if ((blocks % 4) | (blocks < 0) | (blocks + 4 > size)).any():
            return None
        counts = words[blocks // 4].astype(np.int64)
        if (counts > (size - blocks - 4) // 8).any():
            return None
        keep = counts > 0
        has, blocks, counts = has[keep], blocks[keep], counts[keep]
        if not len(has):
            return b"", new_offs
        if counts.sum() > size // 8:  # blocks shared by many dirents (hostile): no gather
            return None
        child_of_pair, pair_in_child = _ranges(counts)
        pair_word = blocks[child_of_pair] // 4 + 1 + 2 * pair_in_child
        key_field = words[pair_word].astype(np.int64)
        value_off = words[pair_word + 1].astype(np.int64)
        is_list = (key_field & LIST_FLAG) != 0
        kid = key_field & ~LIST_FLAG
        if (kid >= len(self.kid_map)).any():
            return None
        new_kid = self.kid_map[kid]
        same_child = child_of_pair[1:] == child_of_pair[:-1]
        if (np.diff(new_kid)[same_child] <= 0).any():        # blocks are bisected by key id
            return None
        tables = self._list_tables(value_off[is_list])
        if tables is None:
            return None
        table_len, table_strings = tables
        strings = np.concatenate((value_off[~is_list], table_strings))
        values = self.base.string_region(strings) if len(strings) else (0, b"")
        if values is None:
            return None
        block_words = 1 + 2 * counts
        block_start = np.cumsum(block_words) - block_words  # in words from `start`
        tables_start = start + 4 * int(block_words.sum())
        values_start = tables_start + 4 * int(table_len.sum())
        shift = values_start - values[0]                    # old string offset -> new
        blocks_out = np.empty(int(block_words.sum()), dtype=">u4")
        blocks_out[block_start] = counts
        pair_at = block_start[child_of_pair] + 1 + 2 * pair_in_child
        blocks_out[pair_at] = key_field - kid + new_kid     # keeps LIST_FLAG
        table_at = tables_start + 4 * (np.cumsum(table_len) - table_len)
        blocks_out[pair_at + 1] = np.where(is_list, 0, value_off + shift)
        blocks_out[(pair_at + 1)[is_list]] = table_at
        tables_out = np.empty(int(table_len.sum()), dtype=">u4")
        if len(table_len):
            heads = (table_at - tables_start) // 4
            tables_out[heads] = table_len - 1
            mask = np.ones(len(tables_out), dtype=bool)
            mask[heads] = False
            tables_out[mask] = table_strings + shift
        new_offs[has] = start + 4 * block_start
        data = values[1]
        return b"".join((blocks_out.tobytes(), tables_out.tobytes(), data, bytes(-len(data) % 4))), new_offs

    def _list_tables(self, table_off: np.ndarray):
        """(words per list table incl. its count, every string offset of every table in
        order) of list values whose tables are at ``table_off``, or None."""
        size, words = self.base.size, self.words
        if not len(table_off):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        if ((table_off % 4) | (table_off + 4 > size)).any():
            return None
        counts = words[table_off // 4].astype(np.int64)
        if (counts > (size - table_off - 4) // 4).any() or counts.sum() > size // 4:
            return None
        table_of, index = _ranges(counts)
        return counts + 1, words[table_off[table_of] // 4 + 1 + index].astype(np.int64)

    def _times(self, raw_time: np.ndarray, forced: int | None) -> np.ndarray:
        if forced is not None:
            t = np.full(len(raw_time), forced, dtype=np.int64)
        else:
            t = np.where(raw_time != 0, raw_time + self.base.time_base, 0)
        return np.where(t == 0, 0, np.clip(t - self.time_base, 1, MAX_RAW_TIME))


def _ranges(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For groups of ``counts`` items: (group of each item, its index in its group)."""
    group = np.repeat(np.arange(len(counts)), counts)
    return group, np.arange(int(counts.sum())) - (np.cumsum(counts) - counts)[group]


def _row_block(merged: MergedTree, item, forced: int | None, block_at: int, key_ids: dict,
               kid_map: list[int], empty: int, time_base: int) -> tuple[bytes, list]:
    """A children block written at ``block_at`` from the merged rows of ``item``: (bytes,
    [(child index, child item, its forced time) of children that have children])."""
    rows = merged.writer_rows(item, forced, key_ids, kid_map)
    names = {row[0]: 0 for row in rows}
    names_start = block_at + 4 + DIRENT_SIZE * len(rows)
    name_block = _string_block(names, names_start)
    region, meta_offs = _meta_region([row[4] for row in rows], names_start + len(name_block))
    block = bytearray(_U32.pack(len(rows)))
    subdirs = []
    for i, (name, child, f_child, has_kids, _, mtime) in enumerate(rows):
        block += _DIRENT.pack(names[name], empty, meta_offs[i] or empty, _raw_time(mtime, time_base))
        if has_kids:
            subdirs.append((i, child, f_child))
    return b"".join((block, name_block, region)), subdirs


def write_tree(merged: MergedTree, f: BinaryIO, tag: int) -> int:
    """Serialize ``merged`` into the empty file ``f`` (opened for writing; seekable and
    mmap-able for the final patch pass when it is a real file). Returns the size written.

    Layout: header; keyword table at 32 (sorted); one shared zero word that serves as every
    empty children block and every empty metadata block; root dirent; then per directory,
    breadth-first: its children block with the names' string block, followed by its children's
    metadata blocks, list tables and one string block (as gvfs groups them). Children offsets
    of directories are patched once their block is written (gvfs readers follow offsets only).
    """
    out = _Out(f)
    time_base = _time_base(merged)
    keys = sorted(merged.keys, key=key_bytes)
    key_ids = {k: i for i, k in enumerate(keys)}
    out.write(bytes(HEADER_SIZE))
    # keyword table
    kw_strings = {key_bytes(k): 0 for k in keys}
    table_len = 4 + 4 * len(keys)
    kw_block = _string_block(kw_strings, HEADER_SIZE + table_len)
    out.write(_U32.pack(len(keys)) + b"".join(_U32.pack(kw_strings[key_bytes(k)]) for k in keys))
    out.write(kw_block)
    empty = out.write(bytes(4))
    # root dirent + its name + its metadata
    root_at = out.pos
    out.write(bytes(DIRENT_SIZE))
    out.write(b"/\0")
    out.pad4()
    kid_map = [key_ids[k] for k in merged.base.keywords] if merged.base else []
    root_meta = merged.encoded_metadata(merged.root, key_ids, kid_map)
    region, (meta_off,) = _meta_region([root_meta], out.pos)
    out.write(region)
    patches = array("I")  # pairs: file position, value (children offsets of directories)
    _DIRENT.pack_into(out.tail, root_at, root_at + DIRENT_SIZE, empty, meta_off or empty, 0)
    level = [(root_at, merged.root, merged.root.forced)]
    guard = merged.cycle_guard()
    copier = _DirectoryCopier(merged.base, kid_map, empty, time_base)
    try:
        while level:
            nxt = []
            for dirent_at, item, forced in level:
                guard(item)
                block_at = out.pos
                patches.extend((dirent_at + 4, block_at))
                # an untouched directory is bulk-copied (no per-node objects); else row by row
                block = None if isinstance(item, Node) else copier.directory(item, forced, block_at)
                if block is None:
                    block = _row_block(merged, item, forced, block_at, key_ids, kid_map, empty, time_base)
                data, subdirs = block
                out.write(data)
                nxt.extend((block_at + 4 + DIRENT_SIZE * i, child, f) for i, child, f in subdirs)
            level = nxt
    finally:
        copier.close()  # release its view of the (mapped) base tree
    # the header last: now every offset is known
    header = _HEADER.pack(MAGIC, 1, 0, 0, tag, root_at, HEADER_SIZE, time_base)
    out.flush()
    size = out.pos
    _apply_patches(f, header, patches, size)
    return size


def _apply_patches(f: BinaryIO, header: bytes, patches: array, size: int) -> None:
    pairs = np.frombuffer(patches, dtype=np.uint32).reshape(-1, 2) if len(patches) else None
    if isinstance(f, io.BytesIO):
        view = f.getbuffer()
        _patch_view(view, header, pairs)
        del view
        return
    f.flush()
    with mmap.mmap(f.fileno(), size) as m:
        _patch_view(m, header, pairs)
        m.flush()


def _patch_view(view, header: bytes, pairs) -> None:
    view[:HEADER_SIZE] = header
    if pairs is None:
        return
    words = np.frombuffer(view, dtype=">u4")
    # later patches win (the placeholder for the root comes first)
    words[pairs[:, 0] // 4] = pairs[:, 1]
    del words


def tree_bytes(merged: MergedTree, tag: int) -> bytes:
    buf = io.BytesIO()
    write_tree(merged, buf, tag)
    return buf.getvalue()


# ------------------------------------------------------------------------------------------
# The codec
# ------------------------------------------------------------------------------------------
class GvfsTree(Codec):
    name = "gvfs-tree"
    store_label = "gvfs-store"
    columns = ColumnMap(time="mtime", key="path")
    kinds = ("node",)
    resumable = False
    magics = (MAGIC,)
    header_size = HEADER_SIZE

    def sample_file(self, rng: random.Random, count: int) -> bytes:
        """Files a thousand to a directory, each with an annotation, every fourth with
        emblems too."""
        nodes = [{"path": f"/home/user/d{i // 1000}/file-{i}.txt", "mtime": samples.BASE_S + i,
                  "metadata": {"annotation": f"note {rng.randrange(10**6)}",
                               **({"emblems": ["urgent", "shared"]} if i % 4 == 3 else {})}}
                 for i in range(count)]
        return self.write(nodes, tag=0x12345678)

    def demo_files(self, rng, described):
        """A store ``home`` (tree and journal) about the demo's ordinary files."""
        return {f"gvfs-metadata/{n}": d for n, d in store_demo_files(rng, described).items()}

    def read(self, buf, source, start=None, seq=0, stop=None) -> Iterator[Record]:
        tree = TreeView(buf, source)
        yield from self._records(tree, tree.walk(), 0)

    def read_columns(self, buf, source, start=None, seq=0, stop=None, limit=None):
        """A level of the tree at a time with numpy (see :mod:`.tree_columns`): exactly the
        generic default's columns, rows and damage."""
        try:
            tree = TreeView(buf, source)
        except FormatError as exc:
            return Columns({}, 0, None, seq, exc)
        return tree_columns.read_columns(self, tree, seq, limit)

    def _records(self, tree: TreeView, walk: Iterator[tuple[str, int]], seq: int
                 ) -> Iterator[Record]:
        """The records of the nodes ``walk`` visits that carry metadata, numbered from ``seq``."""
        for path, off in walk:
            if not tree.has_metadata(off):
                continue
            yield {"format": self.name, "seq": seq, "offset": off, "kind": "node", "path": path,
                   "mtime": tree.time(off), "metadata": tree.metadata(off)}
            seq += 1

    def write(self, records: Sequence[Record], *, tag: int = 0, **header) -> bytes:
        merged = MergedTree(None)
        for rec in records:
            node = merged.node(rec["path"], create=True)
            for k, v in rec.get("metadata", {}).items():
                node.meta[k] = list(v) if isinstance(v, (list, tuple)) else v
                merged.keys.add(k)
            node.mtime = int(rec.get("mtime") or 0)
            if node is not merged.root:  # the root's time is not stored (gvfs quirk)
                merged._note_time(node.mtime)
        return tree_bytes(merged, tag)

    def scan(self, buf, source, start=None, seq=0, stop=None, *, rows=SCAN_ROWS, span=None,
             form="columns", pace=None) -> Iterator[Columns]:
        """:meth:`read_columns`' rows and damage in batches of about ``rows`` rows, in memory
        bounded per batch (and per directory of two adjacent levels), whatever the tree's
        size: a tree cannot resume mid-file, so this is how it streams (``start`` must be
        None; ``span`` and ``form`` change nothing: every batch has every column). Each
        batch's texts may be read from ``buf`` only while it stays open; ``pace`` is called
        between batches and steps (the pages read so far are not needed again)."""
        if start is not None:
            raise ValueError(f"{self.name} cannot resume mid-file")
        try:
            tree = TreeView(buf, source)
        except FormatError as exc:
            yield Columns({}, 0, None, 0, exc)
            return
        yield from tree_columns.column_batches(self, tree, rows, pace)

    def records(self, buf, source, pace=None) -> Iterator[Record]:
        """read()'s records, made from :meth:`scan`'s batches: bounded memory, and no Python
        step per node that carries no metadata."""
        with contextlib.closing(self.scan(buf, source, pace=pace)) as batches:
            for cols in batches:
                yield from cols.records()
                if cols.error is not None:
                    raise cols.error

    paces_validation = True  # validate() calls its ``pace`` keyword after each batch

    def validate(self, buf, source, pace=None, **context) -> list[Finding]:
        """read()'s damage, without its dicts, in bounded memory."""
        for cols in self.scan(buf, source, pace=pace):
            if cols.error is not None:
                return [Finding(cols.error.offset, cols.error.reason)]
        return []


# -- samples (the demo tree) -----------------------------------------------------------------------

#: The demo store's tag (its journal's name carries it).
DEMO_TAG = 0x5EEDFACE


def store_demo_files(rng: random.Random, paths: Sequence[str]) -> dict[str, bytes]:
    """A tree holding emblems/annotations for ``paths`` (at least two) and a journal of later
    changes (a set, a list set, an unset, a move = copy + remove), tied by one tag."""
    nodes = []
    for n, path in enumerate(paths):
        meta: dict = {"annotation": f"{rng.choice(samples.WORDS)} #{n}"}
        if n % 2 == 0:
            meta["emblems"] = sorted(rng.sample(["important", "urgent", "shared", "favorite"], 2))
        nodes.append({"path": path, "mtime": samples.BASE_S + 60 * n, "metadata": meta})
    later = samples.BASE_S + 86_400
    entries = [
        {"kind": "set", "mtime": later, "path": paths[0], "key": "rating", "value": "5"},
        {"kind": "setv", "mtime": later + 1, "path": paths[1], "key": "tags",
         "value": ["draft", "q3"]},
        {"kind": "unset", "mtime": later + 2, "path": paths[0], "key": "annotation"},
        {"kind": "copy", "mtime": later + 3, "path": "/docs/archive/old-notes.md",
         "source": "/docs/old-notes.md"},
        {"kind": "remove", "mtime": later + 3, "path": "/docs/old-notes.md"},
    ]
    old = {"path": "/docs/old-notes.md", "mtime": samples.BASE_S, "metadata": {"x": "1"}}
    return {
        "home": GvfsTree().write(nodes + [old], tag=DEMO_TAG),
        journal_name("home", DEMO_TAG): GvfsJournal().write(entries, tag=DEMO_TAG),
    }
