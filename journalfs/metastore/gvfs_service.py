"""One writer per gvfs store: which backend a mount uses, and journalfs as gvfsd-metadata.

gvfs lets exactly one process write a metadata store: whoever owns `org.gtk.vfs.Metadata`
on the session bus of the store's owner. GIO clients only map the files and send every write
there (and D-Bus activation starts gvfsd-metadata the moment one asks). So before a mount
writes a gvfs directory (``--store``), :func:`open_metadata_backend` settles who writes it:

- the owner's session bus is reachable and gvfsd-metadata owns the name: the mount joins it
  (:class:`~.gvfsd.GvfsdBackend`, as ``--gvfs``);
- nobody owns the name: journalfs claims it (RequestName, DO_NOT_QUEUE) and serves the
  interface itself (:class:`MetadataServer`) until unmount, so GIO programs write through
  journalfs: a drop-in gvfsd-metadata (:class:`SessionStoreBackend`);
- no such bus: refuse if a gvfsd-metadata for the directory runs (found under /proc);
  otherwise take the store, saying in the log and status that a desktop session starting
  meanwhile would write it too (``exclusive=True`` refuses instead).

Stores outside any gvfs directory (journalfs's private ones) are only checked under /proc.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import pwd
import re
import stat
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import trio
from jeepney import HeaderFields, MessageFlag, MessageType
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import open_dbus_connection as blocking_connection
from jeepney.io.trio import DBusConnection, open_dbus_connection
from jeepney.low_level import Message
from jeepney.wrappers import new_error, new_method_return, new_signal

from ..formats.gvfs_journal import JOURNAL_SUFFIX
from ..journals import BACKUP_MARK
from .files import LOCK_SUFFIX
from .backend import CopyOp, MetadataBackend, MoveOp, RemoveOp, SetOp, UnsetOp, Value, WriteOp
from .gvfsd import BUS_NAME, METADATA, REPLY_TIMEOUT, GvfsdBackend, GvfsdUnavailable, StoreBusError
from .ledger import Ledger
from .location import StoreLocation, mount_paths_location, tree_for_device
from .mirror import MirroredBackend, MountView
from .service import MetaService
from .store import MetaStore

log = logging.getLogger("journalfs.metastore")

GVFS_DIR_NAME = "gvfs-metadata"
# RequestName flags and answers (D-Bus specification)
_DO_NOT_QUEUE = 4
_PRIMARY_OWNER, _EXISTS, _ALREADY_OWNER = 1, 3, 4
#: A gvfsd-metadata found under /proc that does not own the bus name yet may be starting:
#: checks, and seconds between them, before it counts as another session's.
STARTING_CHECKS, STARTING_WAIT = 10, 0.2
#: gvfsd-metadata tells GIO listeners about a changed path at most once a second
SIGNAL_DELAY = 1.0
# GError domain G_IO_ERROR as GDBus names it on the wire, so GIO clients get their own codes
_GIO_ERROR = "org.gtk.GDBus.UnmappedGError.Quark._g_2dio_2derror_2dquark.Code{}"
_IO_FAILED, _IO_NOT_FOUND, _IO_INVALID_ARGUMENT = 0, 1, 13
_UNKNOWN_METHOD = "org.freedesktop.DBus.Error.UnknownMethod"
_INVALID_ARGS = "org.freedesktop.DBus.Error.InvalidArgs"
# a tree name GIO uses: home, root, uuid-<ID_FS_UUID_ENC>, label-<ID_FS_LABEL_ENC>; never one
# of the store's own helper files (journals, lock, temporary trees)
_TREE_NAME = re.compile(r"[A-Za-z0-9][^/\0]*")
_NOT_A_TREE = re.compile(".*(" + "|".join((
    JOURNAL_SUFFIX.removesuffix("$"), re.escape(LOCK_SUFFIX), re.escape(BACKUP_MARK) + ".*",
    r"\.[A-Za-z0-9]{6,8}")) + ")")

#: The interface as gvfs defines it (org.gtk.vfs.Metadata), for Introspect callers.
INTROSPECTION = """<!DOCTYPE node PUBLIC "-//freedesktop//DTD D-BUS Object Introspection 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd">
<node>
  <interface name="org.gtk.vfs.Metadata">
    <method name="Set"><arg direction="in" type="ay" name="treefile"/>
      <arg direction="in" type="ay" name="path"/><arg direction="in" type="a{sv}" name="data"/></method>
    <method name="Remove"><arg direction="in" type="ay" name="treefile"/>
      <arg direction="in" type="ay" name="path"/></method>
    <method name="Move"><arg direction="in" type="ay" name="treefile"/>
      <arg direction="in" type="ay" name="path"/><arg direction="in" type="ay" name="dest_path"/></method>
    <method name="GetTreeFromDevice"><arg direction="in" type="u" name="major"/>
      <arg direction="in" type="u" name="minor"/><arg direction="out" type="s" name="tree"/></method>
    <signal name="AttributeChanged"><arg type="s" name="tree_path"/><arg type="s" name="file_path"/></signal>
  </interface>
  <interface name="org.freedesktop.DBus.Introspectable">
    <method name="Introspect"><arg direction="out" type="s" name="xml"/></method>
  </interface>
  <interface name="org.freedesktop.DBus.Peer">
    <method name="Ping"/>
    <method name="GetMachineId"><arg direction="out" type="s" name="machine_uuid"/></method>
  </interface>
</node>
"""


class StoreRefused(StoreBusError):
    """The store may be written by a gvfsd-metadata journalfs cannot coordinate with (EBUSY).
    Its text is the one line shown to the user."""

    errno_code = errno.EBUSY


# ---- whose store, which session ------------------------------------------------------
def store_owner(store_dir: str) -> int:
    """uid owning the store directory (or its nearest existing parent, before creation)."""
    path = os.path.abspath(store_dir)
    while True:
        try:
            return os.stat(path).st_uid
        except FileNotFoundError:
            parent = os.path.dirname(path)
            if parent == path:
                return os.geteuid()
            path = parent


def _real(path: str) -> str:
    return os.path.realpath(path)


def session_gvfs_dirs(uid: int) -> set[str]:
    """Directories GIO programs of ``uid``'s desktop session keep their stores in: from our
    environment when we are that user, and from the passwd home."""
    dirs = set()
    if uid == os.geteuid():
        data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
        dirs.add(_real(os.path.join(data, GVFS_DIR_NAME)))
    try:
        dirs.add(_real(os.path.join(pwd.getpwuid(uid).pw_dir, ".local", "share", GVFS_DIR_NAME)))
    except KeyError:
        pass
    return dirs


def is_gvfs_dir(store_dir: str, uid: int) -> bool:
    """A directory some gvfsd-metadata may write: named like gvfs's, or the user's own."""
    real = _real(store_dir)
    return os.path.basename(real) == GVFS_DIR_NAME or real in session_gvfs_dirs(uid)


def _socket_path(address: str) -> str | None:
    for part in address.split(";"):
        kind, _, params = part.partition(":")
        if kind == "unix":
            for kv in params.split(","):
                key, _, value = kv.partition("=")
                if key == "path":
                    return value
    return None


def session_bus_candidates(uid: int) -> list[str]:
    """Addresses of ``uid``'s session bus, best first: DBUS_SESSION_BUS_ADDRESS when it is that
    user's (we are the user, or its socket belongs to them), then /run/user/<uid>/bus."""
    found = []
    env = os.environ.get("DBUS_SESSION_BUS_ADDRESS", "")
    if env:
        sock = _socket_path(env)
        try:
            owned = sock is not None and os.stat(sock).st_uid == uid
        except OSError:
            owned = False
        if uid == os.geteuid() or owned:
            found.append(env)
    runtime = f"/run/user/{uid}/bus"
    try:
        if stat.S_ISSOCK(os.stat(runtime).st_mode):
            found.append(f"unix:path={runtime}")
    except OSError:
        pass
    return found


def _name_owner_pid(address: str) -> int | None:
    """pid owning org.gtk.vfs.Metadata on the bus (None: nobody); OSError if unreachable."""
    try:
        conn = blocking_connection(address)
    except (OSError, StopIteration, ValueError) as exc:
        raise OSError(f"cannot connect to {address}: {exc}") from None
    with conn:
        reply = conn.send_and_get_reply(message_bus.NameHasOwner(BUS_NAME), timeout=10)
        if not reply.body[0]:
            return None
        reply = conn.send_and_get_reply(message_bus.GetConnectionUnixProcessID(BUS_NAME), timeout=10)
        return reply.body[0] if reply.header.message_type == MessageType.method_return else None


# ---- gvfsd-metadata processes --------------------------------------------------------
def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def gvfsd_metadata_processes(store_dir: str) -> list[int]:
    """pids of gvfsd-metadata processes that write ``store_dir``: they map or hold open one
    of its files, or their environment (XDG_DATA_HOME, else HOME) points GIO there."""
    directory = _real(store_dir)
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        base = f"/proc/{entry.name}"
        if _comm(int(entry.name)) != "gvfsd-metadata":
            continue
        if _process_uses(base, directory):
            pids.append(int(entry.name))
    return sorted(pids)


def _process_uses(base: str, directory: str) -> bool:
    try:
        with open(f"{base}/environ", "rb") as f:
            env = dict(item.partition(b"=")[::2] for item in f.read().split(b"\0") if item)
        data = env.get(b"XDG_DATA_HOME") or (env[b"HOME"] + b"/.local/share" if b"HOME" in env else None)
        if data and _real(os.fsdecode(data) + "/" + GVFS_DIR_NAME) == directory:
            return True
    except OSError:
        pass
    try:
        for fd in os.listdir(f"{base}/fd"):
            try:
                if _inside(os.readlink(f"{base}/fd/{fd}"), directory):
                    return True
            except OSError:
                continue
    except OSError:
        pass
    try:
        with open(f"{base}/maps", "rb") as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 6 and _inside(os.fsdecode(fields[5].rstrip(b"\n")), directory):
                    return True
    except OSError:
        pass
    return False


# ---- the decision --------------------------------------------------------------------
@dataclass(frozen=True)
class StoreGuard:
    """How this mount keeps to one writer per store (shown in status.json)."""

    mode: str  # "private" | "serve" | "join" | "unguarded"
    bus: str | None = None
    warning: str | None = None

    def status(self) -> dict[str, Any]:
        out = {"store_mode": self.mode, "store_bus": self.bus}
        if self.warning:
            out["store_warning"] = self.warning
        return out


def decide(store_dir: str, *, exclusive: bool = False, quiet: bool = False) -> StoreGuard:
    """Who writes ``store_dir`` while we mount it (see the module doc); raises StoreRefused."""
    uid = store_owner(store_dir)
    pids = gvfsd_metadata_processes(store_dir)
    if not is_gvfs_dir(store_dir, uid):
        if pids:
            raise StoreRefused(f"gvfsd-metadata (pid {pids[0]}) writes the store directory "
                               f"{store_dir}: two writers would corrupt it")
        return StoreGuard("private")
    reachable = _real(store_dir) in session_gvfs_dirs(uid)
    failures = []
    for address in session_bus_candidates(uid) if reachable else []:
        try:
            owner_pid = _name_owner_pid(address)
            strangers = [p for p in pids if p != owner_pid]
            for _ in range(STARTING_CHECKS):  # one may be starting up (activated) right now
                if not strangers:
                    break
                time.sleep(STARTING_WAIT)
                pids = gvfsd_metadata_processes(store_dir)
                owner_pid = _name_owner_pid(address)
                strangers = [p for p in pids if p != owner_pid]
        except OSError as exc:
            failures.append(str(exc))
            continue
        if strangers:
            raise StoreRefused(f"gvfsd-metadata (pid {strangers[0]}) of another session writes "
                               f"{store_dir}: two writers would corrupt it")
        return StoreGuard("join" if owner_pid is not None else "serve", address)
    if pids:
        raise StoreRefused(f"gvfsd-metadata (pid {pids[0]}) writes {store_dir} and its session "
                           "bus is not reachable from here: mount from that session (it "
                           "joins gvfsd-metadata) or stop it first")
    if not reachable:
        why = f"{store_dir} is not where uid {uid}'s desktop session keeps its metadata"
    else:
        why = "; ".join(failures) or f"no D-Bus session bus of uid {uid} is reachable"
    if exclusive:
        raise StoreRefused(f"cannot make sure no gvfsd-metadata writes {store_dir} meanwhile "
                           f"({why}); drop --exclusive-store to take it anyway")
    warning = (f"{why}: journalfs takes {store_dir} alone, but a desktop session of uid {uid} "
               "starting meanwhile would write it too (gvfsd-metadata); use --exclusive-store "
               "to refuse instead")
    if not quiet:
        log.warning("%s", warning)
    return StoreGuard("unguarded", warning=warning)


def open_metadata_backend(tree_path: str, *, shared_dir: bool, gvfs: bool, sync: str,
                          readonly: bool, exclusive: bool = False, bus: str | None = None,
                          location: StoreLocation | None = None, mountpoint: str | None = None,
                          source_kind: Callable[[str], str] | None = None) -> MetadataBackend:
    """The metadata backend a mount serves xattrs from.

    ``shared_dir``: the store lives in a directory given by the user (``--store``), which a
    gvfsd-metadata may also write; ``gvfs``: always join the running gvfsd-metadata.
    ``location`` (the SOURCE paths' StoreLocation) and ``mountpoint`` (resolved): when GIO
    programs share the store, GIO's view of the mount's own paths is kept equal too
    (:mod:`.mirror`; ``source_kind`` as MirroredBackend takes it)."""
    if gvfs:
        return _with_mount_paths(GvfsdBackend(tree_path, bus=bus), location, mountpoint,
                                 readonly, source_kind)
    guard = StoreGuard("private")
    if shared_dir and not readonly:
        guard = decide(os.path.dirname(os.path.abspath(tree_path)), exclusive=exclusive)
        if guard.mode in ("serve", "join") and guard.bus is not None:
            return _with_mount_paths(SessionStoreBackend(tree_path, guard.bus, sync=sync),
                                     location, mountpoint, readonly, source_kind)
    store = MetaStore.open(tree_path, sync=sync, readonly=readonly)
    return GuardedMetaService(store, guard, sync=sync)


def _with_mount_paths(backend: GvfsdBackend | SessionStoreBackend, location: StoreLocation | None,
                      mountpoint: str | None, readonly: bool,
                      source_kind: Callable[[str], str] | None) -> MetadataBackend:
    """``backend`` wrapped so that GIO on the mount's paths sees what getfattr sees (and the
    other way round), unless the mount is read-only or the two places cannot be told apart."""
    if location is None or mountpoint is None or readonly:
        return backend
    mount_location = mount_paths_location(os.path.dirname(location.tree_path), mountpoint)
    if mount_location is None:
        log.warning("the home directory lies inside the mount %s: GIO's metadata of the "
                    "mount's paths is not kept equal to the mount's", mountpoint)
        return backend
    view = MountView(location, mount_location)
    if view.overlaps():
        log.warning("SOURCE and the mountpoint %s nest inside each other: GIO's metadata of "
                    "the mount's paths is not kept equal to the mount's", mountpoint)
        return backend
    return MirroredBackend(backend, view, source_kind)


def refuse_if_gvfsd_writes(tree_path: str) -> None:
    """Raise StoreRefused when a gvfsd-metadata writes this store (owning the name on the
    owner's session bus, or found under /proc): a command must not rewrite it beside it. A
    journalfs mount serving the name is not refused here: it holds the store's lock."""
    store_dir = os.path.dirname(os.path.abspath(tree_path))
    guard = decide(store_dir, quiet=True)
    if guard.mode == "join" and guard.bus is not None:
        pid = _name_owner_pid(guard.bus)
        if pid is not None and _comm(pid) == "gvfsd-metadata":
            raise StoreRefused(f"gvfsd-metadata (pid {pid}) writes {tree_path} and compacts it "
                               "itself (60 s after changes, and when it exits)")


def _comm(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().strip().decode("utf-8", "replace")
    except OSError:
        return None


def write_through_owner(tree_path: str, op: WriteOp) -> bool:
    """For a command writing a store outside any mount (``journalfs meta set``...): when a
    process on the owner's session bus owns org.gtk.vfs.Metadata (gvfsd-metadata, or a
    journalfs mount serving it), make the write through it and return True. False: nobody
    else writes the store; open it directly. Raises StoreRefused when a gvfsd-metadata
    writes it and cannot be reached."""
    store_dir = os.path.dirname(os.path.abspath(tree_path))
    guard = decide(store_dir, quiet=True)
    if guard.mode != "join":
        return False
    backend = GvfsdBackend(tree_path, bus=guard.bus)

    async def write() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(backend.run)
            await _apply(backend, op)
            await backend.sync()
            nursery.cancel_scope.cancel()

    try:
        trio.run(write)
    except BaseExceptionGroup as group:  # one error, as the command's one line
        first = group
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return True


async def _apply(backend: GvfsdBackend, op: WriteOp) -> None:
    if isinstance(op, SetOp):
        await backend.set(op.path, op.key, op.value)
    elif isinstance(op, UnsetOp):
        await backend.unset(op.path, op.key)
    elif isinstance(op, RemoveOp):
        await backend.remove(op.path)
    elif isinstance(op, MoveOp):
        await backend.move(op.src, op.dst)
    elif isinstance(op, CopyOp):
        await backend.copy(op.src, op.dst)
    else:
        raise TypeError(f"not a metadata write: {op!r}")


class GuardedMetaService(MetaService):
    """The embedded store's MetaService, whose status also says how the store is guarded."""

    def __init__(self, store: MetaStore, guard: StoreGuard, **kwargs: Any):
        super().__init__(store, **kwargs)
        self.guard = guard

    def status(self) -> dict[str, Any]:
        return {**super().status(), **self.guard.status()}


# ---- serving org.gtk.vfs.Metadata ----------------------------------------------------
def _bytestring_arg(raw: bytes) -> str:
    """A GLib bytestring argument (``ay``, NUL-terminated) as a surrogateescape str."""
    raw = bytes(raw)
    if raw.endswith(b"\0"):
        raw = raw[:-1]
    if b"\0" in raw or not raw:
        raise ValueError("bad bytestring argument")
    return os.fsdecode(raw)


#: a method's answer: (D-Bus signature of the body or None, body)
Reply = tuple[str | None, tuple[Any, ...]]


class _CallFailed(Exception):
    def __init__(self, name: str, text: str):
        super().__init__(text)
        self.name = name
        self.text = text


def _gio_error(code: int, text: str) -> _CallFailed:
    return _CallFailed(_GIO_ERROR.format(code), text)


class MetadataServer:
    """org.gtk.vfs.Metadata on one bus connection, for the trees of one store directory.

    The mount's own tree is served by the mount's MetaService; other trees of the directory
    (GIO also keeps "root", "uuid-…" there) are opened on first use and closed at shutdown,
    as gvfsd-metadata does. Calls for trees elsewhere are refused: GIO never sends them, and
    the daemon may run as root."""

    def __init__(self, store_dir: str, own_tree: str, own_service: MetaService):
        self.store_dir = _real(store_dir)
        self.own_name = os.path.basename(own_tree)
        self.services: dict[str, MetaService] = {self.own_name: own_service}
        self._opening = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self._conn = None
        self.bus_lost: str | None = None
        self._pending: set[tuple[str, str]] = set()
        self._signal_wanted = trio.Event()
        self.calls = 0
        self.signals = 0
        #: called with (tree file, path) after each write a D-Bus client made (not the mount's)
        self.listeners: list[Callable[[str, str], None]] = []

    def tree_file(self, name: str) -> str:
        return os.path.join(self.store_dir, name)

    @property
    def sync_mode(self) -> str:
        """The mount's tree's mode, which every tree served follows."""
        return self.services[self.own_name].sync_mode

    def set_sync(self, mode: str) -> None:
        for service in list(self.services.values()):
            service.set_sync(mode)

    # -- serving
    async def serve(self, conn: DBusConnection, *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Answer method calls arriving on ``conn`` (a jeepney trio DBusConnection owning our
        bus name) until cancelled; each call is its own task, so none waits for another."""
        async with trio.open_nursery() as nursery:
            self._conn, self._nursery = conn, nursery
            nursery.start_soon(self._signal_task)
            task_status.started()
            try:
                while True:
                    try:
                        message = await conn.receive()
                    except Exception as exc:  # noqa: BLE001 -- closed, reset or garbled: stop serving
                        self.bus_lost = f"session bus connection lost: {exc or 'closed'}"
                        log.warning("gvfs metadata service: %s; the mount keeps the store", self.bus_lost)
                        break
                    if message.header.message_type == MessageType.method_call:
                        nursery.start_soon(self._answer, message)
            finally:
                self._conn = None
            await trio.sleep_forever()  # opened trees stay served to the mount until unmount

    async def _answer(self, message: Message) -> None:
        fields = message.header.fields
        member = fields.get(HeaderFields.member)
        interface = fields.get(HeaderFields.interface)
        handler = {
            ("org.gtk.vfs.Metadata", "Set"): self._set,
            ("org.gtk.vfs.Metadata", "Remove"): self._remove,
            ("org.gtk.vfs.Metadata", "Move"): self._move,
            ("org.gtk.vfs.Metadata", "GetTreeFromDevice"): self._tree_from_device,
            ("org.freedesktop.DBus.Introspectable", "Introspect"): self._introspect,
            ("org.freedesktop.DBus.Peer", "Ping"): self._ping,
            ("org.freedesktop.DBus.Peer", "GetMachineId"): self._machine_id,
        }.get((interface or "org.gtk.vfs.Metadata", member))
        if interface is None and handler is None:
            handler = {"Introspect": self._introspect, "Ping": self._ping}.get(member)
        try:
            if handler is None:
                raise _CallFailed(_UNKNOWN_METHOD, f"no method {interface}.{member} here")
            if fields.get(HeaderFields.path) != METADATA.object_path and \
                    (interface or "org.gtk.vfs.Metadata") == "org.gtk.vfs.Metadata":
                raise _CallFailed(_UNKNOWN_METHOD, f"no object {fields.get(HeaderFields.path)}")
            self.calls += 1
            signature, body = await handler(message)
            reply = new_method_return(message, signature, body)
        except _CallFailed as exc:
            reply = new_error(message, exc.name, "s", (exc.text,))
        except (ValueError, TypeError, IndexError) as exc:
            reply = new_error(message, _INVALID_ARGS, "s", (f"bad arguments: {exc}",))
        except Exception as exc:  # noqa: BLE001 -- a failed call must never end the mount
            log.exception("gvfs metadata service: %s failed", member)
            reply = new_error(message, _GIO_ERROR.format(_IO_FAILED), "s", (f"{member} failed: {exc}",))
        if message.header.flags & MessageFlag.no_reply_expected or self._conn is None:
            return
        try:
            await self._conn.send(reply)
        except (OSError, trio.ClosedResourceError, trio.BrokenResourceError):
            log.warning("gvfs metadata service: could not answer a %s call", member)

    def _args(self, message: Message, signature: str) -> tuple[Any, ...]:
        got = message.header.fields.get(HeaderFields.signature, "")
        if got != signature:
            raise _CallFailed(_INVALID_ARGS, f"expected arguments {signature!r}, got {got!r}")
        body: tuple[Any, ...] = message.body
        return body

    async def _service_for(self, treefile: bytes) -> tuple[str, MetaService]:
        """(the tree file as the caller named it, its MetaService) of a tree in our directory;
        AttributeChanged carries the caller's name, as gvfsd-metadata's does."""
        path = _bytestring_arg(treefile)
        name = os.path.basename(path)
        if _real(os.path.dirname(os.path.abspath(path))) != self.store_dir or \
                not _TREE_NAME.fullmatch(name) or _NOT_A_TREE.fullmatch(name):
            raise _gio_error(_IO_NOT_FOUND, f"Can't find metadata file {path}")
        service = self.services.get(name)
        if service is None:
            async with self._opening:
                service = self.services.get(name) or await self._open_tree(name, path)
        return path, service

    async def service_for_tree(self, tree_path: str) -> MetaService:
        """The MetaService writing another tree of our directory (opened as for a call)."""
        return (await self._service_for(os.fsencode(tree_path) + b"\0"))[1]

    def _client_wrote(self, tree: str, *paths: str) -> None:
        for path in paths:
            self.changed(tree, path)
            for listener in self.listeners:
                listener(tree, path)

    async def _open_tree(self, name: str, path: str) -> MetaService:
        sync = self.sync_mode
        try:
            store = await trio.to_thread.run_sync(
                lambda: MetaStore.open(self.tree_file(name), sync=sync))
        except (OSError, ValueError) as exc:
            log.warning("gvfs metadata service: cannot open tree %s: %s", name, exc)
            raise _gio_error(_IO_NOT_FOUND, f"Can't find metadata file {path}") from None
        service = MetaService(store, sync=sync)
        assert self._nursery is not None  # trees are opened for calls, which serve() answers
        await self._nursery.start(service.run)
        self.services[name] = service
        return service

    async def _set(self, message: Message) -> Reply:
        treefile, path, data = self._args(message, "ayaya{sv}")
        tree, service = await self._service_for(treefile)
        path = _bytestring_arg(path)
        failed = False
        for key, (kind, value) in data.items():  # one journal entry per key, in order
            try:
                if kind == "as":
                    await service.set(path, key, list(value))
                elif kind == "s":
                    await service.set(path, key, value)
                elif kind == "y":
                    await service.unset(path, key)
                # gvfsd-metadata ignores any other type, so do we
            except (OSError, ValueError) as exc:
                log.info("gvfs metadata service: Set %s %s: %s", path, key, exc)
                failed = True
        if failed:
            raise _gio_error(_IO_FAILED, "Unable to set metadata key")
        self._client_wrote(tree, path)
        return None, ()

    async def _remove(self, message: Message) -> Reply:
        treefile, path = self._args(message, "ayay")
        tree, service = await self._service_for(treefile)
        path = _bytestring_arg(path)
        try:
            await service.remove(path)
        except (OSError, ValueError):
            raise _gio_error(_IO_FAILED, "Unable to remove metadata keys") from None
        self._client_wrote(tree, path)
        return None, ()

    async def _move(self, message: Message) -> Reply:
        treefile, src, dst = self._args(message, "ayayay")
        tree, service = await self._service_for(treefile)
        src, dst = _bytestring_arg(src), _bytestring_arg(dst)
        try:
            await service.move(src, dst)  # COPY (replacing dst) + REMOVE, as gvfs journals it
        except (OSError, ValueError):
            raise _gio_error(_IO_FAILED, "Unable to move metadata keys") from None
        self._client_wrote(tree, src, dst)
        return None, ()

    async def _tree_from_device(self, message: Message) -> Reply:
        major, minor = self._args(message, "uu")
        return "s", (tree_for_device(major, minor),)

    async def _introspect(self, message: Message) -> Reply:
        return "s", (INTROSPECTION,)

    async def _ping(self, message: Message) -> Reply:
        return None, ()

    async def _machine_id(self, message: Message) -> Reply:
        try:
            with open("/etc/machine-id") as f:
                return "s", (f.read().strip(),)
        except OSError:
            raise _CallFailed("org.freedesktop.DBus.Error.FileNotFound", "no machine id") from None

    # -- AttributeChanged
    def changed(self, tree: str, path: str) -> None:
        """Announce (within SIGNAL_DELAY, once per path) that ``path`` of ``tree`` changed."""
        self._pending.add((tree, path))
        self._signal_wanted.set()

    async def _signal_task(self) -> None:
        while True:
            await self._signal_wanted.wait()
            await trio.sleep(SIGNAL_DELAY)
            self._signal_wanted = trio.Event()
            pending, self._pending = self._pending, set()
            for tree, path in sorted(pending):
                await self._emit(tree, path)

    async def _emit(self, tree: str, path: str) -> None:
        try:  # signal arguments are D-Bus strings: UTF-8 only
            args = (tree.encode("utf-8").decode(), path.encode("utf-8").decode())
        except UnicodeError:
            return
        if self._conn is None:
            return
        try:
            await self._conn.send(new_signal(METADATA, "AttributeChanged", "ss", args))
            self.signals += 1
        except (OSError, trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    def status(self) -> dict[str, Any]:
        out = {"gvfs_calls": self.calls, "gvfs_signals": self.signals,
               "gvfs_trees": sorted(self.services)}
        if self.bus_lost:
            out["store_warning"] = self.bus_lost
        return out


async def _request_name(conn: DBusConnection) -> bool:
    """Claim org.gtk.vfs.Metadata on ``conn`` without queueing: True if it is ours now."""
    request = message_bus.RequestName(BUS_NAME, _DO_NOT_QUEUE)
    serial = next(conn.outgoing_serial)
    try:
        with trio.fail_after(REPLY_TIMEOUT):
            await conn.send(request, serial=serial)
            while True:  # nothing else is addressed to us before we own the name but signals
                reply = await conn.receive()
                if reply.header.fields.get(HeaderFields.reply_serial) == serial:
                    break
    except trio.TooSlowError:
        raise GvfsdUnavailable(f"the session bus does not answer RequestName({BUS_NAME})") from None
    if reply.header.message_type != MessageType.method_return:
        raise GvfsdUnavailable(f"the session bus refused {BUS_NAME} to journalfs: {reply.body}")
    return reply.body[0] in (_PRIMARY_OWNER, _ALREADY_OWNER)


class _Announcing:
    """Another tree's MetaService, whose writes are announced (AttributeChanged) to GIO
    listeners such as Nautilus, as gvfsd-metadata announces every write."""

    def __init__(self, service: MetaService, server: MetadataServer, tree_path: str):
        self.service, self.server, self.tree = service, server, tree_path

    async def get_all(self, path: str) -> dict[str, Value]:
        return await self.service.get_all(path)

    async def subtree(self, root: str) -> dict[str, dict[str, Value]]:
        return await self.service.subtree(root)

    def _announce(self, *paths: str) -> None:
        for path in paths:
            self.server.changed(self.tree, path)

    async def set(self, path: str, key: str, value: Value) -> None:
        await self.service.set(path, key, value)
        self._announce(path)

    async def unset(self, path: str, key: str) -> None:
        await self.service.unset(path, key)
        self._announce(path)

    async def set_many(self, path: str, changes: Mapping[str, Value | None]) -> None:
        await self.service.set_many(path, changes)
        self._announce(path)

    def fresh(self) -> None:
        return None  # the mount's own store: nothing of its own to open

    async def remove(self, path: str) -> None:
        await self.service.remove(path)
        self._announce(path)

    async def copy(self, src: str, dst: str) -> None:
        await self.service.copy(src, dst)
        self._announce(dst)

    async def move(self, src: str, dst: str) -> None:
        await self.service.move(src, dst)
        self._announce(src, dst)


class SessionStoreBackend:
    """A mount's metadata on a gvfs store whose owner's session bus we reach: at start it
    claims `org.gtk.vfs.Metadata` and serves it (journalfs is the store's one writer), or,
    when gvfsd-metadata (or another journalfs) owns the name, joins it as ``--gvfs`` does.
    The name is released only after the store is flushed and closed at unmount. A
    :class:`~.backend.MetadataBackend`: serving, it answers as the embedded store does;
    joined, as :class:`~.gvfsd.GvfsdBackend` does."""

    def __init__(self, tree_path: str, bus: str, *, sync: str = "batch"):
        self.tree_path = os.path.abspath(tree_path)
        self.bus = bus
        self._sync_at_start = sync  # the store's mode once it is opened (serving)
        self.mode = "starting"
        self._active: MetaService | GvfsdBackend | None = None
        self._server: MetadataServer | None = None

    @property
    def active(self) -> MetaService | GvfsdBackend:
        """The writer: the embedded store's MetaService (serve) or GvfsdBackend (join)."""
        if self._active is None:
            raise GvfsdUnavailable("the session store backend is not running (start run() first)")
        return self._active

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with trio.fail_after(REPLY_TIMEOUT):
                conn = await open_dbus_connection(self.bus)
        except (OSError, StopIteration, ValueError, trio.TooSlowError) as exc:
            raise GvfsdUnavailable(f"cannot connect to the session bus {self.bus}: "
                                   f"{exc or 'no answer'}") from None
        try:
            if await _request_name(conn):
                try:
                    await self._serve(conn, task_status)
                finally:  # after _serve closed the store; closing the connection also releases it
                    with trio.CancelScope(shield=True), contextlib.suppress(Exception):
                        await conn.send(message_bus.ReleaseName(BUS_NAME))
                return
        finally:
            await conn.aclose()
        await self._join(task_status)  # gvfsd-metadata (or another journalfs) got it first

    async def _join(self, task_status: trio.TaskStatus[None]) -> None:
        self.mode = "join"
        log.info("gvfsd-metadata owns %s: writing %s through it", BUS_NAME, self.tree_path)
        self._active = GvfsdBackend(self.tree_path, bus=self.bus)
        await self._active.run(task_status=task_status)

    async def _serve(self, conn: DBusConnection, task_status: trio.TaskStatus[None]) -> None:
        # the name is ours first, the store second: no gvfsd-metadata can start writing it
        sync = self._sync_at_start
        store = await trio.to_thread.run_sync(lambda: MetaStore.open(self.tree_path, sync=sync))
        service = MetaService(store, sync=sync)
        self._active = service
        self._server = MetadataServer(os.path.dirname(self.tree_path), self.tree_path, service)
        self.mode = "serve"
        log.info("journalfs serves %s on %s for %s", BUS_NAME, self.bus, os.path.dirname(self.tree_path))
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)  # closed (flushed, rotated) before the name goes
            await nursery.start(self._server.serve, conn)
            task_status.started()
            await trio.sleep_forever()

    # -- the backend API: MetaService's, through whichever writer we have
    def _announce(self, *paths: str) -> None:
        if self._server is not None:
            tree = self._server.tree_file(self._server.own_name)
            for path in paths:
                self._server.changed(tree, path)

    async def get(self, path: str, key: str) -> Value | None:
        return await self.active.get(path, key)

    async def subtree(self, root: str) -> dict[str, dict[str, Value]]:
        return await self.active.subtree(root)

    async def open_tree(self, tree_path: str) -> _Announcing | GvfsdBackend:
        """The backend writing another tree of this store directory, through this store's
        one writer (call once :meth:`run` has started)."""
        active = self.active
        if isinstance(active, GvfsdBackend):
            return await active.open_tree(tree_path)
        assert self._server is not None  # serving: set together with the MetaService
        service = await self._server.service_for_tree(tree_path)
        return _Announcing(service, self._server, tree_path)

    async def watch_changes(self, changed: Callable[[str, str], None], *,
                            task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Call ``changed(tree file, path)`` after each write GIO programs make."""
        active = self.active
        if isinstance(active, GvfsdBackend):
            return await active.watch_changes(changed, task_status=task_status)
        assert self._server is not None
        self._server.listeners.append(changed)
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            self._server.listeners.remove(changed)

    async def get_all(self, path: str) -> dict[str, Value]:
        return await self.active.get_all(path)

    async def set_many(self, path: str, changes: Mapping[str, Value | None]) -> None:
        await self.active.set_many(path, changes)
        self._announce(path)

    async def set(self, path: str, key: str, value: Value) -> object:
        result = await self.active.set(path, key, value)
        self._announce(path)
        return result

    def set_now(self, path: str, key: str, value: Value) -> bool:
        return False  # joined: a D-Bus call; served: set() announces it

    async def unset(self, path: str, key: str) -> object:
        result = await self.active.unset(path, key)
        self._announce(path)
        return result

    async def remove(self, path: str) -> object:
        result = await self.active.remove(path)
        self._announce(path)
        return result

    async def move(self, src: str, dst: str) -> object:
        result = await self.active.move(src, dst)
        self._announce(src, dst)
        return result

    async def copy(self, src: str, dst: str) -> object:
        result = await self.active.copy(src, dst)
        self._announce(dst)
        return result

    async def compact(self) -> None:
        await self.active.compact()

    async def sync(self) -> None:
        """Every earlier acknowledged write durable (the store's or gvfsd's journal)."""
        await self.active.sync()

    # before run() has started the writer is not known: nothing is claimed
    def rotations(self) -> int | None:
        return self._active.rotations() if self._active is not None else None

    @property
    def sync_mode(self) -> str | None:
        if self._active is None:  # not started: the mode it will open the store with
            return self._sync_at_start
        return self._server.sync_mode if self._server is not None else self._active.sync_mode

    def set_sync(self, mode: str) -> None:
        if self._server is not None:  # serving: every tree it serves follows the mount's
            self._server.set_sync(mode)
        else:
            self.active.set_sync(mode)

    @property
    def readonly(self) -> bool:
        return self._active.readonly if self._active is not None else False

    @property
    def sole_writer(self) -> bool:
        return self._active.sole_writer if self._active is not None else False

    @property
    def ledger(self) -> Ledger | None:
        return self._active.ledger if self._active is not None else None

    def journal_path(self) -> str | None:
        return self._active.journal_path() if self._active is not None else None

    def status(self) -> dict[str, Any]:
        active = self._active.status() if self._active is not None else {"tree_path": self.tree_path}
        extra = {"store_mode": self.mode, "store_bus": self.bus}
        if self._server is not None:
            extra.update(self._server.status())
        return {**active, **extra}
