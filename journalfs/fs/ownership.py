"""Metadata belongs to the file, not to its name: the mount's side of the store's ledger
(``metastore/ledger.py``).

The store keys metadata by path (gvfs readers need that); the ledger beside it records, per
path written through the mount, the identity of the file it belongs to (inode number +
birth time) and the uid charged for it. This module keeps the two true to SOURCE:

* **Binding** (lazily, the first time an inode is asked for metadata under a name): the
  entries at the name are shown only if the ledger says they are this file's. If they belong
  to another file (a new file at an old path), they are parked under ``PARK`` (keyed by
  the owner's identity) and the new file starts bare. If the file's own metadata is recorded
  under other names -- it was renamed, or hard-linked, behind the mount's back, or while
  nothing was mounted -- it follows the file: copied from a name that is still a link of it,
  else moved (from its old name or the parking place).
* **Watching** (while mounted, through ``fs/watch.py``): a rename made directly in SOURCE
  moves the metadata as one through the mount does; a delete drops it; any other change of
  a name whose entries belong to a file no longer there parks them.
* **Quota**: a write is checked against the ledger's limits before the store sees it and
  recorded after; the charge goes to the file's owner, as ext4 charges an xattr block.

Entries no mount recorded (written by gvfs, ``journalfs meta``, or a version without the
ledger) are adopted by the file found at their path on first binding.
"""
from __future__ import annotations

import errno
import logging
import os

import pyfuse3

from ..metastore.ledger import file_identity, metadata_bytes

log = logging.getLogger("journalfs.fs")

#: Store path under which entries of files not found at their name wait for them. A SOURCE
#: path that maps there (a file named so at the top of SOURCE) carries no metadata.
PARK = "/.journalfs-detached"


def _parked(sp: str) -> bool:
    return sp == PARK or sp.startswith(PARK + "/")


class Ownership:
    def __init__(self, fs, ledger):
        self.fs = fs
        self.ledger = ledger  # None: a store this mount does not own (gvfsd): no binding

    # -- identities ------------------------------------------------------------------------
    def identity(self, node) -> tuple[tuple, int]:
        """(identity, owner uid) of ``node``'s object."""
        table = self.fs.table
        fd = table.fd(node)
        try:
            return file_identity(fd)
        finally:
            table.let_go(node)

    def _rel_of(self, store_path: str) -> bytes | None:
        prefix = self.fs.location.prefix
        if prefix and prefix != "/":
            if store_path == prefix:
                return b""
            if not store_path.startswith(prefix + "/"):
                return None
            store_path = store_path[len(prefix):]
        return os.fsencode(store_path.lstrip("/"))

    def identity_at(self, store_path: str) -> tuple | None:
        """The identity of what SOURCE holds at ``store_path`` now (None: nothing)."""
        if _parked(store_path):
            return None
        rel = self._rel_of(store_path)
        if rel is None:
            return None
        try:
            return file_identity(self.fs.table.root.fd, rel)[0]
        except OSError:
            return None

    # -- binding ---------------------------------------------------------------------------
    async def store_path(self, node) -> str | None:
        """The store path ``node``'s metadata is read from, bound to its file; None when it
        has no name left or its entries cannot be shown."""
        paths = node.paths
        if not paths:
            return None
        rel = paths[-1]
        made = node.meta_path
        if made is not None and made[0] is rel:
            return made[1]
        sp = self.fs.store_path(rel)
        if self.ledger is not None and (_parked(sp) or not await self.bind(node, sp)):
            return None
        node.meta_path = (rel, sp)
        return sp

    async def bind(self, node, sp: str, strict: bool = False) -> bool:
        """Make the entries at ``sp`` this node's file's; False if they must not be shown
        (``strict``: raise why instead)."""
        try:
            ident, uid = self.identity(node)
        except (OSError, pyfuse3.FUSEError):
            if strict:
                raise
            return False
        entry = self.ledger.owner(sp)
        if entry is not None and entry[0] == ident:
            return True
        try:
            if entry is not None:
                await self._detach(sp, entry[0])
            await self._adopt(sp, ident, uid)
            return True
        except (OSError, pyfuse3.FUSEError) as exc:
            if strict:
                raise
            log.warning("metadata of %r cannot be bound to its file: %s", sp, exc)
            return False

    async def _detach(self, sp: str, owner: tuple) -> None:
        """The entries at ``sp`` belong to the file ``owner``, which is not there any more."""
        if any(p != sp and self.identity_at(p) == owner for p in self.ledger.paths_of(owner)):
            await self.fs._meta_restructure("remove", sp)  # another name keeps its own copy
            return
        await self.fs._meta_restructure("move", sp, f"{PARK}/{owner[0]}-{owner[1]}")

    async def _adopt(self, sp: str, ident: tuple, uid: int) -> None:
        """``sp`` has no owner: take the file's metadata recorded elsewhere, or adopt what
        is at ``sp``."""
        others = [p for p in self.ledger.paths_of(ident) if p != sp and not p.startswith(sp + "/")]
        for p in others:
            if self.identity_at(p) == ident:  # a hard link: names of one file share metadata
                await self.fs._meta_restructure("copy", p, sp)
                return
        if others:  # renamed or parked: the metadata follows the file
            await self.fs._meta_restructure("move", others[0], sp)
            for p in others[1:]:
                await self.fs._meta_restructure("remove", p)
            return
        values = await self.fs._meta_values(sp)
        if values:
            self.ledger.record(sp, ident, uid, metadata_bytes(values))

    # -- writes ----------------------------------------------------------------------------
    async def set(self, node, names: list[bytes], key: str, value) -> None:
        """Set ``key`` on every name of ``node``, within the quota."""
        if self.ledger is None:
            for rel in names:
                await self.fs._meta_write("set", self.fs.store_path(rel), key, value)
            return
        ident, uid = self.identity(node)
        plans = []
        for rel in names:
            sp = self.fs.store_path(rel)
            if _parked(sp):
                raise pyfuse3.FUSEError(errno.EPERM)
            await self.bind(node, sp, strict=True)
            values = dict(await self.fs._meta_values(sp))
            values[key] = value
            size = metadata_bytes(values)
            self.ledger.check(sp, uid, size)
            plans.append((sp, size))
        for sp, size in plans:
            await self.fs._meta_write("set", sp, key, value)
            self.ledger.record(sp, ident, uid, size)

    async def unset(self, node, names: list[bytes], key: str) -> None:
        for rel in names:
            sp = self.fs.store_path(rel)
            await self.fs._meta_write("unset", sp, key)
            if self.ledger is not None:
                entry = self.ledger.owner(sp)
                if entry is not None:
                    values = await self.fs._meta_values(sp)
                    self.ledger.record(sp, entry[0], entry[1], metadata_bytes(values))

    # -- SOURCE changed behind the mount ---------------------------------------------------
    async def renamed(self, old: bytes, new: bytes) -> None:
        """SOURCE renamed ``old`` to ``new`` (paths relative to SOURCE) behind the mount."""
        if self.ledger is None:
            return
        await self._quietly("move", self.fs.store_path(old), self.fs.store_path(new))

    async def deleted(self, rel: bytes) -> None:
        """SOURCE deleted the name ``rel`` behind the mount."""
        await self.unlinked(rel, self.fs.table.by_path.get(rel))

    async def unlinked(self, rel: bytes, victim) -> None:
        """The name ``rel`` is gone (``victim``: the inode it named, if known). Its metadata
        goes with it -- unless the file lives on under a name whose own copy is not recorded
        (a hard link made behind the mount's back): then it is parked for that name to find.
        Never raises: the unlink has happened whatever becomes of its metadata."""
        sp = self.fs.store_path(rel)
        if self.ledger is None:
            await self._quietly("remove", sp)
            return
        entry = self.ledger.owner(sp)
        if entry is None and not self.ledger.paths_below(sp):
            await self._quietly("remove", sp)  # nothing recorded: whatever gvfs wrote there
            return
        if entry is not None and victim is not None and self._still_linked(victim) and \
                not any(p != sp and self.identity_at(p) == entry[0]
                        for p in self.ledger.paths_of(entry[0])):
            await self._quietly("move", sp, f"{PARK}/{entry[0][0]}-{entry[0][1]}")
            return
        await self._quietly("remove", sp)

    def _still_linked(self, node) -> bool:
        if node.fd is None:
            return False
        try:
            return os.fstat(node.fd).st_nlink > 0
        except OSError:
            return False

    async def changed(self, rel: bytes) -> None:
        """A name changed in some other way (created, moved out of sight): entries there that
        belong to a file no longer at it are parked."""
        if self.ledger is None:
            return
        sp = self.fs.store_path(rel)
        entry = self.ledger.owner(sp)
        if entry is None or self.identity_at(sp) == entry[0]:
            return
        try:
            await self._detach(sp, entry[0])
        except (OSError, pyfuse3.FUSEError) as exc:
            log.warning("metadata of %r not detached from a changed name: %s", sp, exc)

    async def _quietly(self, method: str, *paths: str) -> None:
        try:
            await self.fs._meta_restructure(method, *paths)
        except (OSError, pyfuse3.FUSEError) as exc:
            log.warning("metadata %s of %r after a change in SOURCE failed: %s", method, paths, exc)

    def status(self) -> dict | None:
        return None if self.ledger is None else self.ledger.status()
