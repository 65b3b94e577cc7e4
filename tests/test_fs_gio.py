"""The mount and real GNOME gvfs share one metadata store: what setfattr writes through the
mount, `gio info` reads; what `gio set` writes via gvfsd-metadata, getfattr reads through the
mount.  SOURCE lives under the gvfs session's scratch HOME, so store paths are HOME-relative.

One writer per store (issue 14): next to a running gvfsd-metadata the mount joins it; with no
one on the bus journalfs serves org.gtk.vfs.Metadata itself (GIO writes through it, and
gvfsd-metadata, D-Bus-activated after unmount, carries on); without a bus it refuses next to
a running gvfsd-metadata, else takes the store and says so."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gvfsd import gvfs_session  # noqa: F401  (fixture)
from mountutil import mounted

pytestmark = [pytest.mark.fuse, pytest.mark.gvfs]

POLL_TIMEOUT = 20.0  # how long a change may take to cross between gvfsd and the mount


@pytest.fixture
def home_source(gvfs_session, tmp_path, monkeypatch):  # noqa: F811
    """SOURCE = HOME/docs with two files; the mount process inherits the session's HOME/bus."""
    src = gvfs_session.home / "docs"
    src.mkdir()
    (src / "a.txt").write_text("a\n")
    (src / "sub").mkdir()
    (src / "sub" / "b.txt").write_text("b\n")
    for key, value in gvfs_session.env().items():
        monkeypatch.setenv(key, value)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    return src, mnt


def xattr_or_none(path: Path, key: str) -> bytes | None:
    try:
        return os.getxattr(path, f"user.metadata.{key}")
    except OSError:
        return None


def eventually(probe, want, what: str):
    """Poll `probe()` until it returns `want` (changes cross processes asynchronously)."""
    deadline = time.monotonic() + POLL_TIMEOUT
    while (got := probe()) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    assert got == want, f"{what}: got {got!r}, want {want!r}"


def test_setfattr_through_the_mount_is_read_by_gio(gvfs_session, home_source):  # noqa: F811
    src, mnt = home_source
    gvfs_session.stop_daemon()  # store mode: journalfs is the only writer
    with mounted(src, mnt, "--store", str(gvfs_session.metadata_dir), "--sync", "always"):
        os.setxattr(mnt / "a.txt", "user.metadata.comment", "grüße".encode())
        os.setxattr(mnt / "sub" / "b.txt", "user.metadata.emblems", b"important\0urgent\0")
        os.setxattr(mnt / "sub", "user.metadata.color", b"teal")
        # gio reads the store files itself (as every GNOME application does)
        assert gvfs_session.gio_metadata([src / "a.txt", src / "sub" / "b.txt", src / "sub"]) == {
            str(src / "a.txt"): {"comment": "grüße"},
            str(src / "sub" / "b.txt"): {"emblems": ["important", "urgent"]},
            str(src / "sub"): {"color": "teal"},
        }
        assert "metadata::comment: grüße" in gvfs_session.gio("info", "-a", "metadata::*", src / "a.txt")
        os.removexattr(mnt / "a.txt", "user.metadata.comment")
        os.rename(mnt / "sub", mnt / "moved")
        assert gvfs_session.gio_metadata([src / "a.txt", src / "moved", src / "moved" / "b.txt"]) == {
            str(src / "moved" / "b.txt"): {"emblems": ["important", "urgent"]},
            str(src / "moved"): {"color": "teal"},
        }


def test_gio_set_is_read_through_the_mount(gvfs_session, home_source):  # noqa: F811
    src, mnt = home_source
    gvfs_session.gio_set(src / "a.txt", "comment", "from gio")
    gvfs_session.gio_set(src / "sub" / "b.txt", "emblems", ["one", "two"])
    # gvfsd-metadata owns the store while it runs: stop it (it flushes on SIGTERM) first
    gvfs_session.stop_daemon()
    with mounted(src, mnt, "--store", str(gvfs_session.metadata_dir)):
        assert os.getxattr(mnt / "a.txt", "user.metadata.comment") == b"from gio"
        assert os.getxattr(mnt / "sub" / "b.txt", "user.metadata.emblems") == b"one\0two\0"
        assert "user.metadata.comment" in os.listxattr(mnt / "a.txt")
    # and gvfs, started again, still reads its store after journalfs had it
    gvfs_session.start_daemon()
    assert gvfs_session.gio_metadata([src / "a.txt"]) == {str(src / "a.txt"): {"comment": "from gio"}}


def test_gvfs_mode_shares_the_running_daemon(gvfs_session, home_source):  # noqa: F811
    src, mnt = home_source
    gvfs_session.gio_set(src / "a.txt", "before", "mount")
    with mounted(src, mnt, "--gvfs", "--store", str(gvfs_session.metadata_dir)):
        assert os.getxattr(mnt / "a.txt", "user.metadata.before") == b"mount"
        # gio set -> gvfsd-metadata -> store -> the mount
        gvfs_session.gio_set(src / "a.txt", "comment", "via gio")
        eventually(lambda: xattr_or_none(mnt / "a.txt", "comment"), b"via gio", "gio set seen by getfattr")
        gvfs_session.gio_set(src / "sub" / "b.txt", "tags", ["x", "y"])
        eventually(lambda: xattr_or_none(mnt / "sub" / "b.txt", "tags"), b"x\0y\0", "gio stringv")
        # setfattr -> the mount -> (gvfsd) -> store -> gio
        os.setxattr(mnt / "sub" / "b.txt", "user.metadata.note", b"via setfattr")
        eventually(lambda: gvfs_session.gio_metadata([src / "sub" / "b.txt"]).get(str(src / "sub" / "b.txt")),
                   {"tags": ["x", "y"], "note": "via setfattr"}, "setfattr seen by gio")
        gvfs_session.gio_set(src / "a.txt", "comment", None)
        eventually(lambda: xattr_or_none(mnt / "a.txt", "comment"), None, "gio unset seen by getfattr")
        # gvfsd-metadata decides durability and rotation: the mount offers neither, and says so
        control = mnt / ".journalfs"
        names = os.listxattr(control)
        assert "user.journalfs.timeout" in names and "user.journalfs.ro" in names
        assert "user.journalfs.sync" not in names and "user.journalfs.rotate" not in names
        for name, value in (("user.journalfs.sync", b"always"), ("user.journalfs.rotate", b"1")):
            with pytest.raises(OSError) as refused:
                os.setxattr(control, name, value)
            assert refused.value.errno == errno.ENOTSUP, name
            last = status_of(mnt)["last_error"]
            assert last["setting"] == name.rsplit(".", 1)[1] and last["errno"] == "ENOTSUP"
            assert "gvfsd-metadata" in last["message"]
        assert status_of(mnt)["options"]["sync"] is None
    assert gvfs_session.daemon_on_bus(), "the mount must leave the shared gvfsd-metadata running"
    assert gvfs_session.gio_metadata([src / "a.txt", src / "sub" / "b.txt"]) == {
        str(src / "a.txt"): {"before": "mount"},
        str(src / "sub" / "b.txt"): {"tags": ["x", "y"], "note": "via setfattr"},
    }


# ---- one writer per gvfs store (issue 14) ------------------------------------------------
from gvfsd import GvfsSession, gvfs_desktop  # noqa: E402,F401  (fixture)


def status_of(mnt: Path) -> dict:
    return json.loads((mnt / ".journalfs" / "status.json").read_text())


def desktop_source(session: GvfsSession, tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    src = session.home / "files"
    src.mkdir()
    (src / "F").write_text("f\n")
    for key, value in session.env().items():
        monkeypatch.setenv(key, value)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    return src, mnt


def new_session_reads(session: GvfsSession, path: Path) -> dict:
    """What a fresh desktop session reads: every gvfsd-metadata ended (it writes its trees
    out), a new one started, GIO asked."""
    session.stop_daemon()
    session.stop_activated_daemon()
    session.start_daemon()
    try:
        return session.gio_metadata([path]).get(str(path), {})
    finally:
        session.stop_daemon()


def test_store_next_to_a_running_gvfsd_joins_it_and_loses_nothing(gvfs_desktop, tmp_path, monkeypatch):  # noqa: F811
    """The first loss of issue 14: `gio set` made gvfsd-metadata run, then a mount with
    --store on the same directory; a `gio set` while mounted was lost at unmount."""
    session = gvfs_desktop
    src, mnt = desktop_source(session, tmp_path, monkeypatch)
    session.gio_set(src / "F", "k0", "v0")  # D-Bus activation starts gvfsd-metadata
    daemon = session.activated_daemon_pid()
    assert daemon is not None, "gio set did not start gvfsd-metadata"
    with mounted(src, mnt, "--store", str(session.metadata_dir)):
        assert status_of(mnt)["service"]["store_mode"] == "join"
        os.setxattr(mnt / "F", "user.metadata.k1", b"v1")
        session.gio_set(src / "F", "k2", "v2")
        eventually(lambda: xattr_or_none(mnt / "F", "k2"), b"v2", "gio set seen through the mount")
        os.setxattr(mnt / "F", "user.metadata.k3", b"v3")
        eventually(lambda: gio_on_both_sides(session, src, mnt, "F"), ({"k0": "v0", "k1": "v1", "k2": "v2", "k3": "v3"},) * 2,
                   "GIO on the mount's path and on SOURCE's")
    assert session.activated_daemon_pid() == daemon, "the mount must leave gvfsd-metadata running"
    want = {"k0": "v0", "k1": "v1", "k2": "v2", "k3": "v3"}
    assert session.gio_metadata([src / "F"])[str(src / "F")] == want
    assert new_session_reads(session, src / "F") == want
    assert "wrong sized entry" not in session.daemon_log()


def test_store_with_no_gvfsd_is_served_by_journalfs_and_loses_nothing(gvfs_desktop, tmp_path, monkeypatch):  # noqa: F811
    """The second loss of issue 14: setfattr through the mount, unmount, a later `gio set`
    in the same session, then a new session. journalfs now owns org.gtk.vfs.Metadata while
    mounted (GIO writes through it), releases it at unmount, and gvfsd-metadata, activated
    afterwards, continues the same store."""
    session = gvfs_desktop
    src, mnt = desktop_source(session, tmp_path, monkeypatch)
    with mounted(src, mnt, "--store", str(session.metadata_dir)) as m:
        status = status_of(mnt)["service"]
        assert status["store_mode"] == "serve"
        assert session.name_owner_pid() == m.pid  # journalfs is the store's gvfsd-metadata
        os.setxattr(mnt / "F", "user.metadata.k1", b"v1")
        session.gio_set(src / "F", "k2", "v2")  # Set over D-Bus, answered by journalfs
        assert os.getxattr(mnt / "F", "user.metadata.k2") == b"v2"  # one store: seen at once
        assert "metadata::k1: v1" in session.gio("info", "-a", "metadata::*", src / "F")
        session.gio_set(src / "F", "k1", None)
        assert xattr_or_none(mnt / "F", "k1") is None
        os.setxattr(mnt / "F", "user.metadata.k1", b"v1")
        assert session.activated_daemon_pid() is None  # no gvfsd-metadata was started
        assert status_of(mnt)["service"]["gvfs_calls"] >= 2
    assert not session.daemon_on_bus()  # released at unmount
    session.gio_set(src / "F", "k4", "v4")  # activates gvfsd-metadata on the same store
    assert session.activated_daemon_pid() is not None
    want = {"k1": "v1", "k2": "v2", "k4": "v4"}
    assert session.gio_metadata([src / "F"])[str(src / "F")] == want
    assert new_session_reads(session, src / "F") == want
    assert "wrong sized entry" not in session.daemon_log()


def test_gio_programs_write_through_journalfs_while_the_mount_writes(gvfs_desktop, tmp_path, monkeypatch):  # noqa: F811
    session = gvfs_desktop
    src, mnt = desktop_source(session, tmp_path, monkeypatch)
    files = [src / f"f{i}" for i in range(20)]
    for f in files:
        f.write_text("x")
    (src / "dir").mkdir()
    (src / "dir" / "inner").write_text("x")
    with mounted(src, mnt, "--store", str(session.metadata_dir), "--sync", "batch"):
        assert status_of(mnt)["service"]["store_mode"] == "serve"
        gio_ops = [("set", f, "gio", f"g{i}-{n}") for n in range(5) for i, f in enumerate(files)]
        gio_ops += [("set", files[0], "list", ["a", "b c"]), ("set", src / "dir", "d", "dir"),
                    ("set", src / "dir" / "inner", "i", "inner"),
                    ("move", src / "dir", src / "moved"), ("remove", files[19])]
        writer = threading.Thread(target=session.gio_apply, args=(gio_ops,))
        writer.start()
        for n in range(5):  # meanwhile, the mount writes other keys of the same files
            for i, f in enumerate(files[:19]):
                os.setxattr(mnt / f.name, "user.metadata.fuse", f"s{i}-{n}".encode())
        writer.join(timeout=300)
        assert not writer.is_alive()
        for i, f in enumerate(files[:19]):
            assert os.getxattr(mnt / f.name, "user.metadata.gio") == f"g{i}-4".encode()
            assert os.getxattr(mnt / f.name, "user.metadata.fuse") == f"s{i}-4".encode()
        assert os.getxattr(mnt / "f0", "user.metadata.list") == b"a\0b c\0"
        assert os.getxattr(mnt / "moved" / "inner", "user.metadata.i") == b"inner"
        assert os.getxattr(mnt / "moved", "user.metadata.d") == b"dir"
        assert not (mnt / "dir").exists() and not (mnt / "f19").exists()
        # "root": where GIO keeps the mount's own paths, kept equal by the mount
        assert sorted(status_of(mnt)["service"]["gvfs_trees"]) == ["home", "root"]
        eventually(lambda: session.gio_metadata([mnt / "f3", mnt / "moved" / "inner"]),
                   {str(mnt / "f3"): {"gio": "g3-4", "fuse": "s3-4"}, str(mnt / "moved" / "inner"): {"i": "inner"}},
                   "GIO on the mount's paths after concurrent writes from both sides")
    seen = session.gio_metadata([*files, src / "moved", src / "moved" / "inner"])
    assert seen[str(files[3])] == {"gio": "g3-4", "fuse": "s3-4"}
    assert seen[str(files[0])] == {"gio": "g0-4", "fuse": "s0-4", "list": ["a", "b c"]}
    assert seen[str(src / "moved" / "inner")] == {"i": "inner"}
    assert str(files[19]) not in seen


_GIO_READER = r"""
import json, sys
import gi
gi.require_version("Gio", "2.0")
from gi.repository import Gio
f = Gio.File.new_for_path(sys.argv[1])   # one GFile, one process: GIO keeps its tree mapped
for _ in sys.stdin:
    info = f.query_info("metadata::*", Gio.FileQueryInfoFlags.NOFOLLOW_SYMLINKS, None)
    print(json.dumps({a[10:]: info.get_attribute_string(a)
                      for a in info.list_attributes("metadata") or []}), flush=True)
"""


def test_a_running_gio_reader_follows_journalfs_rotations(gvfs_desktop, tmp_path, monkeypatch):  # noqa: F811
    session = gvfs_desktop
    src, mnt = desktop_source(session, tmp_path, monkeypatch)
    reader = subprocess.Popen(["/usr/bin/python3", "-c", _GIO_READER, str(src / "F")], env=session.env(),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def gio_reads() -> dict:
        reader.stdin.write("\n")
        reader.stdin.flush()
        return json.loads(reader.stdout.readline())

    try:
        with mounted(src, mnt, "--store", str(session.metadata_dir)) as m:
            os.setxattr(mnt / "F", "user.metadata.k", b"before")
            os.setxattr(mnt / "F", "user.metadata.kept", b"yes")
            assert gio_reads() == {"k": "before", "kept": "yes"}
            for round_ in range(3):
                rotations = status_of(mnt)["rotations"]
                tree_ino = (session.metadata_dir / "home").stat().st_ino
                os.kill(m.pid, signal.SIGUSR1)  # rotate now (what `journalfs meta compact` asks)
                eventually(lambda: status_of(mnt)["rotations"], rotations + 1, "rotation")
                assert (session.metadata_dir / "home").stat().st_ino != tree_ino
                # the old tree + journal the reader maps say "before": only the new ones say this
                os.setxattr(mnt / "F", "user.metadata.k", f"after {round_}".encode())
                assert gio_reads() == {"k": f"after {round_}", "kept": "yes"}
                session.gio_set(src / "F", "k", f"gio {round_}")  # and GIO writes keep landing
                assert gio_reads() == {"k": f"gio {round_}", "kept": "yes"}
    finally:
        reader.stdin.close()
        reader.wait(timeout=30)
    assert session.gio_metadata([src / "F"])[str(src / "F")] == {"k": "gio 2", "kept": "yes"}


# ---- no session bus: refuse next to a running gvfsd-metadata, else take it and say so ------
def no_bus_env(session: GvfsSession) -> dict:
    env = {k: v for k, v in session.env().items() if k != "DBUS_SESSION_BUS_ADDRESS"}
    return {**os.environ, **env, "DBUS_SESSION_BUS_ADDRESS": ""}


def journalfs_mount(args: list, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "journalfs.cli", "mount", *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(os.path.exists(f"/run/user/{os.geteuid()}/bus"), reason="a real session bus is reachable")
def test_without_a_bus_a_running_gvfsd_for_the_directory_refuses_the_mount(gvfs_session, tmp_path):  # noqa: F811
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    gvfs_session.gio_set(gvfs_session.home, "k", "v")  # the daemon maps the store now
    pid = gvfs_session.daemon_pid
    done = journalfs_mount([src, mnt, "--store", gvfs_session.metadata_dir], no_bus_env(gvfs_session))
    assert done.returncode == 1 and not os.path.ismount(mnt)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"gvfsd-metadata (pid {pid})" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(os.path.exists(f"/run/user/{os.geteuid()}/bus"), reason="a real session bus is reachable")
def test_without_a_bus_the_store_is_taken_with_a_warning_or_refused_if_exclusive(gvfs_session, tmp_path):  # noqa: F811
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    gvfs_session.stop_daemon()
    env = no_bus_env(gvfs_session)
    refused = journalfs_mount([src, mnt, "--store", gvfs_session.metadata_dir, "--exclusive-store"], env)
    assert refused.returncode == 1 and "--exclusive-store" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    with mounted(src, mnt, "--store", str(gvfs_session.metadata_dir), env=env) as m:
        status = status_of(mnt)["service"]
        assert status["store_mode"] == "unguarded"
        assert "desktop session" in status["store_warning"]
        os.setxattr(mnt, "user.metadata.k", b"v")
        assert "desktop session" in m.stderr()  # and in the log


def meta_cli(session: GvfsSession, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "journalfs.cli", "meta", *map(str, args)],
                          env={**os.environ, **session.env()}, capture_output=True, text=True, timeout=120)


def test_meta_commands_write_through_the_stores_one_writer(gvfs_desktop, tmp_path, monkeypatch):  # noqa: F811
    """`journalfs meta set` next to a mount serving the store, and next to gvfsd-metadata:
    the write goes to whoever owns org.gtk.vfs.Metadata, never into the files beside it."""
    session = gvfs_desktop
    src, mnt = desktop_source(session, tmp_path, monkeypatch)
    tree = session.home_tree
    with mounted(src, mnt, "--store", str(session.metadata_dir)):
        done = meta_cli(session, "set", tree, "/files/F", "cli", "via mount")
        assert done.returncode == 0, done.stderr
        assert os.getxattr(mnt / "F", "user.metadata.cli") == b"via mount"
        assert status_of(mnt)["service"]["gvfs_calls"] >= 1
    session.gio_set(src / "F", "gio", "v")  # gvfsd-metadata runs now
    assert session.activated_daemon_pid() is not None
    for args in (("set", tree, "/files/F", "cli", "a", "b", "--list"), ("unset", tree, "/files/F", "gio")):
        done = meta_cli(session, *args)
        assert done.returncode == 0, done.stderr
    assert session.gio_metadata([src / "F"])[str(src / "F")] == {"cli": ["a", "b"]}
    refused = meta_cli(session, "compact", tree)  # gvfsd-metadata compacts its own store
    assert refused.returncode == 1 and "gvfsd-metadata (pid" in refused.stderr
    assert new_session_reads(session, src / "F") == {"cli": ["a", "b"]}


def test_journalfs_as_gvfsd_answers_every_call_gio_makes_and_signals_changes(gvfs_desktop, tmp_path, monkeypatch):  # noqa: F811
    from jeepney import DBusAddress, MessageType, new_method_call
    from jeepney.bus_messages import MatchRule, message_bus
    from jeepney.io.blocking import open_dbus_connection
    session = gvfs_desktop
    src, mnt = desktop_source(session, tmp_path, monkeypatch)
    outside = tmp_path / "outside.txt"  # not under HOME: GIO keeps it in the "root" tree
    outside.write_text("o")
    metadata = DBusAddress("/org/gtk/vfs/metadata", bus_name="org.gtk.vfs.Metadata",
                           interface="org.gtk.vfs.Metadata")
    with mounted(src, mnt, "--store", str(session.metadata_dir)), \
            open_dbus_connection(session.address) as conn:
        rule = MatchRule(type="signal", interface="org.gtk.vfs.Metadata", member="AttributeChanged")
        conn.send_and_get_reply(message_bus.AddMatch(rule), timeout=5)
        with conn.filter(rule, bufsize=100) as signals:
            os.setxattr(mnt / "F", "user.metadata.k", b"v")  # a write through the mount ...
            session.gio_set(src / "F", "g", "w")  # ... and one through GIO: one signal per path
            got = conn.recv_until_filtered(signals, timeout=10)
            assert got.body == (str(session.home_tree), "/files/F")
        session.gio_set(outside, "o", "root tree")  # a second tree of the directory
        assert session.gio_metadata([outside]) == {str(outside): {"o": "root tree"}}
        assert status_of(mnt)["service"]["gvfs_trees"] == ["home", "root"]
        reply = conn.send_and_get_reply(new_method_call(metadata, "GetTreeFromDevice", "uu", (0, 0)), timeout=5)
        assert reply.header.message_type == MessageType.method_return and reply.body == ("",)
        intro = DBusAddress("/org/gtk/vfs/metadata", bus_name="org.gtk.vfs.Metadata",
                            interface="org.freedesktop.DBus.Introspectable")
        xml = conn.send_and_get_reply(new_method_call(intro, "Introspect"), timeout=5).body[0]
        assert '<method name="Move">' in xml and '<signal name="AttributeChanged">' in xml
        outside_tree = str(session.metadata_dir / ".." / "elsewhere" / "home").encode() + b"\0"
        refused = conn.send_and_get_reply(new_method_call(metadata, "Remove", "ayay", (outside_tree, b"/\0")), timeout=5)
        assert refused.header.message_type == MessageType.error  # only trees of its directory
        home = str(session.home_tree).encode() + b"\0"
        for hostile in (new_method_call(metadata, "Set", "ayay", (home, b"/x\0")),  # wrong signature
                        new_method_call(metadata, "Remove", "ayay", (home, b"/a\0b\0")),  # NUL inside
                        new_method_call(metadata, "Move", "ayayay", (home, b"", b"/y\0")),  # empty path
                        new_method_call(metadata, "Set", "ayaya{sv}", (home, b"/x\0", {"": ("s", "v")})),
                        new_method_call(metadata, "Explode", "s", ("now",))):
            answer = conn.send_and_get_reply(hostile, timeout=5)
            assert answer.header.message_type == MessageType.error, hostile.header.fields
        assert os.getxattr(mnt / "F", "user.metadata.k") == b"v"  # and the mount serves on
    assert (session.metadata_dir / "root").exists()
    session.start_daemon()  # and gvfsd-metadata carries on with both trees
    assert session.gio_metadata([outside, src / "F"]) == {str(outside): {"o": "root tree"},
                                                         str(src / "F"): {"k": "v", "g": "w"}}


def test_a_killed_serving_mount_hands_the_store_to_gvfsd_with_every_acknowledged_write(gvfs_desktop, tmp_path, monkeypatch):  # noqa: F811
    session = gvfs_desktop
    src, mnt = desktop_source(session, tmp_path, monkeypatch)
    with mounted(src, mnt, "--store", str(session.metadata_dir), "--sync", "always", check_exit=False) as m:
        os.setxattr(mnt / "F", "user.metadata.fuse", b"acknowledged")
        session.gio_set(src / "F", "gio", "acknowledged too")
        os.kill(m.pid, signal.SIGKILL)  # no unmount, no rotation, no ReleaseName
        m.process.wait(timeout=30)
        subprocess.run(["fusermount3", "-uz", str(mnt)], check=False, capture_output=True)
    eventually(session.daemon_on_bus, False, "the bus drops a dead owner's name")
    session.gio_set(src / "F", "after", "crash")  # activates gvfsd-metadata on the same store
    want = {"fuse": "acknowledged", "gio": "acknowledged too", "after": "crash"}
    assert session.gio_metadata([src / "F"])[str(src / "F")] == want
    assert new_session_reads(session, src / "F") == want


def test_a_gvfsd_started_with_replace_cannot_take_the_store_from_journalfs(gvfs_desktop, tmp_path, monkeypatch):  # noqa: F811
    """journalfs holds the name without allowing replacement: a `gvfsd-metadata --replace`
    started meanwhile (as a session manager may) does not get it, writes nothing and leaves;
    journalfs keeps serving GIO."""
    from gvfsd import GVFSD_METADATA
    session = gvfs_desktop
    src, mnt = desktop_source(session, tmp_path, monkeypatch)
    with mounted(src, mnt, "--store", str(session.metadata_dir)) as m:
        rival = subprocess.run([GVFSD_METADATA, "--replace"], env=session.env(), cwd=session.scratch,
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
        assert rival.returncode == 0  # it lost the name at once and quit
        assert session.name_owner_pid() == m.pid
        session.gio_set(src / "F", "after", "rival")
        assert os.getxattr(mnt / "F", "user.metadata.after") == b"rival"
    session.gio_set(src / "F", "then", "gvfsd")  # activated once journalfs let go
    assert session.gio_metadata([src / "F"])[str(src / "F")] == {"after": "rival", "then": "gvfsd"}


# ---- GIO on the mount's own paths (issue 27) -------------------------------------------------
# GIO keeps the metadata of MNT/f -- a FUSE device, neither the home directory's device nor a
# block device udev knows -- in the "root" tree under MNT's absolute path, not where SRC/f's
# lives. The mount keeps that place equal to its own, both ways (journalfs/metastore/mirror.py).
def root_tree_paths(session: GvfsSession, prefix: Path) -> dict:
    """What the "root" tree holds at and below ``prefix``, read with journalfs's own reader."""
    from journalfs.metastore.store import MetaStore
    tree = session.metadata_dir / "root"
    if not tree.exists():
        return {}
    store = MetaStore.open(str(tree), readonly=True, create=False)
    try:
        return {p: k for p, k in store.dump().items()
                if k and (p == str(prefix) or p.startswith(f"{prefix}/"))}
    finally:
        store.close()


def gio_on_both_sides(session: GvfsSession, src: Path, mnt: Path, rel: str) -> tuple[dict, dict]:
    """(GIO's keys of MNT/rel, GIO's keys of SRC/rel): one GIO process reads both."""
    seen = session.gio_metadata([mnt / rel, src / rel])
    return seen.get(str(mnt / rel), {}), seen.get(str(src / rel), {})


class _Signals:
    def __init__(self, conn, signals):
        self.conn, self.signals = conn, signals

    def wait_for(self, body: tuple, timeout: float = 10.0) -> bool:
        """True once an AttributeChanged signal with ``body`` (tree file, path) arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                got = self.conn.recv_until_filtered(self.signals, timeout=deadline - time.monotonic())
            except TimeoutError:
                return False
            if tuple(got.body) == body:
                return True
        return False


@contextlib.contextmanager
def attribute_changes(session: GvfsSession):
    """AttributeChanged signals of org.gtk.vfs.Metadata on the session bus, as Nautilus
    receives them."""
    from jeepney.bus_messages import MatchRule, message_bus
    from jeepney.io.blocking import open_dbus_connection
    with open_dbus_connection(session.address) as conn:
        rule = MatchRule(type="signal", interface="org.gtk.vfs.Metadata", member="AttributeChanged")
        conn.send_and_get_reply(message_bus.AddMatch(rule), timeout=5)
        with conn.filter(rule, bufsize=1000) as signals:
            yield _Signals(conn, signals)


def check_gio_and_xattrs_agree_on_mount_paths(session: GvfsSession, src: Path, mnt: Path,
                                              m) -> None:
    both = lambda rel: gio_on_both_sides(session, src, mnt, rel)  # noqa: E731
    # what was there before the mount shows on the mount's paths too
    eventually(lambda: both("old.txt"), ({"before": "mount"},) * 2, "metadata from before the mount")
    # the issue's reproduction: setfattr on MNT/f, `gio info` on MNT/f and SRC/f ...
    with attribute_changes(session) as changes:
        os.setxattr(mnt / "f", "user.metadata.comment", b"x")
        assert "metadata::comment: x" in session.gio("info", "-a", "metadata::*", mnt / "f")
        assert both("f") == ({"comment": "x"},) * 2  # in both places before setfattr returned
        # ... and GIO listeners (Nautilus) are told about MNT/f, in the tree they read it from
        assert changes.wait_for((str(session.metadata_dir / "root"), str(mnt / "f")))
    # `gio set` on MNT/g (and on SRC/g) is read by getfattr on MNT/g
    session.gio("set", "-t", "stringv", mnt / "g", "metadata::emblems", "a", "b")
    eventually(lambda: xattr_or_none(mnt / "g", "emblems"), b"a\0b\0", "gio set on MNT seen by getfattr")
    session.gio_set(src / "g", "rating", "5")
    eventually(lambda: xattr_or_none(mnt / "g", "rating"), b"5", "gio set on SRC seen by getfattr")
    eventually(lambda: both("g"), ({"emblems": ["a", "b"], "rating": "5"},) * 2, "gio on SRC seen by gio on MNT")
    session.gio_set(mnt / "g", "rating", None)
    eventually(lambda: xattr_or_none(mnt / "g", "rating"), None, "gio unset on MNT seen by getfattr")
    eventually(lambda: both("g"), ({"emblems": ["a", "b"]},) * 2, "gio unset on MNT seen by gio on SRC")
    os.removexattr(mnt / "g", "user.metadata.emblems")
    assert both("g") == ({}, {})

    # removal: through the mount, by GIO on MNT, by GIO behind the mount's back on SRC
    for name in ("rm1", "rm2", "rm3"):
        os.setxattr(mnt / name, "user.metadata.k", name.encode())
    os.unlink(mnt / "rm1")
    session.gio_remove(mnt / "rm2")
    session.gio_remove(src / "rm3")
    for name in ("rm1", "rm2", "rm3"):
        (src / name).write_text("a new file of the same name")
    eventually(lambda: [both(n) for n in ("rm1", "rm2", "rm3")], [({}, {})] * 3, "removed metadata stays gone")
    assert all(xattr_or_none(mnt / n, "k") is None for n in ("rm1", "rm2", "rm3"))

    # rename: mv through the mount, `gio move` on MNT paths, `gio move` on SRC paths
    os.setxattr(mnt / "r1", "user.metadata.k", b"moved")
    os.setxattr(mnt / "dir" / "inner", "user.metadata.k", b"inner")
    os.setxattr(mnt / "dir", "user.metadata.d", b"dir")
    os.rename(mnt / "r1", mnt / "r2")
    assert both("r2") == ({"k": "moved"},) * 2
    session.gio_move(mnt / "r2", mnt / "r3")
    eventually(lambda: (both("r3"), xattr_or_none(mnt / "r3", "k")), (({"k": "moved"},) * 2, b"moved"),
               "gio move on MNT")
    session.gio_move(src / "r3", src / "r4")
    eventually(lambda: (both("r4"), xattr_or_none(mnt / "r4", "k")), (({"k": "moved"},) * 2, b"moved"),
               "gio move on SRC")
    os.rename(mnt / "dir", mnt / "dir2")  # a directory with metadata below it
    assert both("dir2/inner") == ({"k": "inner"},) * 2 and both("dir2") == ({"d": "dir"},) * 2
    session.gio_set(mnt / "dir2" / "inner", "after", "rename")  # right after: kept
    eventually(lambda: xattr_or_none(mnt / "dir2" / "inner", "after"), b"rename",
               "gio set below a directory just renamed through the mount")
    session.gio_move(src / "dir2", src / "dir3")
    inner = {"k": "inner", "after": "rename"}
    eventually(lambda: both("dir3/inner"), (inner,) * 2, "gio move of a directory on SRC")
    assert xattr_or_none(mnt / "dir3" / "inner", "k") == b"inner"
    for name in ("r1", "r2", "r3", "dir", "dir2"):  # old names: nothing stale resurfaces
        target = src / name
        target.mkdir() if name.startswith("dir") else target.write_text("new")
    eventually(lambda: [both(n) for n in ("r1", "r2", "r3", "dir", "dir2")], [({}, {})] * 5,
               "nothing stale at the old names")
    # the mount's place in the "root" tree holds exactly what the SOURCE paths hold
    want = {"/old.txt": {"before": "mount"}, "/f": {"comment": "x"}, "/r4": {"k": "moved"},
            "/dir3": {"d": "dir"}, "/dir3/inner": inner}
    eventually(lambda: {p[len(str(mnt)):]: k for p, k in root_tree_paths(session, mnt).items()}, want,
               "GIO's place of the mount's paths")

    service = status_of(mnt)["service"]["mount_paths"]
    assert service["kept"] and service["failures"] == 0, service
    assert service["prefix"] == str(mnt) and service["tree"] == str(session.metadata_dir / "root")
    log = m.stderr()
    assert "WARNING" not in log and "ERROR" not in log and "Traceback" not in log, log


def mount_paths_source(session: GvfsSession, tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """SOURCE and MNT both under HOME: GIO still keeps MNT's paths in the "root" tree."""
    src = session.home / "docs"
    src.mkdir()
    for name in ("f", "g", "old.txt", "rm1", "rm2", "rm3", "r1"):
        (src / name).write_text(name)
    (src / "dir").mkdir()
    (src / "dir" / "inner").write_text("i")
    for key, value in session.env().items():
        monkeypatch.setenv(key, value)
    mnt = session.home / "mnt"
    mnt.mkdir()
    return src, mnt


def test_gvfs_mode_gio_on_the_mounts_paths_agrees_with_xattrs(gvfs_session, tmp_path, monkeypatch):  # noqa: F811
    session = gvfs_session
    src, mnt = mount_paths_source(session, tmp_path, monkeypatch)
    session.gio_set(src / "old.txt", "before", "mount")
    with mounted(src, mnt, "--gvfs") as m:
        check_gio_and_xattrs_agree_on_mount_paths(session, src, mnt, m)
    assert session.daemon_on_bus()
    # the mount's paths are gone with it: nothing of them stays in the "root" tree ...
    assert root_tree_paths(session, mnt) == {}
    # ... and the SOURCE paths keep everything
    assert session.gio_metadata([src / "f", src / "r4", src / "dir3" / "inner"]) == {
        str(src / "f"): {"comment": "x"}, str(src / "r4"): {"k": "moved"},
        str(src / "dir3" / "inner"): {"k": "inner", "after": "rename"}}


def test_served_store_gio_on_the_mounts_paths_agrees_with_xattrs(gvfs_desktop, tmp_path, monkeypatch):  # noqa: F811
    """The same with journalfs serving org.gtk.vfs.Metadata itself (--store, no gvfsd)."""
    session = gvfs_desktop
    src, mnt = mount_paths_source(session, tmp_path, monkeypatch)
    session.gio_set(src / "old.txt", "before", "mount")
    session.stop_activated_daemon()
    with mounted(src, mnt, "--store", str(session.metadata_dir)) as m:
        assert status_of(mnt)["service"]["store_mode"] == "serve"
        check_gio_and_xattrs_agree_on_mount_paths(session, src, mnt, m)
        assert session.activated_daemon_pid() is None  # every GIO write went through journalfs
    assert root_tree_paths(session, mnt) == {}
    assert new_session_reads(session, src / "f") == {"comment": "x"}


def test_the_private_default_store_stays_out_of_gios_sight(gvfs_session, tmp_path, monkeypatch):  # noqa: F811
    """Without --gvfs or a gvfs --store, the metadata lives in journalfs's own store, which
    no GIO program reads or writes: GIO on MNT paths (and on SOURCE paths) has its own."""
    session = gvfs_session
    src, mnt = mount_paths_source(session, tmp_path, monkeypatch)
    with mounted(src, mnt):
        os.setxattr(mnt / "f", "user.metadata.comment", b"private")
        session.gio_set(mnt / "g", "comment", "gio's own")
        time.sleep(1.5)  # a report from gvfsd-metadata would have come by now
        assert gio_on_both_sides(session, src, mnt, "f") == ({}, {})
        assert xattr_or_none(mnt / "g", "comment") is None
        assert os.getxattr(mnt / "f", "user.metadata.comment") == b"private"
        assert "mount_paths" not in status_of(mnt)["service"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")
def test_source_under_home_on_another_filesystem_uses_gios_tree_for_it(gvfs_session, tmp_path, monkeypatch):  # noqa: F811
    """GIO puts a file under $HOME in the "home" tree only on the home directory's own
    device: SOURCE on a filesystem mounted under HOME (here a tmpfs, which udev does not
    name) is in "root" at its absolute path, and so are the mount's writes for it."""
    session = gvfs_session
    disk = session.home / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "jfs-giomnt-test", str(disk)], check=True)
    try:
        src = disk / "docs"
        src.mkdir()
        (src / "f").write_text("f")
        for key, value in session.env().items():
            monkeypatch.setenv(key, value)
        mnt = tmp_path / "mnt"
        with mounted(src, mnt, "--gvfs"):
            service = status_of(mnt)["service"]
            assert service["tree"] == str(session.metadata_dir / "root")
            os.setxattr(mnt / "f", "user.metadata.comment", b"on tmpfs")
            assert gio_on_both_sides(session, src, mnt, "f") == ({"comment": "on tmpfs"},) * 2
            session.gio_set(src / "f", "rating", "3")
            eventually(lambda: xattr_or_none(mnt / "f", "rating"), b"3", "gio set on SRC seen by getfattr")
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_gio_on_both_sides_and_setfattr_at_once_end_equal_everywhere(gvfs_session, tmp_path, monkeypatch):  # noqa: F811
    """GIO programs write MNT paths and SOURCE paths while setfattr writes through the mount,
    each its own key of the same files: afterwards getfattr, GIO on MNT and GIO on SOURCE
    all show every last value."""
    session = gvfs_session
    src, mnt = mount_paths_source(session, tmp_path, monkeypatch)
    names = [f"c{i}" for i in range(8)]
    for name in names:
        (src / name).write_text(name)
    rounds = 3
    with mounted(src, mnt, "--gvfs") as m:
        on_mnt = threading.Thread(target=session.gio_apply, args=(
            [("set", mnt / n, "viamnt", f"m{r}-{n}") for r in range(rounds) for n in names],))
        on_src = threading.Thread(target=session.gio_apply, args=(
            [("set", src / n, "viasrc", f"s{r}-{n}") for r in range(rounds) for n in names],))
        on_mnt.start()
        on_src.start()
        for r in range(rounds):
            for n in names:
                os.setxattr(mnt / n, "user.metadata.viafuse", f"f{r}-{n}".encode())
        on_mnt.join(timeout=300)
        on_src.join(timeout=300)
        last = rounds - 1
        want = {n: {"viamnt": f"m{last}-{n}", "viasrc": f"s{last}-{n}", "viafuse": f"f{last}-{n}"} for n in names}
        eventually(lambda: {n: {k: os.getxattr(mnt / n, f"user.metadata.{k}").decode() for k in want[n]
                                if xattr_or_none(mnt / n, k) is not None} for n in names}, want, "getfattr")
        seen = lambda: session.gio_metadata([mnt / n for n in names] + [src / n for n in names])  # noqa: E731
        eventually(seen, {**{str(mnt / n): want[n] for n in names}, **{str(src / n): want[n] for n in names}},
                   "GIO on both sides")
        assert status_of(mnt)["service"]["mount_paths"]["failures"] == 0
        assert "WARNING" not in m.stderr()


def test_a_broken_tree_for_the_mounts_paths_never_fails_a_syscall(gvfs_session, tmp_path, monkeypatch):  # noqa: F811
    """GIO's "root" tree cannot be written (here: a directory stands in its place): setfattr,
    getfattr and GIO on SOURCE paths work as before; the failure is logged and in status.json."""
    session = gvfs_session
    src, mnt = mount_paths_source(session, tmp_path, monkeypatch)
    (session.metadata_dir / "root").mkdir()
    with mounted(src, mnt, "--gvfs") as m:
        for n in range(3):
            os.setxattr(mnt / "f", "user.metadata.comment", f"still works {n}".encode())
        assert os.getxattr(mnt / "f", "user.metadata.comment") == b"still works 2"
        assert session.gio_metadata([src / "f"]) == {str(src / "f"): {"comment": "still works 2"}}
        kept = status_of(mnt)["service"]["mount_paths"]
        assert kept["failures"] >= 1 and kept["paused"] and "root" in kept["last_error"], kept
        assert "GIO's metadata of the mount's paths" in m.stderr()
