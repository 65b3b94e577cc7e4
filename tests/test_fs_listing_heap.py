"""A huge directory listed again and again costs the heap nothing new (issue 24, attack 5):
the inodes the kernel forgot between two listings come back as the very same objects, an
open directory shares its listing instead of copying it, and the daemon's garbage collector
never runs a full collection on its own, only at the rate its policy allows
(journalfs/fs/collector.py, docs/security.md "Slower")."""
from __future__ import annotations

import os
import subprocess
import sys

import trio

from fastops import listdir, lookup_path, serving
from journalfs.fs import inodes
from journalfs.fs.caches import Listing

BIG = 100_000


def test_forgotten_inodes_of_a_kept_listing_come_back_as_the_same_objects(tmp_path, monkeypatch):
    src = tmp_path / "src"
    (src / "big").mkdir(parents=True)
    for i in range(BIG):
        os.close(os.open(src / "big" / f"entry-{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644))
    made = []
    real_init = inodes.Inode.__init__

    def counted(self, ino, key, *args, **kwargs):
        if key is not None:  # not the stand-ins readdir's . and .. are built with
            made.append(ino)
        real_init(self, ino, key, *args, **kwargs)

    monkeypatch.setattr(inodes.Inode, "__init__", counted)

    async def main():
        async with serving(src, tmp_path / "store", timeout=120.0) as ops:
            big = (await lookup_path(ops, "big")).st_ino
            first = await listdir(ops, big)
            assert len(first) == BIG and len(made) >= BIG
            nodes = {n.ino: n for n in ops.table.by_ino.values() if n.name.startswith(b"entry-")}
            assert len(nodes) == BIG
            # the kernel forgets every entry (memory pressure, drop_caches): all dropped
            await ops.forget([(ino, 1) for ino in nodes])
            assert not any(ino in ops.table.by_ino for ino in nodes)
            assert all(node.dropped for node in nodes.values())
            made.clear()
            assert await listdir(ops, big) == first
            assert made == []  # not one new inode object: the same ones stand again
            for ino, node in nodes.items():
                assert ops.table.by_ino[ino] is node and not node.dropped
                assert ops.table.by_path[b"big/" + node.name] is node
                assert node.lookups == 1

    trio.run(main)


def test_an_open_directory_shares_its_listing_until_it_changes():
    stats = {b"a": os.stat_result((0,) * 10), b"c": os.stat_result((0,) * 10)}
    listing = Listing(stats)
    copy = listing.frozen()
    assert copy.stats is listing.stats and copy.names is listing.names  # O(1): nothing copied
    listing.mark_unknown(b"b")  # a new name: the listing copies, the open directory keeps its
    assert listing.names == [b"a", b"b", b"c"] and listing.stats[b"b"] is None
    assert copy.names == [b"a", b"c"] and b"b" not in copy.stats
    again = listing.frozen()
    listing.mark_unknown(b"a")
    assert again.stats[b"a"] is not None and listing.stats[b"a"] is None
    assert listing.unknown == 2 and again.unknown == 1


_POLICY = r"""
import gc, sys, trio
from journalfs.fs.collector import Collector
full = []
gc.callbacks.append(lambda phase, info: phase == "stop" and info["generation"] == 2
                    and full.append(1))
collector = Collector(full_every=0.05, whole_every=float(sys.argv[2]))
if sys.argv[1] == "policy":
    collector.start()
else:
    gc.collect()
    gc.freeze()
full.clear()
kept = [[i] for i in range(400_000)]  # long-lived objects: hundreds of young collections
automatic = len(full)
due = collector.due()

async def main():
    async with trio.open_nursery() as nursery:
        nursery.start_soon(collector.run)
        while collector.full_collections == 0:
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()

if sys.argv[1] == "policy":
    frozen = gc.get_freeze_count()
    trio.run(main)
    assert gc.get_freeze_count() >= frozen + len(kept)  # what survived is frozen
print(automatic, due, len(full), collector.due(), collector.whole_walks)
"""


def test_full_collections_run_only_from_the_collectors_task():
    def run(mode: str, whole_every: float = 600.0) -> list[str]:
        out = subprocess.run([sys.executable, "-c", _POLICY, mode, str(whole_every)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    # CPython's own thresholds collect the oldest generation while such a heap grows...
    automatic = run("cpython")[0]
    assert int(automatic) >= 1
    # ...the policy never does: only its task does, once, and nothing is due after it; it
    # walks the whole heap (frozen objects included) only once whole_every has passed
    assert run("policy") == ["0", "True", "1", "False", "0"]
    assert run("policy", whole_every=0.0) == ["0", "True", "1", "False", "1"]
