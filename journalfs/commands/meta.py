"""`journalfs meta ...`: read and write a gvfs-format metadata store (tree + journal) directly.

TREE is the tree file (e.g. ~/.local/share/gvfs-metadata/home); its journal is found by tag.
Reads open the store read-only (no lock); writes take the store's writer lock, so they fail
with a clear message while a mount (or another `meta` command) is writing it -- except
`compact`, which asks a mount holding the store to rotate it (SIGUSR1) and waits for that.
Only `set --create` makes a new store: a mistyped TREE is an error, not a new store.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time

from ..fs.main import journalfs_mount_of
from ..metastore.backend import MoveOp, RemoveOp, SetOp, UnsetOp, WriteOp
from ..metastore.location import resolve_store
from ..metastore.store import MetaStore, StoreLocked, lock_holder
from . import EXIT_ERROR, EXIT_OK

def _reader(args) -> MetaStore:
    return MetaStore.open(args.tree, readonly=True, create=False)


def _writer(args, create: bool = False) -> MetaStore:
    if not create and not os.path.exists(args.tree):
        raise FileNotFoundError(errno.ENOENT, f"no metadata store at {args.tree} "
                                "(meta set --create makes a new one)")
    try:
        return MetaStore.open(args.tree, sync=args.sync, create=create)
    except (StoreLocked, OSError) as exc:
        if isinstance(exc, StoreLocked) or exc.errno == errno.EBUSY:
            raise StoreInUse(args.tree, getattr(args, "path", None), exc) from None
        raise


class StoreInUse(Exception):
    """The store's writer lock is held: name the holder and, for a journalfs mount, the way
    to change the metadata through it."""

    def __init__(self, tree: str, path: str | None, locked: Exception):
        pid = lock_holder(tree)
        text = str(locked)
        mount = journalfs_mount_of(pid) if pid is not None else None
        if mount is not None:
            target = mount_path_for(mount, tree, path)
            text += (f"; it is served by the journalfs mount on {mount[1]}: change metadata "
                     f"through it, e.g. setfattr -n user.metadata.KEY -v VALUE {target}")
        super().__init__(text)


def mount_path_for(mount: tuple[str, str, dict], tree: str, path: str | None) -> str:
    """Where store path ``path`` of ``tree`` shows in the mount (the mountpoint itself when
    the mapping cannot be worked out)."""
    source, mountpoint, options = mount
    if path is None:
        return mountpoint
    store = options.get("--store")
    try:
        location = resolve_store(source, store, gvfs=bool(options.get("--gvfs")))
    except Exception:
        return mountpoint
    if os.path.realpath(location.tree_path) != os.path.realpath(tree):
        return mountpoint
    prefix = location.prefix.rstrip("/")
    if prefix and not (path == prefix or path.startswith(prefix + "/")):
        return mountpoint
    return mountpoint.rstrip("/") + "/" + path[len(prefix):].lstrip("/")


def _warn_damage(store: MetaStore) -> None:
    error = store.status()["journal_error"]
    if error:
        print(f"journalfs: warning: {error} (later journal entries ignored, as gvfs does)",
              file=sys.stderr)


def _show(value) -> str:
    return ", ".join(json.dumps(v, ensure_ascii=False) for v in value) if isinstance(value, list) \
        else json.dumps(value, ensure_ascii=False)


def run_dump(args) -> int:
    store = _reader(args)
    try:
        state = store.dump()
        _warn_damage(store)
    finally:
        store.close()
    if args.json:
        print(json.dumps(state, ensure_ascii=False, sort_keys=True, indent=1))
        return EXIT_OK
    for path in sorted(state):
        print(path)
        for key, value in sorted(state[path].items()):
            kind = "list" if isinstance(value, list) else "string"
            print(f"  {key} ({kind}): {_show(value)}")
    return EXIT_OK


def run_get(args) -> int:
    store = _reader(args)
    try:
        meta = store.get_all(args.path)
    finally:
        store.close()
    if args.key is not None:
        if args.key not in meta:
            print(f"journalfs: {args.path}: no key {args.key!r} in {args.tree}", file=sys.stderr)
            return EXIT_ERROR
        meta = {args.key: meta[args.key]}
    elif not meta:
        print(f"journalfs: {args.path}: no metadata in {args.tree}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps(meta if args.key is None else meta[args.key], ensure_ascii=False))
    elif args.key is not None:
        value = meta[args.key]
        print("\n".join(value) if isinstance(value, list) else value)
    else:
        for key, value in meta.items():
            print(f"{key}: {_show(value)}")
    return EXIT_OK


def _write(args, op, create: bool = False, owner_call: WriteOp | None = None) -> int:
    """Apply ``op`` to the store, unless the store's owner on the session bus (gvfsd-metadata
    or a serving mount) takes the write ``owner_call``."""
    # late: D-Bus (jeepney) is loaded only by a write, never by `meta get`/`dump`
    from ..metastore.gvfs_service import write_through_owner
    if owner_call is not None and write_through_owner(args.tree, owner_call):
        return EXIT_OK
    store = _writer(args, create)
    try:
        op(store)
    finally:
        store.close(compact=False)  # no full rewrite per command; `meta compact` does that
    return EXIT_OK


class NothingThere(Exception):
    """The path named by a write command has nothing to change (exit 1, as getfattr/mv do)."""


def _has_subtree(store: MetaStore, path: str) -> bool:
    """Does ``path`` or any path below it have metadata?"""
    if store.get_all(path):
        return True
    below = path.rstrip("/") + "/"
    return any(p.startswith(below) for p in store.dump())


def run_set(args) -> int:
    value = list(args.values) if (args.list or len(args.values) > 1) else args.values[0]
    return _write(args, lambda s: s.set(args.path, args.key, value), create=args.create,
                  owner_call=SetOp(args.path, args.key, value))


def run_unset(args) -> int:
    def unset(store):
        if args.key not in store.get_all(args.path):
            raise NothingThere(f"{args.path}: no key {args.key!r} in {args.tree}")
        store.unset(args.path, args.key)
    return _write(args, unset, owner_call=UnsetOp(args.path, args.key))


def run_rm(args) -> int:
    def remove(store):
        if not _has_subtree(store, args.path):
            raise NothingThere(f"{args.path}: no metadata in {args.tree}")
        store.remove(args.path)
    return _write(args, remove, owner_call=RemoveOp(args.path))


def run_mv(args) -> int:
    def move(store):
        if not _has_subtree(store, args.src):
            raise NothingThere(f"{args.src}: no metadata in {args.tree} (nothing to move)")
        store.move(args.src, args.dst)
    return _write(args, move, owner_call=MoveOp(args.src, args.dst))


def run_compact(args) -> int:
    # late: D-Bus (jeepney) is loaded only by a write, never by `meta get`/`dump`
    from ..metastore.gvfs_service import refuse_if_gvfsd_writes
    refuse_if_gvfsd_writes(args.tree)
    args.sync = "always"
    try:
        store = _writer(args)
    except StoreInUse:
        pid = lock_holder(args.tree)
        if pid is None or journalfs_mount_of(pid) is None:
            raise
        return _compact_in_mount(args.tree, pid)
    with store:
        store.rotate()
        print(f"compacted {store.tree_path}: new journal {store.journal_path}")
    return EXIT_OK


#: How long `meta compact` waits for a mount holding the store to finish its rotation.
MOUNT_COMPACT_TIMEOUT = 300.0


def _compact_in_mount(tree: str, pid: int) -> int:
    """The store belongs to a running mount: ask it to rotate (SIGUSR1) and wait until the
    tree file has been replaced."""
    before = os.stat(tree).st_ino
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + MOUNT_COMPACT_TIMEOUT
    while os.stat(tree).st_ino == before:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the mount holding {tree} (pid {pid}) did not compact it "
                               f"within {MOUNT_COMPACT_TIMEOUT:g} s")
        time.sleep(0.05)
    print(f"compacted {tree} through the mount holding it (pid {pid})")
    return EXIT_OK
