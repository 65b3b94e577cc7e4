"""The metadata store as the request handlers use it: its errors as errnos, the values
cache kept exact, restructuring after a namespace change."""
from __future__ import annotations

import errno
import logging
from typing import Awaitable, Callable, ParamSpec, TypeVar

import pyfuse3

from .mountcore import MountCore

log = logging.getLogger("journalfs.fs")

P = ParamSpec("P")
T = TypeVar("T")


class StoreCalls(MountCore):
    """Calls of the metadata backend from the handlers."""

    async def _meta_call(self, fn: Callable[P, Awaitable[T]], *args: P.args,
                         **kwargs: P.kwargs) -> T:
        """Call a method of the metadata backend (``self.meta.get``, ...; typed: the checker
        sees the call), turning its errors into errnos."""
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except OSError as exc:
            if exc.errno:
                raise pyfuse3.FUSEError(exc.errno) from None
            log.exception("metadata %s%r failed", getattr(fn, "__name__", fn), args)
            raise pyfuse3.FUSEError(errno.EIO) from None
        except Exception:
            log.exception("metadata %s%r failed", getattr(fn, "__name__", fn), args)
            raise pyfuse3.FUSEError(errno.EIO) from None

    async def _meta_values(self, store_path: str) -> dict:
        """Every metadata key of ``store_path``: from memory when cached (no thread hop)."""
        cache = self.meta_cache
        values = cache.get_all(store_path) if cache is not None else None
        if values is None:
            generation = cache.generation if cache is not None else 0
            values = await self._meta_call(self.meta.get_all, store_path) or {}
            if cache is not None:
                cache.store(store_path, generation, values)
        return values

    async def _meta_get(self, store_path: str, key: str):
        if self.meta_cache is None:
            return await self._meta_call(self.meta.get, store_path, key)
        return (await self._meta_values(store_path)).get(key)

    def _meta_values_cached(self, store_path: str) -> dict | None:
        """:meth:`_meta_values` when the values cache holds them (None: it does not)."""
        cache = self.meta_cache
        return cache.get_all(store_path) if cache is not None else None

    def _meta_set_now(self, store_path: str, key: str, value) -> bool:
        """:meth:`_meta_set` on this thread if the backend can do it without a wait
        (``MetadataBackend.set_now``): True once done, the cache kept exact; False:
        nothing written, await :meth:`_meta_set`."""
        try:
            done = self.meta.set_now(store_path, key, value)
        except Exception as exc:
            if self.meta_cache is not None:
                self.meta_cache.forget(store_path)
            if isinstance(exc, OSError) and exc.errno:
                raise pyfuse3.FUSEError(exc.errno) from None
            log.exception("metadata set_now(%r, %r) failed", store_path, key)
            raise pyfuse3.FUSEError(errno.EIO) from None
        if done and self.meta_cache is not None:
            self.meta_cache.written(store_path, key, value)
        return done

    async def _meta_set(self, store_path: str, key: str, value) -> None:
        await self._meta_write(store_path, key, value, self._meta_call(self.meta.set, store_path,
                                                                       key, value))

    async def _meta_unset(self, store_path: str, key: str) -> None:
        await self._meta_write(store_path, key, None,
                               self._meta_call(self.meta.unset, store_path, key))

    async def _meta_write(self, store_path: str, key: str, value,
                          call: Awaitable[object]) -> None:
        """Await ``call``, which sets ``key`` to ``value`` (None: unsets it), keeping the cache
        exact (dropped when the outcome is unknown)."""
        try:
            await call
        except BaseException:
            if self.meta_cache is not None:
                self.meta_cache.forget(store_path)
            raise
        if self.meta_cache is not None:
            self.meta_cache.written(store_path, key, value)

    async def _meta_restructure_after(self, rel: bytes, fn: Callable[P, Awaitable[object]],
                                      *args: P.args, **kwargs: P.kwargs) -> None:
        """A store change following a namespace change that already happened in SOURCE:
        its failure (a full store) is logged, never the caller's answer (the ledger keeps
        the entries tied to their file, so they are never shown on another one)."""
        try:
            await self._meta_restructure(fn, *args, **kwargs)
        except (OSError, pyfuse3.FUSEError) as exc:
            log.warning("metadata %s for %r failed after the change in SOURCE: %s",
                        fn.__name__, rel, exc)

    async def _meta_restructure(self, fn: Callable[P, Awaitable[object]], *args: P.args,
                                **kwargs: P.kwargs) -> None:
        """``fn`` (``self.meta.remove``/``move``/``copy``) on whole subtrees in the store;
        cached values are dropped after."""
        try:
            await self._meta_call(fn, *args, **kwargs)
        finally:
            if self.meta_cache is not None:
                self.meta_cache.moved_or_removed()

    async def _meta_sync(self) -> None:
        """Make every acknowledged metadata write durable (CONTRACT: fsync of any file)."""
        await self._meta_call(self.meta.sync)
