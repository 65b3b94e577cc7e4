"""Cheap record checkpoints for splitting one big variable-width journal across tasks.

The driver walks only the chain of record *headers* (a few bytes per record, skipping every
payload, so pages holding only payload are never touched) and keeps one ``(offset, seq)``
checkpoint per split. Executors then decode exact ranges with exact ``seq`` numbers.
Checkpoints are cached per file identity; a journal that only grew (append-only) is walked
from its last checkpoint on.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import Callable

from ..journals import mapped

#: A walker: (buffer, offset of a record) -> offset of the next record, or None at the end of
#: valid data. It checks every size against the buffer and the format's own limits.
Walker = Callable[[object, int], "int | None"]

_U32_LE = struct.Struct("<I")
_I32_LE = struct.Struct("<i")
_U32_U32_I64_LE = struct.Struct("<IIq")
_I32_I32_BE = struct.Struct(">ii")
KESTREL_MAX_PAYLOAD = 16 << 20


def _kestrel_next(buf, pos: int) -> int | None:
    if pos >= len(buf):
        return None
    head = buf[pos]
    if head == 0:
        return None
    words = head & 0x0F
    size = 1 + 4 * words
    if head >> 4 >= 8:  # data-carrying command: the first header word is the data length
        if words == 0 or pos + 5 > len(buf):
            return None
        data = _I32_LE.unpack_from(buf, pos + 1)[0]
        if data < 0 or data > KESTREL_MAX_PAYLOAD:
            return None
        size += data
    nxt = pos + size
    return nxt if nxt <= len(buf) else None


def _wallaby_next(buf, pos: int) -> int | None:
    if pos + 16 > len(buf):
        return None
    size, _flags, time = _U32_U32_I64_LE.unpack_from(buf, pos)
    if size == 0 and time == 0:  # pre-extended zero tail
        return None
    nxt = pos + 16 + size
    return nxt if nxt <= len(buf) else None


def _akka_next(buf, pos: int) -> int | None:
    if pos + 24 > len(buf):
        return None
    size, self_offset = _I32_I32_BE.unpack_from(buf, pos)
    if size < 24 or self_offset != pos:
        return None
    nxt = pos + size
    return nxt if nxt <= len(buf) else None


WALKERS: dict[str, Walker] = {
    "kestrel-writer": _kestrel_next,
    "kestrel-reader": _kestrel_next,
    "wallaby-log": _wallaby_next,
    "akka-data": _akka_next,
}


def can_split(fmt: str) -> bool:
    return fmt in WALKERS


def _first_offset(codec, buf, path: str) -> int | None:
    cols = codec.read_columns(buf, path, None, 0, None, 1)
    if not cols.rows:
        return None
    return int(cols.data["offset"][0])


def walk(path: str, fmt: str, every: int, resume: list[tuple[int, int]] | None = None
         ) -> list[tuple[int, int]]:
    """``(offset, seq)`` of the first record and then of the first record at or after each
    further ``every`` bytes, continuing from ``resume`` (checkpoints of an older, shorter
    version of the same file)."""
    from ..formats import CODECS
    step = WALKERS[fmt]
    with mapped(path) as buf:
        if resume:
            points = list(resume)
            pos, seq = points[-1]
        else:
            first = _first_offset(CODECS[fmt], buf, path)
            if first is None:
                return []
            points = [(first, 0)]
            pos, seq = first, 0
        goal = pos + every
        while True:
            nxt = step(buf, pos)
            if nxt is None:
                break
            pos, seq = nxt, seq + 1
            if pos >= goal:
                points.append((pos, seq))
                goal = pos + every
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
