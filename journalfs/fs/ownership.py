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
* **Expiry** (once per mount, in the background, :meth:`Ownership.expire_gone`): entries of
  files that no longer exist -- deleted while nothing was mounted, or parked for a file that
  never came back -- are dropped, so they stop counting against their owner's quota. A pass
  checks at most EXPIRE_CHECKS entries from a random place (the next mount checks others).
  A file is gone when SOURCE's filesystem, asked by inode number, has no such inode
  (ESTALE) or has given the number to a file born later. That question needs root
  (``open_by_handle_at``) and a filesystem whose handles are (inode, generation) pairs
  that accept generation 0 (ext2/3/4); elsewhere nothing expires (status.json says why).

Entries no mount recorded (written by gvfs, ``journalfs meta``, or a version without the
ledger) are adopted by the file found at their path on first binding.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import random
import struct
from typing import Any, Awaitable, Callable, ParamSpec, Protocol

import pyfuse3
import trio

from ..metastore.backend import MetadataBackend
from ..metastore.ledger import file_identity, metadata_bytes, metadata_bytes_with
from ..metastore.location import StoreLocation
from .inodes import InodeTable, source_handle

P = ParamSpec("P")


class Mount(Protocol):
    """What the rules use of the mount: its store calls (``fs.storecalls.StoreCalls``,
    which this module must not import: the mount's core imports it), typed so the checker
    sees each call of the store."""
    meta: MetadataBackend
    table: InodeTable
    location: StoreLocation

    def store_path(self, rel: bytes) -> str: ...
    async def _meta_values(self, store_path: str) -> dict: ...
    async def _meta_set(self, store_path: str, key: str, value: Any) -> None: ...
    def _meta_set_now(self, store_path: str, key: str, value: Any) -> bool: ...
    def _meta_values_cached(self, store_path: str) -> dict | None: ...
    async def _meta_unset(self, store_path: str, key: str) -> None: ...
    async def _meta_restructure(self, fn: Callable[P, Awaitable[object]], *args: P.args,
                                **kwargs: P.kwargs) -> None: ...

log = logging.getLogger("journalfs.fs")

#: Store path under which entries of files not found at their name wait for them. A SOURCE
#: path that maps there (a file named so at the top of SOURCE) carries no metadata.
PARK = "/.journalfs-detached"


#: Ledger entries one mount checks for files that are gone (see the module doc).
EXPIRE_CHECKS = 10_000
#: Entries checked per worker-thread call during the pass.
EXPIRE_BATCH = 256
#: struct file_handle type of (32-bit inode, generation) handles: ext2/3/4 (and others)
_FILEID_INO32_GEN = 1
_libc = ctypes.CDLL(None, use_errno=True)


_PARK_BELOW = PARK + "/"


def _parked(sp: str) -> bool:
    return sp == PARK or sp.startswith(_PARK_BELOW)


class InodeProbe:
    """Whether a file of a given identity (inode number, birth time) still exists on the
    filesystem of ``root_fd``, asked by inode number (see the module doc)."""

    def __init__(self, root_fd: int):
        self.reason = ""
        self._mount_fd = -1
        handle = source_handle(root_fd, True) if os.geteuid() == 0 else None
        if os.geteuid() != 0:
            self.reason = "only root can look files up by inode number"
        elif handle is None or struct.unpack_from("=i", handle, 4)[0] != _FILEID_INO32_GEN:
            self.reason = "SOURCE's filesystem has no (inode, generation) file handles"
        else:
            self._mount_fd = os.open(b"/proc/self/fd/%d" % root_fd,
                                     os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    @property
    def usable(self) -> bool:
        return self._mount_fd >= 0

    def close(self) -> None:
        if self._mount_fd >= 0:
            os.close(self._mount_fd)
            self._mount_fd = -1

    def gone(self, ident: tuple) -> bool | None:
        """True: no file of identity ``ident`` exists; False: it does; None: cannot tell."""
        ino, btime = ident
        if not self.usable or not 0 < ino < 1 << 32:
            return None
        handle = struct.pack("=Ii", 8, _FILEID_INO32_GEN) + struct.pack("=II", ino, 0)
        fd = _libc.open_by_handle_at(self._mount_fd, handle, os.O_PATH | os.O_CLOEXEC)
        if fd < 0:
            return True if ctypes.get_errno() == errno.ESTALE else None
        try:
            now, _ = file_identity(fd)
        except OSError:
            return None
        finally:
            os.close(fd)
        return now != (ino, btime)  # the number now belongs to a file born later


class Ownership:
    def __init__(self, fs: Any, ledger):
        self.fs: Mount = fs  # the mount's core, built on StoreCalls (see Mount)
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

    def _root_fd(self) -> int:
        fd = self.fs.table.root.fd
        assert fd is not None  # SOURCE's root is held open for as long as the mount runs
        return fd

    def identity_at(self, store_path: str) -> tuple | None:
        """The identity of what SOURCE holds at ``store_path`` now (None: nothing)."""
        if _parked(store_path):
            return None
        rel = self._rel_of(store_path)
        if rel is None:
            return None
        try:
            return file_identity(self._root_fd(), rel)[0]
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

    async def bind(self, node, sp: str, strict: bool = False,
                   identity: tuple[tuple, int] | None = None) -> bool:
        """Make the entries at ``sp`` this node's file's; False if they must not be shown
        (``strict``: raise why instead). ``identity``: :meth:`identity` of ``node``, when
        the caller just took it."""
        try:
            ident, uid = identity if identity is not None else self.identity(node)
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
            # another name keeps its own copy
            await self.fs._meta_restructure(self.fs.meta.remove, sp)
            return
        await self.fs._meta_restructure(self.fs.meta.move, sp, f"{PARK}/{owner[0]}-{owner[1]}")

    async def _adopt(self, sp: str, ident: tuple, uid: int) -> None:
        """``sp`` has no owner: take the file's metadata recorded elsewhere, or adopt what
        is at ``sp``."""
        others = [p for p in self.ledger.paths_of(ident) if p != sp and not p.startswith(sp + "/")]
        for p in others:
            if self.identity_at(p) == ident:  # a hard link: names of one file share metadata
                await self.fs._meta_restructure(self.fs.meta.copy, p, sp)
                return
        if others:  # renamed or parked: the metadata follows the file
            await self.fs._meta_restructure(self.fs.meta.move, others[0], sp)
            for p in others[1:]:
                await self.fs._meta_restructure(self.fs.meta.remove, p)
            return
        values = await self.fs._meta_values(sp)
        if values:
            self.ledger.record(sp, ident, uid, metadata_bytes(values))

    # -- writes ----------------------------------------------------------------------------
    async def set(self, node, names: list[bytes], key: str, value,
                  identity: tuple[tuple, int] | None = None) -> None:
        """Set ``key`` on every name of ``node``, within the quota (``identity``: as for
        :meth:`bind`)."""
        ledger = self.ledger
        if ledger is None:
            for rel in names:
                await self.fs._meta_set(self.fs.store_path(rel), key, value)
            return
        if identity is None:
            identity = self.identity(node)
        ident, uid = identity
        plans = []
        made = node.meta_path
        for rel in names:
            sp = made[1] if made is not None and made[0] is rel else self.fs.store_path(rel)
            if _parked(sp):
                raise pyfuse3.FUSEError(errno.EPERM)
            owner = ledger.owner(sp)
            if owner is None or owner[0] != ident:  # (bind's own first question)
                await self.bind(node, sp, strict=True, identity=identity)
            if made is None and node.paths and rel is node.paths[-1]:
                node.meta_path = made = (rel, sp)  # bound: what store_path() would note
            values = self.fs._meta_values_cached(sp)  # (no coroutine when cached)
            if values is None:
                values = await self.fs._meta_values(sp)
            size = metadata_bytes_with(values, key, value)
            ledger.check(sp, uid, size)
            plans.append((sp, size))
        for sp, size in plans:
            if not self.fs._meta_set_now(sp, key, value):  # appended inline, or else:
                await self.fs._meta_set(sp, key, value)
            ledger.record(sp, ident, uid, size)

    def set_now(self, node, names: list[bytes], key: str, value,
                identity: tuple[tuple, int]) -> bool:
        """:meth:`set` on this thread, with no coroutine, in the common case: one name, whose
        entries the ledger already gives this file, its values cached and the store taking
        the write inline. True once done (checked against the quota and recorded as
        :meth:`set` does); False: nothing written, await :meth:`set`."""
        ledger = self.ledger
        made = node.meta_path
        if ledger is None or made is None or len(names) != 1 or made[0] is not names[0]:
            return False
        sp = made[1]
        owner = ledger.owner(sp)
        ident, uid = identity
        if owner is None or owner[0] != ident or _parked(sp):
            return False
        values = self.fs._meta_values_cached(sp)
        if values is None:
            return False
        size = metadata_bytes_with(values, key, value)
        ledger.check(sp, uid, size)
        if not self.fs._meta_set_now(sp, key, value):
            return False
        ledger.record(sp, ident, uid, size)
        return True

    async def unset(self, node, names: list[bytes], key: str) -> None:
        for rel in names:
            sp = self.fs.store_path(rel)
            await self.fs._meta_unset(sp, key)
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
        await self._quietly(self.fs.meta.move, self.fs.store_path(old), self.fs.store_path(new))

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
            await self._quietly(self.fs.meta.remove, sp)
            return
        entry = self.ledger.owner(sp)
        if entry is None and not self.ledger.paths_below(sp):
            # nothing recorded: whatever gvfs wrote there
            await self._quietly(self.fs.meta.remove, sp)
            return
        if entry is not None and victim is not None and self._still_linked(victim) and \
                not any(p != sp and self.identity_at(p) == entry[0]
                        for p in self.ledger.paths_of(entry[0])):
            await self._quietly(self.fs.meta.move, sp, f"{PARK}/{entry[0][0]}-{entry[0][1]}")
            return
        await self._quietly(self.fs.meta.remove, sp)

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

    async def _quietly(self, fn: Callable[P, Awaitable[object]], *paths: P.args,
                       **kwargs: P.kwargs) -> None:
        try:
            await self.fs._meta_restructure(fn, *paths, **kwargs)
        except (OSError, pyfuse3.FUSEError) as exc:
            log.warning("metadata %s of %r after a change in SOURCE failed: %s", fn.__name__,
                        paths, exc)

    # -- quota -----------------------------------------------------------------------------
    def set_quota(self, quotas: dict[str, int]) -> None:
        """The quota options of the mount (``quota_file`` ... in bytes) into the ledger."""
        if quotas and self.ledger is None:
            log.warning("quota options (%s) have no effect: gvfsd-metadata writes this store, "
                        "this mount keeps no ledger", ", ".join(sorted(quotas)))
            return
        for name, size in quotas.items():
            self.ledger.set_quota(name, size)

    # -- expiry ----------------------------------------------------------------------------
    async def expire_gone(self, limit: int = EXPIRE_CHECKS) -> None:
        """Drop the metadata of files that no longer exist (see the module doc): at most
        ``limit`` ledger entries checked, in worker threads, EXPIRE_BATCH at a time. Run
        once per mount, in the background."""
        if self.ledger is None:
            return
        self.expiry = self.ledger.expiry  # status.json: service.ledger.expiry
        probe = await trio.to_thread.run_sync(InodeProbe, self._root_fd())
        try:
            if not probe.usable:
                self.expiry["state"] = f"off: {probe.reason}"
                return
            self.expiry["state"] = "running"
            entries = self.ledger.sample(limit, random.random())
            for first in range(0, len(entries), EXPIRE_BATCH):
                batch = entries[first:first + EXPIRE_BATCH]
                gone = await trio.to_thread.run_sync(self._gone_in, probe, batch)
                self.expiry["checked"] += len(batch)
                for sp, ident, uid in gone:
                    await self._expire(sp, ident)
            self.expiry["state"] = "done"
            if self.expiry["expired"]:
                log.info("metadata of %d files that no longer exist dropped (%d bytes of "
                         "quota freed)", self.expiry["expired"], self.expiry["bytes"])
        except (OSError, pyfuse3.FUSEError) as exc:
            self.expiry["state"] = f"stopped: {exc}"
            log.warning("dropping metadata of files that no longer exist stopped: %s", exc)
        finally:
            probe.close()

    def _gone_in(self, probe: InodeProbe, batch: list) -> list:
        """(Worker thread) the entries of ``batch`` whose file is gone: neither at its
        path (parked entries have none) nor anywhere on SOURCE's filesystem."""
        out = []
        for sp, ident, uid in batch:
            if not _parked(sp) and self.identity_at(sp) == ident:
                continue  # where it was written: alive
            if probe.gone(ident):
                out.append((sp, ident, uid))
        return out

    async def _expire(self, sp: str, ident: tuple) -> None:
        """The keys at ``sp`` itself go (names below it may hold other files' entries)."""
        entry = self.ledger.owner(sp)
        if entry is None or entry[0] != ident:
            return  # changed meanwhile: bound to another file now
        for key in list(await self.fs._meta_values(sp)):
            await self.fs._meta_unset(sp, key)
        self.ledger.record(sp, ident, entry[1], 0)
        self.expiry["expired"] += 1
        self.expiry["bytes"] += entry[2]

    def status(self) -> dict | None:
        return None if self.ledger is None else self.ledger.status()
