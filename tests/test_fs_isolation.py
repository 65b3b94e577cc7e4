"""Issue 24 on a real root `-o allow_other` mount, as real unprivileged users (bob attacks,
carol is the bystander): no request waits on another user's lease, chattr +i/+a refuse
metadata writes, writes through the mount stop at root's reserved blocks, names reach no log
line unescaped, status.json tells bob nothing, memory stays bounded under renames."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import re
import subprocess
import time
from pathlib import Path

import pytest

from mountutil import mounted
from test_fs_permissions import SYSTEM_PYTHON
from test_fs_security import run_as
from users import ensure_user, reachable_dir

pytestmark = pytest.mark.fuse

F_SETLEASE = 1024


@contextlib.contextmanager
def temporary_user(name: str):
    """A system user for this test, removed afterwards if the test created it."""
    try:
        pwd.getpwnam(name)
        existed = True
    except KeyError:
        existed = False
    user = ensure_user(name)
    try:
        yield user
    finally:
        if not existed:
            subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture(scope="module")
def bob():
    with temporary_user("jfs-iso-bob") as user:
        yield user


@pytest.fixture(scope="module")
def carol():
    with temporary_user("jfs-iso-carol") as user:
        yield user


@pytest.fixture
def tmp_path():
    with reachable_dir("jfs-iso-") as path:
        yield path


def _own(path: Path, user) -> Path:
    os.chown(path, user.pw_uid, user.pw_gid)
    return path


def _tree(tmp_path: Path, *users) -> tuple[Path, Path]:
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    os.chmod(src, 0o755)
    for user in users:
        home = src / user.pw_name
        home.mkdir()
        _own(home, user)
    return src, mnt


def _user_process(user, code: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups",
         "--reset-env", SYSTEM_PYTHON, "-u", "-c", code],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


LEASE_HOLDER = r"""
import fcntl, os, signal, sys, time
broken = []
signal.signal(signal.SIGIO, lambda *_: broken.append(1))
fd = os.open(sys.argv[1] if len(sys.argv) > 1 else PATH, os.O_RDONLY)
fcntl.fcntl(fd, 1024, fcntl.F_WRLCK)
print("leased", flush=True)
while not broken:
    time.sleep(0.01)
print("breaking", flush=True)
while not os.path.exists(GO):
    time.sleep(0.01)
fcntl.fcntl(fd, 1024, fcntl.F_UNLCK)
print("released", flush=True)
"""


def _line(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline().strip()
    assert line, proc.stderr.read()
    return line


# -- finding 1: a lease on one file ------------------------------------------------------------
def test_an_open_waiting_on_a_lease_holds_up_no_other_request(tmp_path, bob, carol):
    src, mnt = _tree(tmp_path, bob, carol)
    leased = src / bob.pw_name / "leased"
    leased.write_text("bob's\n")
    _own(leased, bob)
    mine = src / carol.pw_name / "mine"
    mine.write_text("carol's\n")
    _own(mine, carol)
    go = tmp_path / "go"
    with mounted(src, mnt, "-o", "allow_other") as m:
        os.setxattr(mnt / carol.pw_name / "mine", "user.metadata.k", b"v")
        holder = _user_process(bob, f"PATH, GO = {str(leased)!r}, {str(go)!r}\n" + LEASE_HOLDER)
        opener = None
        try:
            assert _line(holder) == "leased"
            # bob opens his own leased file through the mount: that open waits for the
            # lease break, which his holder delays until carol is done
            opener = _user_process(bob, f"open({str(mnt / bob.pw_name / 'leased')!r}).read()\n"
                                        "print('opened', flush=True)")
            assert _line(holder) == "breaking"
            got = run_as(carol, [
                ("stat", f"os.stat({str(mnt / carol.pw_name / 'mine')!r}).st_size"),
                ("read", f"open({str(mnt / carol.pw_name / 'mine')!r}).read()"),
                ("xattr", f"os.getxattr({str(mnt / carol.pw_name / 'mine')!r}, 'user.metadata.k')"),
                ("list", f"sorted(os.listdir({str(mnt)!r}))"),
                ("create", f"open({str(mnt / carol.pw_name / 'new')!r}, 'w').write('x')"),
            ])
            assert got == {"stat": 8, "read": "carol's\n", "xattr": "v",
                           "list": sorted([bob.pw_name, carol.pw_name]), "create": 1}, got
            # carol was served while bob's open was still waiting on the lease
            assert opener.poll() is None and holder.poll() is None
            go.touch()
            assert _line(holder) == "released"
            assert _line(opener) == "opened"
            assert opener.wait(timeout=60) == 0 and holder.wait(timeout=60) == 0
        finally:
            go.touch()
            for proc in (holder, opener):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
        assert "Traceback" not in m.stderr()


# -- finding 5: a user listing a huge directory in a loop ---------------------------------------
TRACING = Path("/sys/kernel/tracing")
FUSE_READDIRPLUS = 44
#: TASK-PID [CPU] FLAGS TIME: fuse_request_send: connection N req U opcode OP (NAME) len L
TRACE_LINE = re.compile(r"-(\d+)\s+\[\d+\][^:]*?\s(\d+\.\d+): fuse_request_(send|end): "
                        r"connection \d+ req (\d+)(?: opcode (\d+))?")
LISTER = r"""
import os, sys
path, want, until = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
import time
n = 0
while time.time() < until:
    got = os.listdir(path)
    assert len(got) == want and len(set(got)) == want, len(got)
    n += 1
print(n, flush=True)
"""
PROBE = r"""
import os, sys, time
path, until = sys.argv[1], float(sys.argv[2])
n = 0
while time.time() < until:
    os.getxattr(path, "user.metadata.k")
    os.close(os.open(path, os.O_RDONLY))
    n += 1
    time.sleep(0.001)
print(n, flush=True)
"""


def _traced(connection: int, *procs: subprocess.Popen) -> tuple[list[str], list[tuple]]:
    """Each of ``procs``'s output once it is done, and (pid, sent, answered, opcode) of every
    request of one FUSE connection meanwhile (the fuse tracepoints, in an ftrace instance of
    this test's own)."""
    inst = TRACING / "instances" / f"jfs-iso-{os.getpid()}"
    inst.mkdir()
    outputs = []
    try:
        (inst / "buffer_size_kb").write_text("16384")
        (inst / "events/fuse/filter").write_text(f"connection == {connection}")
        (inst / "events/fuse/enable").write_text("1")
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            outputs.append(out)
        (inst / "events/fuse/enable").write_text("0")
        text = (inst / "trace").read_text()
    finally:
        (inst / "events/fuse/enable").write_text("0")
        inst.rmdir()
    assert "LOST" not in text
    sent, requests = {}, []
    for m in TRACE_LINE.finditer(text):
        pid, when, kind, unique, opcode = int(m[1]), float(m[2]), m[3], m[4], m[5]
        if kind == "send":
            sent[unique] = (pid, when, int(opcode))
        elif unique in sent:
            pid, start, op = sent.pop(unique)
            requests.append((pid, start, when, op))
    return outputs, requests


@pytest.mark.skipif(not (TRACING / "events" / "fuse").is_dir(), reason="no fuse tracepoints")
def test_carol_is_served_in_the_middle_of_bobs_listing_replies(tmp_path, bob, carol):
    """Bob lists a big directory in a loop: alone, each of his READDIRPLUS replies carries
    what the kernel's buffer takes (a few requests per listing, not one per 64 entries);
    from two processes at once with carol working beside him, her requests are answered
    between the steps of his replies (kernel-side: sent and answered while one of his
    READDIRPLUS is in flight), and every listing he gets is complete."""
    src, mnt = _tree(tmp_path, bob, carol)
    entries = 20_000
    big = src / bob.pw_name / "big"
    big.mkdir()
    for i in range(entries):
        os.close(os.open(big / f"entry-{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644))
    subprocess.run(["chown", "-R", f"{bob.pw_uid}:{bob.pw_gid}", str(big)], check=True)
    (src / carol.pw_name / "mine").write_text("carol's\n")
    _own(src / carol.pw_name / "mine", carol)

    def as_user(user, code: str, *args) -> subprocess.Popen:
        return _user_process(user, f"import sys\nsys.argv[1:] = {list(map(str, args))!r}\n"
                                   + code)
    with mounted(src, mnt, "-o", "allow_other") as m:
        os.setxattr(mnt / carol.pw_name / "mine", "user.metadata.k", b"v")
        connection = os.stat(mnt).st_dev
        lister = as_user(bob, LISTER, mnt / bob.pw_name / "big", entries, time.time() + 1.5)
        (listings,), requests = _traced(connection, lister)
        readdirs = sum(1 for r in requests if r[3] == FUSE_READDIRPLUS)
        # 64 entries a reply would be 313 requests per listing
        assert 0 < readdirs <= int(listings) * entries // 1000, (readdirs, listings)

        until = time.time() + 3
        listers = [as_user(bob, LISTER, mnt / bob.pw_name / "big", entries, until)
                   for _ in range(2)]
        probe = as_user(carol, PROBE, mnt / carol.pw_name / "mine", until)
        _, requests = _traced(connection, *listers, probe)
        replies = [r for r in requests if r[3] == FUSE_READDIRPLUS]
        carols = [r for r in requests if r[0] == probe.pid]
        assert replies and carols
        inside = sum(1 for c in carols if any(r[1] < c[1] and c[2] < r[2] for r in replies))
        assert inside > 0, (len(carols), len(replies))
        assert "Traceback" not in m.stderr()


# -- finding 10: chattr +i / +a -----------------------------------------------------------------
@pytest.mark.parametrize("flag", ["+i", "+a"])
def test_immutable_and_append_only_files_refuse_metadata_writes(tmp_path, bob, flag):
    src, mnt = _tree(tmp_path, bob)
    target = src / "frozen"
    target.write_text("x")
    os.chmod(target, 0o666)
    if subprocess.run(["chattr", flag, str(target)], capture_output=True).returncode != 0:
        pytest.skip(f"chattr {flag} is not supported on {src}")
    try:
        with mounted(src, mnt, "-o", "allow_other"):
            # set before the flag: removal is refused as well
            subprocess.run(["chattr", "-i", "-a", str(target)], check=True)
            os.setxattr(mnt / "frozen", "user.metadata.old", b"1")
            subprocess.run(["chattr", flag, str(target)], check=True)
            got = run_as(bob, [
                ("native", f"os.setxattr({str(target)!r}, 'user.t', b'1')"),
                ("set", f"os.setxattr({str(mnt / 'frozen')!r}, 'user.metadata.t', b'1')"),
                ("remove", f"os.removexattr({str(mnt / 'frozen')!r}, 'user.metadata.old')"),
                ("read", f"os.getxattr({str(mnt / 'frozen')!r}, 'user.metadata.old')"),
            ])
            assert got == {"native": "EPERM", "set": "EPERM", "remove": "EPERM", "read": "1"}, got
            with pytest.raises(OSError) as exc:  # root too, as natively
                os.setxattr(mnt / "frozen", "user.metadata.t", b"1")
            assert exc.value.errno == errno.EPERM
            subprocess.run(["chattr", "-i", "-a", str(target)], check=True)
            os.setxattr(mnt / "frozen", "user.metadata.t", b"1")  # writable again
    finally:
        subprocess.run(["chattr", "-i", "-a", str(target)], capture_output=True)


# -- finding 11: root's reserved blocks -----------------------------------------------------
FILL = r"""
import errno, os, sys
written = 0
chunk = b"\xa5" * 65536
fd = os.open(sys.argv[1] if len(sys.argv) > 1 else PATH, os.O_WRONLY | os.O_CREAT, 0o644)
try:
    while True:
        written += os.write(fd, chunk)
except OSError as exc:
    assert exc.errno in (errno.ENOSPC, errno.EDQUOT), exc
try:
    os.fsync(fd)
except OSError:
    pass
os.close(fd)
print(written)
"""


@contextlib.contextmanager
def _reserved_disk(workdir: Path):
    """A 16 MiB ext4 on a loop device with 25% of its blocks reserved for root."""
    image, disk = workdir / "disk.img", workdir / "disk"
    disk.mkdir()
    subprocess.run(["truncate", "-s", "16M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "25", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
        out = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True).stdout
        for line in out.splitlines():
            subprocess.run(["losetup", "-d", line.split(":", 1)[0]], capture_output=True)


def test_writes_through_the_mount_stop_at_roots_reserve(tmp_path, bob):
    with _reserved_disk(tmp_path) as disk:
        os.chmod(disk, 0o755)
        src, mnt = disk / "src", tmp_path / "mnt"
        src.mkdir()
        os.chmod(src, 0o755)
        home = src / "bob"
        home.mkdir()
        _own(home, bob)
        st = os.statvfs(disk)
        reserve = (st.f_bfree - st.f_bavail) * st.f_frsize
        assert reserve > 2 << 20

        def fill_as_bob(path: Path) -> int:
            proc = _user_process(bob, f"PATH = {str(path)!r}\n" + FILL)
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
            return int(out)

        native = fill_as_bob(home / "native")
        os.unlink(home / "native")
        subprocess.run(["sync", "-f", str(disk)])
        with mounted(src, mnt, "-o", "allow_other", "--store", str(tmp_path / "store")) as m:
            through = fill_as_bob(mnt / "bob" / "through")
            st = os.statvfs(disk)
            # root's reserve is still there for root: bob stopped where he stops natively
            assert (st.f_bfree - st.f_bavail) * st.f_frsize > reserve // 2
            assert through <= native + (256 << 10), (through, native)
            # and a file created through the mount is bob's
            assert os.stat(home / "through").st_uid == bob.pw_uid
            os.unlink(mnt / "bob" / "through")
            assert "Traceback" not in m.stderr()


# -- findings 6 and 8: status.json and the log ----------------------------------------------
HOSTILE_NAME = (b"x\n2026-11-27T10:00:00 journalfs[1]: INFO setting sync changed to none "
                b"by uid 0\n\x1b[31mred\xff.1800000000000")  # a torn Kestrel queue file


def test_hostile_names_reach_the_log_escaped_and_status_json_tells_bob_nothing(
        tmp_path, bob, records_corpus):
    src, mnt = _tree(tmp_path, bob)
    home = src / bob.pw_name
    damaged = os.fsencode(home) + b"/" + HOSTILE_NAME
    with open(damaged, "wb") as f:
        f.write((records_corpus / "torn.1800000000000").read_bytes())
    os.chown(damaged, bob.pw_uid, bob.pw_gid)
    with mounted(src, mnt, "-o", "allow_other") as m:
        status_path = mnt / ".journalfs" / "status.json"
        before = run_as(bob, [("size", f"os.stat({str(status_path)!r}).st_size")])
        view = os.fsencode(mnt) + b"/.journalfs/records/" + bob.pw_name.encode() + b"/" + HOSTILE_NAME
        subprocess.run(["ls", "-l", os.fsdecode(view)], capture_output=True)
        try:
            os.getxattr(view, "user.journal.damage")
        except OSError:
            pass
        deadline = time.monotonic() + 30
        while True:
            status = json.loads(status_path.read_bytes())
            if status["damaged_journals"] or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert status["damaged_journals"], status  # the owner (root) sees the damage
        got = run_as(bob, [("size", f"os.stat({str(status_path)!r}).st_size"),
                           ("read", f"open({str(status_path)!r}).read()")])
        assert got == {"size": 0, "read": "EACCES"} and before == {"size": 0}, (got, before)
        log = m.stderr_path.read_bytes()
        assert b"\x1b" not in log and b"\xff" not in log
        assert not any(line.startswith(b"2026-11-27T10:00:00 journalfs[1]")
                       for line in log.splitlines()), log[-2000:]
        assert b"x\\n2026-11-27T10:00:00" in log  # the name is there, escaped


# -- finding 7 (the mirror's maps): renames ----------------------------------------------------
RENAMER = r"""
import os, sys
d = DIR
os.chdir(d)
open(PREFIX + "0", "w").close()
for i in range(1, COUNT + 1):
    os.rename(PREFIX + str(i - 1), PREFIX + str(i))
    os.stat(PREFIX + str(i))
print("done", flush=True)
"""


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_renames_to_ever_new_names_leave_memory_bounded(tmp_path, bob):
    src, mnt = _tree(tmp_path, bob)
    with mounted(src, mnt, "-o", "allow_other") as m:
        where = str(mnt / bob.pw_name)

        def rename(count: int, prefix: str) -> None:
            code = RENAMER.replace("DIR", repr(where)).replace("COUNT", str(count)) \
                .replace("PREFIX", repr(prefix))
            proc = _user_process(bob, code)
            out, err = proc.communicate(timeout=600)
            assert proc.returncode == 0 and out.strip() == "done", err

        rename(5_000, "warm")
        before = _rss_kib(m.pid)
        rename(40_000, "n")
        grown = _rss_kib(m.pid) - before
        # what a name costs if it were kept: 40k names held would be well above this
        assert grown < 16 * 1024, f"RSS grew {grown} KiB over 40,000 renames"
        assert "Traceback" not in m.stderr()
