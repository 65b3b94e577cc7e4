"""Extended attributes of the views: a record's fields (``user.record.*``), a damaged journal's
place of damage, the ACLs mirrored read-only from SOURCE, the mount's settings on the root."""
from __future__ import annotations

import errno
import json
import time

import pyfuse3

from ..selection import format_time, record_time_ns
from .viewbase import TRUST_SECONDS
from .viewindex import ViewIndexes
from .viewnodes import (JOURNAL, JSONL, LIVE, RECORD, RECORDS_DIR, ROOT, DAMAGE_XATTR,
    RECORD_XATTR_PREFIX, VNode)


#: The access ACL the kernel asks for (POSIX ACL mode) before deciding on a view inode.
ACL_XATTR = b"system.posix_acl_access"
_ACL_VERSION = 2
_ACL_ENTRY = 8  # u16 tag, u16 perm, u32 id (little endian)
_R, _W, _X = 4, 2, 1


def view_acl(raw: bytes, kind: str) -> bytes | None:
    """The ACL of a view inode made from its SOURCE object's ``raw`` access ACL: every
    entry's w bit cleared (views are read-only), as the view's mode is made from the mode.
    ``kind``: RECORDS_DIR keeps r and x (a SOURCE directory); JOURNAL (a journal's view
    directory) gets x wherever r is set; a record file or records.jsonl keeps r only.
    None for anything that is not a well-formed version-2 ACL (the mode alone then rules)."""
    if len(raw) < 4 or (len(raw) - 4) % _ACL_ENTRY or \
            int.from_bytes(raw[:4], "little") != _ACL_VERSION:
        return None
    out = bytearray(raw)
    for pos in range(4 + 2, len(out), _ACL_ENTRY):
        perm = int.from_bytes(out[pos:pos + 2], "little")
        if kind == RECORDS_DIR:
            perm &= _R | _X
        elif kind == JOURNAL:
            perm = _R | _X if perm & _R else 0
        else:
            perm &= _R
        out[pos:pos + 2] = perm.to_bytes(2, "little")
    return bytes(out)


def scalar_text(value) -> str | None:
    """A record field as xattr text; None for non-scalars (lists, dicts, payload bytes)."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, (bool, int, float)):
        return json.dumps(value)
    return None


class ViewXattrs(ViewIndexes):
    """getxattr, listxattr, setxattr of view inodes."""

    @staticmethod
    def _record_fields(rec: dict) -> dict[bytes, bytes]:
        out = {}
        for key, value in rec.items():
            text = scalar_text(value)
            if text is not None:
                out[RECORD_XATTR_PREFIX + key.encode("utf-8", "surrogateescape")] = \
                    text.encode("utf-8", "surrogateescape")
        return out

    async def _xattrs(self, node: VNode) -> dict[bytes, bytes]:
        if node.kind == RECORD:
            idx = await self._index(node.rel, node.seq)
            rec = await self._on_file(node.rel, self._record, node.rel, node.seq, idx)
            fields = self._record_fields(rec)
            ns = record_time_ns(idx.codec, rec)
            if ns is not None:  # the record's own time, readable (UTC)
                fields[RECORD_XATTR_PREFIX + b"time_iso"] = \
                    format_time(ns, idx.codec.columns.time_unit, utc=True).encode()
            return fields
        if node.kind == JOURNAL:
            idx = await self._index(node.rel)
            if idx.error is None:
                return {}
            text = f"{idx.error.offset}: {idx.error.reason}"
            return {DAMAGE_XATTR: text.encode("utf-8", "surrogateescape")}
        return {}

    def _source_acl(self, node: VNode) -> bytes | None:
        """The raw access ACL of the SOURCE object ``node`` stands for (thread)."""
        if node.kind != RECORDS_DIR and self._journal_info(node.rel) is None:
            return None  # no longer a journal: the view is going away
        return self.source.access_acl(node.rel)

    async def _acl(self, node: VNode) -> bytes | None:
        """The view ACL of ``node``: its SOURCE object's, read-only (:func:`view_acl`).
        Remembered for TRUST_SECONDS per SOURCE object, so that ``ls -l`` of a journal's
        many record files (ls asks each for its ACL) reads SOURCE's ACL about once."""
        if node.kind not in (RECORDS_DIR, JOURNAL, RECORD, JSONL) or node.rel == LIVE:
            return None
        key = ("acl", node.rel)
        cached = self.catalog.get(key)
        if cached is None or time.monotonic() - cached[0] >= TRUST_SECONDS:
            cached = (time.monotonic(), await self._on_file(node.rel, self._source_acl, node))
            self.catalog.put(key, cached, 100 + len(node.rel) + len(cached[1] or b""))
        return None if cached[1] is None else view_acl(cached[1], node.kind)

    async def getxattr(self, ino: int, name: bytes) -> bytes:
        node = self._get(ino)
        if node.kind == ROOT and self.control is not None:
            return await self.control.getxattr(name)
        if name == ACL_XATTR:
            acl = await self._acl(node)
            if acl is None:
                raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
            return acl
        wanted = (node.kind == RECORD and name.startswith(RECORD_XATTR_PREFIX)) or \
            (node.kind == JOURNAL and name == DAMAGE_XATTR)
        if not wanted:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        fields = await self._xattrs(node)
        try:
            return fields[name]
        except KeyError:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR) from None

    async def listxattr(self, ino: int) -> list[bytes]:
        node = self._get(ino)
        if node.kind == ROOT and self.control is not None:
            return await self.control.listxattr()
        names = list(await self._xattrs(node))
        if await self._acl(node) is not None:
            names.append(ACL_XATTR)
        return names

    async def setxattr(self, ino: int, name: bytes, value: bytes, ctx) -> None:
        """Only the mount's settings on ``.journalfs`` itself change; the rest is read-only."""
        if self._get(ino).kind != ROOT or self.control is None:
            raise pyfuse3.FUSEError(errno.EROFS)
        await self.control.setxattr(name, value, ctx)
