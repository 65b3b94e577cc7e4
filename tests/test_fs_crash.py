"""Every `--sync` mode: a metadata write that setxattr acknowledged survives kill -9 of the
server (the write reached the kernel -- the store's journal -- before the reply).

A client process sets xattrs in a loop and prints each acknowledged write; once it has a random
number of acknowledgements the server is killed with SIGKILL, the dead mount is detached, the
store is mounted again and every acknowledged value must read back (the one write in flight at
the kill may or may not have landed)."""
from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mountutil import mounted

pytestmark = pytest.mark.fuse

REPO = Path(__file__).resolve().parents[1]
JOURNALFS = [sys.executable, "-m", "journalfs.cli"]  # honours PYTHONPATH
TRIALS = 2
FILES = 10
KEYS = 6
MOUNT_TIMEOUT = 30.0

# Writes forever (until the mount dies): write j goes to file j % FILES, key K<j // FILES % KEYS>,
# value "<trial>.<j>"; prints "j" after each setxattr returned.
CLIENT = r"""
import os, sys
mnt, trial, files, keys = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
j = 0
while True:
    path = os.path.join(mnt, f"f{j % files}")
    try:
        os.setxattr(path, f"user.metadata.t{trial}k{j // files % keys}", f"{trial}.{j}".encode())
    except OSError as exc:
        print(f"stopped {exc.errno}", flush=True)
        break
    print(j, flush=True)
    j += 1
"""


def write_target(trial: int, j: int) -> tuple[str, str, str]:
    return f"f{j % FILES}", f"t{trial}k{j // FILES % KEYS}", f"{trial}.{j}"


def acceptable_values(trial: int, acked: int) -> dict[tuple[str, str], set[str | None]]:
    """{(file, key): allowed values} after writes 0..acked-1 were acknowledged; write `acked`
    was possibly in flight, so its value is allowed too (None: the key may still be absent)."""
    allowed: dict[tuple[str, str], set[str | None]] = {}
    for j in range(acked):
        file, key, value = write_target(trial, j)
        allowed[(file, key)] = {value}
    file, key, value = write_target(trial, acked)
    allowed.setdefault((file, key), {None}).add(value)
    return allowed


def read_value(path: Path, key: str) -> str | None:
    try:
        return os.getxattr(path, f"user.metadata.{key}").decode()
    except OSError as exc:
        if exc.errno == errno.ENODATA:
            return None
        raise


def start_server(src: Path, mnt: Path, store: Path, log: Path, mode: str) -> subprocess.Popen:
    with open(log, "ab") as err:  # a file, not a pipe: a full pipe would stall the server
        server = subprocess.Popen([*JOURNALFS, "mount", "--foreground", "--sync", mode,
                                   "--store", str(store), str(src), str(mnt)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + MOUNT_TIMEOUT
    while not os.path.ismount(mnt):
        if server.poll() is not None:
            pytest.fail(f"journalfs mount exited {server.returncode}: {log.read_text(errors='replace')}")
        if time.monotonic() > deadline:
            server.kill()
            pytest.fail("journalfs mount did not come up")
        time.sleep(0.05)
    return server


def detach(mnt: Path) -> None:
    subprocess.run(["fusermount3", "-uz", str(mnt)], check=False, capture_output=True)


@pytest.mark.parametrize("mode", ["always", "batch", "none"])
def test_acknowledged_writes_survive_kill_9(tmp_path, mode):
    src, mnt, store = tmp_path / "src", tmp_path / "mnt", tmp_path / "store"
    for d in (src, mnt, store):
        d.mkdir()
    for i in range(FILES):
        (src / f"f{i}").write_text(f"file {i}\n")
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    allowed: dict[tuple[str, str], set[str | None]] = {}
    for trial in range(TRIALS):
        kill_after = rng.randint(5, 400)
        server = start_server(src, mnt, store, tmp_path / f"server{trial}.log", mode)
        client = subprocess.Popen([sys.executable, "-c", CLIENT, str(mnt), str(trial), str(FILES), str(KEYS)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            acked = 0
            for line in client.stdout:  # the client keeps writing while we read
                if line.startswith("stopped"):
                    pytest.fail(f"client failed before the kill: errno {line.split()[1]}")
                acked = int(line) + 1
                if acked >= kill_after:
                    break
            os.kill(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
            for line in client.stdout:  # writes acknowledged between our decision and the kill
                if not line.startswith("stopped"):
                    acked = int(line) + 1
            client.wait(timeout=30)
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
            if server.poll() is None:
                server.kill()
                server.wait()
            detach(mnt)
        assert server.returncode == -signal.SIGKILL
        allowed.update(acceptable_values(trial, acked))

        with mounted(src, mnt, "--store", str(store), "--sync", mode):
            lost = []
            for (file, key), values in sorted(allowed.items()):
                got = read_value(mnt / file, key)
                if got not in values:
                    lost.append(f"{file} {key}: got {got}, acknowledged {values}")
            assert not lost, f"trial {trial} (kill after {kill_after} acks, {acked} acked):\n" + \
                "\n".join(lost[:20])
            # the next trial's reads must not be satisfied by values only in flight now
            for (file, key), values in allowed.items():
                if len(values) > 1:
                    allowed[(file, key)] = {read_value(mnt / file, key)}


# ---- durability against power loss, through a real mount ---------------------------------
def _slow_writeback_or_skip() -> None:
    expire = int(Path("/proc/sys/vm/dirty_expire_centisecs").read_text())
    if expire < 1000:
        pytest.skip(f"dirty_expire_centisecs={expire}: the kernel writes back too soon to tell")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a loop mount")
def test_batch_setxattr_reaches_the_disk_within_the_flush_bound_and_none_at_unmount(tmp_path):
    """The store lives on a loop-mounted ext4 (commit=60): the image file holds exactly what
    reached the device. --sync batch: a setxattr's bytes are there within the flusher's bound
    (1 s; 5 s allowed on a busy machine, far below the kernel's own 30 s writeback).
    --sync none: they are there once the mount is unmounted."""
    from diskutil import small_disk

    _slow_writeback_or_skip()
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    (src / "f").write_text("x")
    with small_disk(tmp_path / "loop", "16M", mount_options="commit=60") as disk:
        image = tmp_path / "loop" / "disk.img"

        def on_disk(marker: bytes) -> bool:
            return marker in image.read_bytes()

        with mounted(src, mnt, "--store", str(disk / "store"), "--sync", "batch"):
            marker = os.urandom(16).hex().encode()
            os.setxattr(mnt / "f", "user.metadata.batch", marker)
            deadline = time.monotonic() + 5
            while not on_disk(marker) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert on_disk(marker), "a batch write was not on the disk within the bound"
        with mounted(src, mnt, "--store", str(disk / "store"), "--sync", "none"):
            marker = os.urandom(16).hex().encode()
            os.setxattr(mnt / "f", "user.metadata.none", marker)
        assert on_disk(marker), "unmount did not make a --sync none write durable"
