"""The mount's operations class driven in-process, with no kernel (the `fast` test tier).

:func:`serving` builds what ``fs/main.py``'s ``serve`` builds (the metadata backend of a
mount without ``--store``, through main.py's own ``_open_metadata``, started in a trio
nursery; a :class:`JournalFS` on SOURCE with its settings control) but calls the handlers
directly. ``pyfuse3.readdir_reply`` needs a token from a real kernel request, so
:func:`listdir` hands readdir a list as its token and collects the entries through a
stand-in reply function.

Every store served is remembered in :data:`SERVED_STORES`; tests/conftest.py checks each with
the store's fsck after the test (:func:`store_findings`) and fails the test on any finding.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import pyfuse3
import trio

from journalfs.fs.main import MountConfig, _open_metadata, assemble
from journalfs.fs.passthrough import JournalFS
from journalfs.metastore.fsck import check_store

#: tree paths of the stores :func:`serving` opened since the last :func:`take_served_stores`
SERVED_STORES: list[str] = []


@dataclass
class Ctx:
    """The request context pyfuse3 passes to handlers (only what they read)."""
    uid: int = 0
    gid: int = 0
    pid: int = 0
    umask: int = 0o022


ROOT = Ctx()


class ReplyBuffer(list):
    """A readdir "token": collects (name, attrs, next_id); with ``room`` it fills up after that
    many entries per readdir call, as the kernel's reply buffer does, and the handler must
    stop and resume at the next call's offset."""

    def __init__(self, room: int | None = None):
        super().__init__()
        self.room = room
        self.this_call = 0


def _collect_reply(token, name, attrs, next_id):
    if isinstance(token, ReplyBuffer) and token.room is not None:
        if token.this_call >= token.room:
            return False
        token.this_call += 1
    token.append((name, attrs, next_id))
    return True


#: the kernel cache invalidations asked for in-process: (function name, arguments)
INVALIDATIONS: list[tuple[str, tuple]] = []


def _recorder(name: str):
    def record(*args, **kwargs):
        INVALIDATIONS.append((name, args))
    return record


@contextlib.contextmanager
def list_tokens():
    """Lets readdir answer into a list instead of a kernel reply buffer, and records the
    kernel cache invalidations (with no kernel session libfuse refuses them with EINVAL,
    which pyfuse3's notify thread would log as errors)."""
    stand_ins = {"readdir_reply": _collect_reply,
                 "invalidate_entry_async": _recorder("invalidate_entry_async"),
                 "invalidate_entry": _recorder("invalidate_entry"),
                 "invalidate_inode": _recorder("invalidate_inode")}
    real = {name: getattr(pyfuse3, name) for name in stand_ins}
    for name, stand_in in stand_ins.items():
        setattr(pyfuse3, name, stand_in)
    try:
        yield
    finally:
        for name, function in real.items():
            setattr(pyfuse3, name, function)


@contextlib.contextmanager
def _data_home(path: Path):
    """XDG_DATA_HOME pointing at ``path`` (where a mount without --store keeps its store)."""
    before = os.environ.get("XDG_DATA_HOME")
    os.environ["XDG_DATA_HOME"] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("XDG_DATA_HOME", None)
        else:
            os.environ["XDG_DATA_HOME"] = before


@contextlib.asynccontextmanager
async def serving(source: Path, data_home: Path, *, sync: str = "always", timeout: float = 1.0,
                  ro: bool = False):
    """A JournalFS on ``source`` as ``journalfs mount -o sync=SYNC SOURCE MNT`` serves it, its
    embedded store below ``data_home`` (XDG_DATA_HOME), served until exit."""
    config = MountConfig(source=str(source), mountpoint=str(Path(data_home) / "mnt"),
                         sync=sync, timeout=timeout, ro=ro)
    with _data_home(Path(data_home)):
        meta, location = _open_metadata(config)
    SERVED_STORES.append(location.tree_path)
    ops = assemble(config, meta, location, str(source))  # as main.py's serve builds it
    async with trio.open_nursery() as nursery:
        await nursery.start(meta.run)
        try:
            with list_tokens():
                yield ops
        finally:
            nursery.cancel_scope.cancel()


def run(source: Path, scenario, data_home: str = "data", **kwargs):
    """Run ``scenario(ops)`` against a JournalFS serving ``source`` (its store below
    ``source``'s sibling ``data_home``); returns the scenario's result."""
    async def main():
        async with serving(source, source.parent / data_home, **kwargs) as ops:
            return await scenario(ops)
    return trio.run(main)


def take_served_stores() -> list[str]:
    """The stores served since the last call (each once), forgetting them."""
    taken = list(dict.fromkeys(SERVED_STORES))
    SERVED_STORES.clear()
    return taken


def store_findings(tree_path: str) -> list[str]:
    """What the store's fsck (``journalfs fsck``'s check of a store) finds in the store at
    ``tree_path``, one line each; a store never written (no tree yet) has none."""
    if not os.path.exists(tree_path):
        return []
    return [f"{tree_path}: byte {f.offset}: {f.severity}: {f.reason}"
            for f in check_store(tree_path)]


async def lookup_path(ops: JournalFS, path: str, ctx: Ctx = ROOT) -> pyfuse3.EntryAttributes:
    """The entry of ``path`` (relative to the mount root), looked up one name at a time."""
    attrs = await ops.getattr(pyfuse3.ROOT_INODE, ctx)
    for name in path.strip("/").split("/"):
        if name:
            attrs = await ops.lookup(attrs.st_ino, os.fsencode(name), ctx)
    return attrs


async def listdir(ops: JournalFS, inode: int, ctx: Ctx = ROOT, room: int | None = None
                  ) -> list[str]:
    """Every name readdir gives for the directory ``inode`` (without . and ..); with ``room``,
    a reply buffer that takes that many entries per call."""
    fh = await ops.opendir(inode, ctx)
    entries = ReplyBuffer(room)
    try:
        while True:  # as the kernel does: again from the last offset until nothing comes
            before = len(entries)
            entries.this_call = 0
            await ops.readdir(fh, entries[-1][2] if entries else 0, entries)
            if len(entries) == before:
                break
    finally:
        await ops.releasedir(fh)
    names = [os.fsdecode(name) for name, _attrs, _next in entries]
    return [n for n in names if n not in (".", "..")]


async def error_of(call) -> int:
    """The errno a handler call (an awaitable that must fail) answers with."""
    try:
        await call
    except pyfuse3.FUSEError as exc:
        return exc.errno
    raise AssertionError("the call succeeded")


async def read_all(ops: JournalFS, inode: int, ctx: Ctx = ROOT) -> bytes:
    info = await ops.open(inode, os.O_RDONLY, ctx)
    try:
        chunks = []
        while chunk := await ops.read(info.fh, sum(map(len, chunks)), 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        await ops.release(info.fh)


class Yielded(AssertionError):
    """A handler meant to run straight through yielded to the scheduler."""


def at_once(coro):
    """The result of ``coro``, which must complete without yielding to the scheduler."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise Yielded("the handler yielded to the scheduler")
