"""`journalfs meta ...`: read and write a gvfs-format metadata store (tree + journal) directly.

TREE is the tree file (e.g. ~/.local/share/gvfs-metadata/home); its journal is found by tag.
Reads open the store read-only (no lock); writes take the store's writer lock, so they fail
with a clear message while a mount (or another `meta` command) is writing it -- except
`compact`, which asks a mount holding the store to rotate it (SIGUSR1) and waits for that.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

from ..metastore.store import SYNC_MODES, MetaStore, StoreLocked, lock_holder


def add_parser(sub) -> None:
    p = sub.add_parser("meta", help="read and write a gvfs metadata store",
                       description=__doc__.split("\n\n")[0])
    msub = p.add_subparsers(dest="meta_command", required=True, parser_class=type(p))

    def cmd(name, fn, help, *args):
        c = msub.add_parser(name, help=help)
        c.add_argument("tree", help="the store's tree file")
        for a in args:
            c.add_argument(a)
        c.add_argument("--sync", choices=SYNC_MODES, default="always",
                       help="durability of writes (default: always)")
        c.set_defaults(run=fn)
        return c

    cmd("dump", run_dump, "print every path with metadata").add_argument(
        "--json", action="store_true", help="one JSON object {path: {key: value}}")
    g = cmd("get", run_get, "print a path's keys (or one key)", "path")
    g.add_argument("key", nargs="?")
    g.add_argument("--json", action="store_true")
    s = cmd("set", run_set, "set a key (several values or --list: a list)", "path", "key")
    s.add_argument("values", nargs="+", metavar="VALUE")
    s.add_argument("--list", action="store_true", help="store a list even for one value")
    cmd("unset", run_unset, "remove a key", "path", "key")
    cmd("rm", run_rm, "remove a path's metadata and its subtree's", "path")
    cmd("mv", run_mv, "move a path's metadata (subtree included)", "src", "dst")
    cmd("compact", run_compact, "rotate: merge the journal into a new tree")


def _reader(args) -> MetaStore:
    return MetaStore.open(args.tree, readonly=True, create=False)


def _writer(args) -> MetaStore:
    return MetaStore.open(args.tree, sync=args.sync)


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
        return 0
    for path in sorted(state):
        print(path)
        for key, value in sorted(state[path].items()):
            kind = "list" if isinstance(value, list) else "string"
            print(f"  {key} ({kind}): {_show(value)}")
    return 0


def run_get(args) -> int:
    store = _reader(args)
    try:
        meta = store.get_all(args.path)
    finally:
        store.close()
    if args.key is not None:
        if args.key not in meta:
            print(f"journalfs: {args.path}: no key {args.key!r}", file=sys.stderr)
            return 1
        meta = {args.key: meta[args.key]}
    if args.json:
        print(json.dumps(meta if args.key is None else meta[args.key], ensure_ascii=False))
    elif args.key is not None:
        value = meta[args.key]
        print("\n".join(value) if isinstance(value, list) else value)
    else:
        for key, value in meta.items():
            print(f"{key}: {_show(value)}")
    return 0


def _write(args, method: str, *call) -> int:
    from ..metastore.gvfs_service import write_through_owner
    if write_through_owner(args.tree, method, *call):  # gvfsd-metadata (or a mount) writes it
        return 0
    store = _writer(args)
    try:
        getattr(store, method)(*call)
    finally:
        store.close(compact=False)  # no full rewrite per command; `meta compact` does that
    return 0


def run_set(args) -> int:
    value = list(args.values) if (args.list or len(args.values) > 1) else args.values[0]
    return _write(args, "set", args.path, args.key, value)


def run_unset(args) -> int:
    return _write(args, "unset", args.path, args.key)


def run_rm(args) -> int:
    return _write(args, "remove", args.path)


def run_mv(args) -> int:
    return _write(args, "move", args.src, args.dst)


def run_compact(args) -> int:
    from ..metastore.gvfs_service import refuse_if_gvfsd_writes
    refuse_if_gvfsd_writes(args.tree)
    try:
        store = _writer(args)
    except StoreLocked:
        pid = lock_holder(args.tree)
        if pid is None or not _is_journalfs_mount(pid):
            raise
        return _compact_in_mount(args.tree, pid)
    with store:
        store.rotate()
        print(f"compacted {store.tree_path}: new journal {store.journal_path}")
    return 0


#: How long `meta compact` waits for a mount holding the store to finish its rotation.
MOUNT_COMPACT_TIMEOUT = 300.0


def _is_journalfs_mount(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return b"mount" in argv and any(os.path.basename(a) in (b"journalfs", b"journalfs.cli") for a in argv)


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
    return 0
