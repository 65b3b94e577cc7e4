"""A private, real GNOME gvfs metadata daemon for tests (and benchmarks).

`GvfsSession` starts its own D-Bus session bus (listening only on a unix socket in a
temporary directory, no service files) and on it `/usr/libexec/gvfsd --no-fuse` (GIO only
uses the gvfs VFS, which carries `metadata::*`, when that daemon is on the bus) and
`/usr/libexec/gvfsd-metadata`, with HOME and the XDG directories inside a scratch
directory, so nothing touches the real user's session. Everything it starts is stopped by
pid in `stop()` (the fixtures do that also when a test fails).

GIO runs in Debian's /usr/bin/python3 (python3-gi), the way GNOME applications use it:
`gio_metadata()` reads exactly (stringv values as lists: `gio info` prints `[a, b]`,
which is ambiguous), `gio_set()`/`gio_apply()` write (gvfsd-metadata stores the writes).

    with GvfsSession() as gvfs:
        gvfs.create_files(["/docs/a.txt"])                   # store path -> file under HOME
        gvfs.gio_set(gvfs.file_of("/docs/a.txt"), "comment", "hi")
        gvfs.gio_store_metadata(["/docs/a.txt"])             # {"/docs/a.txt": {"comment": "hi"}}
        gvfs.install_store(my_tree)                          # use a journalfs-written store

Fixtures: `gvfs_session` (function scope), `gvfs_module_session` (module scope); import
them into a test module: `from gvfsd import gvfs_session  # noqa: F401` (tests/ is on
sys.path). `GvfsModel` is a reference model of gvfs store semantics; `random_op` /
`apply_to_store` drive random operation sequences.
"""
from __future__ import annotations

import bisect
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterable, Sequence

import pytest

DBUS_DAEMON = "/usr/bin/dbus-daemon"
GVFSD_METADATA = "/usr/libexec/gvfsd-metadata"
# GIO only uses the gvfs VFS (which carries metadata::*) when the main gvfs daemon is on the bus
GVFSD = "/usr/libexec/gvfsd"
GVFSD_BUS_NAME = "org.gtk.vfs.Daemon"
GIO = "/usr/bin/gio"
SYSTEM_PYTHON = "/usr/bin/python3"  # has python3-gi; the venv does not
METADATA_BUS_NAME = "org.gtk.vfs.Metadata"
START_TIMEOUT = 20.0

Value = str | list[str]

_BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
{servicedir}  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""

# Runs under /usr/bin/python3: reads metadata::* of every path given on stdin (JSON list)
# and prints {path: {key: str | [str]}} (paths without keys or that do not exist left out).
_GIO_READ_SCRIPT = r"""
import json, sys
import gi
gi.require_version("Gio", "2.0")
from gi.repository import Gio, GLib
out = {}
for p in json.load(sys.stdin):
    f = Gio.File.new_for_path(p)
    try:
        info = f.query_info("metadata::*", Gio.FileQueryInfoFlags.NOFOLLOW_SYMLINKS, None)
    except GLib.Error:
        continue
    m = {}
    for a in info.list_attributes("metadata") or []:
        k = a[len("metadata::"):]
        if info.get_attribute_type(a) == Gio.FileAttributeType.STRINGV:
            m[k] = list(info.get_attribute_stringv(a))
        else:
            m[k] = info.get_attribute_string(a)
    if m:
        out[p] = m
json.dump(out, sys.stdout, ensure_ascii=False)
"""

# Runs under /usr/bin/python3: applies operations through GIO, the way GNOME applications
# do: ["set", path, key, value | [values] | null (unset)], ["move", src, dst],
# ["remove", path], ["touch", path] (an empty file, made with plain os calls).
_GIO_WRITE_SCRIPT = r"""
import json, os, sys
import gi
gi.require_version("Gio", "2.0")
from gi.repository import Gio
NOFOLLOW = Gio.FileQueryInfoFlags.NOFOLLOW_SYMLINKS
for op, p, *args in json.load(sys.stdin):
    f = Gio.File.new_for_path(p)
    if op == "set":
        k, v = args
        a = "metadata::" + k
        if v is None:
            f.set_attribute(a, Gio.FileAttributeType.INVALID, None, NOFOLLOW, None)
        elif isinstance(v, list):
            info = Gio.FileInfo()
            info.set_attribute_stringv(a, v)
            f.set_attributes_from_info(info, NOFOLLOW, None)
        else:
            f.set_attribute_string(a, v, NOFOLLOW, None)
    elif op == "move":
        f.move(Gio.File.new_for_path(args[0]), Gio.FileCopyFlags.NONE, None, None, None)
    elif op == "remove":
        f.delete(None)
    elif op == "touch":
        os.makedirs(os.path.dirname(p), exist_ok=True)
        open(p, "a").close()
    else:
        sys.exit("unknown op " + op)
"""


class GvfsSessionError(RuntimeError):
    pass


class GvfsSession:
    """A private D-Bus session bus + gvfsd-metadata with a scratch HOME."""

    def __init__(self, scratch: Path | str | None = None, *, activatable: bool = False,
                 start_metadata_daemon: bool = True):
        """``activatable``: the bus starts gvfsd-metadata when a GIO program first asks for
        it (D-Bus activation, as on a desktop); ``start_metadata_daemon=False``: do not start
        it up front."""
        self.activatable = activatable
        self.start_metadata_daemon = start_metadata_daemon
        self._activated: set[int] = set()  # pids of gvfsd-metadata the bus started
        # unix socket paths are limited to 108 bytes: keep the bus in a short /tmp dir
        self._bus_dir = Path(tempfile.mkdtemp(prefix="jfs-bus-"))
        self._own_scratch = scratch is None
        self.scratch = Path(scratch) if scratch else Path(tempfile.mkdtemp(prefix="jfs-gvfs-"))
        self.home = self.scratch / "home"
        self.address = ""
        self._bus: subprocess.Popen | None = None
        self._daemon: subprocess.Popen | None = None
        self._gvfsd: subprocess.Popen | None = None
        self._daemon_log = self.scratch / "gvfsd-metadata.log"

    # ---- paths -----------------------------------------------------------------------
    @property
    def metadata_dir(self) -> Path:
        """Where gvfsd-metadata keeps its stores (`home`, `root`, ...)."""
        return self.home / ".local" / "share" / "gvfs-metadata"

    @property
    def home_tree(self) -> Path:
        return self.metadata_dir / "home"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "GIO_", "GVFS_"))}
        env.update(
            HOME=str(self.home),
            XDG_DATA_HOME=str(self.home / ".local" / "share"),
            XDG_CONFIG_HOME=str(self.home / ".config"),
            XDG_CACHE_HOME=str(self.home / ".cache"),
            XDG_RUNTIME_DIR=str(self.scratch / "run"),
            DBUS_SESSION_BUS_ADDRESS=self.address,
            GVFS_DISABLE_FUSE="1",
            LC_ALL="C.UTF-8",
        )
        return env

    def store_path(self, path: Path | str) -> str:
        """The home-tree store path of a file under HOME ("/docs/a.txt")."""
        return "/" + os.path.relpath(Path(path), self.home)

    # ---- lifecycle -----------------------------------------------------------------
    def start(self) -> "GvfsSession":
        for d in (self.metadata_dir, self.home / ".config", self.home / ".cache"):
            d.mkdir(parents=True, exist_ok=True)
        (self.scratch / "run").mkdir(mode=0o700, exist_ok=True)
        try:
            self._start_bus()
            self._gvfsd = self._start_on_bus([GVFSD, "--no-fuse"], GVFSD_BUS_NAME)
            if self.start_metadata_daemon:
                self.start_daemon()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_bus(self) -> None:
        config = self._bus_dir / "bus.conf"
        servicedir = ""
        if self.activatable:
            services = self._bus_dir / "services"
            services.mkdir()
            (services / f"{METADATA_BUS_NAME}.service").write_text(
                f"[D-BUS Service]\nName={METADATA_BUS_NAME}\nExec={GVFSD_METADATA}\n")
            servicedir = f"  <servicedir>{services}</servicedir>\n"
        config.write_text(_BUS_CONFIG.format(socket=self._bus_dir / "bus", servicedir=servicedir))
        # activated services inherit the bus's environment: the scratch HOME, not ours
        env = {k: v for k, v in self.env().items() if k != "DBUS_SESSION_BUS_ADDRESS"}
        self._bus = subprocess.Popen(
            [DBUS_DAEMON, f"--config-file={config}", "--nofork", "--nopidfile", "--print-address=1"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env,
            cwd=self.scratch,
        )
        line = self._bus.stdout.readline().decode().strip()  # printed once it listens
        if not line.startswith("unix:"):
            raise GvfsSessionError(f"dbus-daemon did not start (exit {self._bus.poll()})")
        self.address = line

    def start_daemon(self) -> None:
        """(Re)start gvfsd-metadata and wait until it owns its bus name."""
        self._daemon = self._start_on_bus([GVFSD_METADATA], METADATA_BUS_NAME)

    def _start_on_bus(self, argv: list[str], bus_name: str) -> subprocess.Popen:
        with open(self._daemon_log, "ab") as log:
            # cwd: gvfsd-metadata resolves relative tree names against it
            proc = subprocess.Popen(argv, env=self.env(), cwd=self.scratch, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + START_TIMEOUT
        while not self.name_on_bus(bus_name):
            if proc.poll() is not None:
                raise GvfsSessionError(f"{argv[0]} exited ({proc.returncode}): {self.daemon_log()}")
            if time.monotonic() > deadline:
                _stop(proc, signal.SIGTERM)
                raise GvfsSessionError(f"{argv[0]} did not take its bus name {bus_name}")
            time.sleep(0.05)
        return proc

    @property
    def daemon_pid(self) -> int | None:
        return self._daemon.pid if self._daemon and self._daemon.poll() is None else None

    def daemon_log(self) -> str:
        try:
            return self._daemon_log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def daemon_on_bus(self) -> bool:
        return self.name_on_bus(METADATA_BUS_NAME)

    def name_owner_pid(self, bus_name: str = METADATA_BUS_NAME) -> int | None:
        """pid of the process owning ``bus_name`` on this bus (None: nobody)."""
        from jeepney import DBusAddress, new_method_call
        from jeepney.io.blocking import open_dbus_connection
        bus = DBusAddress("/org/freedesktop/DBus", bus_name="org.freedesktop.DBus",
                          interface="org.freedesktop.DBus")
        with open_dbus_connection(self.address) as conn:
            reply = conn.send_and_get_reply(
                new_method_call(bus, "GetConnectionUnixProcessID", "s", (bus_name,)), timeout=5)
        return reply.body[0] if reply.body and isinstance(reply.body[0], int) else None

    def activated_daemon_pid(self) -> int | None:
        """pid of a gvfsd-metadata the bus started on demand (None if journalfs or nobody
        owns the name); remembered, so stop() ends it by pid."""
        pid = self.name_owner_pid()
        if pid is None or _comm(pid) != "gvfsd-metadata" or (self._daemon and pid == self._daemon.pid):
            return None
        self._activated.add(pid)
        return pid

    def stop_activated_daemon(self) -> None:
        """SIGTERM (gvfsd-metadata writes its trees out) the daemons the bus started; wait."""
        self.activated_daemon_pid()
        for pid in sorted(self._activated):
            _stop_pid(pid, signal.SIGTERM)
        self._activated.clear()

    def name_on_bus(self, bus_name: str) -> bool:
        from jeepney import DBusAddress, new_method_call
        from jeepney.io.blocking import open_dbus_connection
        bus = DBusAddress("/org/freedesktop/DBus", bus_name="org.freedesktop.DBus",
                          interface="org.freedesktop.DBus")
        with open_dbus_connection(self.address) as conn:
            reply = conn.send_and_get_reply(new_method_call(bus, "NameHasOwner", "s", (bus_name,)),
                                            timeout=5)
        return bool(reply.body[0])

    def stop_daemon(self, sig: int = signal.SIGTERM) -> int | None:
        """Stop gvfsd-metadata (SIGTERM: it writes out a rotated tree on exit)."""
        proc, self._daemon = self._daemon, None
        return _stop(proc, sig)

    def stop(self) -> None:
        self.stop_daemon()
        if self._bus is not None and self._bus.poll() is None and self.address:
            try:
                self.stop_activated_daemon()
            except Exception:  # noqa: BLE001 -- the bus may be gone; the daemon then exits too
                pass
        gvfsd, self._gvfsd = self._gvfsd, None
        _stop(gvfsd, signal.SIGTERM)
        bus, self._bus = self._bus, None
        _stop(bus, signal.SIGTERM)
        shutil.rmtree(self._bus_dir, ignore_errors=True)
        if self._own_scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> "GvfsSession":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- GIO -----------------------------------------------------------------------
    def gio(self, *args: str | Path, check: bool = True) -> str:
        """Run /usr/bin/gio with this session's environment; returns stdout."""
        p = subprocess.run([GIO, *map(str, args)], env=self.env(), capture_output=True, text=True, timeout=60)
        if check and p.returncode != 0:
            raise GvfsSessionError(f"gio {' '.join(map(str, args))}: exit {p.returncode}: {p.stderr.strip()}")
        return p.stdout

    def _system_python(self, script: str, payload) -> str:
        p = subprocess.run([SYSTEM_PYTHON, "-c", script], env=self.env(), input=json.dumps(payload),
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise GvfsSessionError(f"GIO helper failed (exit {p.returncode}): {p.stderr.strip()[-1000:]}")
        return p.stdout

    def gio_metadata(self, paths: Iterable[Path | str]) -> dict[str, dict[str, Value]]:
        """{path: {key: str | [str]}} as GIO reads it; paths with no keys are left out.

        One fresh process per call, so GIO never answers from an earlier mapping."""
        return json.loads(self._system_python(_GIO_READ_SCRIPT, [str(p) for p in paths]))

    def gio_set(self, path: Path | str, key: str, value: Value | None) -> None:
        """`gio set` one key: a str, a list (stringv), or None to unset."""
        values = value if isinstance(value, list) else [value]
        if any(v is not None and v.startswith("-") for v in values):
            # gio's option parser would take these for options (and keeps a "--")
            return self.gio_set_many([(path, key, value)])
        if value is None:
            self.gio("set", "-n", "-t", "unset", path, f"metadata::{key}")
        elif isinstance(value, list):
            self.gio("set", "-n", "-t", "stringv", path, f"metadata::{key}", *value)
        else:
            self.gio("set", "-n", path, f"metadata::{key}", value)

    def gio_set_many(self, writes: Sequence[tuple[Path | str, str, Value | None]]) -> None:
        """Apply many writes through GIO in one process (None unsets)."""
        self.gio_apply([("set", p, k, v) for p, k, v in writes])

    def gio_apply(self, ops: Sequence[Sequence]) -> None:
        """Run many GIO operations in one process, in order (file paths, not store paths):
        ("set", file, key, value|list|None), ("move", src, dst), ("remove", file),
        ("touch", file)."""
        if ops:
            self._system_python(_GIO_WRITE_SCRIPT, [[op[0], *map(_jsonable, op[1:])] for op in ops])

    def gio_move(self, src: Path | str, dst: Path | str) -> None:
        """`gio move`: the file moves and its metadata (subtree included) follows."""
        self.gio("move", src, dst)

    def gio_remove(self, path: Path | str) -> None:
        self.gio("remove", path)

    # ---- store <-> files -------------------------------------------------------------
    def file_of(self, store_path: str) -> Path:
        """The file under HOME that a home-tree store path names."""
        return self.home / store_path.lstrip("/")

    def create_files(self, store_paths: Iterable[str]) -> None:
        """Make every store path exist under HOME (GIO reports metadata of existing
        files only): a path that is an ancestor of another becomes a directory (an
        empty file made by an earlier call is replaced), the others empty files."""
        paths = sorted(set(store_paths) - {"/"})
        parents = {p.rsplit("/", 1)[0] for p in paths}
        for p in paths:
            f = self.file_of(p)
            if p in parents:
                _make_dirs(f)
            elif not f.exists():
                _make_dirs(f.parent)
                f.write_bytes(b"")

    def install_store(self, tree: Path | str, restart_daemon: bool = True) -> None:
        """Copy a store (tree file + its journals) in as this HOME's `home` store,
        replacing what was there. A running gvfsd-metadata is restarted around the copy
        (it may hold the old store open, and writes it out when it exits); pass
        restart_daemon=False when nothing wrote through it since it started."""
        tree = Path(tree)
        running = self._daemon is not None and restart_daemon
        if running:
            self.stop_daemon()
        for old in self.metadata_dir.glob("home*"):
            old.unlink()
        shutil.copyfile(tree, self.home_tree)
        for journal in tree.parent.glob(tree.name + "-*.log"):
            shutil.copyfile(journal, self.metadata_dir / ("home" + journal.name[len(tree.name):]))
        if running:
            self.start_daemon()

    def gio_store_metadata(self, store_paths: Iterable[str]) -> dict[str, dict[str, Value]]:
        """gio_metadata keyed by store path; the paths must exist (see create_files)."""
        by_file = {str(self.file_of(p)): p for p in store_paths}
        return {by_file[f]: keys for f, keys in self.gio_metadata(by_file).items()}


class GvfsModel:
    """What a gvfs store should hold after a sequence of journal operations
    (specs/gvfs-metadata.md "Compaction semantics"): {path: {key: value}}."""

    def __init__(self, state: dict[str, dict[str, Value]] | None = None):
        self.state = {p: dict(k) for p, k in (state or {}).items()}
        self._sorted: list[str] | None = None  # sorted paths, rebuilt lazily for subtree scans

    def apply(self, op: Sequence) -> None:
        kind, path, *args = op
        if kind in ("set", "setv"):
            if path not in self.state:
                self._sorted = None
            self.state.setdefault(path, {})[args[0]] = list(args[1]) if kind == "setv" else args[1]
        elif kind == "unset":
            keys = self.state.get(path, {})
            keys.pop(args[0], None)
            if not keys:
                self.state.pop(path, None)
        elif kind == "remove":
            self._remove(path)
        elif kind == "copy":  # path is the destination
            self._copy(args[0], path)
        elif kind == "move":
            self._copy(path, args[0])
            self._remove(path)
        elif kind != "rotate":
            raise ValueError(f"unknown op {kind}")

    def _subtree(self, root: str) -> list[str]:
        if root == "/":
            return list(self.state)
        if self._sorted is None:
            self._sorted = sorted(self.state)
        # root itself, then everything in [root + "/", root + "0"): "0" follows "/"
        lo = bisect.bisect_left(self._sorted, root)
        hi = bisect.bisect_left(self._sorted, root + "0")
        return [p for p in self._sorted[lo:hi] if p in self.state and (p == root or p[len(root)] == "/")]

    def _remove(self, root: str) -> None:
        for p in self._subtree(root):
            del self.state[p]

    def _copy(self, src: str, dst: str) -> None:
        if src == dst:
            return
        if src == "/":
            raise ValueError("copying the root is not modelled")
        copied = {dst + p[len(src):]: dict(self.state[p]) for p in self._subtree(src)}
        self._remove(dst)
        self.state.update(copied)
        self._sorted = None

    def dump(self) -> dict[str, dict[str, Value]]:
        return {p: dict(k) for p, k in self.state.items() if k}


def _jsonable(x):
    return str(x) if isinstance(x, Path) else x


def _make_dirs(path: Path) -> None:
    for d in reversed([path, *path.parents]):
        if d.is_file():
            d.unlink()
    path.mkdir(parents=True, exist_ok=True)


def _comm(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def _stop_pid(pid: int, sig: int, timeout: float = 10.0) -> None:
    """Signal a process we did not fork (bus-activated) by pid and wait for it to go."""
    if _comm(pid) != "gvfsd-metadata":
        return
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while _comm(pid) == "gvfsd-metadata" and time.monotonic() < deadline:
        time.sleep(0.02)
    if _comm(pid) == "gvfsd-metadata":
        os.kill(pid, signal.SIGKILL)


def _stop(proc: subprocess.Popen | None, sig: int) -> int | None:
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    if proc.stdout:
        proc.stdout.close()
    return proc.returncode


@pytest.fixture
def gvfs_session(tmp_path):
    """A running private gvfsd-metadata; HOME is `tmp_path/gvfs/home`."""
    session = GvfsSession(tmp_path / "gvfs")
    session.scratch.mkdir()
    with session:
        yield session


@pytest.fixture
def gvfs_desktop(tmp_path):
    """A private session as a desktop has it: no gvfsd-metadata running, the bus starts it
    when a GIO program first asks (D-Bus activation). HOME is `tmp_path/gvfs/home`."""
    session = GvfsSession(tmp_path / "gvfs", activatable=True, start_metadata_daemon=False)
    session.scratch.mkdir()
    with session:
        yield session


@pytest.fixture(scope="module")
def gvfs_module_session(tmp_path_factory):
    """One private gvfsd-metadata shared by a test module (cheaper for read-only GIO checks)."""
    with GvfsSession(tmp_path_factory.mktemp("gvfs")) as session:
        yield session


# ---- random operation sequences (shared by the interop and crash tests) --------------
KEYS = ["comment", "emblems", "rating", "custom-icon", "ключ", "a.b.c", "k-" + "z" * 40]
DIRS = ["/data", "/data/dir1", "/data/dir1/sub", "/data/dir 2", "/data/ünï"]
NAMES = ["a.txt", "b b.txt", "日本語.txt", "semi;colon", "quote'd"]


def universe(dirs: Sequence[str] = DIRS, names: Sequence[str] = NAMES) -> list[str]:
    """The store paths random ops touch: every directory and a few files in each."""
    return list(dirs) + [f"{d}/{n}" for d in dirs for n in names]


def random_value(rng) -> str:
    return rng.choice(["hello", "", "value with spaces", "ünïcode ✓", "x" * rng.randint(1, 400),
                       str(rng.randint(0, 10**9)), "tab\there"])


def random_op(rng, paths: Sequence[str]) -> tuple:
    """One op for GvfsModel.apply / apply_to_store. Moves never go into their own subtree."""
    r = rng.random()
    p = rng.choice(paths)
    if r < 0.45:
        return ("set", p, rng.choice(KEYS), random_value(rng))
    if r < 0.65:
        return ("setv", p, rng.choice(KEYS), [rng.choice(["red", "", "ünï", "a,b", "sp ace", "[x]"])
                                              for _ in range(rng.randint(1, 5))])
    if r < 0.77:
        return ("unset", p, rng.choice(KEYS))
    if r < 0.92:
        dst = rng.choice([q for q in paths if not _related(p, q)] or [p + "-moved"])
        return ("move", p, dst)
    return ("remove", p)


def _related(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def apply_to_store(store, op: Sequence):
    """Apply one op to a journalfs MetaStore; returns the write ticket (None for rotate)."""
    kind, path, *args = op
    if kind in ("set", "setv"):
        return store.set(path, args[0], args[1])
    if kind == "unset":
        return store.unset(path, args[0])
    if kind == "remove":
        return store.remove(path)
    if kind == "move":
        return store.move(path, args[0])
    if kind == "copy":
        return store.copy(args[0], path)
    if kind == "rotate":
        store.rotate()
        return None
    raise ValueError(f"unknown op {kind}")
