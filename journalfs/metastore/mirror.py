"""GIO's view of the mount's own paths, kept equal to the mount's metadata.

GIO keeps metadata per path, in the tree its lookup picks for the file's device (see
:func:`.location.mount_paths_location`): SOURCE's files in the tree of SOURCE's disk ("home"
under $HOME), the mount's paths -- a FUSE device -- in the "root" tree under MNT's absolute
path. GIO programs read those trees themselves (mapped files), so a value GIO must see on
MNT/f has to be written at MNT/f's place too. The rule (docs/gvfs.md):

- the SOURCE-path place is canonical: getfattr through the mount reads it, as before;
- every write through the mount goes to both places (the mount's place second; a failure
  there is logged and counted, never the syscall's error);
- a GIO write on a SOURCE path is copied to the mount's place (that path and its subtree:
  a Remove or Move behind the mount's back);
- a GIO write on an MNT path is copied, key by key, to the SOURCE-path place (removes and
  moves on MNT paths follow the mount's own unlink/rename, which already did both);
- a rename through the mount copies (not moves) in the mount's place: GIO then sends its own
  Move of the MNT paths, which would wipe a destination a move had already emptied the
  source of; the old path is reconciled :data:`RENAME_SETTLE` seconds later;
- at mount time the mount's place is made equal to the SOURCE-path place, and at unmount it
  is removed (the paths no longer exist), so nothing stale resurfaces there.

Changes reach the other place once the store's writer says they happened (gvfsd-metadata's
AttributeChanged signal, at most once a second per path; journalfs serving the store calls
back at once). Conflicting writes to one file from both sides within that second: the
SOURCE-path side wins."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Callable

import trio

from .location import StoreLocation

log = logging.getLogger("journalfs.metastore")

#: seconds after a rename through the mount before its old path is reconciled (GIO's Move of
#: the MNT paths comes right after the rename returns)
RENAME_SETTLE = 2.0
#: how long a rename's paths keep the SOURCE side winning over an emptied mount-side place
PROTECT_SECONDS = 30.0
#: changes reported together are handled after this short pause, once each
DEBOUNCE = 0.05
#: how long a key written through the mount counts as ours when its change is reported
OWN_WRITE_SECONDS = 10.0
UNMOUNT_CLEANUP = 10.0
_MAX_PROTECTED = 10_000


@dataclass(frozen=True)
class MountView:
    """The mount's two places in the store: SOURCE paths (canonical) and MNT paths (GIO's)."""

    source: StoreLocation
    mount: StoreLocation

    def to_mount(self, source_path: str) -> str | None:
        rel = self.source.rel_path(source_path)
        return None if rel is None else self.mount.store_path(rel)

    def overlaps(self) -> bool:
        """The two places share a tree and one prefix holds the other (SOURCE inside the
        mountpoint or the other way round): a path would have two meanings."""
        if self.source.tree_path != self.mount.tree_path:
            return False
        a, b = self.source.prefix or "/", self.mount.prefix or "/"
        return a == b or _inside(a, b) or _inside(b, a)


def _inside(path: str, root: str) -> bool:
    return root == "/" or path.startswith(root + "/")


def _join(root: str, rest: str) -> str:
    return (rest or "/") if root in ("", "/") else root + rest


async def subtree_of(backend, root: str) -> dict:
    """{path below root ("" = root): keys} of every keyed path at or below ``root``: the
    backend's own ``subtree``, or one pass over a MetaService's store."""
    own = getattr(backend, "subtree", None)
    if own is not None:
        return await own(root)
    from .gvfsd import _under

    def walk() -> dict:
        found = {}
        for path, keys in backend.store.dump().items():
            rest = _under(path, root)
            if rest is not None and keys:
                found[rest] = dict(keys)
        return found
    return await trio.to_thread.run_sync(walk)


class MirroredBackend:
    """The mount's metadata backend for a shared gvfs store: ``primary`` (GvfsdBackend or
    SessionStoreBackend) serves the SOURCE-path place, and the mount's place is kept equal
    (see the module doc). Same async API as the backend it wraps."""

    def __init__(self, primary, view: MountView,
                 source_kind: Callable[[str], str] | None = None):
        """``source_kind(rel)`` says what a mount-relative path is in SOURCE -- "file",
        "dir", "absent" or "view" (the mount's own views: never mirrored) -- from a worker
        thread; None: every change is checked with its subtree."""
        self.primary = primary
        self.view = view
        self.source_kind = source_kind
        self._own: dict[str, float] = {}  # mount-relative paths set through the mount -> until
        self.mirror = None  # the backend of the mount's tree, once running
        self._pending: dict[tuple[str, str], None] = {}
        self._wanted = trio.Event()
        self._protected: dict[str, tuple[float, bool]] = {}  # rel -> (until, old name?)
        self._primary_scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self._trees = {name: tree for tree in (view.source.tree_path, view.mount.tree_path)
                       for name in (tree, os.path.realpath(tree))}
        self.mirrored = 0
        self.synced = 0
        self.failures = 0
        self.last_error: str | None = None

    # everything the FUSE layer may ask that is not about writes: the primary's
    def __getattr__(self, name):
        return getattr(self.primary, name)

    @property
    def store(self):
        return getattr(self.primary, "store", None)

    # -- lifecycle
    async def _run_primary(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        # shielded: at unmount the mount's place is removed through it before it stops
        with trio.CancelScope(shield=True) as self._primary_scope:
            await self.primary.run(task_status=task_status)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as outer:
            await outer.start(self._run_primary)
            try:
                async with trio.open_nursery() as nursery:
                    try:
                        self.mirror = await self.primary.open_tree(self.view.mount.tree_path)
                        await nursery.start(self.primary.watch_changes, self._changed)
                    except (OSError, ValueError) as exc:
                        self._failed("GIO's view of the mount's paths is not kept", exc)
                        self.mirror = None
                    else:
                        self._nursery = nursery
                        nursery.start_soon(self._sync_task)
                        self._changed(self.view.source.tree_path, self.view.source.store_path("/"))
                    task_status.started()
                    await trio.sleep_forever()
            finally:
                self._nursery = None
                with trio.CancelScope(shield=True), trio.move_on_after(UNMOUNT_CLEANUP):
                    await self._remove_mount_place()
                self._primary_scope.cancel()

    async def _remove_mount_place(self) -> None:
        if self.mirror is None:
            return
        try:
            await self.mirror.remove(self.view.mount.store_path("/"))
        except (OSError, ValueError) as exc:
            self._failed("could not clear GIO's view of the mount's paths at unmount", exc)

    # -- reads: the SOURCE-path place
    async def get(self, path, key):
        return await self.primary.get(path, key)

    async def get_all(self, path):
        return await self.primary.get_all(path)

    # -- writes: both places
    async def set(self, path, key, value):
        result = await self.primary.set(path, key, value)
        await self._mirrored("set", path, key, value)
        self._remember_own(path)
        return result

    async def unset(self, path, key):
        result = await self.primary.unset(path, key)
        await self._mirrored("unset", path, key)
        self._remember_own(path)
        return result

    def _remember_own(self, path: str) -> None:
        """A key of ``path`` changed in both places: when its change is reported, only the
        path's own keys need a look (no subtree)."""
        rel = self.view.source.rel_path(path)
        if rel is None:
            return
        now = time.monotonic()
        if len(self._own) >= _MAX_PROTECTED:
            self._own = {p: t for p, t in self._own.items() if t > now}
            while len(self._own) >= _MAX_PROTECTED:
                self._own.pop(next(iter(self._own)))
        self._own[rel] = now + OWN_WRITE_SECONDS

    async def remove(self, path):
        result = await self.primary.remove(path)
        await self._mirrored("remove", path)
        return result

    async def copy(self, src, dst):
        result = await self.primary.copy(src, dst)
        await self._mirrored("copy", src, dst)
        return result

    async def move(self, src, dst):
        result = await self.primary.move(src, dst)
        # copy, not move: GIO's own Move of the MNT paths follows (see the module doc)
        await self._mirrored("copy", src, dst)
        for path, old in ((src, True), (dst, False)):
            rel = self.view.source.rel_path(path)
            if rel is not None:
                self._protect(rel, old)
        rel = self.view.source.rel_path(src)
        if rel is not None and self._nursery is not None:
            self._nursery.start_soon(self._settle, rel)
        return result

    async def _settle(self, rel: str) -> None:
        await trio.sleep(RENAME_SETTLE)
        if self.mirror is not None:
            self._changed(self.view.source.tree_path, self.view.source.store_path(rel))

    async def _mirrored(self, method: str, *args) -> None:
        if self.mirror is None:
            return
        paths = [self.view.to_mount(p) for p in args[:2 if method == "copy" else 1]]
        if None in paths:
            return
        try:
            await getattr(self.mirror, method)(*paths, *args[len(paths):])
            self.mirrored += 1
        except (OSError, ValueError) as exc:
            self._failed(f"{method} of {paths[0]} in GIO's view of the mount", exc)

    def _failed(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        self.last_error = f"{what}: {exc}"
        log.warning("%s", self.last_error)

    def _protect(self, rel: str, old: bool) -> None:
        """Keep the SOURCE side winning for a while on a rename's paths: on the old name
        always (a signal of a GIO write from before the rename must not bring its metadata
        back there), on the new name against being emptied (a late Move of GIO's)."""
        now = time.monotonic()
        if len(self._protected) >= _MAX_PROTECTED:
            self._protected = {p: e for p, e in self._protected.items() if e[0] > now}
            while len(self._protected) >= _MAX_PROTECTED:
                self._protected.pop(next(iter(self._protected)))
        self._protected[rel] = (now + PROTECT_SECONDS, old)

    def _protection(self, rel: str) -> str | None:
        """"old", "new" or None: how a rename through the mount protects ``rel`` now."""
        entry = self._protected.get(rel)
        if entry is None:
            return None
        if entry[0] < time.monotonic():
            del self._protected[rel]
            return None
        return "old" if entry[1] else "new"

    # -- changes made by others
    def _changed(self, tree: str, path: str) -> None:
        """A writer reports ``path`` of ``tree`` (a tree file, as its client named it) changed."""
        known = self._trees.get(tree)
        if known is None:
            known = self._trees.get(os.path.realpath(tree))
            if known is None:
                return  # another tree of the directory: not the mount's
        self._pending[(known, path)] = None
        self._wanted.set()

    async def _sync_task(self) -> None:
        while True:
            await self._wanted.wait()
            await trio.sleep(DEBOUNCE)
            self._wanted = trio.Event()
            pending, self._pending = self._pending, {}
            for tree, path in pending:
                try:
                    await self._sync(tree, path)
                except Exception as exc:  # noqa: BLE001 -- never the end of the mount
                    self._failed(f"keeping {path} of {tree} equal in both places", exc)

    async def _kind(self, rel: str) -> str | None:
        if self.source_kind is None:
            return None
        return await trio.to_thread.run_sync(self.source_kind, rel)

    async def _sync(self, tree: str, path: str) -> None:
        view = self.view
        if tree == view.source.tree_path:
            rel = view.source.rel_path(path)
            if rel is not None:
                kind = await self._kind(rel)
                if kind == "view":
                    return
                # a file's change, or our own write's echo, is that path's keys; a
                # directory's or a vanished path's may be a Remove or Move of a subtree
                own = self._own.pop(rel, 0.0) > time.monotonic()
                await self.sync_to_mount(rel, subtree=not (own or kind == "file"))
                return
        if tree == view.mount.tree_path:
            rel = view.mount.rel_path(path)
            if rel is None or await self._kind(rel) == "view":
                return
            here = await self.mirror.get_all(path)
            protection = self._protection(rel)
            if protection == "old" or (protection == "new" and not here):
                await self.sync_to_mount(rel)
            else:
                await self._keys_to_source(rel, here)

    async def sync_to_mount(self, rel: str, *, subtree: bool = True) -> None:
        """Make the mount's place of ``rel`` (and below, with ``subtree``) equal to the
        SOURCE-path place."""
        src_root, mnt_root = self.view.source.store_path(rel), self.view.mount.store_path(rel)
        if not subtree:
            keys, have = await self.primary.get_all(src_root), await self.mirror.get_all(mnt_root)
            if keys != have:
                self.synced += 1
                await self._apply_keys(self.mirror, mnt_root, keys, have)
            return
        wanted = await subtree_of(self.primary, src_root)
        have = await subtree_of(self.mirror, mnt_root)
        if wanted == have:
            return
        self.synced += 1
        if not wanted:
            await self.mirror.remove(mnt_root)
            return
        for rest in sorted(set(have) - set(wanted)):
            await self.mirror.remove(_join(mnt_root, rest))
        for rest, keys in sorted(wanted.items()):
            await self._apply_keys(self.mirror, _join(mnt_root, rest), keys, have.get(rest, {}))

    async def _keys_to_source(self, rel: str, keys: dict) -> None:
        """A GIO write on an MNT path: its keys, as they are now, to the SOURCE-path place."""
        src = self.view.source.store_path(rel)
        have = await self.primary.get_all(src)
        if have != keys:
            self.synced += 1
            await self._apply_keys(self.primary, src, keys, have)

    @staticmethod
    async def _apply_keys(target, path: str, keys: dict, have: dict) -> None:
        changes = {k: v for k, v in keys.items() if have.get(k) != v}
        changes.update({k: None for k in have if k not in keys})
        if not changes:
            return
        set_many = getattr(target, "set_many", None)
        if set_many is not None:
            await set_many(path, changes)
            return
        for key, value in changes.items():
            if value is None:
                await target.unset(path, key)
            else:
                await target.set(path, key, value)

    def status(self) -> dict:
        status = self.primary.status()
        status["mount_paths"] = {
            "tree": self.view.mount.tree_path, "prefix": self.view.mount.prefix or "/",
            "kept": self.mirror is not None, "mirrored_writes": self.mirrored,
            "synced_changes": self.synced, "failures": self.failures, "last_error": self.last_error}
        return status
