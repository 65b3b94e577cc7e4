"""The pieces of the expiry of metadata of files that are gone (fs/ownership.py): the inode
probe on SOURCE's filesystem and the ledger's bounded, wrapping sample."""
from __future__ import annotations

import os

import pytest

from journalfs.fs.ownership import InodeProbe
from journalfs.metastore.ledger import Ledger, file_identity

pytestmark = pytest.mark.fast


def identity(path) -> tuple:
    fd = os.open(path, os.O_PATH)
    try:
        return file_identity(fd)[0]
    finally:
        os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root looks files up by inode number")
def test_the_probe_tells_a_live_file_from_a_deleted_or_replaced_one(tmp_path):
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    probe = InodeProbe(root)
    try:
        if not probe.usable:
            pytest.skip(probe.reason)
        live, doomed = tmp_path / "live", tmp_path / "doomed"
        live.write_text("x")
        doomed.write_text("x")
        alive_id, doomed_id = identity(live), identity(doomed)
        assert probe.gone(alive_id) is False
        os.rename(live, tmp_path / "elsewhere")
        assert probe.gone(alive_id) is False  # renamed: still there
        os.unlink(doomed)
        assert probe.gone(doomed_id) is True
        (tmp_path / "new").write_text("y")  # may take the freed number: born later
        assert probe.gone(doomed_id) is True
        assert probe.gone((alive_id[0], alive_id[1] + 1)) is True  # same number, other birth
        assert probe.gone((1 << 40, 0)) is None  # not a 32-bit inode number: cannot tell
    finally:
        probe.close()
        os.close(root)


class _Dir:
    """The slice of StoreDir a Ledger uses, over a plain directory."""

    def __init__(self, path):
        self.path = path

    def open_file(self, name, flags):
        fd = os.open(os.path.join(self.path, name), flags | os.O_CLOEXEC, 0o600)
        return fd, os.fstat(fd)

    def where(self, name):
        return os.path.join(self.path, name)


def test_the_ledger_sample_is_bounded_and_wraps_around(tmp_path):
    ledger = Ledger(_Dir(str(tmp_path)), "tree")
    for n in range(10):
        ledger.record(f"/p{n}", (n + 100, 7), 1000, 300)
    paths = sorted(f"/p{n}" for n in range(10))
    assert [p for p, _, _ in ledger.sample(3, 0.0)] == paths[:3]
    assert [p for p, _, _ in ledger.sample(4, 0.85)] == paths[8:] + paths[:2]
    assert len(ledger.sample(50, 0.5)) == 10
    assert ledger.sample(1, 0.0)[0][1:] == ((100, 7), 1000)
    assert ledger.status()["expiry"]["state"] == "not started"
    ledger.close()
