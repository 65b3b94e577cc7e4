"""mount_scripts/: the installer, the mount(8) helper (direct and through Debian's mount.fuse3),
an /etc/fstab line, and the systemd unit.

mount(8) only looks for helpers in /sbin (libmount's fixed search path), so the installed files are
overlaid onto /usr/sbin (or /usr/local/bin) inside a private mount namespace: the real system is
never changed, and everything the namespace mounts dies with it."""
from __future__ import annotations

import json
import os
import stat
import re
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


def test_unit_documentation_is_the_installed_man_page(staged):
    """`systemctl help journalfs@X` opens journalfs(1), the page the installer puts beside it."""
    unit = (staged / "etc" / "systemd" / "system" / "journalfs@.service").read_text()
    docs = re.findall(r"^Documentation=(.*)$", unit, re.M)
    assert docs == ["man:journalfs(1)"]
    page = staged / "usr" / "local" / "share" / "man" / "man1" / "journalfs.1"
    assert page.is_file() and page.read_text().startswith(".TH JOURNALFS 1")


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
    typo = subprocess.run([str(shim), "recrds", "x"], capture_output=True, text=True)
    assert typo.returncode == 2 and "invalid choice: 'recrds'" in typo.stderr


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
    # a machine with journalfs installed (bootstrap.sh does it) has /sbin/mount.fuse.journalfs:
    # an overlay whiteout (a 0/0 character device) hides it here
    hide = staged / "hide-sbin"
    hide.mkdir()
    os.mknod(hide / "mount.fuse.journalfs", stat.S_IFCHR | 0o000, os.makedev(0, 0))
    out = run_in_namespace(
        {"/usr/local/bin": staged / "usr" / "local" / "bin", "/usr/sbin": hide},
        "test ! -e /sbin/mount.fuse.journalfs\n"
        + check_mounted_script(f"mount -t fuse.journalfs {src} {mnt} -o store={store},nofail", mnt))
    assert_mounted_output(out, src, mnt, store)


def test_fstab_line(staged, tree, tmp_path):
    src, mnt, store = tree
    fstab = tmp_path / "fstab"
    fstab.write_text(f"# journalfs\n{src} {mnt} fuse.journalfs "
                     f"store={store},noauto,nofail,_netdev,x-systemd.automount 0 0\n")
    out = run_in_namespace({"/usr/sbin": staged / "sbin"},
                           check_mounted_script(f"mount --fstab {fstab} {mnt}", mnt))
    assert_mounted_output(out, src, mnt, store)


def remount_script(mount_command: str, remount_ro: str, remount_rw: str, mnt: Path) -> str:
    """Mount, remount ro (writes and metadata refused), remount rw (both work), unmount."""
    show = f"awk '$5 == \"{mnt}\" {{print \"flags=\" $6}}' /proc/self/mountinfo"
    return f"""
{mount_command}
{remount_ro}
{show}
getfattr --only-values -n user.journalfs.ro {mnt}/.journalfs; echo
touch {mnt}/new 2>&1 || echo touch refused
setfattr -n user.metadata.color -v red {mnt}/hello.txt 2>&1 || echo setfattr refused
{remount_rw}
{show}
touch {mnt}/new && echo touched
setfattr -n user.metadata.color -v blue {mnt}/hello.txt && echo set
umount {mnt}
"""


def assert_remounted_output(out: str, src: Path, mnt: Path, store: Path,
                            nosuid: bool = False) -> None:
    lines = out.splitlines()
    flags = [line for line in lines if line.startswith("flags=")]
    assert flags[0].startswith("flags=ro,") and flags[1].startswith("flags=rw,"), out
    # as for ext4, mount(8) as root means dev,suid unless nodev/nosuid are asked for
    assert ("nosuid" in flags[0]) == nosuid and "nodev" not in flags[0], out
    assert "1" in lines
    assert "touch refused" in lines and "setfattr refused" in lines
    assert out.count("Read-only file system") == 2, out
    assert "touched" in lines and "set" in lines
    assert (src / "new").exists()
    wait_daemons_gone(mnt)
    dump = subprocess.run([str(JOURNALFS), "meta", "dump", str(store / "root"), "--json"],
                          capture_output=True, text=True, check=True)
    assert json.loads(dump.stdout)[str(src / "hello.txt")] == {"color": "blue"}


def test_mount_remount_ro_and_rw(staged, tree):
    # mount(8) runs the helper with "-o remount,ro,nosuid,...,user_id=0,...": xfstests'
    # _scratch_remount, generic/306 and 452
    src, mnt, store = tree
    out = run_in_namespace({"/usr/sbin": staged / "sbin"}, remount_script(
        f"mount -t fuse.journalfs {src} {mnt} -o store={store},allow_other",
        f"mount -o remount,ro {mnt}", f"mount -o remount,rw {mnt}", mnt))
    assert_remounted_output(out, src, mnt, store)


def test_fstab_remount(staged, tree, tmp_path):
    # the fstab line's options come along (store=, allow_other): the same values are accepted
    src, mnt, store = tree
    fstab = tmp_path / "fstab"
    fstab.write_text(f"{src} {mnt} fuse.journalfs store={store},allow_other,noauto,nosuid 0 0\n")
    out = run_in_namespace({"/usr/sbin": staged / "sbin"}, remount_script(
        f"mount --fstab {fstab} {mnt}", f"mount --fstab {fstab} -o remount,ro {mnt}",
        f"mount --fstab {fstab} -o remount,rw {mnt}", mnt))
    assert_remounted_output(out, src, mnt, store, nosuid=True)


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


# -- help, man page, examples/ and the bootstrap demo ------------------------------------------

EXAMPLES = REPO / "examples"


def test_helper_help_is_real_help(staged):
    helper = staged / "sbin" / "mount.fuse.journalfs"
    proc = subprocess.run([str(helper), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("usage: mount.fuse.journalfs SOURCE MOUNTPOINT")
    assert "fuse.journalfs" in out and "/etc/fstab" in out
    # the option list comes from `journalfs mount --help` itself
    mount_help = subprocess.run([str(JOURNALFS), "mount", "--help"], capture_output=True,
                                text=True, check=True).stdout
    options = mount_help[mount_help.index("Mount options"):mount_help.index("Caching:")].strip()
    assert options in out


def test_installer_installs_the_generated_man_page(staged):
    page = staged / "usr" / "local" / "share" / "man" / "man1" / "journalfs.1"
    assert page.stat().st_mode & 0o777 == 0o644
    generated = subprocess.run([str(JOURNALFS), "--man"], capture_output=True, text=True,
                               check=True).stdout
    assert page.read_text() == generated
    rendered = subprocess.run(["man", "-l", str(page)], capture_output=True, text=True,
                              env={**os.environ, "MANPAGER": "cat", "COLUMNS": "100"})
    assert rendered.returncode == 0, rendered.stderr
    assert "journalfs umount" in rendered.stdout and "EXIT STATUS" in rendered.stdout


def _example_fstab_line() -> list[str]:
    lines = [line.split() for line in (EXAMPLES / "fstab").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert len(lines) == 1 and len(lines[0]) == 6 and lines[0][2] == "fuse.journalfs"
    return lines[0]


def test_example_fstab_line(staged, tree, tmp_path):
    # the example's own options, with its paths replaced by the test's
    src, mnt, store = tree
    fields = _example_fstab_line()
    readme_lines = [line.split() for line in (REPO / "README.md").read_text().splitlines()]
    assert fields in readme_lines  # the README shows the tested line
    options = ",".join(f"store={store}" if o.startswith("store=") else o
                       for o in fields[3].split(","))
    fstab = tmp_path / "fstab"
    fstab.write_text(f"{src} {mnt} fuse.journalfs {options} {fields[4]} {fields[5]}\n")
    script = check_mounted_script(f"mount --fstab {fstab} {mnt}", mnt).replace(
        f"umount {mnt}", f"grep ' {mnt} ' /proc/self/mountinfo\numount {mnt}")
    out = run_in_namespace({"/usr/sbin": staged / "sbin"}, script)
    assert_mounted_output(out, src, mnt, store)
    (mountinfo,) = [line for line in out.splitlines() if f" {mnt} " in line]
    assert "noatime" in mountinfo.split(" - ")[0]          # the example's kernel flag
    assert "allow_other" in mountinfo.split(" - ")[1]


def test_example_unit_settings_run_the_unit_command(staged, tree, tmp_path):
    """Run the unit's ExecStart/ExecStop as systemd would, with examples/srv-meta.conf's
    settings (paths replaced by the test's): the mount comes up in the foreground and the
    stop command ends it."""
    src, mnt, store = tree
    settings = dict(line.split("=", 1) for line in (EXAMPLES / "srv-meta.conf").read_text()
                    .splitlines() if line and not line.startswith("#"))
    assert settings["JOURNALFS_SOURCE"] == "/srv/data"
    args = settings["JOURNALFS_ARGS"].replace("/var/lib/journalfs", str(store)).split()
    unit = (staged / "etc" / "systemd" / "system" / "journalfs@.service").read_text()
    start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    stop = next(line for line in unit.splitlines() if line.startswith("ExecStop="))
    start_argv = start.removeprefix("ExecStart=").split()
    assert start_argv[-3:] == ["${JOURNALFS_SOURCE}", "${JOURNALFS_MOUNTPOINT}", "$JOURNALFS_ARGS"]
    start_argv = start_argv[:-3] + [str(src), str(mnt)] + args
    daemon = subprocess.Popen(start_argv, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "JOURNAL_STREAM": "8:1"})
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mnt):
            assert daemon.poll() is None, daemon.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        status = json.loads((mnt / ".journalfs" / "status.json").read_text())
        assert status["options"]["allow_other"] and status["options"]["sync"] == "batch"
        assert status["options"]["log"] == "stderr (systemd journal)"
        assert status["store"]["tree"] == str(store / "root")
        stop_argv = stop.removeprefix("ExecStop=").replace("${JOURNALFS_MOUNTPOINT}", str(mnt))
        subprocess.run(stop_argv.split(), check=True)
        assert daemon.wait(timeout=30) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-uz", str(mnt)], check=False)


def _bootstrap_demo(demo_dir: Path) -> subprocess.CompletedProcess:
    # the demo job alone (bootstrap.sh defines its functions when sourced); no installing.
    # Its default store goes under the test's directory, not root's home.
    env = {**os.environ, "JOURNALFS_DEMO_DIR": str(demo_dir),
           "XDG_DATA_HOME": str(demo_dir.parent / "xdg")}
    return subprocess.run(["bash", "-c", f'source "{REPO}/bootstrap.sh" && demo'], env=env,
                          capture_output=True, text=True, timeout=300, cwd=REPO)


def test_bootstrap_demo_keeps_to_its_own_directory(tmp_path):
    foreign = tmp_path / "precious"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine\n")
    proc = _bootstrap_demo(foreign)
    assert proc.returncode != 0
    assert f"{foreign} exists and was not made by the demo" in proc.stderr
    assert (foreign / "keep.txt").read_text() == "mine\n" and len(list(foreign.iterdir())) == 1

    demo_dir = tmp_path / "demo"
    try:
        for _ in range(2):  # a rerun replaces its own earlier demo
            proc = _bootstrap_demo(demo_dir)
            assert proc.returncode == 0, proc.stderr
            assert f"== demo directory: {demo_dir}" in proc.stdout
            assert (demo_dir / ".journalfs-demo").exists()
            assert '"rotate"' not in proc.stdout and "user.journalfs.sync=" in proc.stdout
    finally:
        if os.path.ismount(demo_dir / "mnt"):
            subprocess.run([str(JOURNALFS), "umount", str(demo_dir / "mnt")], check=False)
