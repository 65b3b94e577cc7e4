"""Record checkpoints for splitting one big journal of a splittable format across tasks.

The driver finds record starts through the codec's cheapest exact way
(:func:`journalfs.journals.scan` of record offsets: header walks that skip payloads where
the codec has one) and keeps one ``(offset, seq)`` checkpoint per split, releasing the pages it passed.
Executors then decode exact ranges with exact ``seq`` numbers. Checkpoints are cached per file
identity; a journal that only grew (append-only) is walked from its last checkpoint on.
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from ..formats import CODECS
from ..journals import mapped, scan

#: Record starts found per call while walking (bounds the walk's memory).
WALK_BATCH = 1 << 18


def walk(path: str, fmt: str, every: int, resume: list[tuple[int, int]] | None = None
         ) -> list[tuple[int, int]]:
    """``(offset, seq)`` of the first record and then of the first record at or after each
    further ``every`` bytes, continuing from ``resume`` (checkpoints of an older, shorter
    version of the same file). Ends at the end of the valid records."""
    codec = CODECS[fmt]
    points: list[tuple[int, int]] = list(resume or ())
    start, seq = points[-1] if points else (None, 0)
    goal = points[-1][0] + every if points else None
    skip_first = bool(points)  # the resumed-from record is a checkpoint already
    with mapped(path) as buf:
        for cols in scan(codec, buf, path, start, seq, rows=WALK_BATCH, form="offsets"):
            offsets = np.asarray(cols.data.get("offset", ())[:cols.rows], dtype=np.int64)
            base = cols.next_seq - cols.rows
            if skip_first and len(offsets):
                offsets, base, skip_first = offsets[1:], base + 1, False
            if len(offsets):
                if goal is None:
                    points.append((int(offsets[0]), base))
                    goal = int(offsets[0]) + every
                i = int(np.searchsorted(offsets, goal))
                while i < len(offsets):
                    points.append((int(offsets[i]), base + i))
                    goal = int(offsets[i]) + every
                    i = int(np.searchsorted(offsets, goal))
    return points


def _cache_file(cache_dir: str, path: str) -> str:
    digest = hashlib.sha1(os.path.realpath(path).encode("utf-8", "surrogateescape")).hexdigest()
    return os.path.join(cache_dir, digest + ".json")


def checkpoints(path: str, fmt: str, every: int, cache_dir: str | None) -> list[tuple[int, int]]:
    """Cached :func:`walk`: reuse exact matches, extend grown append-only files."""
    st = os.stat(path)
    identity = {"ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                "every": every, "format": fmt}
    cached = None
    cache = _cache_file(cache_dir, path) if cache_dir else None
    if cache:
        try:
            with open(cache) as f:
                cached = json.load(f)
        except (OSError, ValueError):
            cached = None
    resume = None
    if cached and all(cached.get(k) == identity[k] for k in ("ino", "every", "format")):
        points = [tuple(p) for p in cached.get("points", [])]
        if cached.get("size") == st.st_size and cached.get("mtime_ns") == st.st_mtime_ns:
            return points
        if cached.get("size", 0) < st.st_size and len(points) > 1:
            resume = points[:-1]  # the last point may have sat at the old end of valid data
    points = walk(path, fmt, every, resume)
    if cache:
        try:
            os.makedirs(cache_dir, exist_ok=True)
            tmp = f"{cache}.{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump({**identity, "points": points}, f)
            os.replace(tmp, cache)
        except OSError:
            pass  # a cache that cannot be written only costs a re-walk next time
    return points


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "journalfs", "checkpoints")
