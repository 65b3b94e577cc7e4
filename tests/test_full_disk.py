"""A full disk under the metadata store (issue 10 point 6), on a real small ext4 loop mount.

The caller gets ENOSPC (never E2BIG), nothing is acknowledged that is not in the journal, a
rotation that cannot complete leaves the old tree and journal in use untouched (and no temp
files) and is retried, no background failure ends the service (it is listed in status), and
once space is freed every acknowledged write is there after unmount + remount and by fsck."""
from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest
import trio

from diskutil import fill, small_disk
from journalfs.formats.gvfs_journal import HEADER_SIZE
from journalfs.metastore.fsck import check_store
from journalfs.metastore.service import MetaService
from journalfs.metastore.store import MetaStore
from mountutil import mounted

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for loop mounts")
FULL = (errno.ENOSPC, errno.EDQUOT)


def remount(disk: Path) -> None:
    """Unmount and mount the loop filesystem again: what is read next comes from the disk."""
    image = disk.parent / "disk.img"
    subprocess.run(["umount", str(disk)], check=True)
    for line in subprocess.run(["losetup", "-j", str(image)], capture_output=True,
                               text=True).stdout.splitlines():
        subprocess.run(["losetup", "-d", line.split(":", 1)[0]], capture_output=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(disk)], check=True)


def store_files(tree: Path) -> set[str]:
    return {p.name for p in tree.parent.iterdir()}


def journal_count(path: str) -> int:
    with open(path, "rb") as f:
        return int.from_bytes(f.read(HEADER_SIZE)[16:20], "big")


def value(i: int) -> str:
    return f"value {i} " + "x" * 150


@pytest.mark.parametrize("mode,leave", [("batch", 0), ("always", 0), ("batch", 48 << 10),
                                        ("none", 20 << 10)])
def test_store_on_a_full_disk_loses_nothing_acknowledged(tmp_path, mode, leave):
    with small_disk(tmp_path) as disk:
        tree = disk / "store" / "home"
        acked: dict[tuple[str, str], str] = {}
        store = MetaStore.open(str(tree), sync=mode, journal_size=64 << 10)
        try:
            for i in range(40):
                store.set(f"/f{i % 37}", f"k{i % 3}", value(i))
                acked[(f"/f{i % 37}", f"k{i % 3}")] = value(i)
            tree_before = tree.read_bytes()
            journal_before = store.journal_path
            files_before = store_files(tree)
            filler = fill(disk, leave)
            failures = []
            i = 40
            while len(failures) < 3 and i < 20000:
                path, key = f"/f{i % 37}", f"k{i % 3}"
                try:
                    store.set(path, key, value(i))
                    acked[(path, key)] = value(i)
                except OSError as exc:
                    failures.append(exc)
                i += 1
            assert failures, "the disk never filled up"
            assert all(exc.errno in FULL for exc in failures), failures  # never E2BIG
            # the rotation that could not complete left the old tree and journal in use
            assert tree.read_bytes() == tree_before
            assert store.journal_path == journal_before
            assert store_files(tree) == files_before  # no temp tree or half journal left
            status = store.status()
            # refused before its filesystem lacked the room of one rotation (issue 24), or
            # (with some room left) by the rotation that could not complete
            assert status["refused_for_space"] >= 1 or status["failed_rotations"] >= 1
            assert journal_count(journal_before) == status["entries"]  # all of them counted
            # space comes back: the rotation is retried and writes go on
            filler.unlink()
            for j in range(i, i + 400):
                store.set(f"/f{j % 37}", f"k{j % 3}", value(j))
                acked[(f"/f{j % 37}", f"k{j % 3}")] = value(j)
            assert store.status()["rotations"] >= 1
        finally:
            store.close()
        remount(disk)
        with MetaStore.open(str(tree), readonly=True) as reader:
            state = reader.dump()
        lost = [(p, k) for (p, k), v in acked.items() if state.get(p, {}).get(k) != v]
        assert not lost, f"{len(lost)} acknowledged writes lost, e.g. {lost[:5]}"
        assert not [f for f in check_store(str(tree)) if f.severity == "error"]


def test_service_survives_background_failures_and_reports_them(tmp_path):
    """batch: the background rotation fails on the full disk; the service keeps answering,
    lists the failure in status, retries, and gets there once space is freed. (Sets are
    refused while the disk lacks a rotation's room; unsets are not: they fill the journal.)"""
    with small_disk(tmp_path) as disk:
        tree = disk / "store" / "home"
        store = MetaStore.open(str(tree), sync="batch", journal_size=64 << 10)
        acked: dict[tuple[str, str], str] = {}
        outcome = {}

        async def main():
            service = MetaService(store, fill_threshold=0.3, quiet_seconds=3600)
            async with trio.open_nursery() as nursery:
                await nursery.start(service.run)
                for i in range(50):
                    await service.set(f"/d/f{i}", "k", value(i))
                    acked[(f"/d/f{i}", "k")] = value(i)
                filler = fill(disk)
                refused = 0
                for i in range(2000):
                    try:
                        await service.set(f"/d/f{i % 50}", "k", value(i))
                        acked[(f"/d/f{i % 50}", "k")] = value(i)
                    except OSError as exc:
                        assert exc.errno in FULL, exc
                        refused += 1
                        if refused >= 3:
                            break
                    await trio.sleep(0)
                for i in range(2000):  # unsets of keys never set: journal entries, no data
                    try:
                        await service.unset(f"/d/f{i % 50}", "never-set")
                    except OSError as exc:
                        # the journal filled up as the background rotation failed: the
                        # unset's own rotation is refused (ENOSPC), nothing acknowledged lost
                        assert exc.errno in FULL, exc
                        break
                    await trio.sleep(0)
                    if service.status()["background_errors"]:
                        break
                with trio.fail_after(60):  # a bound against hanging, not a timing check
                    while not service.status()["background_errors"]:
                        await trio.sleep(0.05)
                outcome["errors"] = service.status()["background_errors"]
                outcome["refused"] = refused
                filler.unlink()
                await service.set("/after", "k", "space again")
                acked[("/after", "k")] = "space again"
                with trio.fail_after(60):
                    while store.rotations == 0:
                        await trio.sleep(0.05)
                await service.sync()
                nursery.cancel_scope.cancel()

        trio.run(main)
        assert outcome["refused"] >= 3
        assert any(e["task"] == "rotation" and "No space left" in e["error"] for e in outcome["errors"])
        remount(disk)
        with MetaStore.open(str(tree), readonly=True) as reader:
            state = reader.dump()
        assert all(state.get(p, {}).get(k) == v for (p, k), v in acked.items())


@pytest.mark.fuse
def test_setfattr_through_the_mount_gets_enospc_and_nothing_is_lost(tmp_path):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    for i in range(20):
        (src / f"f{i}").write_text("x")
    acked: dict[tuple[str, str], bytes] = {}
    with small_disk(tmp_path) as disk:
        store = disk / "store"
        with mounted(src, mnt, "--store", str(store), "--sync", "batch") as m:
            for i in range(20):  # before the disk fills
                name, key, val = f"f{i}", "user.metadata.first", b"v" * 1500
                os.setxattr(mnt / name, key, val)
                acked[(name, key)] = val
            filler = fill(disk)
            refused = None
            for i in range(5000):
                name, key, val = f"f{i % 20}", "user.metadata.k", (f"{i}:" + "v" * 1500).encode()
                try:
                    os.setxattr(mnt / name, key, val)
                    acked[(name, key)] = val
                except OSError as exc:
                    refused = exc
                    break
            assert refused is not None and refused.errno in FULL, refused
            cmd = subprocess.run(["setfattr", "-n", "user.metadata.more", "-v", "x" * 3000,
                                  str(mnt / "f0")], capture_output=True, text=True)
            assert cmd.returncode != 0 and "No space left on device" in cmd.stderr, cmd.stderr
            assert "Argument list too long" not in cmd.stderr
            # the daemon lives on and reads still work
            name, key = next(iter(acked))
            assert os.getxattr(mnt / name, key) == acked[(name, key)]
            status = json.loads((mnt / ".journalfs" / "status.json").read_text())
            assert m.process.poll() is None
            filler.unlink()
            os.setxattr(mnt / "f1", "user.metadata.after", b"freed")
            acked[("f1", "user.metadata.after")] = b"freed"
        assert status["service"]["failed_rotations"] >= 1 or \
            status["service"]["background_errors"] or status["service"]["refused_for_space"]
        remount(disk)
        tree = next(p for p in store.iterdir() if p.name in ("home", "root"))  # gvfs's mapping
        assert not [f for f in check_store(str(tree)) if f.severity == "error"]
        with mounted(src, mnt, "--store", str(store)):
            lost = [(n, k) for (n, k), v in acked.items() if os.getxattr(mnt / n, k) != v]
        assert not lost, f"{len(lost)} acknowledged setxattrs lost, e.g. {lost[:5]}"


def test_failed_rotation_is_not_retried_in_a_tight_loop(tmp_path):
    """A journal full of removals on a full disk: the first rotation fails; writes that
    come on meanwhile do not each start another one (no new temp tree, no new failure)
    until the backoff passes or the room is back."""
    with small_disk(tmp_path) as disk:
        tree = disk / "store" / "home"
        store = MetaStore.open(str(tree), sync="batch", journal_size=64 << 10)
        try:
            for i in range(20):
                store.set(f"/f{i}", "k", value(i))
            filler = fill(disk)
            refusals = []
            for i in range(5000):
                try:
                    store.unset(f"/f{i % 20}", "never-set")
                except OSError as exc:
                    refusals.append(exc.errno)
                    if len(refusals) >= 200:
                        break
            assert len(refusals) == 200 and set(refusals) <= set(FULL), refusals[:5]
            assert store.status()["failed_rotations"] == 1  # the other 199 waited
            assert not [p for p in tree.parent.iterdir() if p.name.startswith("home.")
                        and p.name[5:6].isdigit()]  # no temp tree left
            filler.unlink()  # the room is back: the next write rotates at once
            store.set("/after", "k", "v")
            assert store.status()["rotations"] >= 1
        finally:
            store.close()
