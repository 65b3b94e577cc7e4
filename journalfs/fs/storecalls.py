"""The metadata store as the request handlers use it: its errors as errnos, the values
cache kept exact, restructuring after a namespace change."""
from __future__ import annotations

import errno
import logging
from typing import Callable

import pyfuse3

from .mountcore import MountCore

log = logging.getLogger("journalfs.fs")


class StoreCalls(MountCore):
    """Calls of the metadata backend from the handlers."""

    async def _meta_call(self, method: str, *args):
        return await self._meta_call_fn(getattr(self.meta, method), *args)

    async def _meta_call_fn(self, fn: Callable, *args):
        """Call the metadata service, turning its errors into errnos."""
        try:
            return await fn(*args)
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
            values = await self._meta_call("get_all", store_path) or {}
            if cache is not None:
                cache.store(store_path, generation, values)
        return values

    async def _meta_get(self, store_path: str, key: str):
        if self.meta_cache is None:
            return await self._meta_call("get", store_path, key)
        return (await self._meta_values(store_path)).get(key)

    async def _meta_write(self, method: str, store_path: str, key: str, value=None) -> None:
        """set/unset one key, keeping the cache exact (dropped when the outcome is unknown)."""
        try:
            await self._meta_call(method, store_path, key, *(() if value is None else (value,)))
        except BaseException:
            if self.meta_cache is not None:
                self.meta_cache.forget(store_path)
            raise
        if self.meta_cache is not None:
            self.meta_cache.written(store_path, key, value)

    async def _meta_restructure_after(self, rel: bytes, method: str, *paths: str) -> None:
        """A store change following a namespace change that already happened in SOURCE:
        its failure (a full store) is logged, never the caller's answer (the ledger keeps
        the entries tied to their file, so they are never shown on another one)."""
        try:
            await self._meta_restructure(method, *paths)
        except (OSError, pyfuse3.FUSEError) as exc:
            log.warning("metadata %s for %r failed after the change in SOURCE: %s", method,
                        rel, exc)

    async def _meta_restructure(self, method: str, *paths: str) -> None:
        """remove/move/copy whole subtrees in the store; cached values are dropped after."""
        try:
            await self._meta_call(method, *paths)
        finally:
            if self.meta_cache is not None:
                self.meta_cache.moved_or_removed()

    async def _meta_sync(self) -> None:
        """Make every acknowledged metadata write durable (CONTRACT: fsync of any file)."""
        await self._meta_call_fn(self.meta.sync)
