"""A real small ext4 filesystem on a loop device, for full-disk tests and benches.

``with small_disk(workdir, "8M") as mnt: ...`` makes an image, mkfs.ext4 (no reserved blocks:
root could otherwise write into them), mounts it with ``mount -o loop`` and on exit unmounts
by mountpoint and detaches the loop device bound to that image (found with ``losetup -j``)."""
from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from pathlib import Path


def _loops_of(image: Path) -> list[str]:
    out = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True).stdout
    return [line.split(":", 1)[0] for line in out.splitlines() if line.strip()]


@contextlib.contextmanager
def small_disk(workdir: Path, size: str = "8M", mount_options: str = ""):
    workdir = Path(workdir)
    image, mnt = workdir / "disk.img", workdir / "disk"
    mnt.mkdir(parents=True, exist_ok=True)
    subprocess.run(["truncate", "-s", size, str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    options = "loop" + ("," + mount_options if mount_options else "")
    subprocess.run(["mount", "-o", options, str(image), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        for _ in range(20):
            if not os.path.ismount(mnt):
                break
            if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        for loop in _loops_of(image):
            subprocess.run(["losetup", "-d", loop], capture_output=True)


def fill(directory: Path, leave: int = 0, name: str = "filler") -> Path:
    """Write a file until the filesystem has only ``leave`` bytes (or nothing) free."""
    path = Path(directory) / name
    st = os.statvfs(directory)
    target = max(0, st.f_bavail * st.f_frsize - leave)
    chunk = b"\xa5" * (1 << 16)
    written = 0
    with open(path, "ab", buffering=0) as f:
        try:
            while written < target or not leave:
                n = f.write(chunk[:max(4096, min(len(chunk), target - written))] if leave else chunk)
                written += n
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
        os.fsync(f.fileno())
    return path

