"""What a user meets first, through the real CLI and real mounts: help and the man page,
mount options as /proc/self/mountinfo shows them, unmounting, logs, mistakes that used to be
silent, and the runtime settings on MNT/.journalfs."""
from __future__ import annotations

import errno
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from mountutil import JOURNALFS, check_log_file, mounted
from users import ensure_user

REPO = Path(__file__).resolve().parents[1]
UX_USER = "jfs-ux-test"


def jfs(*args, check: bool | None = None, env: dict | None = None, cwd=None,
        timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run([*JOURNALFS, *map(os.fspath, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)
    if check:
        assert proc.returncode == 0, f"journalfs {args}: exit {proc.returncode}: {proc.stderr}"
    return proc


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{text}"
    assert "Traceback" not in text
    return lines[0]


def mount_entry(mnt: Path) -> dict | None:
    """Our own reading of /proc/self/mountinfo (not journalfs's)."""
    found = None
    for line in Path("/proc/self/mountinfo").read_text(errors="surrogateescape").splitlines():
        fields = line.split(" ")
        sep = fields.index("-")
        if fields[4] == str(mnt):
            found = {"flags": fields[5].split(","), "fstype": fields[sep + 1],
                     "source": fields[sep + 2], "super": fields[sep + 3].split(",")}
    return found


@pytest.fixture
def tree(tmp_path):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    (src / "hello.txt").write_text("hello\n")
    return src, mnt


@pytest.fixture
def private_data(tmp_path):
    """Environment whose default stores and pid files live under tmp_path."""
    return {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg"),
            "JOURNALFS_RUNTIME_DIR": str(tmp_path / "run")}


@pytest.fixture
def daemon_mount(tree, private_data):
    """`journalfs mount` the way users run it (daemonized); unmounted at the end."""
    src, mnt = tree
    mounts = []

    def mount(*extra, source=src, mountpoint=mnt, expect_ok=True):
        proc = jfs("mount", source, mountpoint, *extra, env=private_data)
        if expect_ok:
            assert proc.returncode == 0, proc.stderr
            mounts.append(Path(mountpoint))
        return proc
    yield mount
    for m in mounts:
        if mount_entry(m) is not None:
            jfs("umount", m, env=private_data)
        if mount_entry(m) is not None:
            subprocess.run(["fusermount3", "-uz", str(m)], check=False)
    # with no system log the daemons logged beside their stores: checked as mounted()'s are
    stores = Path(private_data["XDG_DATA_HOME"]) / "journalfs" / "stores"
    for log in sorted(stores.glob("*/journalfs.log")):
        check_log_file(log, f"daemonized journalfs ({log})")


def daemon_pid(mnt: Path) -> int:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"mount" in argv and os.fsencode(mnt) in argv and any(b"journalfs" in a for a in argv):
            return int(proc.name)
    raise AssertionError(f"no journalfs daemon for {mnt}")


def wait_for(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# -- help, version, man page ------------------------------------------------------------------

def test_top_level_help_is_for_users_grouped_with_examples():
    out = jfs("--help", check=True).stdout
    assert "argument parsing" not in out and ":mod:" not in out
    for heading in ("Mounting:", "Journal files:", "Metadata stores:", "Examples:"):
        assert heading in out
    assert out.index("Mounting:") < out.index("options:")  # commands first
    assert re.search(r"^  umount\s+\S", out, re.M)
    assert jfs("--version", check=True).stdout.startswith("journalfs ")


@pytest.mark.parametrize("command", [
    ["mount"], ["umount"], ["records"], ["fsck"], ["pipeline"], ["meta"],
    ["meta", "dump"], ["meta", "get"], ["meta", "set"], ["meta", "unset"], ["meta", "rm"],
    ["meta", "mv"], ["meta", "compact"]])
def test_every_command_has_a_description_and_an_example(command):
    out = jfs(*command, "--help", check=True).stdout
    usage, _, rest = out.partition("\n\n")
    assert usage.startswith(f"usage: journalfs {' '.join(command)}")
    description = rest.split("\n\n")[0]
    assert len(description.split()) >= 8, description
    assert "`journalfs" not in description  # no developer docstring
    examples = out[out.index("Examples:"):]
    assert f"journalfs {' '.join(command)}" in examples


def test_sync_is_offered_only_where_it_applies():
    for read in ("dump", "get", "compact"):
        assert "--sync" not in jfs("meta", read, "--help", check=True).stdout
    for write in ("set", "unset", "rm", "mv"):
        assert "--sync" in jfs("meta", write, "--help", check=True).stdout
    p = jfs("meta", "dump", "/nonexistent/home", "--sync", "none")
    assert p.returncode == 2 and "unrecognized arguments: --sync" in p.stderr


def test_a_missing_command_reads_naturally():
    for args, prog in (([], "journalfs"), (["meta"], "journalfs meta")):
        p = jfs(*args)
        assert p.returncode == 2
        assert "required" not in p.stderr and "meta_command" not in p.stderr
        assert f"{prog}: error: missing command: choose one of" in p.stderr
        assert "Traceback" not in p.stderr


def _parser_strings() -> list[str]:
    """Every command name and option string of the real parser tree."""
    import argparse

    from journalfs.cli import build_parser

    found = []

    def walk(parser):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    found.append(child.prog)
                    walk(child)
            else:
                found.extend(action.option_strings)
    walk(build_parser())
    return found


def test_man_page_is_generated_from_the_parsers_and_renders_cleanly(tmp_path):
    page = jfs("--man", check=True).stdout
    assert page.startswith(".TH JOURNALFS 1")
    groff = shutil.which("groff")
    if groff is None:
        pytest.fail("groff is missing (bootstrap.sh installs groff-base)")
    rendered = subprocess.run([groff, "-man", "-Tutf8", "-ww", "-P", "-cbou"], input=page,
                              capture_output=True, text=True, check=True)
    assert rendered.stderr == "", rendered.stderr  # no roff warnings
    text = rendered.stdout.replace("\u2010", "-").replace("\u2212", "-")
    flat = " ".join(text.replace("-\n", "-").split())
    for item in _parser_strings():
        assert item in flat, f"{item!r} missing from the man page"
    for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "EXAMPLES", "EXIT STATUS"):
        assert re.search(rf"^{section}$", text, re.M), section


# -- mount options ------------------------------------------------------------------------------

@pytest.mark.fuse
def test_kernel_mount_flags_take_effect(tree):
    src, mnt = tree
    with mounted(src, mnt, "-o", "noatime,dev,suid,exec,dirsync,sync"):
        entry = mount_entry(mnt)
        assert entry["fstype"] == "fuse.journalfs"
        assert "noatime" in entry["flags"] and "relatime" not in entry["flags"]
        assert "nosuid" not in entry["flags"] and "nodev" not in entry["flags"]
        assert "noexec" not in entry["flags"]
        assert "dirsync" in entry["super"] and "sync" in entry["super"]
        status = json.loads((mnt / ".journalfs" / "status.json").read_text())
        assert status["options"]["sync"] == "batch"  # plain "sync" is the kernel flag
        assert status["options"]["mount_flags"] == ["noatime", "dev", "suid", "exec",
                                                     "dirsync", "sync"]
    with mounted(src, mnt, "-o", "noexec,nodev,ro"):
        entry = mount_entry(mnt)
        assert {"noexec", "nodev", "nosuid", "ro", "relatime"} <= set(entry["flags"])


@pytest.mark.parametrize("option, reason", [
    ("strictatime", "libfuse"), ("nodiratime", "noatime works"), ("lazytime", "lazytime"),
    ("max_read=65536", "pyfuse3"), ("uid=1000", "bindfs"), ("direct_io", "page cache"),
    ("subtype=other", "fuse.journalfs"), ("allow_other,allow_root", "exclude each other"),
    ("nosymfollow", "libfuse"), ("silent", "libfuse"),
    ("auto_unmount,suid", "fusermount3"), ("frobnicate", "unknown mount option")])
def test_options_that_cannot_work_are_refused_with_a_reason(tree, option, reason):
    src, mnt = tree
    p = jfs("mount", src, mnt, "-o", option)
    assert p.returncode == 2
    assert reason in one_line(p.stderr)
    assert mount_entry(mnt) is None


@pytest.mark.fuse
def test_allow_root_lets_root_in_and_keeps_others_out(open_tree):
    src, mnt = open_tree
    user = ux_user()
    with mounted(src, mnt, "-o", "allow_root"):
        assert "allow_other" in mount_entry(mnt)["super"]  # libfuse itself turns others away
        assert (mnt / "a.txt").read_text() == "a\n"
        p = _as(user, ["cat", str(mnt / "a.txt")])
        assert p.returncode == 1 and "Permission denied" in p.stderr
    with mounted(src, mnt, "-o", "allow_other"):
        assert _as(user, ["cat", str(mnt / "a.txt")]).stdout == "a\n"


@pytest.mark.fuse
def test_auto_unmount_removes_the_mount_when_the_daemon_is_killed(tree, daemon_mount):
    src, mnt = tree
    daemon_mount("-o", "auto_unmount")
    assert mount_entry(mnt)["fstype"] == "fuse.journalfs"
    os.kill(daemon_pid(mnt), signal.SIGKILL)
    wait_for(lambda: mount_entry(mnt) is None, timeout=120, what="auto_unmount")


# -- unmounting ---------------------------------------------------------------------------------

@pytest.mark.fuse
def test_umount_touches_only_journalfs_mounts(tmp_path):
    src, mnt = tmp_path / "src", tmp_path / "bind"
    src.mkdir()
    mnt.mkdir()
    subprocess.run(["bindfs", str(src), str(mnt)], check=True)
    try:
        p = jfs("umount", mnt)
        assert p.returncode == 2 and "not a journalfs mount" in one_line(p.stderr)
        assert mount_entry(mnt)["fstype"] in ("fuse", "fuse.bindfs")  # still mounted
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
    p = jfs("umount", "/")
    assert p.returncode == 2 and "/ is not a journalfs mount" in one_line(p.stderr)
    p = jfs("umount", src)
    assert p.returncode == 1 and "is not mounted" in one_line(p.stderr)


@pytest.mark.fuse
def test_busy_mount_gives_a_hint_and_lazy_umount_returns_at_once(tree, daemon_mount,
                                                                 private_data):
    src, mnt = tree
    daemon_mount()
    pid = daemon_pid(mnt)
    sleeper = subprocess.Popen(["sleep", "300"], cwd=mnt)
    try:
        p = jfs("umount", mnt, env=private_data)
        assert p.returncode == 1
        line = one_line(p.stderr)
        assert "busy" in line and f"fuser -vm {mnt}" in line and "-z" in line
        assert mount_entry(mnt) is not None
        # lazy: detached at once; the daemon keeps serving the shell-like process inside.
        # (the old behaviour waited 30 s in silence: the timeout here is below that)
        p = jfs("umount", "-z", mnt, env=private_data, timeout=20)
        assert p.returncode == 0, p.stderr
        assert "detached" in one_line(p.stderr)
        assert mount_entry(mnt) is None
        assert Path(f"/proc/{pid}").exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), what="the daemon to exit")


@pytest.mark.fuse
def test_a_dead_mount_is_cleaned_up_by_the_next_mount(tree, daemon_mount, private_data):
    src, mnt = tree
    daemon_mount()
    os.kill(daemon_pid(mnt), signal.SIGKILL)
    wait_for(lambda: _enotconn(mnt), what="the mount to go dead")
    p = daemon_mount()
    assert "removed the dead journalfs mount" in one_line(p.stderr)
    assert (mnt / "hello.txt").read_text() == "hello\n"


def _enotconn(path: Path) -> bool:
    try:
        os.statvfs(path)
    except OSError as exc:
        return exc.errno == errno.ENOTCONN
    return False


@pytest.mark.fuse
def test_a_dead_mount_can_also_be_unmounted(tree, daemon_mount, private_data):
    src, mnt = tree
    daemon_mount()
    os.kill(daemon_pid(mnt), signal.SIGKILL)
    wait_for(lambda: _enotconn(mnt), what="the mount to go dead")
    jfs("umount", mnt, env=private_data, check=True)
    assert mount_entry(mnt) is None


# -- logs ---------------------------------------------------------------------------------------

@pytest.mark.fuse
def test_daemon_logs_where_status_json_says(tree, daemon_mount):
    src, mnt = tree
    daemon_mount()
    status = json.loads((mnt / ".journalfs" / "status.json").read_text())
    log = status["options"]["log"]
    if os.path.exists("/dev/log"):  # a system log: journald or a syslog daemon
        assert log == "syslog (/dev/log)"
    else:  # none (containers): a file beside the store
        store_dir = Path(status["store"]["tree"]).parent
        assert log == str(store_dir / "journalfs.log")
        text = Path(log).read_text()
        assert f"serving {src} on {mnt}" in text
        assert Path(log).stat().st_mode & 0o777 == 0o600


@pytest.mark.fuse
def test_log_file_and_request_tracing(tree, tmp_path):
    src, mnt = tree
    log = tmp_path / "journalfs.log"
    with mounted(src, mnt, "-d", "--log-file", str(log)):
        assert (mnt / "hello.txt").read_text() == "hello\n"
        assert not (mnt / "missing").exists()
        status = json.loads((mnt / ".journalfs" / "status.json").read_text())
        assert status["options"]["log"] == f"stderr, {log}"
        assert status["options"]["debug"] is True
    text = log.read_text()
    assert "DEBUG lookup(1, b'hello.txt')" in text
    assert "DEBUG lookup(1, b'missing')" in text and "lookup -> ENOENT" in text
    assert re.search(r"DEBUG read\(\d+, 0, \d+\)", text)


@pytest.mark.fuse
def test_without_debug_no_request_is_traced(tree, tmp_path):
    src, mnt = tree
    log = tmp_path / "journalfs.log"
    with mounted(src, mnt, "--log-file", str(log)):
        assert (mnt / "hello.txt").read_text() == "hello\n"
    text = log.read_text()
    assert "serving" in text and "lookup(" not in text


# -- silent mistakes (meta) ---------------------------------------------------------------------

def test_meta_set_does_not_create_a_store_from_a_typo(tmp_path):
    typo = tmp_path / "stroe" / "home"
    p = jfs("meta", "set", typo, "/a", "k", "v")
    assert p.returncode == 1 and "no metadata store" in one_line(p.stderr)
    assert "--create" in p.stderr
    assert not typo.parent.exists()
    jfs("meta", "set", "--create", typo, "/a", "k", "v", check=True)
    assert jfs("meta", "get", typo, "/a", "k", check=True).stdout == "v\n"
    p = jfs("meta", "unset", tmp_path / "other" / "home", "/a", "k")
    assert p.returncode == 1 and not (tmp_path / "other").exists()


def test_meta_missing_paths_and_keys_are_errors(tmp_path):
    tree = tmp_path / "s" / "home"
    jfs("meta", "set", "--create", tree, "/dir/a", "k", "v", check=True)
    for args, needle in ((("get", "/nothing"), "/nothing: no metadata"),
                         (("get", "/dir/a", "nokey"), "no key 'nokey'"),
                         (("mv", "/nothing", "/else"), "nothing to move"),
                         (("rm", "/nothing"), "/nothing: no metadata"),
                         (("unset", "/dir/a", "nokey"), "no key 'nokey'")):
        p = jfs("meta", args[0], tree, *args[1:])
        assert p.returncode == 1, (args, p.stderr)
        assert needle in one_line(p.stderr), (args, p.stderr)
    jfs("meta", "mv", tree, "/dir", "/moved", check=True)  # a parent with keys below it moves
    assert json.loads(jfs("meta", "dump", tree, "--json", check=True).stdout) == {
        "/moved/a": {"k": "v"}}


@pytest.mark.fuse
def test_meta_set_on_a_mounted_store_points_at_the_mount(tree, tmp_path):
    src, mnt = tree
    store = tmp_path / "store"
    with mounted(src, mnt, "--store", str(store)):
        tree_file = store / "root"  # SOURCE is outside $HOME
        p = jfs("meta", "set", tree_file, f"{src}/hello.txt", "comment", "x")
        assert p.returncode == 1
        line = one_line(p.stderr)
        assert f"served by the journalfs mount on {mnt}" in line
        assert f"setfattr -n user.metadata.KEY -v VALUE {mnt}/hello.txt" in line


# -- mount details ------------------------------------------------------------------------------

@pytest.mark.fuse
def test_a_real_dot_journalfs_in_source_is_named_at_mount_time(tree, daemon_mount):
    src, mnt = tree
    (src / ".journalfs").mkdir()
    p = daemon_mount()
    assert "exists in SOURCE but the mount shows its own .journalfs" in one_line(p.stderr)
    assert (mnt / ".journalfs" / "status.json").exists()


@pytest.mark.fuse
def test_mounting_the_same_source_twice_is_one_clean_line(tree, daemon_mount, tmp_path,
                                                          private_data):
    src, mnt = tree
    daemon_mount()
    second = tmp_path / "mnt2"
    second.mkdir()
    p = daemon_mount(mountpoint=second, expect_ok=False)
    assert p.returncode == 1
    line = one_line(p.stderr)
    assert line == f"journalfs: {src} is already mounted by journalfs on {mnt} (pid {daemon_pid(mnt)})"
    p = daemon_mount(expect_ok=False)  # and on the very same mountpoint
    assert p.returncode == 1
    assert f"{mnt} is already a journalfs mount" in one_line(p.stderr)
    assert f"journalfs umount {mnt}" in p.stderr


def test_gvfs_without_a_session_bus_is_a_clear_line(tree, private_data):
    src, mnt = tree
    env = {k: v for k, v in private_data.items() if k != "DBUS_SESSION_BUS_ADDRESS"}
    p = jfs("mount", "--gvfs", src, mnt, env=env)
    assert p.returncode == 1
    line = one_line(p.stderr)
    assert "DBUS_SESSION_BUS_ADDRESS" in line and "Gvfsd" not in line and "Error" not in line
    env["DBUS_SESSION_BUS_ADDRESS"] = f"unix:path={tree[0]}/no-bus-here"
    p = jfs("mount", "--gvfs", src, mnt, env=env)
    assert p.returncode == 1
    line = one_line(p.stderr)
    assert "no gvfsd-metadata reachable" in line and "Unavailable" not in line


@pytest.mark.fuse
def test_a_source_whose_path_is_not_utf8(tmp_path, private_data):
    base = os.fsencode(tmp_path)
    src = base + b"/src-\xff\xfe"
    mnt = base + b"/mnt-\xe9"
    os.mkdir(src)
    os.mkdir(mnt)
    with open(src + b"/f\xff.txt", "wb") as f:
        f.write(b"bytes\n")
    proc = subprocess.run([*map(os.fsencode, JOURNALFS), b"mount", src, mnt],
                          capture_output=True, env=private_data, timeout=120)
    assert proc.returncode == 0, proc.stderr
    try:
        assert os.listdir(mnt) == [b"f\xff.txt"]
        with open("/proc/self/mountinfo", "rb") as f:  # fsname = SOURCE, byte for byte
            assert any(line.split(b" - ")[1].split(b" ")[:2] == [b"fuse.journalfs", src]
                       for line in f if line.split(b" ")[4] == mnt)
        with open(mnt + b"/f\xff.txt", "rb") as f:
            assert f.read() == b"bytes\n"
        status = json.loads(open(mnt + b"/.journalfs/status.json", "rb").read())
        assert os.fsencode(status["options"]["source"]) == src
    finally:
        subprocess.run([*map(os.fsencode, JOURNALFS), b"umount", mnt], env=private_data,
                       check=True)


# -- runtime settings on .journalfs ---------------------------------------------------------------

def getfattr_dump(path: Path, user: pwd.struct_passwd | None = None) -> dict[str, str]:
    cmd = ["getfattr", "-d", "--absolute-names", str(path)]
    proc = _as(user, cmd)
    assert proc.returncode == 0, proc.stderr
    return dict(re.findall(r'^(user\.journalfs\.\w+)="(.*)"$', proc.stdout, re.M))


def _as(user, cmd) -> subprocess.CompletedProcess:
    if user is not None:
        cmd = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
               *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def setfattr(path: Path, name: str, value: str, user=None) -> subprocess.CompletedProcess:
    return _as(user, ["setfattr", "-n", name, "-v", value, str(path)])


def ux_user() -> pwd.struct_passwd:
    return ensure_user(UX_USER)


@pytest.fixture
def open_tree():
    """SOURCE and mountpoint other users can reach (pytest's tmp_path is root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="jfs-ux-"))
    base.chmod(0o755)
    src, mnt = base / "src", base / "mnt"
    src.mkdir(mode=0o755)
    mnt.mkdir(mode=0o755)
    (src / "a.txt").write_text("a\n")
    yield src, mnt
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.fuse
def test_settings_show_and_change_through_xattrs(open_tree, tmp_path):
    src, mnt = open_tree
    control = mnt / ".journalfs"
    with mounted(src, mnt, "-o", "allow_other,timeout=30", "--store", str(tmp_path / "store"),
                 "--log-file", str(tmp_path / "log")):
        quota = {"user.journalfs.quota_file": "4096",  # the metadata quota (bytes)
                 "user.journalfs.quota_user": str(16 << 20),
                 "user.journalfs.quota_total": str(64 << 20)}
        assert getfattr_dump(control) == {"user.journalfs.log_level": "info",
                                          "user.journalfs.ro": "0",
                                          "user.journalfs.rotate": "0",
                                          "user.journalfs.sync": "batch",
                                          "user.journalfs.timeout": "30", **quota}
        for name, value in (("timeout", "2.5"), ("sync", "always"), ("log_level", "debug")):
            assert setfattr(control, f"user.journalfs.{name}", value).returncode == 0
        subprocess.run(["setfattr", "-n", "user.metadata.k", "-v", "v", str(mnt / "a.txt")],
                       check=True)
        assert setfattr(control, "user.journalfs.rotate", "1").returncode == 0
        settings = getfattr_dump(control)
        assert settings == {"user.journalfs.log_level": "debug", "user.journalfs.ro": "0",
                            "user.journalfs.rotate": "1",
                            "user.journalfs.sync": "always", "user.journalfs.timeout": "2.5",
                            **quota}
        status = json.loads((control / "status.json").read_text())
        assert status["options"]["sync"] == "always" and status["options"]["entry_timeout"] == 2.5
        assert status["rotations"] == 1 and status["entries"] == 0  # the set was rotated in
        for name, bad in (("timeout", "-1"), ("sync", "sometimes"), ("log_level", "loud")):
            p = setfattr(control, f"user.journalfs.{name}", bad)
            assert p.returncode == 1 and "Invalid argument" in p.stderr
        # another user reads them but cannot change them
        user = ux_user()
        assert getfattr_dump(control, user) == settings
        p = setfattr(control, "user.journalfs.sync", "none", user)
        assert p.returncode == 1
        assert "Permission denied" in p.stderr or "Operation not permitted" in p.stderr
        assert getfattr_dump(control)["user.journalfs.sync"] == "always"
        # the rest of .journalfs stays read-only
        p = setfattr(control / "status.json", "user.x", "1")
        assert p.returncode == 1 and "Read-only file system" in p.stderr
    text = (tmp_path / "log").read_text()
    assert "setting sync changed to always by uid 0" in text
    assert "DEBUG" in text  # the log level took effect


@pytest.mark.fuse
def test_refused_settings_say_why_and_log_level_debug_traces_requests(tmp_path):
    """A value a setting does not take: EINVAL to the caller, the reason in the log and in
    status.json's last_error. log_level=debug set at run time traces every request, as -d
    does at mount time; log_level=info stops it."""
    src, mnt, log_file = tmp_path / "src", tmp_path / "mnt", tmp_path / "log"
    src.mkdir()
    (src / "a.txt").write_text("a\n")
    control = mnt / ".journalfs"
    with mounted(src, mnt, "--store", str(tmp_path / "store"), "--log-file", str(log_file)):
        status = json.loads((control / "status.json").read_text())
        assert status["last_error"] is None
        timeout = getfattr_dump(control)["user.journalfs.timeout"]
        p = setfattr(control, "user.journalfs.timeout", "abc")
        assert p.returncode == 1 and "Invalid argument" in p.stderr
        text = log_file.read_text()
        assert "setting timeout to 'abc' refused (EINVAL): timeout must be a number of seconds" in text
        last = json.loads((control / "status.json").read_text())["last_error"]
        assert last["setting"] == "timeout" and last["value"] == "abc" and last["errno"] == "EINVAL"
        assert "timeout must be a number of seconds" in last["message"]
        p = setfattr(control, "user.journalfs.log_level", "loud")
        assert p.returncode == 1
        last = json.loads((control / "status.json").read_text())["last_error"]
        assert last["setting"] == "log_level" and "debug, info, warning, error" in last["message"]
        assert getfattr_dump(control)["user.journalfs.timeout"] == timeout  # unchanged

        os.stat(mnt / "a.txt")
        assert " DEBUG " not in log_file.read_text()  # info: no request is traced
        for name in ("b.txt", "c.txt"):
            (src / name).write_text(name)  # names the kernel has not looked up yet
        assert setfattr(control, "user.journalfs.log_level", "debug").returncode == 0
        assert (mnt / "b.txt").read_text() == "b.txt"
        traced = log_file.read_text()
        assert re.search(r" DEBUG lookup\(1, b'b\.txt'", traced), traced[-2000:]
        assert re.search(r" DEBUG read\(\d+, 0, ", traced), traced[-2000:]
        assert setfattr(control, "user.journalfs.log_level", "info").returncode == 0
        size = len(log_file.read_text())
        assert (mnt / "c.txt").read_text() == "c.txt"
        assert " DEBUG " not in log_file.read_text()[size:]


@pytest.mark.fuse
def test_daemon_logs_to_the_system_log_when_there_is_one(tmp_path):
    """A private mount namespace gets a /dev of its own whose /dev/log is a datagram socket
    this test listens on, as journald's or rsyslog's is: the daemon logs there and says so."""
    import socket

    sock_path = tmp_path / "log.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(sock_path))
    listener.settimeout(30)
    src, mnt, old_dev = tmp_path / "src", tmp_path / "mnt", tmp_path / "olddev"
    for d in (src, mnt, old_dev):
        d.mkdir()
    cli = " ".join(JOURNALFS)
    script = f"""
mount --bind /dev {old_dev}
mount -t tmpfs -o mode=0755 devtmp /dev
for n in fuse null zero random urandom; do touch /dev/$n; mount --bind {old_dev}/$n /dev/$n; done
ln -s {sock_path} /dev/log
{cli} mount {src} {mnt}
cat {mnt}/.journalfs/status.json
{cli} umount {mnt}
"""
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")}
    try:
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-euc",
                               script], capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
        status = json.loads(proc.stdout)
        assert status["options"]["log"] == "syslog (/dev/log)"
        messages = []
        while not any("serving" in m for m in messages):
            messages.append(listener.recv(4096).decode())
        assert any(f"serving {src} on {mnt}" in m and "journalfs[" in m for m in messages)
    finally:
        listener.close()
    assert not list((tmp_path / "xdg").rglob("journalfs.log"))  # no file besides


def test_every_argument_and_option_has_help():
    import argparse

    from journalfs.cli import build_parser

    missing = []

    def walk(parser):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    walk(child)
            elif not action.help:
                missing.append(f"{parser.prog} {action.metavar or action.dest}")
    walk(build_parser())
    assert missing == []


#: Modules only some commands need: a command line that does not need them must not load them.
HEAVY_MODULES = ("numpy", "pyarrow", "trio", "pyfuse3", "pyspark", "jeepney", "rich",
                 "journalfs.formats", "journalfs.metastore.store", "journalfs.fs.views")
LOADED = r"""
import json, sys
from journalfs.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def loaded_by(*argv: str) -> tuple[int, set[str]]:
    """The exit code of ``journalfs ARGV`` and every module it loaded."""
    p = subprocess.run([sys.executable, "-c", LOADED, *map(str, argv)], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    result = json.loads(p.stderr.strip().splitlines()[-1])
    return result["code"], set(result["modules"])


@pytest.mark.parametrize("argv", [("--help",), ("--man",), ("records", "--help"),
                                  ("queue", "--help"), ("mount", "--help"),
                                  ("meta", "set", "--help"), ("pipeline", "--help")])
def test_help_and_the_man_page_load_no_command(argv):
    """Start-up: the whole parser tree, every --help and the man page come from
    journalfs.cmdline alone; no command's implementation and nothing heavy is imported."""
    code, modules = loaded_by(*argv)
    assert code == 0
    assert not [m for m in modules if m.startswith("journalfs.commands.")
                and m not in ("journalfs.commands.parsing",)]
    assert not [m for m in modules if m.split(".")[0] in HEAVY_MODULES or m in HEAVY_MODULES]


def test_a_command_loads_only_its_own_module(records_corpus):
    """`journalfs records -n 1 FILE` loads the records command and what decoding needs, no
    other command (fsck, meta, mount, pipeline, state) and nothing of a mount or of Spark."""
    code, modules = loaded_by("records", "-n", "1", "--json",
                              records_corpus / "jobs.1700000000000")
    assert code == 0
    commands = {m for m in modules if m.startswith("journalfs.commands.")}
    assert commands == {"journalfs.commands.records", "journalfs.commands.parsing",
                        "journalfs.commands.progress"}
    assert "journalfs.formats" in modules  # it does decode
    for heavy in ("pyarrow", "trio", "pyfuse3", "pyspark", "journalfs.metastore.store",
                  "journalfs.fs.views", "journalfs.fs.main"):
        assert heavy not in modules
