"""Joining the store's writer: share the user's running gvfsd-metadata instead of owning
the store (``--gvfs``, and ``--store`` on a gvfs directory whose bus name someone owns, see
:mod:`.gvfs_service`).

gvfs allows exactly one writer per store: whoever owns `org.gtk.vfs.Metadata`. So in this
mode every write goes to it over D-Bus (`org.gtk.vfs.Metadata`, see specs/gvfs-metadata.md "How gvfs users
reach it"), exactly as GIO does, and reads map the store files read-only
(`MetaStore.open(tree, readonly=True)` + `refresh()`), exactly as GIO clients do. We never
take the store lock or write a store file here.

`GvfsdBackend` serves the :class:`~.backend.MetadataBackend` protocol (for the FUSE layer,
on trio; blocking callers run it under ``trio.run``); durability and rotation are
gvfsd-metadata's, so it answers :class:`~.backend.NotSupported` to those. It confirms each write by re-reading the store
until it shows the write (bounded wait): gvfsd-metadata answers a `Set` for a tree it cannot
open with success, so the reply alone proves nothing.
"""
from __future__ import annotations

import errno
import math
import os
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

import trio
from jeepney import DBusAddress, HeaderFields, MatchRule, MessageType, new_method_call
from jeepney.bus_messages import message_bus
from jeepney.io.trio import DBusRouter, open_dbus_router
from jeepney.low_level import Message

from .backend import GVFSD_DECIDES_ROTATION, GVFSD_DECIDES_SYNC, NotSupported, Value, keyed_below
from .ledger import Ledger
from .store import MetaStore

T = TypeVar("T")

BUS_NAME = "org.gtk.vfs.Metadata"
METADATA = DBusAddress("/org/gtk/vfs/metadata", bus_name=BUS_NAME, interface="org.gtk.vfs.Metadata")
MESSAGE_BUS = DBusAddress("/org/freedesktop/DBus", bus_name="org.freedesktop.DBus",
                          interface="org.freedesktop.DBus")
REPLY_TIMEOUT = 30.0  # a Set that triggers a rotation of a huge tree can take a while
VISIBLE_TIMEOUT = 5.0  # how long a confirmed write may take to show up in the files
_POLL = 0.005


class StoreBusError(OSError):
    """A store error whose text is the one line a user sees (errno per subclass)."""

    errno_code = errno.EIO

    def __init__(self, message: str):
        super().__init__(self.errno_code, message)

    def __str__(self) -> str:
        return self.strerror or ""


class GvfsdUnavailable(StoreBusError):
    """No session bus, or no gvfsd-metadata on it."""

    errno_code = errno.ENOTCONN


class GvfsdError(StoreBusError):
    """gvfsd-metadata refused a request, or accepted it without storing it."""

    errno_code = errno.EIO


# ---- messages ------------------------------------------------------------------------
def _bytestring(text: str | bytes | os.PathLike[str]) -> bytes:
    """A GLib bytestring (`ay`): gvfsd reads an unterminated one as the empty string."""
    raw = os.fsencode(text)
    if b"\0" in raw:
        raise ValueError(f"NUL byte in {raw!r}")
    return raw + b"\0"


def _variant(value: Value | None) -> tuple[str, object]:
    if value is None:
        return ("y", 0)  # any byte means "unset"
    if isinstance(value, str):
        return ("s", value)
    values = list(value)
    if not all(isinstance(v, str) for v in values):
        raise TypeError("a list value holds strings only")
    return ("as", values)


def set_message(tree: Path, path: str, changes: Mapping[str, Value | None]) -> Message:
    """One `Set` call; gvfsd writes one journal entry per key (None unsets)."""
    data = {key: _variant(value) for key, value in changes.items()}
    return new_method_call(METADATA, "Set", "ayaya{sv}", (_bytestring(tree), _bytestring(path), data))


def remove_message(tree: Path, path: str) -> Message:
    return new_method_call(METADATA, "Remove", "ayay", (_bytestring(tree), _bytestring(path)))


def move_message(tree: Path, src: str, dst: str) -> Message:
    return new_method_call(METADATA, "Move", "ayayay", (_bytestring(tree), _bytestring(src), _bytestring(dst)))


def _name_has_owner() -> Message:
    return new_method_call(MESSAGE_BUS, "NameHasOwner", "s", (BUS_NAME,))


def _start_service() -> Message:
    return new_method_call(MESSAGE_BUS, "StartServiceByName", "su", (BUS_NAME, 0))


def _check_reply(reply: Message, what: str) -> tuple[Any, ...]:
    if reply.header.message_type == MessageType.error:
        detail = reply.body[0] if reply.body else reply.header.fields.get(HeaderFields.error_name, "error")
        raise GvfsdError(f"gvfsd-metadata refused {what}: {detail}")
    body: tuple[Any, ...] = reply.body
    return body


def bus_address(explicit: str | None = None) -> str:
    address = explicit or os.environ.get("DBUS_SESSION_BUS_ADDRESS", "")
    if not address:
        raise GvfsdUnavailable("--gvfs needs a D-Bus session bus, but DBUS_SESSION_BUS_ADDRESS is not set")
    return address


def _unreachable(address: str, why: object) -> GvfsdUnavailable:
    return GvfsdUnavailable(f"no gvfsd-metadata reachable on the session bus {address}: {why}")


# ---- the read side -------------------------------------------------------------------
class _StoreView:
    """Read-only view of the store files gvfsd-metadata writes (opened lazily: a fresh
    user has no tree until the daemon's first write)."""

    def __init__(self, tree: Path):
        self.tree = tree
        self._store: MetaStore | None = None
        self._opening = threading.Lock()  # status() may come from another thread than reads

    def _current(self) -> MetaStore | None:
        with self._opening:
            if self._store is None:
                if not self.tree.exists():
                    return None
                self._store = MetaStore.open(str(self.tree), readonly=True, create=False)
            store = self._store
        store.refresh()  # MetaStore is thread-safe
        return store

    def get(self, path: str, key: str) -> Value | None:
        store = self._current()
        return store.get(path, key) if store else None

    def get_all(self, path: str) -> dict[str, Value]:
        store = self._current()
        return dict(store.get_all(path)) if store else {}

    def subtree(self, root: str) -> dict[str, dict[str, Value]]:
        """{path below root (root itself = ""): keys} of every path with keys."""
        store = self._current()
        return keyed_below(store.dump(), root) if store is not None else {}

    def sync(self) -> None:
        store = self._current()
        journal = store.journal_path if store is not None else None
        if not journal:
            return
        try:
            fd = os.open(journal, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:  # rotated meanwhile: the rotation synced it
            return
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def status(self) -> dict[str, Any]:
        store = self._current()
        if store is None:  # gvfsd has written nothing yet: no tree, no journal
            return {"tree_path": str(self.tree), "journal_path": None, "exists": False}
        return store.status()

    def close(self) -> None:
        with self._opening:
            store, self._store = self._store, None
        if store is not None:
            store.close()


def _join(root: str, rest: str) -> str:
    """Inverse of :func:`~.backend.below`."""
    return (rest or "/") if root == "/" else root + rest


def _expect_set(path: str, changes: Mapping[str, Value | None]) -> Callable[[_StoreView], bool]:
    wanted = {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in changes.items()}
    return lambda view: all(view.get(path, k) == v for k, v in wanted.items())


def _expect_gone(path: str) -> Callable[[_StoreView], bool]:
    return lambda view: not view.get_all(path)


def _expect_moved(src: str, dst: str, keys: dict[str, Value]) -> Callable[[_StoreView], bool]:
    return lambda view: not view.get_all(src) and view.get_all(dst) == keys


def _copy_plan(view: _StoreView, src: str, dst: str) -> list[tuple[str, dict[str, Value]]]:
    """gvfs COPY semantics as a list of Sets: every keyed path under src, under dst."""
    return [(_join(dst, rest), keys) for rest, keys in sorted(view.subtree(src).items())]


# ---- async backend (trio) ------------------------------------------------------------
class GvfsdBackend:
    """The MetadataBackend of a store the user's gvfsd-metadata writes (see module doc)."""

    def __init__(self, tree_path: str | os.PathLike[str], *, bus: str | None = None,
                 visible_timeout: float = VISIBLE_TIMEOUT):
        self.tree = Path(os.path.abspath(tree_path))
        self._bus = bus
        self._visible_timeout = visible_timeout
        self._view = _StoreView(self.tree)
        self._view_lock = trio.Lock()  # the view is used from worker threads, one at a time
        # one write in flight: its read-back check must not see a concurrent write's value
        self._write_lock = trio.Lock()
        self._router: DBusRouter | None = None
        self._address = ""
        self._writes = 0
        self._store_status: dict[str, Any] = {}
        self._siblings: list[GvfsdBackend] = []  # other trees written over our connection

    async def open_tree(self, tree_path: str | os.PathLike[str]) -> GvfsdBackend:
        """A backend for another tree of the same daemon, sharing this one's bus connection
        and its one-write-at-a-time lock (call once :meth:`run` has started)."""
        other = GvfsdBackend(tree_path, bus=self._bus, visible_timeout=self._visible_timeout)
        other._router, other._address, other._write_lock = self._router, self._address, self._write_lock
        self._siblings.append(other)
        return other

    def fresh(self) -> "GvfsdBackend":
        """A new backend of the same tree and bus, with a connection of its own (not yet
        running)."""
        return GvfsdBackend(self.tree, bus=self._bus, visible_timeout=self._visible_timeout)

    async def watch_changes(self, changed: Callable[[str, str], None], *,
                            task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Call ``changed(tree file, path)`` for every AttributeChanged signal gvfsd-metadata
        sends (once a second at most per path, after every Set, Remove and Move by anyone)."""
        rule = MatchRule(type="signal", interface=METADATA.interface, member="AttributeChanged",
                         path=METADATA.object_path)
        # the bus delivers only the name owner's signals (it resolves the name in the rule);
        # locally the sender is that owner's unique name, so the filter leaves it out
        from_owner = MatchRule(type="signal", sender=BUS_NAME, interface=METADATA.interface,
                               member="AttributeChanged", path=METADATA.object_path)
        # unbounded: the router drops what a full channel cannot take, and a lost report is
        # a change never copied; this loop only hands each signal over, so it keeps up
        send, signals = trio.open_memory_channel[Message](math.inf)
        router = self._router
        if router is None:
            raise GvfsdUnavailable("GvfsdBackend is not running (start run() first)")
        # the filter goes first when leaving: a signal dispatched into a channel whose
        # receiving end is closed would end the router's receiver (and the connection)
        async with signals, router.filter(rule, channel=send):
            _check_reply(await router.send_and_get_reply(message_bus.AddMatch(from_owner)), "AddMatch")
            task_status.started()
            async for signal in signals:
                if len(signal.body) == 2 and all(isinstance(x, str) for x in signal.body):
                    changed(*signal.body)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, check gvfsd-metadata is there (bus-activating it like GIO would),
        report started, and serve until cancelled; closes everything on exit."""
        self._address = bus_address(self._bus)
        failure = None
        try:
            async with open_dbus_router(self._address) as router:
                try:
                    await self._ensure_daemon(router)
                except GvfsdUnavailable as exc:
                    failure = exc  # raised below, not wrapped in the router's exception group
                except trio.TooSlowError:
                    failure = _unreachable(self._address, "the bus does not answer")
                else:
                    await self._serve(router, task_status)
        except (OSError, StopIteration) as exc:
            raise _unreachable(self._address, exc) from None
        finally:
            self._view.close()
            for sibling in self._siblings:
                sibling._router = None
                sibling._view.close()
        if failure:
            raise failure

    async def _serve(self, router: DBusRouter, task_status: trio.TaskStatus[None]) -> None:
        self._router = router
        try:
            self._store_status = await self._read(lambda view: view.status())
            task_status.started()
            await trio.sleep_forever()
        finally:
            self._router = None

    async def _ensure_daemon(self, router: DBusRouter) -> None:
        with trio.fail_after(REPLY_TIMEOUT):
            (owned,) = _check_reply(await router.send_and_get_reply(_name_has_owner()), "NameHasOwner")
            if owned:
                return
            reply = await router.send_and_get_reply(_start_service())
        if reply.header.message_type == MessageType.error:
            raise _unreachable(self._address, reply.body[0] if reply.body else "cannot start it")

    async def _call(self, message: Message, what: str) -> tuple[Any, ...]:
        if self._router is None:
            raise GvfsdUnavailable("GvfsdBackend is not running (start run() first)")
        try:
            with trio.fail_after(REPLY_TIMEOUT):
                reply = await self._router.send_and_get_reply(message)
        except trio.TooSlowError:
            raise GvfsdError(f"gvfsd-metadata did not answer {what} within {REPLY_TIMEOUT:.0f} s") from None
        self._writes += 1
        return _check_reply(reply, what)

    async def _read(self, fn: Callable[[_StoreView], T]) -> T:
        async with self._view_lock:
            return await trio.to_thread.run_sync(fn, self._view)

    async def _until_visible(self, seen: Callable[[_StoreView], bool], what: str) -> None:
        deadline = trio.current_time() + self._visible_timeout
        while not await self._read(seen):
            if trio.current_time() > deadline:
                raise GvfsdError(f"gvfsd-metadata accepted {what} but {self.tree} does not show it")
            await trio.sleep(_POLL)

    # reads
    async def get(self, path: str, key: str) -> Value | None:
        return await self._read(lambda view: view.get(path, key))

    async def get_all(self, path: str) -> dict[str, Value]:
        return await self._read(lambda view: view.get_all(path))

    async def subtree(self, root: str) -> dict[str, dict[str, Value]]:
        """{path below root ("" = root): keys} of every keyed path at or below ``root``."""
        return await self._read(lambda view: view.subtree(root))

    # writes (return once the store files show them)
    async def _write(self, message: Message, what: str, seen: Callable[[_StoreView], bool]) -> None:
        async with self._write_lock:
            await self._call(message, what)
            await self._until_visible(seen, what)
            self._store_status = await self._read(lambda view: view.status())

    async def set_many(self, path: str, changes: Mapping[str, Value | None]) -> None:
        await self._write(set_message(self.tree, path, changes), f"Set {path}", _expect_set(path, changes))

    async def set(self, path: str, key: str, value: Value) -> None:
        await self.set_many(path, {key: value})

    def set_now(self, path: str, key: str, value: Value) -> bool:
        return False  # every write is a D-Bus call to gvfsd-metadata

    async def unset(self, path: str, key: str) -> None:
        await self.set_many(path, {key: None})

    async def remove(self, path: str) -> None:
        await self._write(remove_message(self.tree, path), f"Remove {path}", _expect_gone(path))

    async def move(self, src: str, dst: str) -> None:
        keys = await self.get_all(src)
        await self._write(move_message(self.tree, src, dst), f"Move {src} -> {dst}", _expect_moved(src, dst, keys))

    async def copy(self, src: str, dst: str) -> None:
        """gvfs has no Copy call (GIO copies metadata key by key): replace dst's subtree
        with src's, one Set per path."""
        plan = await self._read(lambda view: _copy_plan(view, src, dst))
        await self.remove(dst)
        for path, keys in plan:
            await self.set_many(path, keys)

    async def compact(self) -> None:
        """gvfsd-metadata rotates on its own schedule; there is no call to force it."""
        raise NotSupported(GVFSD_DECIDES_ROTATION)

    def rotations(self) -> None:
        return None

    @property
    def sync_mode(self) -> None:
        return None

    def set_sync(self, mode: str) -> None:
        raise NotSupported(GVFSD_DECIDES_SYNC)

    @property
    def readonly(self) -> bool:
        return False  # gvfsd-metadata decides; a refused write fails as it would in GIO

    @property
    def sole_writer(self) -> bool:
        return False  # GIO programs write through gvfsd-metadata too

    @property
    def ledger(self) -> Ledger | None:
        return None

    def journal_path(self) -> str | None:
        path = self.status().get("journal_path")
        return str(path) if path else None

    async def flush(self) -> None:
        """Writes are in gvfsd's journal once confirmed; nothing is pending here."""

    async def sync(self) -> None:
        """Make every confirmed write durable: gvfsd-metadata never syncs its journal, so
        fdatasync it here (a read-only descriptor is enough)."""
        await self._read(lambda view: view.sync())

    def status(self) -> dict[str, Any]:
        """The store's status (tree_path, journal_path, fill, entries, ... as MetaService
        gives them), read fresh -- gvfsd may have rotated -- plus ours. Synchronous and
        it may touch the files: call it from a worker thread."""
        try:
            store_status = self._view.status()
        except (OSError, ValueError) as exc:  # mid-rotation or unreadable: say so, do not fail
            store_status = {**self._store_status, "error": str(exc)}
        else:
            self._store_status = store_status
        store_status.setdefault("journal_path", None)
        return {**store_status, "mode": "gvfs", "tree": str(self.tree), "bus": self._address,
                "connected": self._router is not None, "writes": self._writes}
