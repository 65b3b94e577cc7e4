"""Helpers of the column decoders: text of many byte spans decoded in one step per batch,
and cyclic GC paused while a batch's columns are built.

A column decoder knows where each record's strings start and end (numpy offsets). Decoding
them one ``bytes.decode`` per string costs a Python call each; here the spans are gathered
into one byte string by a mask over the region they lie in, decoded once, and cut back into
one ``str`` per span, exactly what decoding each span on its own gives.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator

import numpy as np

#: Spans gathered per step: bounds the temporaries of a huge batch (limit=None on a big file).
CHUNK_SPANS = 1 << 16


def gather(buf, starts: np.ndarray, ends: np.ndarray) -> bytes:
    """The bytes of every ``buf[start:end]`` span, concatenated. The spans must be sorted and
    must not overlap (records of one file in file order); every position is checked by the
    caller."""
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if not len(starts):
        return b""
    lo, hi = int(starts[0]), int(ends[-1])
    region = np.frombuffer(buf, dtype=np.uint8, count=hi - lo, offset=lo)
    # +1 where a span starts, -1 where one ends: the running sum is 1 inside spans. Empty
    # spans are gone, so no position is two starts or two ends; a position that ends one
    # span and starts the next gets 1 - 1 = 0 and stays inside.
    delta = np.zeros(hi - lo + 1, dtype=np.int8)
    delta[starts - lo] = 1
    delta[ends - lo] -= 1
    inside = np.cumsum(delta[:-1], dtype=np.int8).view(np.bool_)
    return region[inside].tobytes()


def _sorted_apart(starts: np.ndarray, ends: np.ndarray) -> bool:
    return bool((ends >= starts).all()) and bool((starts[1:] >= ends[:-1]).all())


def utf8_strings(buf, starts: np.ndarray, ends: np.ndarray) -> list[str] | None:
    """``buf[start:end].decode("utf-8")`` (strict) of every span, or None when some span is
    not valid UTF-8 on its own (the caller then finds which one, and says where)."""
    out: list[str] = []
    if len(starts) and not _sorted_apart(starts, ends):
        raise ValueError("string spans out of order")
    for i in range(0, len(starts), CHUNK_SPANS):
        s, e = starts[i:i + CHUNK_SPANS], ends[i:i + CHUNK_SPANS]
        joined = gather(buf, s, e)
        try:
            text = joined.decode("utf-8")
        except UnicodeDecodeError:
            return None
        lengths = e - s
        bounds = np.zeros(len(s) + 1, dtype=np.int64)
        np.cumsum(lengths, out=bounds[1:])
        if len(text) != len(joined):  # multi-byte characters: cut at character counts
            raw = np.frombuffer(joined, dtype=np.uint8)
            lead = (raw & 0xC0) != 0x80  # every byte that starts a character
            firsts = bounds[:-1][lengths > 0]
            if not lead[firsts].all():
                return None  # a span starting mid-character: valid only joined to the one before
            chars = np.zeros(len(raw) + 1, dtype=np.int64)
            np.cumsum(lead, out=chars[1:])
            bounds = chars[bounds]
        b = bounds.tolist()
        out.extend([text[x:y] for x, y in zip(b, b[1:])])
    return out


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Cyclic GC off while a batch's columns are built: they are acyclic, and the collector's
    passes over hundreds of thousands of new lists and strings cost more than building them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
