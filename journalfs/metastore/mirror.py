"""GIO's view of the mount's own paths, kept equal to the mount's metadata.

GIO keeps metadata per path, in the tree its lookup picks for the file's device (see
:func:`.location.mount_paths_location`): SOURCE's files in the tree of SOURCE's disk ("home"
under $HOME), the mount's paths -- a FUSE device -- in the "root" tree under MNT's absolute
path. GIO programs read those trees themselves (mapped files), so a value GIO must see on
MNT/f has to be written at MNT/f's place too. The rule (docs/gvfs.md):

- the SOURCE-path place is canonical: getfattr through the mount reads it, as before;
- every write through the mount goes to both places before the syscall returns (the
  mount's place second; a failure there is logged and counted, never the syscall's error);
- a GIO write on either side is copied to the other once the store's writer reports it
  (gvfsd-metadata's AttributeChanged signal, at most once a second per path; journalfs
  serving the store itself reports at once). Per key, the side that changed since both
  agreed wins; a change on a SOURCE directory or a vanished SOURCE path (a Remove or Move
  behind the mount's back) is copied with its subtree;
- a rename through the mount copies (not moves) in the mount's place: GIO follows its own
  rename with a Move of the MNT paths, which would empty a destination whose source a move
  had already emptied. The old name is cleared :data:`RENAME_SETTLE` seconds later, and for
  :data:`PROTECT_SECONDS` the SOURCE side wins on the old name and refills an emptied new one;
- at mount time the mount's place is made equal to the SOURCE-path place, and at unmount it
  is removed (those paths are gone with the mount), so nothing stale resurfaces there."""
from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Mapping, Protocol, TypeVar

import trio

from .backend import CopyOp, MetadataBackend, MoveOp, RemoveOp, SetOp, UnsetOp, Value, WriteOp
from .ledger import Ledger
from .location import StoreLocation

log = logging.getLogger("journalfs.metastore")

#: seconds after a rename through the mount before its old name is cleared in the mount's
#: place (GIO's Move of the MNT paths comes right after the rename returns)
RENAME_SETTLE = 2.0
#: how long after a rename through the mount the SOURCE side wins on its two names and
#: below them (the reports of the copy's writes come a second later)
PROTECT_SECONDS = 10.0
#: changes reported together are handled after this short pause, once each
DEBOUNCE = 0.05
#: paths whose last agreed keys are remembered (the least recently used are forgotten)
AGREED_PATHS = 10_000
#: a change reported this soon after journalfs wrote a key of a directory is taken for the
#: report of that write (gvfsd-metadata reports a second later), not for a Move or Remove
ECHO_SECONDS = 10.0
UNMOUNT_CLEANUP = 10.0
#: seconds a look at a SOURCE path may take before it counts as unknown
KIND_TIMEOUT = 5.0
#: after a failed write in the mount's place, writes there pause this long (no syscall waits
#: on a broken tree), then everything is compared again
PAUSE_AFTER_FAILURE = 60.0


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


def _value(v: Value | None) -> Value | None:
    return list(v) if isinstance(v, (list, tuple)) else v


class TreeWriter(Protocol):
    """What the mount's place (another tree of the store directory) is read and written
    through: the shared backend's :meth:`SharedBackend.open_tree`."""

    async def get_all(self, path: str) -> dict[str, Value]: ...

    async def subtree(self, root: str) -> dict[str, dict[str, Value]]:
        """{path below root ("" = root): keys} of every keyed path at or below ``root``."""

    async def set(self, path: str, key: str, value: Value) -> object: ...

    async def unset(self, path: str, key: str) -> object: ...

    async def set_many(self, path: str, changes: Mapping[str, Value | None]) -> None:
        """{key: value, None = unset} at ``path``."""

    async def remove(self, path: str) -> object: ...

    async def copy(self, src: str, dst: str) -> object: ...

    async def move(self, src: str, dst: str) -> object: ...

    def fresh(self) -> FreshWriter | None:
        """The same tree through a connection of its own (for the unmount's cleanup when
        the shared one is gone); None where there is nothing of its own to open."""


class FreshWriter(TreeWriter, Protocol):
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None: ...


class SharedBackend(MetadataBackend, Protocol):
    """A backend of a store GIO programs share (gvfsd-metadata's, or the one journalfs
    serves in its place): what :class:`MirroredBackend` wraps."""

    async def subtree(self, root: str) -> dict[str, dict[str, Value]]: ...

    async def set_many(self, path: str, changes: Mapping[str, Value | None]) -> None: ...

    async def open_tree(self, tree_path: str) -> TreeWriter:
        """Another tree of the store's directory, written through the same writer."""

    async def watch_changes(self, changed: Callable[[str, str], None], *,
                            task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Call ``changed(tree file, path)`` for each write the store's writer reports."""


K = TypeVar("K")
V = TypeVar("V")


_OP_NAMES = {SetOp: "set", UnsetOp: "unset", RemoveOp: "remove", CopyOp: "copy", MoveOp: "copy"}


class _Bounded(OrderedDict[K, V]):
    """An LRU map of at most ``limit`` entries."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def put(self, key: K, value: V) -> None:
        self.pop(key, None)
        self[key] = value
        while len(self) > self.limit:
            self.popitem(last=False)


class _Gate:
    """Writes through the mount may run together; a sync of reported changes runs alone
    (it reads both places, then writes what it decided: a write in between would be undone)."""

    def __init__(self) -> None:
        self.writes = 0
        self.syncing = False
        self._no_writes = trio.Event()
        self._no_writes.set()
        self._no_sync = trio.Event()
        self._no_sync.set()

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[None]:
        while self.syncing:
            await self._no_sync.wait()
        self.writes += 1
        self._no_writes = trio.Event() if self.writes == 1 else self._no_writes
        try:
            yield
        finally:
            self.writes -= 1
            if not self.writes:
                self._no_writes.set()

    @contextlib.asynccontextmanager
    async def sync(self) -> AsyncIterator[None]:
        while self.syncing or self.writes:
            await (self._no_sync if self.syncing else self._no_writes).wait()
        self.syncing = True
        self._no_sync = trio.Event()
        try:
            yield
        finally:
            self.syncing = False
            self._no_sync.set()


class MirroredBackend:
    """The mount's metadata backend for a shared gvfs store: ``primary`` (GvfsdBackend or
    SessionStoreBackend) serves the SOURCE-path place, and the mount's place is kept equal
    (see the module doc). A MetadataBackend: the primary's answers, but writes go to both
    places."""

    def __init__(self, primary: SharedBackend, view: MountView,
                 source_kind: Callable[[str], str] | None = None):
        """``source_kind(rel)`` says what a mount-relative path is in SOURCE -- "file",
        "dir", "absent" or "view" (the mount's own views: never mirrored) -- from a worker
        thread; None: every reported change is copied with its subtree."""
        self.primary = primary
        self.view = view
        self.source_kind = source_kind
        self.mirror: TreeWriter | None = None  # the backend of the mount's tree, once running
        self._pending: dict[tuple[str, str], None] = {}
        self._wanted = trio.Event()
        # rel -> (complete?, {key: value, None = absent}): what both places held when
        # journalfs last wrote or compared them (the base of the comparison in _sync_keys);
        # complete: every key is listed, so one not listed was absent in both
        self._agreed: _Bounded[str, tuple[bool, dict[str, Value | None]]] = _Bounded(AGREED_PATHS)
        # rel -> (until, old name?)
        self._protected: _Bounded[str, tuple[float, bool]] = _Bounded(AGREED_PATHS)
        # (side, rel) -> until: journalfs wrote there itself; a report of it is an echo
        self._echoes: _Bounded[tuple[str, str], float] = _Bounded(AGREED_PATHS)
        self._trees = {name: tree for tree in (view.source.tree_path, view.mount.tree_path)
                       for name in (tree, os.path.realpath(tree))}
        self._primary_scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self._gate = _Gate()
        self._paused_until = 0.0
        self.mirrored = 0
        self.synced = 0
        self.failures = 0
        self.last_error: str | None = None

    # -- what is not about writes: the primary's
    async def sync(self) -> None:
        await self.primary.sync()

    async def compact(self) -> None:
        await self.primary.compact()

    def rotations(self) -> int | None:
        return self.primary.rotations()

    @property
    def sync_mode(self) -> str | None:
        return self.primary.sync_mode

    def set_sync(self, mode: str) -> None:
        self.primary.set_sync(mode)

    @property
    def readonly(self) -> bool:
        return self.primary.readonly

    @property
    def sole_writer(self) -> bool:
        return self.primary.sole_writer

    @property
    def ledger(self) -> Ledger | None:
        return self.primary.ledger

    def journal_path(self) -> str | None:
        return self.primary.journal_path()

    @property
    def place(self) -> TreeWriter:
        """The backend of the mount's place (the mirror), once running."""
        if self.mirror is None:
            raise RuntimeError("GIO's metadata of the mount's paths is not kept")
        return self.mirror

    # -- lifecycle
    async def _run_primary(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # shielded: at unmount the mount's place is removed through it before it stops
        with trio.CancelScope(shield=True) as self._primary_scope:
            await self.primary.run(task_status=task_status)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as outer:
            await outer.start(self._run_primary)
            try:
                async with trio.open_nursery() as nursery:
                    try:
                        self.mirror = await self.primary.open_tree(self.view.mount.tree_path)
                        await nursery.start(self.primary.watch_changes, self._changed)
                    except (OSError, ValueError) as exc:
                        self._failed("GIO's metadata of the mount's paths is not kept", exc)
                        self.mirror = None
                    else:
                        self._nursery = nursery
                        nursery.start_soon(self._sync_task)
                        self._changed(self.view.source.tree_path, self.view.source.store_path("/"))
                    task_status.started()
                    await trio.sleep_forever()
            finally:
                self._nursery = None
                try:
                    with trio.CancelScope(shield=True), trio.move_on_after(UNMOUNT_CLEANUP):
                        await self._remove_mount_place()
                finally:
                    if self._primary_scope is not None:
                        self._primary_scope.cancel()

    async def _remove_mount_place(self) -> None:
        if self.mirror is None:
            return
        place = self.view.mount.store_path("/")
        try:
            await self.mirror.remove(place)
            return
        except Exception as exc:  # noqa: BLE001 -- e.g. the shared bus connection is gone
            failure = exc
        backend = self.mirror.fresh()  # a backend of its own, if it has one
        if backend is not None:
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(backend.run)
                    await backend.remove(place)
                    nursery.cancel_scope.cancel()
                return
            except Exception as exc:  # noqa: BLE001
                failure = exc
        self._failed("could not clear GIO's metadata of the mount's paths at unmount", failure)

    # -- reads: the SOURCE-path place
    async def get(self, path: str, key: str) -> Value | None:
        return await self.primary.get(path, key)

    async def get_all(self, path: str) -> dict[str, Value]:
        return await self.primary.get_all(path)

    # -- writes through the mount: both places
    def set_now(self, path: str, key: str, value: Value) -> bool:
        return False  # two places to write, under the gate

    async def set(self, path: str, key: str, value: Value) -> object:
        async with self._gate.write():
            result = await self.primary.set(path, key, value)
            if await self._mirrored(SetOp(path, key, value)):
                self._agree(path, {key: value}, echo=True)
            else:  # the places differ: no claim they agree
                self._forget(path)
        return result

    async def unset(self, path: str, key: str) -> object:
        async with self._gate.write():
            result = await self.primary.unset(path, key)
            if await self._mirrored(UnsetOp(path, key)):
                self._agree(path, {key: None}, echo=True)
            else:
                self._forget(path)
        return result

    async def remove(self, path: str) -> object:
        async with self._gate.write():
            result = await self.primary.remove(path)
            self._forget(path, below=True)
            await self._mirrored(RemoveOp(path))
        return result

    async def copy(self, src: str, dst: str) -> object:
        async with self._gate.write():
            result = await self.primary.copy(src, dst)
            self._forget(dst, below=True)
            await self._mirrored(CopyOp(src, dst))
        return result

    async def move(self, src: str, dst: str) -> object:
        async with self._gate.write():
            return await self._move(src, dst)

    async def _move(self, src: str, dst: str) -> object:
        result = await self.primary.move(src, dst)
        self._forget(src, below=True)
        self._forget(dst, below=True)
        # copy, not move: GIO's own Move of the MNT paths follows (see the module doc)
        if await self._mirrored(CopyOp(src, dst)):
            self._agree(dst, await self.primary.get_all(dst), complete=True)
        for path, old in ((src, True), (dst, False)):
            rel = self.view.source.rel_path(path)
            if rel is not None:
                self._protected.put(rel, (time.monotonic() + PROTECT_SECONDS, old))
        rel = self.view.source.rel_path(src)
        if rel is not None and self._nursery is not None:
            self._nursery.start_soon(self._settle, rel)
        return result

    async def _settle(self, rel: str) -> None:
        await trio.sleep(RENAME_SETTLE)
        self._changed(self.view.source.tree_path, self.view.source.store_path(rel))

    async def _mirrored(self, op: WriteOp) -> bool:
        """Make the same write (``op``, in SOURCE paths) in the mount's place; True when it
        is there. (A move is mirrored as a copy: see :meth:`_move`.)"""
        if self.mirror is None or time.monotonic() < self._paused_until:
            return False
        paths = (op.src, op.dst) if isinstance(op, (CopyOp, MoveOp)) else (op.path,)
        mapped = [self.view.to_mount(p) for p in paths]
        places = [p for p in mapped if p is not None]
        if len(places) < len(paths):
            return False
        try:
            if isinstance(op, SetOp):
                await self.mirror.set(places[0], op.key, op.value)
            elif isinstance(op, UnsetOp):
                await self.mirror.unset(places[0], op.key)
            elif isinstance(op, RemoveOp):
                await self.mirror.remove(places[0])
            else:
                await self.mirror.copy(places[0], places[1])
        except (OSError, ValueError) as exc:
            self._failed(f"{_OP_NAMES[type(op)]} of {places[0]} in GIO's metadata of the "
                         f"mount's paths (paused for {PAUSE_AFTER_FAILURE:.0f} s)", exc)
            self._paused_until = time.monotonic() + PAUSE_AFTER_FAILURE
            if self._nursery is not None:
                self._nursery.start_soon(self._compare_all_later)
            return False
        self.mirrored += 1
        return True

    async def _compare_all_later(self) -> None:
        await trio.sleep(PAUSE_AFTER_FAILURE)
        self._changed(self.view.source.tree_path, self.view.source.store_path("/"))

    def _failed(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        self.last_error = f"{what}: {exc}"
        log.warning("%s", self.last_error)

    def _agree(self, path: str, changes: Mapping[str, Value | None], echo: bool = False,
               complete: bool = False) -> None:
        rel = self.view.source.rel_path(path)
        if rel is not None:
            self._remember(rel, changes, complete)
            if echo:
                self._wrote("source", rel)
                self._wrote("mount", rel)

    def _wrote(self, side: str, rel: str) -> None:
        self._echoes.put((side, rel), time.monotonic() + ECHO_SECONDS)

    def _is_echo(self, side: str, rel: str) -> bool:
        """The report of a change on ``side`` at ``rel`` may be of journalfs's own write."""
        return self._echoes.pop((side, rel), 0.0) > time.monotonic()

    def _remember(self, rel: str, changes: Mapping[str, Value | None], complete: bool = False) -> None:
        """Both places hold ``changes`` ({key: value, None = absent}) at ``rel`` now
        (``complete``: and no other key)."""
        was_complete, keys = (False, {}) if complete else self._agreed.get(rel, (False, {}))
        keys = {**keys, **{k: _value(v) for k, v in changes.items()}}
        self._agreed.put(rel, (complete or was_complete, keys))

    def _agreed_value(self, rel: str, key: str) -> tuple[bool, Value | None]:
        """(known?, value) both places held for ``key`` of ``rel``."""
        complete, keys = self._agreed.get(rel, (False, {}))
        if key in keys:
            return True, keys[key]
        return complete, None

    def _forget(self, path: str, below: bool = False) -> None:
        """No claim any more that both places agree on ``path`` (and below it)."""
        rel = self.view.source.rel_path(path)
        if rel is None:
            return
        self._agreed.pop(rel, None)
        if below and self._agreed:
            inside = "/" if rel == "/" else rel + "/"
            for known in [p for p in self._agreed if p.startswith(inside)]:
                del self._agreed[known]

    def _protection(self, rel: str) -> str | None:
        """"old", "new" or None: how a recent rename through the mount of ``rel`` or of a
        directory above it protects it."""
        if not self._protected:
            return None
        now = time.monotonic()
        path = rel
        while True:
            entry = self._protected.get(path)
            if entry is not None:
                if entry[0] >= now:
                    return "old" if entry[1] else "new"
                del self._protected[path]
            if path == "/":
                return None
            path = path.rsplit("/", 1)[0] or "/"

    # -- changes reported by the store's writer
    def _changed(self, tree: str, path: str) -> None:
        """``path`` of ``tree`` (a tree file, as its writer's client named it) changed."""
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
                    async with self._gate.sync():
                        await self._sync(tree, path)
                except Exception as exc:  # noqa: BLE001 -- never the end of the mount
                    self._failed(f"keeping {path} of {tree} equal in both places", exc)

    async def _kind(self, rel: str) -> str | None:
        if self.source_kind is None:
            return None
        with trio.move_on_after(KIND_TIMEOUT):  # a hung filesystem in SOURCE: no answer
            return await trio.to_thread.run_sync(self.source_kind, rel, abandon_on_cancel=True)
        return None

    async def _sync(self, tree: str, path: str) -> None:
        view = self.view
        if tree == view.source.tree_path:
            rel = view.source.rel_path(path)
            if rel is not None:
                kind = await self._kind(rel)
                if kind == "view":
                    return
                # a file's change, or the report of journalfs's own write on a directory,
                # is that path's keys; another directory's or a vanished path's may be a
                # Remove or Move of its subtree
                if self._protection(rel) == "old":
                    await self.sync_to_mount(rel)
                elif kind == "file" or (kind == "dir" and ("source", rel) in self._echoes):
                    await self._sync_keys(rel, "source")
                else:
                    await self._sync_subtree(rel)
                return
        if tree == view.mount.tree_path:
            rel = view.mount.rel_path(path)
            if rel is None or await self._kind(rel) == "view":
                return
            protection = self._protection(rel)
            if protection == "old" or (protection == "new" and (
                    not await self.place.get_all(path) or await self._kind(rel) == "absent")):
                # the old name; a new name a late Move of GIO's emptied; or the report of
                # the rename's copy for a path gone from SOURCE since
                await self.sync_to_mount(rel)
            else:
                await self._sync_keys(rel, "mount")

    async def sync_to_mount(self, rel: str) -> None:
        """Make the mount's place of ``rel`` and below equal to the SOURCE-path place."""
        src_root, mnt_root = self.view.source.store_path(rel), self.view.mount.store_path(rel)
        wanted = await self.primary.subtree(src_root)
        have = await self.place.subtree(mnt_root)
        if wanted != have:
            self.synced += 1
            if not wanted:
                await self.place.remove(mnt_root)
            for rest in sorted(set(have) - set(wanted)) if wanted else ():
                await self.place.remove(_join(mnt_root, rest))
            for rest, keys in sorted(wanted.items()):
                mine = have.get(rest, {})
                changes: dict[str, Value | None] = {k: v for k, v in keys.items() if mine.get(k) != v}
                changes.update({k: None for k in mine if k not in keys})
                if changes:
                    await self._apply(self.place, _join(mnt_root, rest), changes)
                    self._wrote("mount", _join(rel, rest))
        # both places agree on every path compared: the base of later comparisons
        for rest in set(have) | set(wanted) | {""}:
            self._remember(_join(rel, rest), wanted.get(rest, {}), complete=True)

    async def _sync_subtree(self, rel: str) -> None:
        """A change reported on a SOURCE directory or a vanished SOURCE path, which may be a
        Remove or Move of a subtree behind the mount: paths below ``rel`` the mount's place
        has and SOURCE no longer has are removed there; every other path that differs is
        merged key by key (:meth:`_merge`)."""
        src_root, mnt_root = self.view.source.store_path(rel), self.view.mount.store_path(rel)
        wanted = await self.primary.subtree(src_root)
        have = await self.place.subtree(mnt_root)
        for rest in sorted(set(have) | set(wanted)):
            at_source, at_mount = wanted.get(rest, {}), have.get(rest, {})
            path = _join(rel, rest)
            if at_source == at_mount:
                self._remember(path, at_source, complete=True)
            elif not at_source and await self._kind(path) == "absent":
                self.synced += 1
                await self.place.remove(_join(mnt_root, rest))
                self._wrote("mount", path)
                self._remember(path, {}, complete=True)
            else:
                await self._merge(path, at_source, at_mount, "source")

    async def _sync_keys(self, rel: str, reported: str) -> None:
        """Make the keys of ``rel`` equal in both places after a change was reported on the
        ``reported`` side ("source" or "mount")."""
        src, mnt = self.view.source.store_path(rel), self.view.mount.store_path(rel)
        at_source, at_mount = await self.primary.get_all(src), await self.place.get_all(mnt)
        if at_source == at_mount:
            self._remember(rel, at_source, complete=True)
            return
        await self._merge(rel, at_source, at_mount, reported)

    async def _merge(self, rel: str, at_source: dict[str, Value], at_mount: dict[str, Value],
                     reported: str) -> None:
        """Per key that differs: where one side still holds the value both held when
        journalfs last wrote or compared them, the other side changed since and wins;
        without that memory, the reported side wins -- unless the report is of journalfs's
        own write (or of a rename's copy), which never drops a value on a guess."""
        src, mnt = self.view.source.store_path(rel), self.view.mount.store_path(rel)
        echo = self._is_echo(reported, rel) or self._protection(rel) == "new"
        other = "mount" if reported == "source" else "source"
        to_source, to_mount = {}, {}
        for key in set(at_source) | set(at_mount):
            here, there = at_source.get(key), at_mount.get(key)
            if here == there:
                continue
            known, agreed = self._agreed_value(rel, key)
            if known:  # the side still holding the agreed value did not change
                winner = "mount" if here == agreed else "source" if there == agreed else reported
            elif echo:
                # the report is of journalfs's own write, already in both places: the
                # difference is a GIO write, on the other side (its report still to come)
                # or folded into this report; a value is never dropped on a guess
                theirs = there if reported == "source" else here
                winner = other if theirs is not None else reported
            else:
                winner = reported
            if winner == "source":
                to_mount[key] = here
            else:
                to_source[key] = there
        self.synced += 1
        if to_mount:
            await self._apply(self.place, mnt, to_mount)
        if to_source:
            await self._apply(self.primary, src, to_source)
        if to_mount:
            self._wrote("mount", rel)
        if to_source:
            self._wrote("source", rel)
        final = {**at_source, **to_source}
        self._remember(rel, {k: v for k, v in final.items() if v is not None}, complete=True)

    @staticmethod
    async def _apply(target: TreeWriter | SharedBackend, path: str,
                     changes: Mapping[str, Value | None]) -> None:
        """{key: value, None = unset} at ``path`` of ``target``."""
        if changes:
            await target.set_many(path, changes)

    def status(self) -> dict[str, Any]:
        status = self.primary.status()
        status["mount_paths"] = {
            "tree": self.view.mount.tree_path, "prefix": self.view.mount.prefix or "/",
            "kept": self.mirror is not None, "mirrored_writes": self.mirrored,
            "synced_changes": self.synced, "failures": self.failures, "last_error": self.last_error,
            "paused": time.monotonic() < self._paused_until}
        return status
