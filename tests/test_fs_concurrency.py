"""Several processes doing file and metadata operations on one mount at once, while the
metadata journal (32 KiB) fills and rotates many times: no errors, no lost updates."""
from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mountutil import mounted

pytestmark = pytest.mark.fuse

REPO = Path(__file__).resolve().parents[1]
JOURNALFS = [sys.executable, "-m", "journalfs.cli"]
WORKERS = 4
ROUNDS = 250
FILES_PER_WORKER = 8
META = "user.metadata."
# Big values fill the 1 MiB journal quickly: ~3 MiB of entries force several rotations mid-run.
PAD = "." * 700  # 4 workers' keys on one file stay within its 4 KiB of metadata


def worker(mnt: str, w: int, rounds: int, queue) -> None:
    """Mixed operations in MNT/w<w>/ plus a key of its own on the shared file.
    Sends (errors, expected) where expected is {relative path: {key: value}}."""
    root = Path(mnt)
    own = root / f"w{w}"
    errors: list[str] = []
    expected: dict[str, dict[str, str]] = {}

    def step(what: str, fn, *args):
        try:
            return fn(*args)
        except OSError as exc:
            errors.append(f"worker {w} {what} {args[:1]}: {exc!r}")

    own.mkdir()
    for i in range(rounds):
        name = f"f{i % FILES_PER_WORKER}"
        path = own / name
        body = f"worker {w} round {i}\n".encode()
        tmp = own / f"{name}.tmp"
        step("write", tmp.write_bytes, body)
        step("rename", os.replace, tmp, path)
        if step("read", path.read_bytes) != body:
            errors.append(f"worker {w} read back wrong content of {path}")
        # the replace moved tmp's (empty) metadata over path's: set it again, as an editor would
        value = f"v{w}.{i}{PAD}".encode()
        step("setxattr", os.setxattr, path, f"{META}round", value)
        step("setxattr", os.setxattr, path, f"{META}list", b"a%d\0b%d\0" % (i, w))
        if step("getxattr", os.getxattr, path, f"{META}round") != value:
            errors.append(f"worker {w} lost its own write on {path}")
        step("setxattr", os.setxattr, root / "shared.txt", f"{META}w{w}", value)
        if i % 5 == 0:  # a short-lived file with metadata: unlink must drop it
            gone = own / f"gone{i}"
            step("create", gone.write_bytes, b"x")
            step("setxattr", os.setxattr, gone, f"{META}doomed", b"yes")
            step("unlink", os.unlink, gone)
        if i % 7 == 0:  # set then remove
            step("setxattr", os.setxattr, path, f"{META}tmp", b"t")
            step("removexattr", os.removexattr, path, f"{META}tmp")
        if i % 11 == 0:  # metadata follows a rename
            moved = own / f"m{i}"
            step("create", moved.write_bytes, b"m")
            step("setxattr", os.setxattr, moved, f"{META}origin", f"m{i}".encode())
            step("rename", os.rename, moved, own / f"r{i}")
            expected[f"w{w}/r{i}"] = {"origin": f"m{i}"}
        expected[f"w{w}/{name}"] = {"round": f"v{w}.{i}{PAD}", "list": [f"a{i}", f"b{w}"]}
    expected.setdefault("shared.txt", {})[f"w{w}"] = f"v{w}.{rounds - 1}{PAD}"
    queue.put((errors, expected))


def read_metadata(path: Path) -> dict:
    """All user.metadata.* of path as {key: str | [str]} (NUL-terminated elements are a list)."""
    out = {}
    for name in os.listxattr(path):
        if name.startswith(META):
            raw = os.getxattr(path, name)
            out[name[len(META):]] = raw.decode() if b"\0" not in raw else raw.decode().split("\0")[:-1]
    return out


def journal_rotations(mnt: Path) -> int | None:
    status = json.loads((mnt / ".journalfs" / "status.json").read_text())

    def find(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if "rotation" in key and isinstance(value, int) and not isinstance(value, bool):
                    return value
                if (found := find(value)) is not None:
                    return found
        return None
    return find(status)


def test_parallel_file_and_metadata_ops_lose_nothing(tmp_path):
    src, mnt, store = tmp_path / "src", tmp_path / "mnt", tmp_path / "store"
    for d in (src, mnt, store):
        d.mkdir()
    (src / "shared.txt").write_text("shared\n")
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    with mounted(src, mnt, "--store", str(store), "--sync", "batch"):
        rotations_before = journal_rotations(mnt)
        procs = [ctx.Process(target=worker, args=(str(mnt), w, ROUNDS, queue)) for w in range(WORKERS)]
        for p in procs:
            p.start()
        results = [queue.get(timeout=300) for _ in procs]
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
        errors = [e for errs, _ in results for e in errs]
        assert not errors, "\n".join(errors[:20])
        expected: dict[str, dict] = {}
        for _, exp in results:
            for path, keys in exp.items():
                expected.setdefault(path, {}).update(keys)

        seen = {rel: read_metadata(mnt / rel) for rel in expected}
        assert seen == expected
        for w in range(WORKERS):  # unlinked and removed keys are gone
            assert not any(n.startswith("gone") for n in os.listdir(mnt / f"w{w}"))
            assert "tmp" not in read_metadata(mnt / f"w{w}" / "f0")
        rotations = journal_rotations(mnt)
        assert rotations is not None, "status.json reports no rotation count"
        assert rotations - rotations_before >= 2, f"only {rotations - rotations_before} rotations: test too small"

    # after a clean unmount the store alone holds exactly the same (SOURCE is outside $HOME)
    dump = subprocess.run([*JOURNALFS, "meta", "dump", str(store / "root"), "--json"],
                          capture_output=True, text=True, check=True)
    stored = {os.path.relpath(p, src): keys for p, keys in json.loads(dump.stdout).items()
              if p.startswith(f"{src}/")}
    assert stored == expected
