"""The mount's operations class driven in-process, with no kernel (the `fast` test tier).

:func:`serving` builds what ``fs/main.py``'s ``serve`` builds (an embedded metadata service
started in a trio nursery, a :class:`JournalFS` on SOURCE) but calls the handlers directly.
``pyfuse3.readdir_reply`` needs a token from a real kernel request, so :func:`listdir` hands
readdir a list as its token and collects the entries through a stand-in reply function.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import pyfuse3
import trio

from journalfs.fs.passthrough import JournalFS
from journalfs.metastore.gvfs_service import open_metadata_backend
from journalfs.metastore.location import resolve_store


@dataclass
class Ctx:
    """The request context pyfuse3 passes to handlers (only what they read)."""
    uid: int = 0
    gid: int = 0
    pid: int = 0
    umask: int = 0o022


ROOT = Ctx()


def _collect_reply(token, name, attrs, next_id):
    token.append((name, attrs, next_id))
    return True


@contextlib.contextmanager
def list_tokens():
    """Lets readdir answer into a list instead of a kernel reply buffer."""
    real = pyfuse3.readdir_reply
    pyfuse3.readdir_reply = _collect_reply
    try:
        yield
    finally:
        pyfuse3.readdir_reply = real


@contextlib.asynccontextmanager
async def serving(source: Path, store: Path, *, sync: str = "always", timeout: float = 1.0):
    """A JournalFS on ``source`` with its embedded store in ``store``, served until exit."""
    location = resolve_store(str(source), str(store))
    meta = open_metadata_backend(location.tree_path, shared_dir=False, gvfs=False, sync=sync,
                                 readonly=False)
    ops = JournalFS(str(source), meta, location, timeout=timeout, options={})
    async with trio.open_nursery() as nursery:
        await nursery.start(meta.run)
        try:
            with list_tokens():
                yield ops
        finally:
            nursery.cancel_scope.cancel()


async def lookup_path(ops: JournalFS, path: str, ctx: Ctx = ROOT) -> pyfuse3.EntryAttributes:
    """The entry of ``path`` (relative to the mount root), looked up one name at a time."""
    attrs = await ops.getattr(pyfuse3.ROOT_INODE, ctx)
    for name in path.strip("/").split("/"):
        if name:
            attrs = await ops.lookup(attrs.st_ino, os.fsencode(name), ctx)
    return attrs


async def listdir(ops: JournalFS, inode: int, ctx: Ctx = ROOT) -> list[str]:
    """Every name readdir gives for the directory ``inode`` (without . and ..)."""
    fh = await ops.opendir(inode, ctx)
    entries: list = []
    try:
        while True:  # as the kernel does: again from the last offset until nothing comes
            before = len(entries)
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
