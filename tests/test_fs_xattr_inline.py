"""setxattr's inline way (``Ownership.set_now``): a ``user.metadata.*`` write of a file known
under one name, its entries bound and values cached, finishes without yielding to trio, and
keeps every rule the general way keeps: the quota, the ledger's record, the values cache,
the store's journal; anything else (a hard link seen, no ledger entry yet) takes the general
way."""
from __future__ import annotations

import errno
import os

import pyfuse3
import pytest
import trio

from fastops import ROOT, at_once, lookup_path, serving
from journalfs.metastore.ledger import metadata_bytes

pytestmark = pytest.mark.fast

KEY = b"user.metadata.colour"


def run(src, tmp_path, scenario):
    async def main():
        async with serving(src, tmp_path / "store", sync="batch") as ops:
            await scenario(ops)
    trio.run(main)


@pytest.fixture
def src(tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_bytes(b"x")
    return src


def general_way_refused(ops) -> None:
    async def general(*args, **kwargs):
        raise AssertionError("took the general way")
    ops.ownership.set = general


def test_a_bound_cached_file_is_written_inline_with_quota_and_ledger(src, tmp_path):
    async def scenario(ops):
        f = await lookup_path(ops, "d/f")
        await ops.setxattr(f.st_ino, KEY, b"blue", ROOT)  # binds the name, caches its values
        node = ops.table.get(f.st_ino)
        sp = node.meta_path[1]
        ledger = ops.ownership.ledger
        ticket = ops.meta.store.ticket
        general_way_refused(ops)
        assert at_once(ops.setxattr(f.st_ino, KEY, b"a much longer value", ROOT)) is None
        assert ops.meta.store.ticket == ticket + 1  # one journal entry, appended inline
        assert at_once(ops.getxattr(f.st_ino, KEY, ROOT)) == b"a much longer value"
        values = await ops.meta.get_all(sp)
        assert values == {"colour": "a much longer value"}
        ident, uid, size = ledger.owner(sp)
        assert size == metadata_bytes(values) and uid == os.getuid()
        # over the per-file quota: refused inline, nothing written, nothing recorded
        ledger.per_file = size + 10
        with pytest.raises(pyfuse3.FUSEError) as refused:
            at_once(ops.setxattr(f.st_ino, KEY, b"y" * 100, ROOT))
        assert refused.value.errno == errno.ENOSPC
        assert ops.meta.store.ticket == ticket + 1 and ledger.owner(sp) == (ident, uid, size)
        assert (await ops.meta.get_all(sp)) == {"colour": "a much longer value"}
    run(src, tmp_path, scenario)


def test_a_hard_link_or_an_unbound_name_takes_the_general_way(src, tmp_path):
    async def scenario(ops):
        f = await lookup_path(ops, "d/f")
        calls = []
        general = ops.ownership.set

        async def counted(*args, **kwargs):
            calls.append(args[1])
            return await general(*args, **kwargs)
        ops.ownership.set = counted
        await ops.setxattr(f.st_ino, KEY, b"blue", ROOT)  # first write: binds the name
        assert len(calls) == 1
        await ops.setxattr(f.st_ino, KEY, b"green", ROOT)  # bound and cached: inline
        assert len(calls) == 1
        os.link(src / "d" / "f", src / "d" / "g")
        g = await lookup_path(ops, "d/g")  # the kernel now knows a second name
        assert g.st_ino == f.st_ino
        await ops.setxattr(f.st_ino, KEY, b"red", ROOT)
        assert calls[-1] == [b"d/f", b"d/g"] and len(calls) == 2  # every name of the file
        for name in ("d/f", "d/g"):
            assert (await ops.meta.get_all(ops.store_path(os.fsencode(name)))) == \
                {"colour": "red"}
    run(src, tmp_path, scenario)
