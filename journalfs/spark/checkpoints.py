"""Split points of one big journal of a splittable format, from its record index.

The driver takes the same record index as the views and the CLI
(:class:`journalfs.journals.RecordIndex`: one streaming pass through the codec's cheapest
exact way to find record starts, a checkpoint every ``CHECKPOINT_EVERY`` records), kept on
disk by :class:`journalfs.fs.indexfiles.IndexCache`: used only while the journal's dev,
inode, size, mtime and the CRC of its head are those it was taken of, extended when the
journal only grew, and parsed as hostile input. One ``(offset, seq)`` checkpoint is picked
per split, so executors decode exact ranges with exact ``seq`` numbers.
"""
from __future__ import annotations

import numpy as np

from ..formats import CODECS
from ..fs.indexfiles import IndexCache


def checkpoints(path: str, fmt: str, every: int, cache: IndexCache | str | None = None
                ) -> list[tuple[int, int]]:
    """``(offset, seq)`` of the first record and then of the first checkpoint at or after
    each further ``every`` bytes. ``cache``: an :class:`IndexCache`, the directory of one
    (``indexes/`` in it), or None for an index in memory only."""
    own = not isinstance(cache, IndexCache)
    indexes = IndexCache(cache or "") if own else cache
    try:
        index = indexes.index(path, CODECS[fmt])
    finally:
        if own:
            indexes.close()
    n = min(len(index.seqs), len(index.offsets))
    return split_points(np.asarray(index.offsets[:n], dtype=np.int64),
                        np.asarray(index.seqs[:n], dtype=np.int64), every)


def split_points(offsets: np.ndarray, seqs: np.ndarray, every: int) -> list[tuple[int, int]]:
    """The first checkpoint, then the first at or after each further ``every`` bytes."""
    points: list[tuple[int, int]] = []
    i = 0
    while i < len(offsets):
        points.append((int(offsets[i]), int(seqs[i])))
        i = int(np.searchsorted(offsets, offsets[i] + every))
    return points
