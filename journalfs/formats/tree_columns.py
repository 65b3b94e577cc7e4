"""Column decoding of gvfs metadata trees: :meth:`GvfsTree.read_columns` without a Python
step per node.

The tree is walked breadth-first a whole level at a time with numpy: the level's dirents are
gathered as big-endian words, their metadata and children blocks checked and gathered at
once, and every string of the level (the children's names, the metadata values) is ended by
looking for its NUL eight bytes at a time. Each check is the one :class:`TreeView` makes
(offsets inside the file and aligned, counts that fit). On top, the walk insists on a plain
tree: no non-empty children block reached twice (then there is no loop and no sharing, so
:meth:`TreeView.find_loop` has nothing to report and the budgets hold), keys strictly
increasing inside a metadata block (no duplicate key, whose dict order only ``read()``
knows), times that fit 64 bits. Where anything does not hold, ``read()``'s own walk takes
over at the first node of that chunk of nodes, with the paths and budgets it would have
there, keeping the rows of the nodes before it -- after its loop check, which may name
damage before any record (skipped when a numpy pass over the children blocks alone finds
them plain) -- so rows, damage and its offset are always ``read()``'s.

A level is kept as the children blocks of the directories above it (block, count, directory,
path length each), its nodes found a chunk at a time: memory per directory, not per node.

Two ways out. :func:`read_columns` decodes the whole tree, its texts spans of a copy of the
file's bytes (the caller's buffer may be an mmap it closes) made into ``str`` -- or straight
into their JSON spelling, for ``records --json`` -- only when a column is read.
:func:`column_batches` (:meth:`GvfsTree.scan`) streams: after a check of the children blocks alone (in file order,
so nothing is remembered per block), each batch of rows is given as it is walked, its texts
spans of the caller's buffer; the walk keeps the next level's children blocks and a chain of
every directory's parent and name (paths are made from it per batch), past KEEP_BYTES in a
temporary file. A tree cannot resume mid-file, so where that walk meets what it does not
decode, :func:`read_columns` takes over and the rows after those given follow.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Sequence

import numpy as np

from .base import Codec, Columns, FormatError, Rows, most_rows
from .spans import paused_gc

#: The tree's layout (specs/gvfs-metadata.md) as both walks need it: a dirent's size, and
#: the flag of a metadata pair's keyword id that marks a list value. (This module is below
#: :mod:`.gvfs_tree`, which hands it the :class:`~.gvfs_tree.TreeView` it walks.)
LIST_FLAG = 0x80000000
DIRENT_SIZE = 16

#: 8-byte words looked at per string by numpy before the rest are found by bytes.find.
NUL_STEPS = 4
#: A level with fewer nodes than this, past NARROW_LEVELS levels, means a deep narrow tree:
#: numpy's cost per level would exceed read()'s per node, so read() decodes it.
NARROW_NODES, NARROW_LEVELS = 16, 256
#: Nodes checked and gathered per numpy step: bounds the step's temporaries.
CHUNK_NODES = 1 << 15

#: 64 KB windows of the file a paced step may reach (:func:`_paced_parts`): a fault on a
#: mapped file maps the cached pages around it (whole large folios: ~300 KB a read measured
#: on 6.18), so nodes whose blocks lie far apart (a level of directories) would otherwise
#: make one step hold the whole file.
PACE_WINDOWS = 256
_WINDOW_SHIFT = 16

_ONES = np.uint64(0x0101010101010101)
_HIGHS = np.uint64(0x8080808080808080)
_ONE = np.uint64(1)


class _Unplain(Exception):
    """The tree is not the plain case the vectorised walk decodes: read() decodes it."""


def string_ends(data: bytes, starts: np.ndarray) -> np.ndarray:
    """The NUL ending the string at each of ``starts`` (every one inside ``data``), -1
    where the file ends first. Eight bytes per string and step as one 64-bit word: the
    lowest byte flagged by ``(w - 0x01..) & ~w & 0x80..`` is the first NUL (borrows only
    flag bytes above a real NUL)."""
    size = len(data)
    ends = np.full(len(starts), -1, np.int64)
    which = np.arange(len(starts))
    pos = starts.astype(np.int64)
    if size >= 8 and len(pos):
        words = np.ndarray((size - 7,), dtype="<u8", buffer=data, strides=(1,))
        late_which, late_pos = [], []
        for _ in range(NUL_STEPS):
            near_end = pos > size - 8
            if near_end.any():  # no whole word left: bytes.find below
                late_which.append(which[near_end])
                late_pos.append(pos[near_end])
                which, pos = which[~near_end], pos[~near_end]
            word = words[pos]
            flags = (word - _ONES) & ~word & _HIGHS
            hit = flags != 0
            found = flags[hit]
            lowest = found & (~found + _ONE)  # 2 ** (8k + 7) for the first NUL at byte k
            ends[which[hit]] = pos[hit] + ((np.log2(lowest.astype(np.float64)).astype(np.int64)
                                            - 7) >> 3)
            which, pos = which[~hit], pos[~hit] + 8
            if not len(which):
                break
        which = np.concatenate([which] + late_which)
        pos = np.concatenate([pos] + late_pos)
    # the rest one by one in file order: the NUL found for one string also ends every later
    # one that starts before it (hostile offsets into one long run cost one scan, not many)
    find, nul = data.find, None
    order = np.argsort(pos, kind="stable")
    for i, p in zip(which[order].tolist(), pos[order].tolist()):
        if nul is None or -1 < nul < p:
            nul = find(b"\0", p)
        ends[i] = nul
    return ends


def _block_counts(words: np.ndarray, blocks: np.ndarray, size: int, item_bytes: int,
                  what: str) -> np.ndarray:
    """The count word at the start of each block (children blocks, metadata blocks, list
    tables): each block aligned to 4 bytes and inside the file, each count of ``item_bytes``
    items fitting in the rest of the file; else :class:`_Unplain` (``what`` failed)."""
    if ((blocks & 3) | (blocks + 4 > size)).any():
        raise _Unplain(what)
    counts = words[blocks >> 2].astype(np.int64)
    if (counts > (size - blocks - 4) // item_bytes).any():
        raise _Unplain(f"{what}: count")
    return counts


def _paced_parts(n: int, targets: np.ndarray) -> list[tuple[int, int]]:
    """``n`` items in (lo, hi) parts of equal size, few enough that each part's ``targets``
    (offsets the items lead to, in file order; 0: none) reach about PACE_WINDOWS windows."""
    windows = len(np.unique(targets[targets != 0] >> _WINDOW_SHIFT))
    parts = -(-windows // PACE_WINDOWS)
    if parts <= 1:
        return [(0, n)]
    step = -(-n // parts)
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def _ranges(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For groups of ``counts`` items: (group of each item, its index in its group)."""
    if len(counts) and (counts == 1).all():
        n = len(counts)
        return np.arange(n), np.zeros(n, np.int64)
    group = np.repeat(np.arange(len(counts)), counts)
    starts = np.cumsum(counts) - counts
    return group, np.arange(len(group)) - starts[group]


def _run_bounds(counts: np.ndarray) -> np.ndarray:
    """Where each of runs of ``counts`` items starts among all of them, and their total."""
    bounds = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=bounds[1:])
    return bounds


def _run_items(firsts: np.ndarray, bounds: np.ndarray, lo: int, hi: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Items ``lo .. hi-1`` of runs of consecutive dirents (run r: from ``firsts[r]``, items
    ``bounds[r] .. bounds[r+1]-1``, see :func:`_run_bounds`): (each item's dirent, its run)."""
    idx = np.arange(lo, hi, dtype=np.int64)
    run = np.searchsorted(bounds, idx, side="right") - 1
    return firsts[run] + DIRENT_SIZE * (idx - bounds[run]), run


def _each_paced(parts: list[tuple[int, int]], pace) -> Iterator[tuple[int, int]]:
    """``parts``, calling ``pace`` between them when there are several."""
    for i, part in enumerate(parts):
        if i and pace is not None:
            pace()
        yield part


#: Bytes of arrays a streamed walk keeps in memory per directory (the next level's
#: children blocks, the chain of directories) before the rest go to a temporary file.
KEEP_BYTES = 16 << 20


class _Kept:
    """An array a :class:`_Store` keeps, in memory or in its file: :meth:`get` gives it
    (from the file: read into memory for the caller), :meth:`rows` a range of its rows."""
    __slots__ = ("array", "store", "at", "dtype", "shape")

    def __init__(self, array=None, store=None, at=0, dtype=None, shape=()):
        self.array, self.store, self.at, self.dtype, self.shape = array, store, at, dtype, shape

    def get(self) -> np.ndarray:
        return self.array if self.array is not None else self.rows(0, self.shape[0])

    def rows(self, lo: int, hi: int) -> np.ndarray:
        if self.array is not None:
            return self.array[lo:hi]
        row = np.dtype(self.dtype).itemsize * int(np.prod(self.shape[1:], dtype=np.int64))
        return self.store.read(self.at + lo * row, (hi - lo, *self.shape[1:]), self.dtype)

    @property
    def nbytes(self) -> int:
        return self.array.nbytes if self.array is not None else \
            int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


class _Store:
    """The arrays of a streamed walk that grow with the tree's directories: in memory up
    to KEEP_BYTES in all, then written to an unlinked temporary file and read back with
    pread, a piece (a chunk's worth) or a range of rows at a time, so memory stays bounded
    whatever the number of directories. Not mapped: a mapping's faults bring in the pages
    around each one, which a walk reading here and there would keep resident."""

    def __init__(self, limit: int | None = None):
        self.limit = KEEP_BYTES if limit is None else limit
        self.in_memory = self.size = 0
        self.file = None

    def keep(self, array: np.ndarray) -> _Kept:
        if self.in_memory + array.nbytes <= self.limit:
            self.in_memory += array.nbytes
            return _Kept(array)
        array = np.ascontiguousarray(array)
        at = self._append(array)
        return _Kept(None, self, at, array.dtype, array.shape)

    def concat(self, pieces: list[_Kept]) -> _Kept:
        """One array of ``pieces`` (1-d, or 2-d of equal widths) end to end."""
        if all(piece.array is not None for piece in pieces):
            return _Kept(np.concatenate([piece.array for piece in pieces]))
        arrays = (piece.get() for piece in pieces)
        first = next(arrays)
        start = self._append(first)
        rows = len(first)
        for array in arrays:
            self._append(array)
            rows += len(array)
        return _Kept(None, self, start, first.dtype, (rows, *first.shape[1:]))

    def _append(self, array: np.ndarray) -> int:
        if self.file is None:
            self.file = tempfile.TemporaryFile(prefix="journalfs-tree-", buffering=0)
        at = self.size
        data = memoryview(np.ascontiguousarray(array)).cast("B")
        while data:  # a write may be short
            data = data[os.pwrite(self.file.fileno(), data, self.size):]
            self.size = at + array.nbytes - len(data)
        return at

    def read(self, at: int, shape: tuple, dtype) -> np.ndarray:
        out = np.empty(shape, dtype)
        if out.nbytes and os.preadv(self.file.fileno(), [memoryview(out).cast("B")], at) \
                != out.nbytes:
            raise OSError("the walk's temporary file was cut short")
        return out

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class _Nodes:
    """A level's nodes given one by one (the root's level): dirent, parent directory (-1: none),
    name span and path length (bytes, an upper bound) of each."""

    def __init__(self, offs, parent_dir, names, path_len):
        self.parts = (offs, parent_dir, names, path_len)

    def __len__(self) -> int:
        return len(self.parts[0])

    def nodes(self, walk: "_Walk", lo: int, hi: int) -> tuple:
        return tuple(part[lo:hi] for part in self.parts)


class _Children:
    """A level's nodes as the non-empty children blocks of some directories of the level
    above (consecutive ids from ``first_dir``): per directory its block, where its children
    start among the level's, and its path length. A node's dirent, name and path length are
    found when its chunk is walked, so a level costs 24 bytes per directory, not per node."""

    def __init__(self, walk: "_Walk", blocks, counts, first_dir: int, plens):
        bounds = _run_bounds(counts)
        self.first_dir, self.size = first_dir, int(bounds[-1])
        self.kept = [walk._keep(a) for a in (blocks + 4, bounds, plens)]

    def __len__(self) -> int:
        return self.size

    def dirents(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        firsts, bounds, _ = (kept.get() for kept in self.kept)
        return _run_items(firsts, bounds, lo, min(hi, self.size))

    def nodes(self, walk: "_Walk", lo: int, hi: int) -> tuple:
        offs, parent = self.dirents(lo, hi)
        name_at = walk.words[offs >> 2].astype(np.int64)
        ends = string_ends(walk.data, name_at)  # each found when the parent was walked
        return (offs, self.first_dir + parent, np.stack([name_at, ends], axis=1),
                self.kept[2].get()[parent] + 1 + (ends - name_at))


class _Walk:
    """The vectorised breadth-first walk (see the module's notes); :meth:`run` fills the
    arrays :class:`_NodeTexts` makes the columns from, or raises :class:`_Unplain`."""

    def __init__(self, tree, data, plain: bool = False):
        self.tree, self.data = tree, data
        self.size = size = len(data)
        self.words = np.frombuffer(data, dtype=">u4", count=size // 4)
        self.last_nul = data.rfind(b"\0")  # a string starting after it runs past the end
        self.keyword_count = len(tree.keywords)
        # True once :meth:`plain_structure` said so: no block can be reached twice
        self.plain = plain
        # per row (node with metadata), in walk order
        self.row_off, self.row_time, self.row_dir, self.row_name = [], [], [], []
        self.row_pairs = []
        # per metadata pair: keyword id, list?, value span (scalars) / item count (lists)
        self.pair_kid, self.pair_list, self.pair_span, self.pair_items = [], [], [], []
        self.item_span = []  # per list item: its span
        # per directory (node with a non-empty children block): parent directory, name span
        self.dir_parent, self.dir_name = [], []
        self.dirs = 0
        self.history: list[list] = []  # every level's pieces: where a hand-over starts from
        self.pace = None  # called while a wide level is checked (see :meth:`batches`)
        self.store: _Store | None = None  # a streamed walk's per-directory arrays
        self.parent_names: _Kept | None = None  # name spans of the level's parents (streamed)

    def _keep(self, array: np.ndarray) -> _Kept:
        """``array``, in the streamed walk's store when there is one."""
        return self.store.keep(array) if self.store is not None else _Kept(array)

    def run(self) -> None:
        """The whole walk; every row kept."""
        for _ in self.steps():
            pass

    def steps(self, keep_history: bool = True) -> Iterator[str]:
        """Walk the tree a chunk of nodes at a time, yielding after each chunk ("chunk"),
        each level ("level") and, paced, each part of a chunk whose nodes lie far apart
        ("part": see :func:`_paced_parts`). ``keep_history``: remember every level (for a
        hand-over)."""
        tree, size = self.tree, self.size
        self._mark_level(0)
        if not -(1 << 62) < tree.time_base < 1 << 62:
            raise _Unplain("times do not fit 64 bits")
        self.pairs = self.items = 0
        self.dirent_budget = size // 16 + 1           # find_loop's bound on dirents
        self.blocks_seen: set[int] = set()
        node_budget, text_budget = tree.node_budget(), tree.text_budget()
        nodes = text = levels = 0
        # the root has no parent (-1), its name is not part of paths, its path is "/"
        level = [_Nodes(np.array([tree.root], np.int64), np.array([-1], np.int64),
                        np.zeros((1, 2), np.int64), np.array([1], np.int64))]
        while level:
            if keep_history:
                self.history.append(level)
            self._mark_level(nodes)
            levels += 1
            if levels > NARROW_LEVELS and sum(map(len, level)) < NARROW_NODES:
                raise _Unplain("deep and narrow")
            nxt: list[_Children] = []
            for at, piece in enumerate(level):  # in chunks: small numpy temporaries
                for lo in range(0, len(piece), CHUNK_NODES):
                    self._mark_level(nodes, (at, lo, nxt))
                    chunk = piece.nodes(self, lo, lo + CHUNK_NODES)
                    nodes += len(chunk[0])
                    text += int(chunk[3].sum())  # bytes: at least the characters
                    if nodes > node_budget or text > text_budget:
                        raise _Unplain("budgets")
                    parts = self._parts(chunk)
                    for a, b in parts:
                        children = self._nodes(*(part[a:b] for part in chunk))
                        if children is not None:
                            nxt.append(children)
                        if len(parts) > 1:
                            yield "part"
                    yield "chunk"
            yield "level"
            level = nxt

    def _parts(self, chunk: tuple) -> list[tuple[int, int]]:
        """A chunk of nodes in parts that each reach a bounded part of the file (paced
        walks only): their children blocks, metadata blocks and parents' names."""
        if self.pace is None:
            return [(0, len(chunk[0]))]
        dirent_words = chunk[0] >> 2
        targets = [self.words[dirent_words + 1], self.words[dirent_words + 2]]
        if self.parent_names is not None and len(chunk[1]):
            parents = chunk[1] - self.prefix_base  # a run of the level above, in order
            lo, hi = int(parents[0]), int(parents[-1]) + 1
            targets.append(self.parent_names.rows(lo, hi)[parents - lo][:, 0])
        return _paced_parts(len(dirent_words), np.concatenate(targets))

    def plain_structure(self, pace=None) -> bool:
        """True when :meth:`TreeView.find_loop` has nothing to report (no damage, no loop):
        every children block reachable from the root passes its checks, none is reached
        twice, and together they hold no more dirents than the file can. Breadth-first over
        the children blocks alone, with numpy; False also for a deep narrow tree (then
        find_loop itself answers). Blocks met in file order, each after the one before
        (as writers lay them out), cannot be met twice: then nothing is remembered per
        block; else a second pass remembers every block."""
        return (self._plain_structure(True, pace)
                or self._plain_structure(False, pace))

    def _plain_structure(self, ordered: bool, pace) -> bool:
        size, words = self.size, self.words
        seen: set[int] = set()
        last_end = 0  # ordered: where the last block met ends
        dirents = size // 16 + 1
        # a level: runs of consecutive dirents (first dirent, count)
        level = [(_Kept(np.array([self.tree.root], np.int64)), _Kept(np.array([1], np.int64)))]
        levels = 0
        while level:
            levels += 1
            if levels > NARROW_LEVELS and len(level) < NARROW_NODES and \
                    sum(int(n.get().sum()) for _, n in level) < NARROW_NODES:
                return False
            nxt = []
            for kept_firsts, kept_counts in level:
                firsts, bounds = kept_firsts.get(), _run_bounds(kept_counts.get())
                for lo in range(0, int(bounds[-1]), CHUNK_NODES):
                    offs, _ = _run_items(firsts, bounds, lo, min(int(bounds[-1]), lo + CHUNK_NODES))
                    if pace is not None and not lo % (8 * CHUNK_NODES):
                        pace()  # the dirents read so far are not needed again
                    kids = words[(offs >> 2) + 1].astype(np.int64)
                    blocks = kids[kids != 0]
                    parts = _paced_parts(len(blocks), blocks) if pace else [(0, len(blocks))]
                    try:
                        n = np.concatenate([np.zeros(0, np.int64)] + [
                            _block_counts(words, blocks[a:b], size, DIRENT_SIZE,
                                          "children block") for a, b in _each_paced(parts, pace)])
                    except _Unplain:
                        return False
                    blocks, n = blocks[n > 0], n[n > 0]
                    if not len(blocks):
                        continue
                    if ordered:
                        ends = blocks + 4 + DIRENT_SIZE * n
                        if blocks[0] < last_end or (blocks[1:] < ends[:-1]).any():
                            return False
                        last_end = int(ends[-1])
                    else:
                        listed = blocks.tolist()
                        if len(set(listed)) != len(listed) or not seen.isdisjoint(listed):
                            return False
                        seen.update(listed)
                    dirents -= int(n.sum())
                    if dirents < 0:
                        return False
                    nxt.append((self._keep(blocks + 4), self._keep(n)))
            level = nxt
        return True

    _KEPT = ("row_off", "row_time", "row_dir", "row_name", "row_pairs", "pair_kid", "pair_list",
             "pair_span", "pair_items", "item_span", "dir_parent", "dir_name")

    def _mark_level(self, nodes: int, where: tuple | None = None) -> None:
        """Remember where the nodes about to be walked (a level, or a chunk of one) start:
        how many nodes come before them, how much of each kept list those filled, and
        ``where``: (piece, its first node, the next level's pieces found before them) --
        None at a level's start."""
        self.level_start = (nodes, self.dirs, [len(getattr(self, name)) for name in self._KEPT],
                            where)

    def drop_level(self) -> int:
        """Forget what the nodes the walk stopped in kept (their rows go to the exact walk);
        return how many nodes come before them."""
        nodes, self.dirs, lengths, _ = self.level_start
        for name, length in zip(self._KEPT, lengths):
            del getattr(self, name)[length:]
        return nodes

    def exact_state(self, texts: "_NodeTexts"):
        """Where read()'s walk goes on from the nodes the walk stopped in (after
        :meth:`drop_level`): (their level's nodes from the first of them on, the next
        level's nodes found before them -- both as (path, dirent) --, the characters of
        path text of every node before them); None before the first level."""
        if not self.history:
            return None
        level = self.history[-1]
        at, lo, found = self.level_start[3] or (0, 0, [])

        def expanded(pieces, first=0):
            return [piece.nodes(self, first if i == 0 else 0, len(piece))
                    for i, piece in enumerate(pieces)]

        before = [piece.nodes(self, 0, len(piece)) for earlier in self.history[:-1]
                  for piece in earlier]
        before += expanded(level[:at]) + [level[at].nodes(self, 0, lo)]
        # each piece's paths joined by NULs: all but one NUL are not path text
        chars = sum(len(texts.path_texts(piece[1], piece[2])) - len(piece[1]) + 1
                    for piece in before if len(piece[1]))
        return (_placed_paths(texts, expanded(level[at:], lo)),
                _placed_paths(texts, expanded(found)), chars)

    def _nodes(self, offs, parent_dir, names, path_len):
        """Check and gather nodes ``offs`` of one level (in walk order): their rows, and the
        next level's piece of their children (None: none)."""
        size, words = self.size, self.words
        at = offs >> 2
        kids = words[at + 1].astype(np.int64)
        meta = words[at + 2].astype(np.int64)
        # -- metadata blocks: the rows ------------------------------------------------
        has = np.flatnonzero(meta)
        counts = np.zeros(len(offs), np.int64)
        if len(has):
            counts[has] = _block_counts(words, meta[has], size, 8, "metadata block")
        rows = np.flatnonzero(counts)
        starts = []  # every string of the rows: values, then list items
        if len(rows):
            n = counts[rows]
            self.pairs += int(n.sum())
            if self.pairs > size >> 3:
                raise _Unplain("shared metadata blocks")
            row_of, index = _ranges(n)
            pair_at = (meta[rows][row_of] >> 2) + 1 + 2 * index
            key = words[pair_at].astype(np.int64)
            value = words[pair_at + 1].astype(np.int64)
            is_list = (key & LIST_FLAG) != 0
            kid = key & ~LIST_FLAG
            if (kid >= self.keyword_count).any():
                raise _Unplain("keyword id")
            if len(kid) > len(rows) and (np.diff(kid)[row_of[1:] == row_of[:-1]] <= 0).any():
                raise _Unplain("keys out of order")
            item_counts = np.zeros(len(kid), np.int64)
            scalars = np.flatnonzero(~is_list)
            lists = np.flatnonzero(is_list)
            scalar_at = value[scalars]
            if ((scalar_at <= 0) | (scalar_at >= size)).any():
                raise _Unplain("value offset")
            starts.append(scalar_at)
            if len(lists):
                tables = value[lists]
                m = _block_counts(words, tables, size, 4, "list table")
                self.items += int(m.sum())
                if self.items > size >> 2:
                    raise _Unplain("shared list tables")
                item_counts[lists] = m
                table_of, index = _ranges(m)
                item_at = words[(tables[table_of] >> 2) + 1 + index].astype(np.int64)
                if ((item_at <= 0) | (item_at >= size)).any():
                    raise _Unplain("list item offset")
                starts.append(item_at)
            self.row_off.append(offs[rows])
            self.row_time.append(words[at[rows] + 3].astype(np.int64))
            # what the texts need is kept narrow: offsets fit 32 bits, counts and ids 31
            self.row_dir.append(parent_dir[rows].astype(np.int32))
            self.row_name.append(names[rows].astype(np.uint32))
            self.row_pairs.append(n.astype(np.int32))
            self.pair_kid.append(kid.astype(np.int32))
            self.pair_list.append(is_list)
            self.pair_items.append(item_counts.astype(np.int32))
        # -- children blocks: the next level ------------------------------------------
        has = np.flatnonzero(kids)
        child_counts = np.zeros(len(offs), np.int64)
        if len(has):
            child_counts[has] = _block_counts(words, kids[has], size, DIRENT_SIZE,
                                              "children block")
        parents = np.flatnonzero(child_counts)
        children = None
        if len(parents):
            blocks = kids[parents]
            if not self.plain:
                listed = blocks.tolist()
                if len(set(listed)) != len(listed) or not self.blocks_seen.isdisjoint(listed):
                    raise _Unplain("a children block reached twice")
                self.blocks_seen.update(listed)
            n = child_counts[parents]
            self.dirent_budget -= int(n.sum())
            if self.dirent_budget < 0:
                raise _Unplain("overlapping children blocks")
            children = _Children(self, blocks, n, self.dirs,
                                 np.where(parent_dir[parents] < 0, 0, path_len[parents]))
            self.dirs += len(parents)
            if self.store is None:
                self.dir_parent.append(parent_dir[parents])
                self.dir_name.append(names[parents].astype(np.uint32))
            else:  # streamed: kept for the chain, the parent as its index in its level
                self.dir_parent.append(self._keep(
                    (parent_dir[parents] - self.prefix_base).astype(np.int32)))
                self.dir_name.append(self._keep(names[parents].astype(np.uint32)))
            self._check_names(children)
        # -- every string of the rows ended at once -----------------------------------
        if starts:
            at_all = np.concatenate(starts) if len(starts) > 1 else starts[0]
            ends = string_ends(self.data, at_all)
            if (ends < 0).any():
                raise _Unplain("string runs past the end")
            spans = np.stack([at_all, ends], axis=1)
            value_spans = np.zeros((len(kid), 2), np.uint32)  # lists: (0, 0), no text
            value_spans[scalars] = spans[:len(scalars)]
            self.pair_span.append(value_spans)
            if len(lists):
                self.item_span.append(spans[len(scalars):].astype(np.uint32))
        return children

    def _check_names(self, children: _Children) -> None:
        """The children's names: each offset inside the file with a NUL after it (their
        ends are found when their own level is walked)."""
        size, words, last_nul = self.size, self.words, self.last_nul
        for lo in range(0, len(children), 8 * CHUNK_NODES):
            offs, _ = children.dirents(lo, lo + 8 * CHUNK_NODES)
            name_at = words[offs >> 2].astype(np.int64)
            if ((name_at <= 0) | (name_at >= size) | (name_at > last_nul)).any():
                raise _Unplain("name offset")
            if self.pace is not None:
                self.pace()  # a wide level's dirents are read again only when it is walked

    def columns(self, name: str, chain: "_Chain | None" = None, first_seq: int = 0
                ) -> tuple[dict, int]:
        """(the columns of the rows kept, how many rows), the rows forgotten. Their paths
        are made from ``chain`` (the rows' directories: the deepest level of it, from
        ``prefix_base`` on); by default from every directory's path, made when a path is
        first asked for."""
        def joined(name, dtype=np.int64, shape=(0,)):
            parts = getattr(self, name)
            setattr(self, name, [])  # each chunk freed once joined: no second copy of all
            return np.concatenate(parts) if parts else np.zeros(shape, dtype)

        offsets = joined("row_off")
        raw = joined("row_time")
        rows = len(offsets)
        mtimes = np.where(raw == 0, 0, raw + self.tree.time_base)
        del raw
        row_dir = joined("row_dir", np.int32)
        if chain is None:
            data, dir_parent = self.data, joined("dir_parent")
            dir_name = joined("dir_name", np.uint32, (0, 2))

            def paths():
                return _dir_prefixes(data, dir_parent, dir_name)
        else:
            row_dir = np.where(row_dir < 0, -1, row_dir - self.prefix_base).astype(np.int32)
            paths = (chain, len(chain.levels))
        texts = _NodeTexts(
            self.data, self.tree.keywords, paths, row_dir,
            joined("row_name", np.uint32, (0, 2)), joined("row_pairs", np.int32),
            joined("pair_kid", np.int32), joined("pair_list", bool),
            joined("pair_span", np.uint32, (0, 2)), joined("pair_items", np.int32),
            joined("item_span", np.uint32, (0, 2)))
        return {"format": [name] * rows,
                "seq": np.arange(first_seq, first_seq + rows, dtype=np.int64),
                "offset": offsets, "kind": ["node"] * rows, "path": _PathColumn(texts),
                "mtime": mtimes, "metadata": _MetadataColumn(texts)}, rows

    def batches(self, name: str, rows: Rows, pace=None) -> Iterator[tuple[dict, int]]:
        """The walk's rows as columns, about ``rows`` (:data:`~.base.Rows`) at a time and
        never across levels,
        keeping only the next level's children blocks and the :class:`_Chain` of
        directories the paths are made from. ``pace`` is called after each batch. Raises
        :class:`_Unplain` where the walk stops."""
        chain = _Chain(self.data)
        self.prefix_base, level_dirs, seq, levels = 0, 0, 0, 0
        self.pace = pace
        self.store = self.store or _Store()
        for step in self.steps(keep_history=False):
            kept = sum(map(len, self.row_off))
            if kept and (step != "chunk" or kept >= most_rows(rows)):
                columns, n = self.columns(name, chain, seq)
                seq += n
                yield columns, n
                if pace is not None:
                    pace()
            elif step == "part" and pace is not None:
                pace()
            if step == "level":  # the next level's nodes are children of this level's directories
                if levels and self.dir_parent:  # the root is the chain's top, no level of it
                    chain.levels.append((self.store.concat(self.dir_parent),
                                         self.store.concat(self.dir_name)))
                    self.parent_names = chain.levels[-1][1]
                levels += 1
                self.prefix_base, level_dirs = level_dirs, self.dirs
                self.dir_parent, self.dir_name = [], []


class _Chain:
    """The directories of the levels walked, 12 bytes each: per level, each directory's
    parent (its index among the level above's; the first level's parent is the root) and
    name span. A batch's paths are made from it, names gathered with numpy."""

    def __init__(self, data):
        self.u8 = np.frombuffer(data, np.uint8)
        self.levels: list[tuple[_Kept, _Kept]] = []

    def paths(self, depth: int, parent: np.ndarray, names: np.ndarray) -> list[bytes]:
        """The raw paths of nodes whose parents are directories ``parent`` of the chain's
        level ``depth`` (its top, the root, when 0) and whose names are at ``names``."""
        out: list[bytes] = []
        step = max(1, (1 << 20) // (depth + 1))  # bounds the (rows x depth) temporaries
        for lo in range(0, len(parent), step):
            out += self._paths(depth, parent[lo:lo + step], names[lo:lo + step])
        return out

    def _paths(self, depth: int, parent: np.ndarray, names: np.ndarray) -> list[bytes]:
        # a path is "/" and each name after a "/"; leading empty names of directories are
        # dropped (join_path keeps "/" for a directory whose names are all empty)
        n = len(parent)
        starts = np.empty((n, depth + 1), np.int64)
        lengths = np.empty((n, depth + 1), np.int64)
        at = parent.astype(np.int64)
        for level in range(depth - 1, -1, -1):
            # the rows' ancestors at a level are a run of it (breadth-first order): read that
            lo, hi = (int(at.min()), int(at.max()) + 1) if n else (0, 0)
            parents, spans = (kept.rows(lo, hi) for kept in self.levels[level])
            span = spans[at - lo].astype(np.int64)
            starts[:, level], lengths[:, level] = span[:, 0], span[:, 1] - span[:, 0]
            at = parents[at - lo]
        starts[:, depth] = names[:, 0]
        lengths[:, depth] = names[:, 1].astype(np.int64) - names[:, 0]
        kept = np.ones((n, depth + 1), bool)
        if depth:
            kept[:, :depth] = ~np.logical_and.accumulate(lengths[:, :depth] == 0, axis=1)
        piece = np.where(kept, lengths + 1, 0).ravel()
        ends = np.cumsum(piece)
        kept = kept.ravel()
        src, size, dst = starts.ravel()[kept], lengths.ravel()[kept], (ends - piece + 1)[kept]
        text = np.full(int(ends[-1]) if n else 0, ord("/"), np.uint8)
        total = int(size.sum())
        if total:
            before = np.cumsum(size) - size
            walk = np.arange(total)
            text[np.repeat(dst - before, size) + walk] = self.u8[np.repeat(src - before, size) + walk]
        blob = text.tobytes()
        row_ends = ends.reshape(n, depth + 1)[:, -1] if n else ends
        row_starts = np.concatenate([[0], row_ends[:-1]]) if n else row_ends
        return list(map(blob.__getitem__, map(slice, row_starts.tolist(), row_ends.tolist())))


def _dir_prefixes(data, dir_parent: np.ndarray, dir_name: np.ndarray) -> list[bytes]:
    """Each directory's path and a "/": what its children's paths start with; "/" alone
    where the path is "/" (the root, whose parent is -1, and directories whose names are all
    empty: join_path's rule). Directories come after their parents."""
    out: list[bytes] = []
    append = out.append
    cut = data.__getitem__
    for parent, start, end in zip(dir_parent.tolist(), dir_name[:, 0].tolist(),
                                  dir_name[:, 1].tolist()):
        if parent < 0:
            append(b"/")
            continue
        path = out[parent] + cut(slice(start, end))
        append(path + b"/" if path != b"/" else path)
    return out


class _NodeTexts:
    """The path and metadata texts of the rows, as spans of ``data``, made into Python
    values (or JSON text) when first asked."""

    def __init__(self, data, keywords: list[str], prefixes, row_dir, row_name, row_pairs,
                 pair_kid, pair_list, pair_span, pair_items, item_span):
        self.data, self.keywords = data, keywords
        self.u8 = np.frombuffer(data, np.uint8)
        self.rows = len(row_dir)
        self.row_dir, self.row_name = row_dir, row_name
        self.pair_bounds = np.zeros(self.rows + 1, np.int64)
        np.cumsum(row_pairs, out=self.pair_bounds[1:])
        self.pair_kid, self.pair_list, self.pair_span = pair_kid, pair_list, pair_span
        self.item_bounds = np.zeros(len(pair_kid) + 1, np.int64)
        np.cumsum(pair_items, out=self.item_bounds[1:])
        self.item_span = item_span
        # the directories' path prefixes: a list, or a function making it when first asked;
        # or (chain, depth): paths made from a :class:`_Chain` (a streamed batch)
        self._prefixes, self._chain = (None, prefixes) if isinstance(prefixes, tuple) \
            else (prefixes, None)
        self._paths: list[str] | None = None
        self._metadata: list[dict] | None = None

    def path_texts(self, parent_dir: np.ndarray, names: np.ndarray) -> str:
        """The paths of nodes whose parents are directories ``parent_dir`` (-1: the root
        itself) and names are at ``names``, decoded as read() does, NUL-separated."""
        prefixes = self.prefixes()
        paths = [b"/" if parent < 0 else prefixes[parent] + name
                 for parent, name in zip(parent_dir.tolist(), self._cut(names))]
        return b"\0".join(paths).decode("utf-8", "surrogateescape")

    def _joined(self, spans: np.ndarray) -> bytes:
        """The strings at ``spans`` (each ending at its NUL), each with its NUL, back to
        back: one numpy gather, no Python step per string."""
        starts = spans[:, 0].astype(np.int64)
        lengths = spans[:, 1].astype(np.int64) - starts + 1
        if not len(lengths):
            return b""
        placed = np.cumsum(lengths) - lengths
        where = np.repeat(starts - placed, lengths) + np.arange(int(placed[-1] + lengths[-1]))
        return self.u8[where].tobytes()

    def _cut(self, spans: np.ndarray) -> list[bytes]:
        data = self.data
        return list(map(data.__getitem__, map(slice, spans[:, 0].tolist(), spans[:, 1].tolist())))

    def prefixes(self) -> list[bytes]:
        """Each directory's path prefix (:func:`_dir_prefixes`)."""
        if callable(self._prefixes):
            self._prefixes = self._prefixes()
        return self._prefixes

    def path_bytes(self, lo: int, hi: int) -> list[bytes]:
        """The raw paths of rows ``lo .. hi-1``."""
        dirs = self.row_dir[lo:hi]
        if len(dirs) and dirs[0] < 0:  # the root's row: "/"
            return [b"/"] + self.path_bytes(lo + 1, hi)
        if self._chain is not None:
            chain, depth = self._chain
            return chain.paths(depth, dirs, self.row_name[lo:hi])
        names = self._joined(self.row_name[lo:hi]).split(b"\0")
        return list(map(bytes.__add__, map(self.prefixes().__getitem__, dirs.tolist()), names))

    def paths(self) -> list[str]:
        if self._paths is None:
            with paused_gc():
                joined = b"\0".join(self.path_bytes(0, self.rows))
                self._paths = joined.decode("utf-8", "surrogateescape").split("\0") \
                    if self.rows else []
        return self._paths

    def _values(self, lo: int, hi: int) -> tuple[list[bytes], list[bytes]]:
        """(scalar value of each pair of rows lo..hi-1, b"" for lists; every list item of
        those pairs), raw bytes."""
        a, b = int(self.pair_bounds[lo]), int(self.pair_bounds[hi])
        spans = self.pair_span[a:b]  # lists: (0, 0), an empty text
        items = self.item_span[int(self.item_bounds[a]):int(self.item_bounds[b])]
        return self._cut(spans), self._cut(items)

    def metadata(self) -> list[dict]:
        if self._metadata is None:
            with paused_gc():
                self._metadata = self._dicts(0, self.rows)
        return self._metadata

    def _dicts(self, lo: int, hi: int) -> list[dict]:
        values, items = self._values(lo, hi)
        text = b"\0".join(values + items).decode("utf-8", "surrogateescape").split("\0")
        a, b = int(self.pair_bounds[lo]), int(self.pair_bounds[hi])
        pairs = b - a
        keys = np.array(self.keywords, dtype=object)[self.pair_kid[a:b]].tolist() \
            if self.keywords else []
        listed = self.pair_list[a:b]
        if listed.any():
            bounds = (self.item_bounds[a:b + 1] - self.item_bounds[a] + pairs).tolist()
            for p in np.flatnonzero(listed).tolist():
                text[p] = text[bounds[p]:bounds[p + 1]]
        counts = np.diff(self.pair_bounds[lo:hi + 1])
        if (counts == 1).all():
            return list(map(dict, zip(zip(keys, text))))
        out, at = [], 0
        for n in counts.tolist():
            out.append(dict(zip(keys[at:at + n], text[at:at + n])))
            at += n
        return out

    # -- JSON ---------------------------------------------------------------------------------
    def path_spelling(self, lo: int, hi: int):
        """Rows lo..hi-1's paths as JSON text without quotes (UTF-8), or None when one needs
        escaping or is not UTF-8 (json_line's own spelling)."""
        paths = self.path_bytes(lo, hi)
        if not _plain_json(b"\0".join(paths)):
            return None
        return paths, True

    def metadata_spelling(self, lo: int, hi: int):
        """Rows lo..hi-1's metadata as json.dumps spells the dicts, or None (see above)."""
        keys = self._key_texts()
        if keys is None:
            return None
        a, b = int(self.pair_bounds[lo]), int(self.pair_bounds[hi])
        if a == b:
            return None
        listed = self.pair_list[a:b]
        scalars = np.flatnonzero(~listed)
        values = self._joined(self.pair_span[a:b][scalars])
        items = self._joined(self.item_span[int(self.item_bounds[a]):int(self.item_bounds[b])])
        if not _plain_json(values + items):
            return None
        texts = (b'"' + values[:-1].replace(b"\0", b'"\0"') + b'"').split(b"\0") \
            if values else []
        if len(scalars) < b - a:
            texts = self._with_lists(texts, scalars, listed, items, a, b)
        # each pair's text after what comes before it: ", " inside a row, "{" at the first
        # row's first key, "}{" at every other row's: the rows' texts are then slices of
        # one joined text, each ending with the "}" that starts the next one's lead
        lead = np.zeros(b - a, np.int64)
        bounds = self.pair_bounds[lo:hi + 1] - a
        lead[bounds[1:-1]] = 2
        lead[0] = 1
        heads = keys[3 * self.pair_kid[a:b].astype(np.int64) + lead].tolist()
        pieces = list(map(bytes.__add__, heads, texts))
        joined = b"".join(pieces) + b"}"
        ends = np.zeros(b - a + 1, np.int64)
        np.cumsum(np.fromiter(map(len, pieces), np.int64, b - a), out=ends[1:])
        firsts = ends[bounds[:-1]] + (np.arange(hi - lo) > 0)
        return list(map(joined.__getitem__, map(slice, firsts.tolist(),
                                                (ends[bounds[1:]] + 1).tolist()))), False

    def _with_lists(self, texts: list[bytes], scalars, listed, items: bytes, a: int, b: int
                    ) -> list[bytes]:
        """Pairs ``a .. b-1``'s value texts: ``texts`` of the scalars, and each list as
        json.dumps spells it, made from ``items`` (every item with its NUL) at once: the
        NUL after a list's last item becomes \\x01, then NULs are the ", " inside lists and
        \\x01s the cuts between them."""
        counts = np.diff(self.item_bounds[a:b + 1])[listed]
        full = counts > 0
        spelt = np.empty(b - a, dtype=object)
        spelt[scalars] = texts
        lists = np.flatnonzero(listed)
        spelt[lists[~full]] = b"[]"
        if full.any():
            marked = np.frombuffer(items, np.uint8).copy()
            ends = np.flatnonzero(marked == 0)  # each item's NUL (texts hold no other)
            marked[ends[np.cumsum(counts[full]) - 1]] = 1
            joined = marked[:-1].tobytes()
            spelt[lists[full]] = (b'["' + joined.replace(b"\0", b'", "')
                                  .replace(b"\x01", b'"]\x01["') + b'"]').split(b"\x01")
        return spelt.tolist()

    def _key_texts(self):
        """Per keyword id k: at 3k its JSON key after ", ", at 3k+1 after "{", at 3k+2
        after "}{"; None when a keyword is not UTF-8 (json_line writes it as "b64:...")."""
        if not hasattr(self, "_keys"):
            texts = []
            try:
                if len(set(self.keywords)) < len(self.keywords):
                    raise UnicodeEncodeError("utf-8", "", 0, 1, "two ids, one key: one dict entry")
                for key in self.keywords:
                    spelt = json.dumps(key, ensure_ascii=False).encode("utf-8") + b": "
                    texts += [b", " + spelt, b"{" + spelt, b"}{" + spelt]
                self._keys = np.array(texts, dtype=object)
            except UnicodeEncodeError:
                self._keys = None
        return self._keys


def _plain_json(text: bytes) -> bool:
    """True when ``text`` (strings joined by NULs) is UTF-8 and none of its strings needs a
    JSON escape (control characters, quotes, backslashes): each is its own JSON text."""
    if not text.isascii():
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            return False
    codes = np.frombuffer(text, np.uint8)
    return not ((codes - np.uint8(1) < 0x1F).any() or b'"' in text or b"\\" in text)


class _TextColumn(Sequence):
    """A text column of the rows (a list once read)."""

    def __init__(self, texts: _NodeTexts):
        self._texts = texts

    def __len__(self) -> int:
        return self._texts.rows

    def __getitem__(self, index):
        return self._values()[index]

    def __iter__(self):
        return iter(self._values())

    def __eq__(self, other):
        return list(self) == list(other)

    def tolist(self) -> list:
        return list(self._values())


class _PathColumn(_TextColumn):
    def _values(self) -> list[str]:
        return self._texts.paths()

    def json_spelling(self, lo: int, hi: int):
        return self._texts.path_spelling(lo, hi)


class _MetadataColumn(_TextColumn):
    def _values(self) -> list[dict]:
        return self._texts.metadata()

    def json_spelling(self, lo: int, hi: int):
        return self._texts.metadata_spelling(lo, hi)


def _placed_paths(texts: _NodeTexts, pieces: list) -> list[tuple[str, int]]:
    """(path, dirent offset) of the nodes of level ``pieces``, in walk order."""
    out: list[tuple[str, int]] = []
    for offs, parent_dir, names, _ in pieces:
        if len(offs):
            out += zip(texts.path_texts(parent_dir, names).split("\0"), offs.tolist())
    return out


def read_columns(codec: Codec, tree, seq: int, limit: int | None) -> Columns:
    """:meth:`GvfsTree.read_columns` of the tree ``tree`` (a :class:`~.gvfs_tree.TreeView`;
    start and stop are ignored, as read() ignores them)."""
    buf = tree.buf
    data = buf if isinstance(buf, bytes) else bytes(buf)
    tree = tree.over(data)
    walk = _Walk(tree, data)
    try:
        with paused_gc():
            walk.run()
    except _Unplain:
        return _handed_over(codec, tree, walk, seq, limit)
    walk.history = []  # no hand-over: the levels' pieces can go before the columns are joined
    columns, rows = walk.columns(codec.name)
    if not rows:  # as the generic default: no rows, no columns
        return Columns({}, 0, None, seq, None)
    next_offset = None
    if limit is not None and rows > limit:
        next_offset = int(columns["offset"][limit])
        columns = {k: v[:limit] if not isinstance(v, _TextColumn) else _Window(v, 0, limit)
                   for k, v in columns.items()}
        rows = limit
    return Columns(columns if rows else {}, rows, next_offset, seq + rows, None)


def _handed_over(codec, tree, walk: _Walk, seq: int, limit: int | None) -> Columns:
    """The columns when the vectorised walk stopped in some chunk of nodes: read()'s loop
    check first (its damage comes before any record, a loop may end the walk early: then
    read() decodes the whole tree), the rows of the nodes before that chunk as the
    vectorised walk found them, then read()'s own walk from that chunk on. The same
    columns as the generic default: a list per field, rows up to ``limit`` (the one after
    it names the resume point), the damage."""
    try:
        looping = None if walk.plain_structure() else tree.find_loop()
    except FormatError as exc:
        return Columns({}, 0, None, seq, exc)
    if looping is not None:
        return Codec.read_columns(codec, tree.buf, tree.source, None, seq, None, limit)
    skip = walk.drop_level()
    columns, rows = walk.columns(codec.name)
    with paused_gc():
        data = {name: (column.tolist() if hasattr(column, "tolist") else list(column))
                for name, column in columns.items()}
        # read()'s walk from the chunk handed over on, with the paths and budgets it would
        # have there (the vectorised walk made the rows before it)
        state = walk.exact_state(columns["path"]._texts)
        if state is None:  # stopped before the first level: read()'s walk from the root
            nodes = tree.walk_levels([("/", tree.root)], None, tree.node_budget(),
                                     tree.text_budget())
        else:
            level, found, chars = state
            nodes = tree.walk_levels(level, None, tree.node_budget() - skip,
                                     tree.text_budget() - chars, found)
        error = next_offset = None
        try:
            records = codec._records(tree, nodes, rows)
            if limit is not None and rows > limit:  # the vectorised rows alone pass it
                records = iter(())
            for rec in records:
                if rows == limit:
                    next_offset = rec["offset"]
                    break
                for name, value in rec.items():
                    data[name].append(value)
                rows += 1
        except FormatError as exc:
            error = exc
        finally:
            nodes.close()
    if limit is not None and rows > limit:
        next_offset = data["offset"][limit]
        data = {name: values[:limit] for name, values in data.items()}
        rows = limit
        error = None
    return Columns(data if rows else {}, rows, next_offset, seq + rows, error)


class _Window(Sequence):
    """Rows ``lo .. hi-1`` of a text column."""

    def __init__(self, column: _TextColumn, lo: int, hi: int):
        self._column, self._lo, self._hi = column, lo, hi

    def __len__(self) -> int:
        return self._hi - self._lo

    def __getitem__(self, index):
        return self.tolist()[index]

    def tolist(self) -> list:
        return self._column.tolist()[self._lo:self._hi]

    def json_spelling(self, lo: int, hi: int):
        return self._column.json_spelling(self._lo + lo, self._lo + hi)


def column_batches(codec: Codec, tree, rows: Rows, pace=None) -> Iterator[Columns]:
    """:meth:`GvfsTree.scan` of ``tree`` (a :class:`~.gvfs_tree.TreeView`): read_columns' rows and damage in batches of about
    ``rows``, holding memory per batch and per directory of two levels, not per node.

    A plain tree (:meth:`_Walk.plain_structure`: then find_loop has nothing to report) is
    walked straight from ``buf``, each batch's texts spans of it. Where the walk meets what
    it does not decode (damage, unsorted keys, a deep narrow tree), the whole-file decoder
    takes over -- read_columns, the file copied -- and its rows after those already given
    follow; a tree that is not plain is decoded that way from the start, unless its loop
    check already names damage before any record."""
    buf = tree.buf
    walk = _Walk(tree, buf, plain=True)
    store = walk.store = _Store()

    def paced() -> None:  # a paced walk splits far-apart nodes into parts: always pace
        if pace is not None:
            pace()
    given = 0
    try:
        if walk.plain_structure(paced):
            for columns, n in walk.batches(codec.name, rows, paced):
                given += n
                yield Columns(columns, n, None, given, None)
            return
        # not plain: damage find_loop names before any record (a truncated tree) is
        # found here, without the whole-file decoder's copy of the file
        tree.find_loop(paced)
    except _Unplain:
        pass
    except FormatError as exc:
        yield Columns({}, 0, None, 0, exc)
        return
    finally:
        store.close()
    del walk
    whole = read_columns(codec, tree, 0, None)
    lo = given
    while lo < whole.rows:
        hi = min(whole.rows, lo + most_rows(rows))
        columns = {k: _Window(v, lo, hi) if isinstance(v, (_TextColumn, _Window)) else v[lo:hi]
                   for k, v in whole.data.items()}
        yield Columns(columns, hi - lo, None, hi, whole.error if hi == whole.rows else None)
        if pace is not None:
            pace()
        lo = hi
    if whole.error is not None and whole.rows <= given:
        yield Columns({}, 0, None, given, whole.error)
