"""Persistence ids for akka-data records: data blocks carry none, so follow the chains.

A chain starts at a meta block's ``first`` offset (a block with ``prev == 0``) and every later
block names its predecessor, so in file order ``pid[self] = pid[prev]``. Only the newest
block of each chain is remembered (memory grows with the number of ids, not with the file).
A slice that starts mid-file walks unknown predecessors back through block headers only.
"""
from __future__ import annotations

import struct

from ..journals import mapped

_PREV_BE = struct.Struct(">i")


def meta_heads(meta_path: str | None) -> dict[int, str]:
    """``{first offset: persistence id}`` from an akka-meta file (its valid prefix)."""
    if not meta_path:
        return {}
    from ..formats import CODECS, FormatError
    heads: dict[int, str] = {}
    try:
        with mapped(meta_path) as buf:
            for rec in CODECS["akka-meta"].read(buf, meta_path):
                heads[int(rec["first"])] = rec["persistence_id"]
    except (OSError, FormatError):
        pass
    return heads


class ChainResolver:
    def __init__(self, heads: dict[int, str], buf):
        self.heads = heads
        self.buf = buf
        self.tips: dict[int, str | None] = {}  # newest known block of each chain -> pid

    def _walk_back(self, offset: int) -> str | None:
        """pid of the block at ``offset`` by following ``prev`` links through headers."""
        seen = 0
        limit = len(self.buf) // 24 + 1  # a longer walk means a cycle
        while seen <= limit:
            if offset in self.tips:
                return self.tips[offset]
            if offset < 8 or offset + 12 > len(self.buf):
                return None
            prev = _PREV_BE.unpack_from(self.buf, offset + 8)[0]
            if prev == 0:
                return self.heads.get(offset)
            if prev >= offset:  # links point backwards in an append-only file
                return None
            offset, seen = prev, seen + 1
        return None

    def resolve(self, selfs, prevs) -> list[str | None]:
        out = []
        tips = self.tips
        for s, p in zip(selfs.tolist() if hasattr(selfs, "tolist") else selfs,
                        prevs.tolist() if hasattr(prevs, "tolist") else prevs):
            if p == 0:
                pid = self.heads.get(s)
            elif p in tips:
                pid = tips.pop(p)
            else:
                pid = self._walk_back(p)
            tips[s] = pid
            out.append(pid)
        return out
