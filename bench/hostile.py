"""Hostile-user soak: a root mount with allow_other, attacked by a real unprivileged user.

    sudo .venv/bin/python bench/hostile.py [--minutes 10] [--round-seconds 20] [--json out.json]
    sudo .venv/bin/python bench/hostile.py --attacks [--phase-seconds 8]

``--attacks`` runs issue 24's attacks instead (bench/attacks.py): carol's latencies while bob
attacks, through journalfs, on native ext4 and through ``bindfs --multithreaded``, in one run.

Until the time is up, rounds of:
  swap      the user swaps their own SOURCE directory for a symlink to a root-only directory
            (inside and outside SOURCE) while reading, listing, stat-ing and creating files
            through the mount; a leak is any secret read, any root-only name seen or any file
            created in a root-only directory;
  fdreuse   many user threads open, write, unlink, pread, ftruncate, fchmod and close files
            through the mount while others set metadata; a leak is any read returning store
            bytes (gvfs magic), lost is a store that fsck no longer finds sound;
  writers   concurrent user threads set metadata; lost is an acknowledged value not read back;
  fulldisk  the store's filesystem (a real loop-mounted ext4) is filled; the user's setfattr
            must get ENOSPC (never E2BIG or a dead mount); once space is freed every
            acknowledged write must read back.
At the end the mount and the loop filesystem are unmounted and mounted again, and every
acknowledged write of the whole run is read back and the store checked by fsck.
Prints a table and a JSON line; exit 0 when nothing leaked and nothing was lost.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
from diskutil import fill, small_disk  # noqa: E402
from journalfs.metastore.fsck import check_store  # noqa: E402

USER = "jfs-hostile"
SECRET = b"ROOT-ONLY-SECRET-7f3a"
STORE_MAGICS = (b"\xda\x1ajour", b"\xda\x1ameta")
SYSTEM_PYTHON = "/usr/bin/python3"

# Runs as the unprivileged user under the system python (stdlib only); JSON in, JSON out.
USER_SCRIPT = r"""
import base64, errno, json, os, random, sys, threading, time
cfg = json.load(sys.stdin)
mode, until = cfg["mode"], time.monotonic() + cfg["seconds"]
out = {"tries": 0, "leaks": [], "errors": {}, "acked": {}}
lock = threading.Lock()
secret = cfg["secret"].encode()
magics = [base64.b64decode(m) for m in cfg["magics"]]

def err(exc):
    name = errno.errorcode.get(exc.errno, str(exc.errno))
    with lock:
        out["errors"][name] = out["errors"].get(name, 0) + 1

def leak(what):
    with lock:
        if len(out["leaks"]) < 50:
            out["leaks"].append(what)

def tried(n=1):
    with lock:
        out["tries"] += n

if mode == "swap":
    src, mnt, targets = cfg["src"], cfg["mnt"], cfg["targets"]
    d, real = os.path.join(src, "d"), os.path.join(src, "d.real")
    stop = threading.Event()
    def swapper():
        i = 0
        while not stop.is_set():
            i += 1
            try:
                os.rename(d, real)
                os.symlink(targets[i % len(targets)], d)
                time.sleep(random.choice((0.0005, 0.005, 0.05)))  # short and long windows
                os.unlink(d)
                os.rename(real, d)
            except OSError:
                if os.path.islink(d):
                    os.unlink(d)
                if os.path.isdir(real) and not os.path.exists(d):
                    os.rename(real, d)
    t = threading.Thread(target=swapper)
    t.start()
    n = 0
    md = os.path.join(mnt, "d")
    while time.monotonic() < until:
        n += 1
        tried(4)
        try:
            names = os.listdir(md)
            if "s.txt" in names:
                leak("listed a root-only directory through the mount")
        except OSError as exc:
            err(exc)
        try:
            with open(os.path.join(md, "s.txt"), "rb") as f:
                if secret in f.read():
                    leak("read a root-only file through the mount")
        except OSError as exc:
            err(exc)
        try:
            os.stat(os.path.join(md, "s.txt"))
            leak("stat of a file in a root-only directory")
        except OSError as exc:
            err(exc)
        try:
            fd = os.open(os.path.join(md, "pwn-%d" % n), os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
            os.close(fd)
        except OSError as exc:
            err(exc)
    stop.set()
    t.join()
elif mode == "fdreuse":
    mnt = cfg["mnt"]
    def churn(w):
        i = 0
        while time.monotonic() < until:
            i += 1
            p = os.path.join(mnt, "t%d-%d" % (w, i))
            try:
                fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o600)
            except OSError as exc:
                err(exc)
                continue
            try:
                os.write(fd, b"user data " * 40)
                os.unlink(p)
                data = os.pread(fd, 64, 0)
                if any(data.startswith(m) for m in magics):
                    leak("read store bytes through an unlinked file's handle")
                os.ftruncate(fd, 10)
                os.fstat(fd)
                os.fchmod(fd, 0o644)
                data = os.pread(fd, 64, 0)
                if any(data.startswith(m) for m in magics):
                    leak("read store bytes after ftruncate")
            except OSError as exc:
                err(exc)
            finally:
                os.close(fd)
            tried()
    def setter(w):
        target = os.path.join(mnt, "meta-%d" % w)
        open(target, "wb").close()
        i = 0
        while time.monotonic() < until:
            i += 1
            try:
                os.setxattr(target, "user.metadata.k", b"v%d" % i)
                out["acked"]["meta-%d\0user.metadata.k" % w] = "v%d" % i
            except OSError as exc:
                err(exc)
            tried()
    threads = [threading.Thread(target=churn, args=(w,)) for w in range(cfg["threads"])]
    threads += [threading.Thread(target=setter, args=(w,)) for w in range(2)]
    for t in threads: t.start()
    for t in threads: t.join()
elif mode in ("writers", "fulldisk"):
    mnt, files, keys = cfg["mnt"], cfg["files"], cfg["keys"]
    stop_on_full = mode == "fulldisk"
    full = threading.Event()
    def writer(w):
        i = 0
        while time.monotonic() < until and not full.is_set():
            i += 1
            name, key = "w-%d" % ((w * 7 + i) % files), "user.metadata.%s%d" % (cfg["tag"], (w + i) % keys)
            value = "%s.%d.%d:" % (cfg["tag"], w, i) + "x" * cfg["value_size"]
            try:
                os.setxattr(os.path.join(mnt, name), key, value.encode())
                with lock:
                    out["acked"][name + "\0" + key] = value
            except OSError as exc:
                err(exc)
                if stop_on_full and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    full.set()
            tried()
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(cfg["threads"])]
    for t in threads: t.start()
    for t in threads: t.join()
json.dump(out, sys.stdout)
"""


def ensure_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
                       check=False, capture_output=True)
        return pwd.getpwnam(USER)


def as_user(user: pwd.struct_passwd, cfg: dict) -> dict:
    cfg = dict(cfg, secret=SECRET.decode(), magics=[base64.b64encode(m).decode() for m in STORE_MAGICS])
    proc = subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups",
                           "--reset-env", SYSTEM_PYTHON, "-c", USER_SCRIPT],
                          input=json.dumps(cfg), capture_output=True, text=True,
                          timeout=cfg["seconds"] + 300)
    if proc.returncode != 0:
        raise RuntimeError(f"user script ({cfg['mode']}) failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


class Mount:
    def __init__(self, src: Path, mnt: Path, store: Path, log: Path):
        self.src, self.mnt, self.store, self.log = src, mnt, store, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "journalfs.cli", "mount", "--foreground",
                                          "-o", "allow_other", "--store", str(self.store),
                                          str(self.src), str(self.mnt)],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=err, env=env)
        deadline = time.monotonic() + 30
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mount failed: {self.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and os.path.ismount(self.mnt)

    def stop(self) -> int | None:
        if os.path.ismount(self.mnt):
            if subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True).returncode:
                time.sleep(0.5)
                subprocess.run(["fusermount3", "-uz", str(self.mnt)], capture_output=True)
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def read_back(mnt: Path, acked: dict[str, str]) -> list[str]:
    lost = []
    for ident, value in acked.items():
        name, key = ident.split("\0")
        try:
            got = os.getxattr(mnt / name, key).decode()
        except OSError as exc:
            got = f"<{exc.strerror}>"
        if got != value:
            lost.append(f"{name} {key}: {got[:40]!r} != {value[:40]!r}")
    return lost


def store_tree(store: Path) -> Path:
    return next(p for p in store.iterdir() if p.name in ("home", "root"))


def store_sound(store: Path) -> bool:
    return not [f for f in check_store(str(store_tree(store))) if f.severity == "error"]


def run(minutes: float, round_seconds: float) -> dict:
    user = ensure_user()
    work = Path(tempfile.mkdtemp(prefix="jfs-hostile-", dir="/tmp"))
    work.chmod(0o755)
    src, mnt = work / "src", work / "mnt"
    for d in (src, mnt):
        d.mkdir()
        d.chmod(0o755)
    own = src / "u"
    (own / "d").mkdir(parents=True)
    (own / "d" / "mine.txt").write_text("mine\n")
    secret_in, secret_out = src / "secret", work / "outside-secret"
    for d in (secret_in, secret_out):
        d.mkdir(mode=0o700)
        (d / "s.txt").write_bytes(SECRET + b"\n")
    for p in (own, own / "d", own / "d" / "mine.txt"):
        os.chown(p, user.pw_uid, user.pw_gid)
    results = {name: {"rounds": 0, "tries": 0, "leaks": [], "lost": [], "errors": {}}
               for name in ("swap", "fdreuse", "writers", "fulldisk")}
    acked_all: dict[str, str] = {}
    deadline = time.monotonic() + minutes * 60
    log = work / "journalfs.log"
    final = {}
    try:
        with small_disk(work / "loop", "24M") as disk:
            store = disk / "store"
            mount = Mount(src, mnt, store, log)
            mount.start()
            (src / "u").chmod(0o755)
            rnd = 0
            while time.monotonic() < deadline:
                rnd += 1
                secs = max(2.0, min(round_seconds, deadline - time.monotonic()))
                # swap
                out = as_user(user, {"mode": "swap", "seconds": secs / 4, "src": str(own),
                                     "mnt": str(mnt / "u"), "targets": [str(secret_in), str(secret_out)]})
                planted = [str(p) for d in (secret_in, secret_out) for p in d.glob("pwn-*")]
                for p in planted:
                    os.unlink(p)
                if planted:
                    out["leaks"].append(f"{len(planted)} files created in root-only directories")
                merge(results["swap"], out)
                # fdreuse
                fd_dir = mnt / "u"
                out = as_user(user, {"mode": "fdreuse", "seconds": secs / 4, "mnt": str(fd_dir), "threads": 6})
                if not store_sound(store):
                    out["lost"] = ["store damaged (fsck) after the fd-reuse round"]
                acked_all.update({f"u/{k}": v for k, v in out["acked"].items()})
                merge(results["fdreuse"], out)
                # writers
                for i in range(8):
                    (src / f"w-{i}").write_text("w")
                    os.chmod(src / f"w-{i}", 0o666)
                out = as_user(user, {"mode": "writers", "seconds": secs / 4, "mnt": str(mnt), "files": 8,
                                     "keys": 5, "threads": 8, "tag": f"r{rnd}", "value_size": 40})
                out["lost"] = read_back(mnt, out["acked"])
                acked_all.update(out["acked"])
                merge(results["writers"], out)
                # fulldisk
                filler = fill(disk)
                out = as_user(user, {"mode": "fulldisk", "seconds": max(secs / 4, 30), "mnt": str(mnt),
                                     "files": 8, "keys": 7, "threads": 4, "tag": f"f{rnd}",
                                     "value_size": 1500})
                filler.unlink()
                bad = {e: n for e, n in out["errors"].items() if e not in ("ENOSPC", "EDQUOT")}
                if bad:
                    out["leaks"].append(f"errors other than ENOSPC on a full disk: {bad}")
                if "ENOSPC" not in out["errors"] and "EDQUOT" not in out["errors"]:
                    out["leaks"].append("the disk never reported full to the user")
                if not mount.alive():
                    out["lost"].append("the daemon died on the full disk")
                    break
                out["lost"] = out.get("lost", []) + read_back(mnt, out["acked"])
                acked_all.update(out["acked"])
                merge(results["fulldisk"], out)
                status = json.loads((mnt / ".journalfs" / "status.json").read_text())
                results["fulldisk"]["background_errors"] = status["service"].get("background_error_count")
            code = mount.stop()
            final["daemon_exit"] = code
            subprocess.run(["umount", str(disk)], check=True)
            for line in subprocess.run(["losetup", "-j", str(work / "loop" / "disk.img")],
                                       capture_output=True, text=True).stdout.splitlines():
                subprocess.run(["losetup", "-d", line.split(":", 1)[0]], capture_output=True)
            subprocess.run(["mount", "-o", "loop", str(work / "loop" / "disk.img"), str(disk)], check=True)
            final["store_sound_after_remount"] = store_sound(store)
            mount = Mount(src, mnt, store, log)
            mount.start()
            final["lost_after_remount"] = read_back(mnt, acked_all)[:50]
            final["acknowledged_writes"] = len(acked_all)
            mount.stop()
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    return {"minutes": minutes, "checks": results, "final": final}


def merge(into: dict, out: dict) -> None:
    into["rounds"] += 1
    into["tries"] += out.get("tries", 0)
    into["leaks"] += out.get("leaks", [])[: max(0, 20 - len(into["leaks"]))]
    into["lost"] += out.get("lost", [])[: max(0, 20 - len(into["lost"]))]
    for e, n in out.get("errors", {}).items():
        into["errors"][e] = into["errors"].get(e, 0) + n


def report(res: dict) -> bool:
    print(f"hostile soak: {res['minutes']} min, a real unprivileged user ({USER}) on a root "
          "allow_other mount")
    print(f"{'check':10} {'rounds':>6} {'tries':>9} {'leaks':>6} {'lost':>5}  errnos seen by the user")
    ok = True
    for name, r in res["checks"].items():
        errs = ", ".join(f"{e} {n}" for e, n in sorted(r["errors"].items(), key=lambda x: -x[1])[:5])
        print(f"{name:10} {r['rounds']:>6} {r['tries']:>9} {len(r['leaks']):>6} {len(r['lost']):>5}  {errs}")
        for what in r["leaks"][:3] + r["lost"][:3]:
            print(f"    {what}")
        ok &= not r["leaks"] and not r["lost"]
    fin = res["final"]
    print(f"after unmount + remount: {fin.get('acknowledged_writes', 0)} acknowledged writes, "
          f"{len(fin.get('lost_after_remount', []))} lost; store sound by fsck: "
          f"{fin.get('store_sound_after_remount')}; daemon exit {fin.get('daemon_exit')}")
    ok &= not fin.get("lost_after_remount") and bool(fin.get("store_sound_after_remount")) \
        and fin.get("daemon_exit") == 0
    print("RESULT:", "nothing leaked, nothing lost" if ok else "LEAKS OR LOSSES (see above)")
    print(json.dumps({"hostile": res, "ok": ok}))
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--round-seconds", type=float, default=20.0)
    ap.add_argument("--json", help="also write the JSON result here")
    ap.add_argument("--attacks", action="store_true",
                    help="issue 24's attacks side by side with native and bindfs instead")
    ap.add_argument("--phase-seconds", type=float, default=8.0,
                    help="with --attacks: seconds carol probes per attack and target")
    ap.add_argument("--only", action="append", metavar="N",
                    help="with --attacks: run only attack N (repeatable; idle always runs)")
    ap.add_argument("--variant", metavar="VAR=VALUE",
                    help="with --attacks: also probe a second journalfs mount whose daemon runs "
                         "with VAR=VALUE in its environment (before/after in one run; "
                         "PYTHONPATH=/work/main runs that tree's code)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("hostile.py: must run as root (it mounts with allow_other and a loop filesystem)",
              file=sys.stderr)
        return 2
    if args.attacks:
        import attacks
        res = attacks.run_attacks(args.phase_seconds, set(args.only) if args.only else None,
                                  args.variant)
        attacks.report(res)
        print(json.dumps({"attacks": res}))
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=1))
        return 0
    res = run(args.minutes, args.round_seconds)
    ok = report(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
