"""mount_scripts/: the installer, the mount(8) helper (direct and through Debian's mount.fuse3),
an /etc/fstab line, and the systemd unit.

mount(8) only looks for helpers in /sbin (libmount's fixed search path), so the installed files are
overlaid onto /usr/sbin (or /usr/local/bin) inside a private mount namespace: the real system is
never changed, and everything the namespace mounts dies with it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "mount_scripts"
JOURNALFS = REPO / ".venv" / "bin" / "journalfs"

pytestmark = pytest.mark.fuse


def install(destdir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "DESTDIR": str(destdir), "JOURNALFS_BIN": str(JOURNALFS)}
    return subprocess.run(["sh", str(SCRIPTS / "install.sh")], env=env, capture_output=True,
                          text=True, check=True)


@pytest.fixture
def staged(tmp_path) -> Path:
    destdir = tmp_path / "dest"
    install(destdir)
    return destdir


@pytest.fixture
def tree(tmp_path):
    """SOURCE with one file, an empty mountpoint and store; yields their paths."""
    src, mnt, store = tmp_path / "src", tmp_path / "mnt", tmp_path / "store"
    for d in (src, mnt, store):
        d.mkdir()
    (src / "hello.txt").write_text("hello from source\n")
    yield src, mnt, store
    if os.path.ismount(mnt):  # only if a namespace leaked it into ours (it should not)
        subprocess.run(["fusermount3", "-uz", str(mnt)], check=False)


def journalfs_daemons(mnt: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if str(mnt) in cmdline and any("journalfs" in part for part in cmdline):
            found.append(proc)
    return found


def wait_daemons_gone(mnt: Path, timeout: float = 30.0) -> None:
    """After umount the daemonized server must exit by itself (it holds the store open)."""
    deadline = time.monotonic() + timeout
    while (left := journalfs_daemons(mnt)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for proc in left:  # leave nothing behind, then fail
        proc.kill()
    assert not left, f"journalfs server still running after umount: {[p.pid for p in left]}"


def run_in_namespace(overlays: dict[str, Path], script: str, env: dict | None = None) -> str:
    """Run `script` (sh) in a private mount namespace where each system directory in `overlays`
    has the given staged directory laid over it."""
    setup = "".join(
        f"mount -t overlay overlay -o lowerdir={staged}:{target} {target}\n"
        for target, staged in overlays.items())
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-euc", setup + script],
        capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    return proc.stdout


def check_mounted_script(mount_command: str, mnt: Path) -> str:
    """Mount, show the file, set and read back an xattr, show the fs type, unmount."""
    return f"""
{mount_command}
cat {mnt}/hello.txt
setfattr -n user.metadata.color -v blue {mnt}/hello.txt
getfattr --only-values -n user.metadata.color {mnt}/hello.txt; echo
awk '$2 == "{mnt}" {{print "fstype=" $3}}' /proc/self/mounts
umount {mnt}
"""


def assert_mounted_output(out: str, src: Path, mnt: Path, store: Path) -> None:
    lines = out.splitlines()
    assert "hello from source" in lines
    assert "blue" in lines
    assert "fstype=fuse.journalfs" in lines, out
    wait_daemons_gone(mnt)
    # -o store=DIR reached journalfs: SOURCE is outside $HOME, so the store is DIR/root
    dump = subprocess.run([str(JOURNALFS), "meta", "dump", str(store / "root"), "--json"],
                          capture_output=True, text=True, check=True)
    assert json.loads(dump.stdout)[str(src / "hello.txt")] == {"color": "blue"}


def test_installer_fills_in_the_journalfs_path(staged):
    helper = staged / "sbin" / "mount.fuse.journalfs"
    shim = staged / "usr" / "local" / "bin" / "journalfs"
    unit = staged / "etc" / "systemd" / "system" / "journalfs@.service"
    for path in (helper, shim, unit):
        text = path.read_text()
        assert "@JOURNALFS_BIN@" not in text, path
        assert str(JOURNALFS) in text, path
    assert os.access(helper, os.X_OK) and os.access(shim, os.X_OK)
    assert unit.stat().st_mode & 0o777 == 0o644


def test_installer_refuses_without_a_journalfs(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "DESTDIR": str(tmp_path / "d"),
           "JOURNALFS_BIN": str(tmp_path / "missing")}
    lonely = tmp_path / "scripts"
    shutil.copytree(SCRIPTS, lonely)  # away from the repo's .venv
    proc = subprocess.run(["sh", str(lonely / "install.sh")], env=env, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "no journalfs executable" in proc.stderr
    assert not (tmp_path / "d").exists()


def test_shim_passes_subcommands_to_the_cli(staged):
    shim = staged / "usr" / "local" / "bin" / "journalfs"
    proc = subprocess.run([str(shim), "umount", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "usage: journalfs umount" in proc.stdout


def test_helper_rejects_bad_usage(staged):
    helper = staged / "sbin" / "mount.fuse.journalfs"
    proc = subprocess.run([str(helper), "only-a-source"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "usage:" in proc.stderr


def test_mount_t_fuse_journalfs_uses_the_helper(staged, tree):
    src, mnt, store = tree
    out = run_in_namespace(
        {"/usr/sbin": staged / "sbin"},
        check_mounted_script(f"mount -t fuse.journalfs {src} {mnt} -o store={store},noauto,rw", mnt))
    assert_mounted_output(out, src, mnt, store)


def test_mount_fuse3_fallback_runs_the_journalfs_shim(staged, tree):
    # no mount.fuse.journalfs: mount(8) runs /sbin/mount.fuse3, which runs
    # "journalfs SOURCE MNT -o OPTS" with a fixed PATH that includes /usr/local/bin
    src, mnt, store = tree
    out = run_in_namespace(
        {"/usr/local/bin": staged / "usr" / "local" / "bin"},
        check_mounted_script(f"mount -t fuse.journalfs {src} {mnt} -o store={store},nofail", mnt))
    assert_mounted_output(out, src, mnt, store)


def test_fstab_line(staged, tree, tmp_path):
    src, mnt, store = tree
    fstab = tmp_path / "fstab"
    fstab.write_text(f"# journalfs\n{src} {mnt} fuse.journalfs "
                     f"store={store},noauto,nofail,_netdev,x-systemd.automount 0 0\n")
    out = run_in_namespace({"/usr/sbin": staged / "sbin"},
                           check_mounted_script(f"mount --fstab {fstab} {mnt}", mnt))
    assert_mounted_output(out, src, mnt, store)


def test_systemd_unit_verifies(staged, tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed")
    # verify an instance of the template (mount point /srv/meta)
    instance = tmp_path / "journalfs@srv-meta.service"
    shutil.copy(staged / "etc" / "systemd" / "system" / "journalfs@.service", instance)
    proc = subprocess.run([analyze, "verify", str(instance)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "ExecStart" not in proc.stderr, proc.stderr
