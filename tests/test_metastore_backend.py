"""The store boundary (#26): every backend serves the MetadataBackend protocol, says up front
what it cannot do and refuses it with ENOTSUP; the sync mode has one owner (the backend, and
under it the store), and the mount's runtime settings one owner (RuntimeSettings), which
MNT/.journalfs's Control changes. In-process, on real stores; a not-running GvfsdBackend
needs no gvfsd-metadata for what is asked of it here."""
from __future__ import annotations

import errno

import pyfuse3
import pytest
import trio

from journalfs.fs.control import PREFIX, Control
from journalfs.fs.settings import RuntimeSettings
from journalfs.metastore.backend import MetadataBackend, NotSupported
from journalfs.metastore.gvfs_service import (GuardedMetaService, SessionStoreBackend,
                                              StoreGuard, open_metadata_backend)
from journalfs.metastore.gvfsd import GvfsdBackend
from journalfs.metastore.location import StoreLocation
from journalfs.metastore.mirror import MirroredBackend, MountView
from journalfs.metastore.service import MetaService
from journalfs.metastore.store import MetaStore

pytestmark = pytest.mark.fast


@pytest.fixture
def store(tmp_path):
    with MetaStore.open(str(tmp_path / "store" / "home"), sync="batch") as opened:
        yield opened


def _settings(backend: MetadataBackend, timeout: float = 30.0) -> RuntimeSettings:
    return RuntimeSettings(backend, timeout=timeout, readonly=False, cache_cap=2.0)


def test_every_backend_serves_the_protocol(tmp_path, store):
    gvfsd = GvfsdBackend(tmp_path / "gvfs" / "home")
    session = SessionStoreBackend(str(tmp_path / "gvfs" / "home"), "unix:path=/nonexistent")
    view = MountView(StoreLocation(str(tmp_path / "gvfs" / "home"), "/src"),
                     StoreLocation(str(tmp_path / "gvfs" / "root"), "/mnt"))
    for backend in (MetaService(store), GuardedMetaService(store, StoreGuard("private")),
                    gvfsd, session, MirroredBackend(gvfsd, view), MirroredBackend(session, view)):
        assert isinstance(backend, MetadataBackend), type(backend).__name__


def test_open_metadata_backend_gives_the_embedded_store(tmp_path):
    backend = open_metadata_backend(str(tmp_path / "s" / "home"), shared_dir=False, gvfs=False,
                                    sync="always", readonly=False)
    assert isinstance(backend, MetadataBackend) and isinstance(backend, MetaService)
    assert backend.sync_mode == "always" and backend.sole_writer and backend.ledger is not None
    backend.store.close()


def test_the_embedded_store_owns_its_sync_mode_and_rotates(store):
    service = MetaService(store, sync="none")
    assert service.sync_mode == store.sync == "none"  # one value: the store's own
    service.set_sync("always")
    assert store.sync == "always" and service.status()["sync"] == "always"
    with pytest.raises(ValueError):
        service.set_sync("sometimes")
    assert service.sync_mode == "always"
    assert service.readonly is False and service.sole_writer and service.ledger is store.ledger
    assert service.journal_path() == store.journal_path

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            assert service.rotations() == 0
            await service.set("/a", "k", "v")
            assert await service.subtree("/") == {"/a": {"k": "v"}}
            await service.set_many("/a", {"k": None, "j": ["x", "y"]})
            assert await service.get_all("/a") == {"j": ["x", "y"]}
            await service.compact()
            assert service.rotations() == 1
            nursery.cancel_scope.cancel()
    trio.run(main)


def test_a_read_only_store_is_no_sole_writer(tmp_path):
    tree = str(tmp_path / "s" / "home")
    with MetaStore.open(tree, sync="none") as writer:
        writer.set("/a", "k", "v")
    with MetaStore.open(tree, readonly=True) as reader:
        service = MetaService(reader)
        assert service.readonly and not service.sole_writer and service.ledger is None


def test_gvfsd_says_what_it_cannot_do_and_refuses_it(tmp_path):
    backend = GvfsdBackend(tmp_path / "home")
    assert backend.sync_mode is None and backend.rotations() is None
    assert not backend.sole_writer and backend.ledger is None and not backend.readonly
    with pytest.raises(NotSupported) as refused:
        backend.set_sync("always")
    assert refused.value.errno == errno.ENOTSUP and "gvfsd-metadata" in str(refused.value)
    with pytest.raises(NotSupported) as refused:
        trio.run(backend.compact)
    assert refused.value.errno == errno.ENOTSUP and "rotates it on its own" in str(refused.value)


def test_settings_have_one_owner_and_tell_their_listeners(store):
    service = MetaService(store, sync="batch")
    settings = _settings(service, timeout=30.0)
    seen = []
    settings.subscribe(lambda s: seen.append((s.timeout, s.cache_ttl, s.readonly, s.sync)))
    assert settings.cache_ttl == 2.0  # the daemon's caches never outlive their cap
    settings.set_timeout(0.5)
    settings.set_sync("always")
    settings.set_readonly(True)
    assert seen == [(0.5, 0.5, False, "batch"), (0.5, 0.5, False, "always"),
                    (0.5, 0.5, True, "always")]
    assert store.sync == "always"  # the mode was changed where it lives, not copied
    assert settings.options() == {"entry_timeout": 0.5, "attr_timeout": 0.5, "ro": True,
                                  "sync": "always"}


def _control(backend: MetadataBackend) -> tuple[Control, RuntimeSettings, list[bool]]:
    traced: list[bool] = []
    settings = _settings(backend)
    return Control(settings, trace=traced.append, owner_uid=0), settings, traced


def test_control_changes_the_embedded_store_settings(store):
    service = MetaService(store, sync="batch")
    control, settings, traced = _control(service)
    root = pyfuse3.RequestContext()  # uid 0

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            names = await control.listxattr()
            assert set(names) == {PREFIX + n for n in (b"timeout", b"ro", b"log_level",
                                                       b"sync", b"rotate")}
            assert await control.getxattr(PREFIX + b"sync") == b"batch"
            await control.setxattr(PREFIX + b"sync", b"none", root)
            assert service.sync_mode == "none" and settings.sync == "none"
            await control.setxattr(PREFIX + b"timeout", b"5", root)
            assert settings.timeout == 5.0 and await control.getxattr(PREFIX + b"timeout") == b"5"
            await control.setxattr(PREFIX + b"rotate", b"1", root)
            assert await control.getxattr(PREFIX + b"rotate") == b"1"
            with pytest.raises(pyfuse3.FUSEError) as refused:
                await control.setxattr(PREFIX + b"sync", b"sometimes", root)
            assert refused.value.errno == errno.EINVAL
            assert control.last_error["setting"] == "sync"
            nursery.cancel_scope.cancel()
    trio.run(main)
    assert traced == []


def test_control_on_a_gvfsd_store_lists_neither_sync_nor_rotate_and_refuses_them(tmp_path):
    control, settings, _ = _control(GvfsdBackend(tmp_path / "home"))
    root = pyfuse3.RequestContext()

    async def main():
        names = await control.listxattr()
        assert PREFIX + b"sync" not in names and PREFIX + b"rotate" not in names
        assert PREFIX + b"timeout" in names
        with pytest.raises(pyfuse3.FUSEError) as missing:
            await control.getxattr(PREFIX + b"sync")
        assert missing.value.errno == pyfuse3.ENOATTR
        for setting, value in ((b"sync", b"always"), (b"rotate", b"1")):
            with pytest.raises(pyfuse3.FUSEError) as refused:
                await control.setxattr(PREFIX + setting, value, root)
            assert refused.value.errno == errno.ENOTSUP
            assert control.last_error["errno"] == "ENOTSUP"
            assert "gvfsd-metadata" in control.last_error["message"]
        with pytest.raises(pyfuse3.FUSEError) as unknown:
            await control.setxattr(PREFIX + b"colour", b"1", root)
        assert unknown.value.errno == pyfuse3.ENOATTR
    trio.run(main)
    assert settings.sync is None and settings.options()["sync"] is None
