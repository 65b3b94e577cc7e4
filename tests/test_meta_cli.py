"""`journalfs meta ...` through the real console script."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path


from journalfs.metastore.store import MetaStore

JOURNALFS = str(Path(sys.executable).parent / "journalfs")


def jfs(*args, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run([JOURNALFS, *map(str, args)], capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"journalfs {args}: exit {p.returncode}: {p.stderr}")
    return p


def test_dump_json_of_every_real_snapshot_equals_gio(gvfs_snapshots):
    procs = [(snap, subprocess.Popen([JOURNALFS, "meta", "dump", str(snap / "gvfs-metadata" / "home"),
                                      "--json"], stdout=subprocess.PIPE, text=True))
             for snap in gvfs_snapshots]  # all at once: the CLI's start-up dominates
    for snap, proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, snap
        assert json.loads(out) == json.loads((snap / "expected.json").read_text()), snap


def test_write_commands_round_trip(tmp_path):
    tree = tmp_path / "store" / "home"
    jfs("meta", "set", "--create", tree, "/a/b", "comment", "hello wörld")
    jfs("meta", "set", tree, "/a/b", "tags", "x", "y")
    jfs("meta", "set", tree, "/a/c", "tags", "only", "--list")
    jfs("meta", "set", tree, "/a/c", "rating", "5", "--sync", "none")
    assert json.loads(jfs("meta", "dump", tree, "--json").stdout) == {
        "/a/b": {"comment": "hello wörld", "tags": ["x", "y"]},
        "/a/c": {"rating": "5", "tags": ["only"]}}
    assert jfs("meta", "get", tree, "/a/b", "comment").stdout == "hello wörld\n"
    assert json.loads(jfs("meta", "get", tree, "/a/b", "--json").stdout) == {
        "comment": "hello wörld", "tags": ["x", "y"]}
    missing = jfs("meta", "get", tree, "/a/b", "nope", check=False)
    assert missing.returncode == 1 and "nope" in missing.stderr
    jfs("meta", "mv", tree, "/a", "/z")
    jfs("meta", "unset", tree, "/z/b", "comment")
    jfs("meta", "rm", tree, "/z/c")
    human = jfs("meta", "dump", tree).stdout
    assert "/z/b" in human and "tags (list)" in human and "/a/b" not in human
    assert json.loads(jfs("meta", "dump", tree, "--json").stdout) == {"/z/b": {"tags": ["x", "y"]}}
    out = jfs("meta", "compact", tree).stdout
    assert "compacted" in out
    with MetaStore.open(str(tree), readonly=True) as store:
        assert store.status()["entries"] == 0 and store.dump() == {"/z/b": {"tags": ["x", "y"]}}


def test_locked_store_is_one_clear_line_exit_1(tmp_path):
    tree = tmp_path / "home"
    with MetaStore.open(str(tree)):
        p = jfs("meta", "set", tree, "/a", "k", "v", check=False)
        assert p.returncode == 1 and "in use by pid" in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
        assert jfs("meta", "dump", tree, "--json").stdout.strip() == "{}"  # readers still work
        p = jfs("meta", "compact", tree, check=False)  # the holder is no mount: refused too
        assert p.returncode == 1 and "in use by pid" in p.stderr


def test_damaged_tree_exits_3_and_missing_store_exits_1(tmp_path, gvfs_snapshots):
    store = tmp_path / "s"
    shutil.copytree(gvfs_snapshots[-1] / "gvfs-metadata", store)
    tree = store / "home"
    tree.chmod(0o600)
    data = bytearray(tree.read_bytes())
    data[16:20] = (len(data) + 64).to_bytes(4, "big")  # root dirent outside the file
    tree.write_bytes(bytes(data))
    p = jfs("meta", "dump", tree, "--json", check=False)
    assert p.returncode == 3 and "damaged at byte 16" in p.stderr and "Traceback" not in p.stderr
    p = jfs("meta", "dump", tmp_path / "nowhere" / "home", check=False)
    assert p.returncode == 1 and "no metadata store" in p.stderr
    p = jfs("meta", "frobnicate", tree, check=False)
    assert p.returncode == 2


def test_dump_warns_about_a_damaged_journal_but_shows_its_valid_prefix(tmp_path, gvfs_snapshots):
    store = tmp_path / "s"
    shutil.copytree(gvfs_snapshots[0] / "gvfs-metadata", store)
    (journal,) = store.glob("home-*.log")
    journal.chmod(0o600)
    data = bytearray(journal.read_bytes())
    data[20 + 4] ^= 0xFF  # first entry's CRC: nothing of the journal counts
    journal.write_bytes(bytes(data))
    p = jfs("meta", "dump", store / "home", "--json", check=False)
    assert p.returncode == 0 and json.loads(p.stdout) == {} and "CRC" in p.stderr
