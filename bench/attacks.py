"""Issue 24's attacks, side by side: carol's latencies while bob attacks, through journalfs,
on native ext4 and through `bindfs --multithreaded`, in one run (run by bench/hostile.py
--attacks; root only: it mounts with allow_other, makes users and loop filesystems).

Per attack and per target (native SOURCE, the journalfs mount, the bindfs mount), bob attacks
through that target while carol stats, opens+closes and getxattrs her own file through it;
the table shows her p50/p99/worst in ms, her idle figures first; through journalfs also her
first view of a new small journal of her own (listed and one record read). Attacks whose
outcome is not a latency (8 log forging, 10 chattr +i, 11 root's reserve) report what
happened on each side.
"""
from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = "/usr/bin/python3"
BOB, CAROL = "jfs-bench-bob", "jfs-bench-carol"
TARGETS = ("native", "journalfs", "bindfs")
BIG_DIR_ENTRIES = 100_000
DAMAGED_JOURNALS = 1000

PROBE = r"""
import json, os, sys, time
cfg = json.loads(sys.argv[1])
path, key, until = cfg["path"], cfg["key"], time.monotonic() + cfg["seconds"]
view = cfg.get("view")  # carol's first view of a new small journal of hers (journalfs only)
lat = {"stat": [], "open": [], "getxattr": []}
if view:
    lat["view"] = []
    template = open(view["template"], "rb").read()
errors = {}
clock = time.perf_counter
n = 0
# with a view: the first half of the time for stat/open/getxattr, the second for views only
# (her own indexing must not show in her other figures)
half = time.monotonic() + cfg["seconds"] / 2 if view else until
while time.monotonic() < until:
    n += 1
    for op in lat:
        if (op == "view") != (time.monotonic() >= half):
            continue
        if op == "view":  # written in SOURCE (untimed), then found, indexed, listed, read
            name = "v%d-%d.log.idx" % (os.getpid(), n)
            with open(os.path.join(view["home"], name), "wb") as f:
                f.write(template)
            old = os.path.join(view["home"], "v%d-%d.log.idx" % (os.getpid(), n - 2))
            if os.path.exists(old):
                os.unlink(old)
        t0 = clock()
        try:
            if op == "stat":
                os.stat(path)
            elif op == "open":
                os.close(os.open(path, os.O_RDONLY))
            elif op == "view":
                d = os.path.join(view["views"], name)
                first = sorted(os.listdir(d))[0]
                with open(os.path.join(d, first), "rb") as f:
                    f.read()
            else:
                os.getxattr(path, key)
        except OSError as exc:
            errors[exc.strerror] = errors.get(exc.strerror, 0) + 1
        lat[op].append(clock() - t0)
    time.sleep(0.002)
def summary(xs):
    xs = sorted(xs)
    if not xs:
        return None
    return {"n": len(xs), "p50": xs[len(xs) // 2] * 1e3, "p99": xs[min(len(xs) - 1, int(len(xs) * 0.99))] * 1e3,
            "worst": xs[-1] * 1e3}
print(json.dumps({"ops": {op: summary(xs) for op, xs in lat.items()}, "errors": errors}))
"""

LEASE_HOLDER = r"""
import fcntl, os, signal, sys, time
signal.signal(signal.SIGIO, lambda *_: None)  # keep the lease until killed
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.fcntl(fd, 1024, fcntl.F_WRLCK)
print("leased", flush=True)
time.sleep(3600)
"""

OPENERS = r"""
import os, sys, threading
def opener():
    while True:
        try:
            os.close(os.open(sys.argv[1], os.O_RDONLY))
        except OSError:
            pass
for _ in range(int(sys.argv[2])):
    threading.Thread(target=opener, daemon=True).start()
threading.Event().wait()
"""

LISTER = r"""
import os, sys
while True:
    os.listdir(sys.argv[1])
"""

STATTER = r"""
import os, sys
while True:
    try:
        os.stat(sys.argv[1])
    except OSError:
        pass
"""

FILL = r"""
import errno, os, sys
written, chunk = 0, b"\xa5" * 65536
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
try:
    while True:
        written += os.write(fd, chunk)
except OSError as exc:
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        raise
try:
    os.fsync(fd)
except OSError:
    pass
os.close(fd)
print(written)
"""


HUGE_VIEWS = r"""
import os, shutil, sys
home, views, template, size, dense = sys.argv[1:6]
size, n = int(size), 0
while True:  # new huge journals all the time: none is indexed once and then served from memory
    name = f"huge{n % 4}.log.idx"
    n += 1
    path = os.path.join(home, name)
    shutil.copyfile(template, path)
    if dense == "dense":  # real zeros, within bob's own disk space: records of zeros
        with open(path, "ab") as f:
            for _ in range(size >> 20):
                f.write(bytes(1 << 20))
    else:  # truncate -s: a hole, never written
        os.truncate(path, size)
    try:
        os.listdir(os.path.join(views, name))
        if dense != "dense":
            with open(os.path.join(views, name, "records.jsonl"), "rb") as f:
                while f.read(1 << 20):
                    pass
    except OSError:
        pass
"""


def user(name: str) -> tuple[pwd.struct_passwd, bool]:
    try:
        return pwd.getpwnam(name), False
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        name], check=True, capture_output=True)
        return pwd.getpwnam(name), True


def as_user(who: pwd.struct_passwd, code: str, *args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(["setpriv", f"--reuid={who.pw_uid}", f"--regid={who.pw_gid}",
                             "--init-groups", "--reset-env", SYSTEM_PYTHON, "-u", "-c", code, *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **popen)


def stop(procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()


@contextlib.contextmanager
def journalfs_mount(src: Path, mnt: Path, store: Path, log: Path, extra_env: dict | None = None):
    mnt.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, (str(REPO), os.environ.get("PYTHONPATH")))))
    env.update(extra_env or {})
    with open(log, "ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "journalfs.cli", "mount", "--foreground",
                                 "-o", "allow_other", "--store", str(store), str(src), str(mnt)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                # a variant PYTHONPATH=TREE runs that tree's code (-m looks in
                                # the working directory first)
                                env=env, cwd=env["PYTHONPATH"].split(os.pathsep)[0])
    try:
        wait_mounted(mnt, proc)
        yield proc
    finally:
        unmount(mnt)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def bindfs_mount(src: Path, mnt: Path):
    mnt.mkdir(exist_ok=True)
    subprocess.run(["bindfs", "--multithreaded", "-o", "allow_other", str(src), str(mnt)],
                   check=True, capture_output=True)
    try:
        wait_mounted(mnt, None)
        yield
    finally:
        unmount(mnt)


def wait_mounted(mnt: Path, proc) -> None:
    deadline = time.monotonic() + 30
    while not os.path.ismount(mnt):
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            raise RuntimeError(f"{mnt} did not mount")
        time.sleep(0.05)


def unmount(mnt: Path) -> None:
    for lazy in (False, False, True):
        if not os.path.ismount(mnt):
            return
        subprocess.run(["fusermount3", "-u", *(["-z"] if lazy else []), str(mnt)],
                       capture_output=True)
        time.sleep(0.3)


def probe(carol, path: Path, key: str, seconds: float, view: dict | None = None) -> dict:
    cfg = {"path": str(path), "key": key, "seconds": seconds, "view": view}
    proc = as_user(carol, PROBE, json.dumps(cfg))
    out, err = proc.communicate(timeout=seconds + 120)
    if proc.returncode != 0:
        raise RuntimeError(f"carol's probe failed: {err[-500:]}")
    return json.loads(out)


def run_attacks(seconds: float = 8.0, only: set[str] | None = None,
                variant: str | None = None) -> dict:
    """``only``: the numbers of the attacks to run (None: all); the idle phase always runs.
    ``variant`` (``VAR=VALUE``): a second journalfs mount, its daemon run with that variable
    in its environment, probed right after the first (a before/after in one run);
    ``PYTHONPATH=/work/main`` runs another tree's code."""
    other = f"journalfs[{variant}]" if variant else None
    jfs_targets = ("journalfs", other) if other else ("journalfs",)
    targets = ("native", *jfs_targets, "bindfs")
    bob, bob_made = user(BOB)
    carol, carol_made = user(CAROL)
    work = Path(tempfile.mkdtemp(prefix="jfs-attacks-", dir="/tmp"))
    work.chmod(0o755)
    src = work / "src"
    roots = {"native": src, "journalfs": work / "jfs", "bindfs": work / "bindfs"}
    if other:
        roots[other] = work / "jfs-variant"
    log = work / "journalfs.log"
    results: dict = {"seconds_per_phase": seconds, "phases": {}, "outcomes": {}}
    try:
        src.mkdir(mode=0o755)
        src.chmod(0o755)
        for who in (bob, carol):
            home = src / who.pw_name
            home.mkdir()
            os.chown(home, who.pw_uid, who.pw_gid)
        mine = src / carol.pw_name / "mine"
        mine.write_text("carol's\n")
        os.chown(mine, carol.pw_uid, carol.pw_gid)
        os.setxattr(mine, "user.k", b"v")  # read natively and through bindfs
        leased = src / bob.pw_name / "leased"
        leased.write_text("bob's\n")
        os.chown(leased, bob.pw_uid, bob.pw_gid)
        big = src / bob.pw_name / "big"
        big.mkdir()
        for i in range(BIG_DIR_ENTRIES):
            os.close(os.open(big / f"entry-{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644))
        subprocess.run(["chown", "-R", f"{bob.pw_uid}:{bob.pw_gid}", str(big)], check=True)
        damaged = src / bob.pw_name / "damaged"
        damaged.mkdir()
        torn = (Path(__file__).resolve().parent.parent / "tests" / "data" / "conformance"
                / "records" / "torn.1800000000000").read_bytes()
        for i in range(DAMAGED_JOURNALS):
            (damaged / (f"q{i:04d}-" + "n" * 200 + ".1800000000000")).write_bytes(torn)
        subprocess.run(["chown", "-R", f"{bob.pw_uid}:{bob.pw_gid}", str(damaged)], check=True)
        with contextlib.ExitStack() as mounts:
            mounts.enter_context(journalfs_mount(src, roots["journalfs"], work / "store", log))
            if other:
                name, _, value = variant.partition("=")
                mounts.enter_context(journalfs_mount(src, roots[other], work / "store-variant",
                                                     work / "variant.log", {name: value}))
            mounts.enter_context(bindfs_mount(src, roots["bindfs"]))
            keys = {"native": "user.k", "bindfs": "user.k"}
            for target in jfs_targets:
                os.setxattr(roots[target] / carol.pw_name / "mine", "user.metadata.k", b"v")
                keys[target] = "user.metadata.k"
            # carol's own small journals (a 4 kB Wallaby index of 7 records), new ones all
            # the time: each view is found, indexed, listed and read for the first time
            carol_template = work / "carol-template.idx"
            shutil.copyfile(REPO / "tests" / "data" / "conformance" / "records" / "wal0.log.idx",
                            carol_template)
            carol_template.chmod(0o644)
            carol_views = {target: {"home": str(src / carol.pw_name),
                                    "template": str(carol_template),
                                    "views": str(roots[target] / ".journalfs" / "records"
                                                 / carol.pw_name)}
                           for target in jfs_targets}

            def wanted(name: str) -> bool:
                return only is None or name.split()[0] in only

            def phase(name: str, targets, attack) -> None:
                if attack and not wanted(name):
                    return
                results["phases"][name] = {}
                for target in targets:
                    root = roots[target]
                    procs = attack(root) if attack else []
                    try:
                        time.sleep(0.5 if attack else 0)  # let the attack start
                        results["phases"][name][target] = probe(
                            carol, root / carol.pw_name / "mine", keys[target], seconds,
                            carol_views.get(target))
                    finally:
                        stop(procs)
                    time.sleep(0.5)

            phase("idle", targets, None)

            def lease_attack(root):
                holder = as_user(bob, LEASE_HOLDER, str(leased))
                assert holder.stdout.readline().strip() == "leased"
                return [holder, as_user(bob, OPENERS, str(root / bob.pw_name / "leased"), "8")]
            phase("1 lease on bob's file, bob opens it", targets, lease_attack)

            template = src / bob.pw_name / "template.idx"  # a real 4 kB Wallaby index
            shutil.copyfile(REPO / "tests" / "data" / "conformance" / "records" / "wal0.log.idx",
                            template)
            os.chown(template, bob.pw_uid, bob.pw_gid)
            def views(root):
                return str(root / ".journalfs" / "records" / bob.pw_name)
            phase("4 bob's 1 GiB sparse .idx copies, views listed and read", jfs_targets,
                  lambda root: [as_user(bob, HUGE_VIEWS, str(src / bob.pw_name), views(root),
                                        str(template), str(1 << 30), "sparse")])
            phase("4 bob's 64 MiB .idx of written zeros, views listed", jfs_targets,
                  lambda root: [as_user(bob, HUGE_VIEWS, str(src / bob.pw_name), views(root),
                                        str(template), str(64 << 20), "dense")])

            phase("5 bob lists 100k entries in a loop", targets,
                  lambda root: [as_user(bob, LISTER, str(root / bob.pw_name / "big"))
                                for _ in range(2)])

            if not wanted("6"):
                return results
            # 6: make the views find the damaged journals, then stat status.json in a loop
            view = roots["journalfs"] / ".journalfs" / "records" / bob.pw_name / "damaged"
            for name in os.listdir(view):
                try:
                    os.getxattr(view / name, "user.journal.damage")
                except OSError:
                    pass
            status = roots["journalfs"] / ".journalfs" / "status.json"
            phase("6 bob stats status.json in a loop", ("journalfs",),
                  lambda root: [as_user(bob, STATTER, str(status)) for _ in range(2)])
            doc = json.loads(status.read_bytes())
            results["outcomes"]["6 status.json"] = {
                "size bob sees": os.stat(status).st_size,
                "damaged journals listed (owner only)": len(doc.get("damaged_journals", []))}
            results["outcomes"]["8 hostile name in the log"] = hostile_name_outcome(
                src, roots["journalfs"], bob, log, torn)
            results["outcomes"]["10 setfattr on a 0666 chattr +i file"] = immutable_outcome(
                src, roots, bob)
        results["outcomes"]["11 bob fills the disk"] = reserve_outcome(work, bob)
    finally:
        for target, root in roots.items():
            if target != "native":
                unmount(root)
        subprocess.run(["chattr", "-R", "-i", str(src)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
        for name, made in ((BOB, bob_made), (CAROL, carol_made)):
            if made:
                subprocess.run(["userdel", name], capture_output=True)
    return results


def hostile_name_outcome(src: Path, mnt: Path, bob, log: Path, torn: bytes) -> dict:
    name = (b"x\n2026-11-27T10:00:00 journalfs[1]: INFO setting sync changed to none by uid 0"
            b"\n\x1b[31mred.1800000000000")
    path = os.fsencode(src / bob.pw_name) + b"/" + name
    with open(path, "wb") as f:
        f.write(torn)
    os.chown(path, bob.pw_uid, bob.pw_gid)
    view = os.fsencode(mnt / ".journalfs" / "records" / bob.pw_name) + b"/" + name
    try:
        os.getxattr(view, "user.journal.damage")
    except OSError:
        pass
    time.sleep(1)
    text = log.read_bytes()
    return {"forged lines": sum(line.startswith(b"2026-11-27T10:00:00 journalfs[1]")
                                for line in text.splitlines()),
            "raw ESC bytes": text.count(b"\x1b"),
            "escaped name logged": b"x\\n2026-11-27T10:00:00" in text}


def immutable_outcome(src: Path, roots: dict, bob) -> dict:
    target = src / "frozen"
    target.write_text("x")
    os.chmod(target, 0o666)
    subprocess.run(["chattr", "+i", str(target)], check=True)
    out = {}
    try:
        for where, key in (("native", "user.t"), ("journalfs", "user.metadata.t"),
                           ("bindfs", "user.t")):
            code = ("import os, sys\ntry:\n    os.setxattr(sys.argv[1], sys.argv[2], b'1')\n"
                    "    print('succeeds')\nexcept OSError as exc:\n"
                    "    import errno; print(errno.errorcode[exc.errno])")
            proc = as_user(bob, code, str(roots[where] / "frozen"), key)
            out[where] = proc.communicate(timeout=60)[0].strip()
    finally:
        subprocess.run(["chattr", "-i", str(target)], check=True)
    return out


def reserve_outcome(work: Path, bob) -> dict:
    """A 32 MiB ext4 (5% reserved for root) as SOURCE; bob fills it natively, through
    journalfs and through bindfs: bytes he got, and root's reserve left."""
    image, disk = work / "disk.img", work / "disk"
    disk.mkdir()
    subprocess.run(["truncate", "-s", "32M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(disk)], check=True)
    out = {}
    try:
        os.chmod(disk, 0o755)
        home = disk / "bob"
        home.mkdir()
        os.chown(home, bob.pw_uid, bob.pw_gid)
        roots = {"native": disk, "journalfs": work / "jfs11", "bindfs": work / "bindfs11"}
        with journalfs_mount(disk, roots["journalfs"], work / "store11", work / "journalfs11.log"), \
                bindfs_mount(disk, roots["bindfs"]):
            for where in TARGETS:
                proc = as_user(bob, FILL, str(roots[where] / "bob" / "fill"))
                written, err = proc.communicate(timeout=600)
                subprocess.run(["sync", "-f", str(disk)])
                st = os.statvfs(disk)
                out[where] = {"bytes written": int(written or 0) if proc.returncode == 0 else err[-200:],
                              "root's reserve left (KiB)": (st.f_bfree - st.f_bavail) * st.f_frsize // 1024
                              if st.f_bavail else st.f_bfree * st.f_frsize // 1024}
                os.unlink(home / "fill")
                subprocess.run(["sync", "-f", str(disk)])
    finally:
        for attempt in range(20):  # the daemons may still hold it for a moment
            if not os.path.ismount(disk):
                break
            if subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
                time.sleep(0.5)
                if attempt == 19:
                    subprocess.run(["umount", "-l", str(disk)], capture_output=True)
        for line in subprocess.run(["losetup", "-j", str(image)], capture_output=True,
                                   text=True).stdout.splitlines():
            subprocess.run(["losetup", "-d", line.split(":", 1)[0]], capture_output=True)
    return out


def report(res: dict) -> None:
    print(f"carol's latency in ms (p50 / p99 / worst) while bob attacks, {res['seconds_per_phase']:g} s "
          "per target, one run")
    ops = ("stat", "open", "getxattr", "view")
    heads = ("stat", "open+close", "getxattr", "her new small view")
    print(f"{'attack':42} {'target':10} " + " ".join(f"{h:>22}" for h in heads))
    for name, per_target in res["phases"].items():
        for target, r in per_target.items():
            cells = []
            for op in ops:
                s = r["ops"].get(op)
                cells.append(f"{s['p50']:6.2f} {s['p99']:7.2f} {s['worst']:7.1f}" if s else "-")
            errs = f"  errors {r['errors']}" if r["errors"] else ""
            print(f"{name[:42]:42} {target:10} " + " ".join(f"{c:>22}" for c in cells) + errs)
    for name, outcome in res["outcomes"].items():
        print(f"{name}: {json.dumps(outcome)}")
