"""The settings of a running mount that change while it runs, and their one owner.

``user.journalfs.*`` on ``MNT/.journalfs`` (:mod:`.control`) and ``mount -o remount`` change
them; the request handlers act on them. :class:`RuntimeSettings` holds each one once: a
reader holds the object and reads it when it needs a value, or subscribes and is told of
every change (the request path keeps what it reads per request in its own fields, updated by
its listener, so a request pays no extra lookup). The metadata durability (``sync``) is the
store backend's own (:attr:`~journalfs.metastore.backend.MetadataBackend.sync_mode`): this
object reads and changes it there and keeps no copy.

Light on purpose: ``fs/main.py`` (which every ``journalfs mount`` command line loads) imports
it for :func:`parse_timeout`, so it imports neither trio nor pyfuse3 nor the store.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # annotations only: importing the store here would load trio at start-up
    from ..metastore.backend import MetadataBackend


class OptionError(ValueError):
    """A bad ``-o`` option or setting value (a usage error)."""


def parse_timeout(value: str) -> float:
    """Seconds of the kernel's name/attribute cache (``timeout=``)."""
    try:
        seconds = float(value)
    except ValueError:
        raise OptionError(f"timeout must be a number of seconds, not {value!r}") from None
    if not 0 <= seconds < 1e9:  # also rejects nan
        raise OptionError(f"timeout must be 0 or more seconds, not {value!r}")
    return seconds


Listener = Callable[["RuntimeSettings"], None]


class RuntimeSettings:
    """The mount's changeable settings (see the module doc)."""

    def __init__(self, backend: MetadataBackend, *, timeout: float, readonly: bool,
                 cache_cap: float):
        """``timeout``: the kernel's entry/attribute timeout; ``readonly``: refuse every
        change (EROFS); ``cache_cap``: the longest the daemon's own short-lived caches (stat
        results, directory listings) may live, whatever the timeout."""
        self.backend = backend
        self._timeout = timeout
        self._readonly = readonly
        self.cache_cap = cache_cap
        self._listeners: list[Listener] = []

    # -- reading
    @property
    def timeout(self) -> float:
        return self._timeout

    @property
    def cache_ttl(self) -> float:
        """How long the daemon's own caches may keep an answer: never longer than the
        kernel's (as when mounting)."""
        return min(self._timeout, self.cache_cap)

    @property
    def readonly(self) -> bool:
        return self._readonly

    @property
    def sync(self) -> str | None:
        """The metadata durability mode; None where the store's writer decides it
        (gvfsd-metadata)."""
        return self.backend.sync_mode

    def options(self) -> dict[str, Any]:
        """These settings as status.json's ``options`` shows them (over the mount's
        configuration, which they start from)."""
        return {"entry_timeout": self._timeout, "attr_timeout": self._timeout,
                "ro": self._readonly, "sync": self.sync}

    # -- changing (each change is told to every listener, in subscription order)
    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(settings)`` after every change (not now: read the current values
        when subscribing)."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener(self)

    def set_timeout(self, seconds: float) -> None:
        self._timeout = seconds
        self._changed()

    def set_readonly(self, readonly: bool) -> None:
        self._readonly = readonly
        self._changed()

    def set_sync(self, mode: str) -> None:
        """ValueError for an unknown mode, NotSupported (ENOTSUP) where the backend does not
        decide durability."""
        self.backend.set_sync(mode)
        self._changed()
