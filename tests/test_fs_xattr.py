"""``user.metadata.<key>`` xattrs on a real mount: values, errno semantics, renames, removal."""
from __future__ import annotations

import ctypes
import errno
import os
import subprocess

import pytest

from journalfs.metastore.location import resolve_store
from journalfs.metastore.store import MetaStore
from mountutil import mounted

pytestmark = pytest.mark.fuse

_libc = ctypes.CDLL(None, use_errno=True)
_libc.getxattr.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
_libc.getxattr.restype = ctypes.c_ssize_t


def raw_getxattr(path, name: str, size: int) -> tuple[int, int, bytes]:
    """getxattr(2) with an explicit buffer size: (return value, errno, bytes)."""
    buf = ctypes.create_string_buffer(max(size, 1))
    ret = _libc.getxattr(os.fsencode(path), name.encode(), buf if size else None, size)
    err = ctypes.get_errno() if ret < 0 else 0
    return ret, err, buf.raw[:max(ret, 0)]


def errno_of(fn, *args, **kwargs) -> int:
    with pytest.raises(OSError) as info:
        fn(*args, **kwargs)
    return info.value.errno


@pytest.fixture(scope="module")
def fs(tmp_path_factory):
    base = tmp_path_factory.mktemp("xattr")
    src, mnt, store = base / "src", base / "mnt", base / "store"
    src.mkdir()
    (src / "f.txt").write_text("file")
    (src / "d").mkdir()
    with mounted(src, mnt, "--store", str(store), "--sync", "always") as m:
        m.location = resolve_store(str(src), str(store))
        yield m


def stored(fs, rel: str) -> dict:
    """What the store itself holds for mount path ``rel`` (read-only view of the files)."""
    store = MetaStore.open(fs.location.tree_path, readonly=True)
    try:
        return store.get_all(fs.location.store_path(rel))
    finally:
        store.close()


def test_string_value_roundtrip_with_attr_tools(fs):
    f = fs.mountpoint / "f.txt"
    subprocess.run(["setfattr", "-n", "user.metadata.colour", "-v", "blue é", str(f)], check=True)
    out = subprocess.run(["getfattr", "--only-values", "-n", "user.metadata.colour", str(f)],
                         capture_output=True, check=True)
    assert out.stdout == "blue é".encode()
    assert stored(fs, "/f.txt")["colour"] == "blue é"
    dump = subprocess.run(["getfattr", "-d", "-m", "-", str(f)], capture_output=True, text=True,
                          check=True).stdout
    assert "user.metadata.colour=0sYmx1ZSDDqQ==" in dump  # non-ASCII: getfattr prints base64
    subprocess.run(["setfattr", "-n", "user.metadata.plain", "-v", "ascii", str(f)], check=True)
    dump = subprocess.run(["getfattr", "-d", str(f)], capture_output=True, text=True,
                          check=True).stdout
    assert 'user.metadata.plain="ascii"' in dump


def test_list_values(fs):
    f = fs.mountpoint / "f.txt"
    os.setxattr(f, "user.metadata.tags", b"a\0bb\0")
    assert os.getxattr(f, "user.metadata.tags") == b"a\0bb\0"
    assert stored(fs, "/f.txt")["tags"] == ["a", "bb"]
    os.setxattr(f, "user.metadata.tags", b"x\0y")  # no trailing NUL: still a list
    assert stored(fs, "/f.txt")["tags"] == ["x", "y"]
    assert os.getxattr(f, "user.metadata.tags") == b"x\0y\0"
    os.setxattr(f, "user.metadata.tags", b"plain")
    assert stored(fs, "/f.txt")["tags"] == "plain"


def test_size_probing_and_erange(fs):
    f = fs.mountpoint / "f.txt"
    os.setxattr(f, "user.metadata.sized", b"0123456789")
    assert raw_getxattr(f, "user.metadata.sized", 0)[0] == 10
    ret, err, _ = raw_getxattr(f, "user.metadata.sized", 4)
    assert ret == -1 and err == errno.ERANGE
    assert raw_getxattr(f, "user.metadata.sized", 10) == (10, 0, b"0123456789")


def test_missing_is_enodata(fs):
    f = fs.mountpoint / "f.txt"
    assert errno_of(os.getxattr, f, "user.metadata.nope") == errno.ENODATA
    assert errno_of(os.removexattr, f, "user.metadata.nope") == errno.ENODATA
    assert errno_of(os.getxattr, f, "security.selinux") == errno.ENODATA
    assert errno_of(os.getxattr, f, "user.not_there") == errno.ENODATA


def test_create_and_replace_flags(fs):
    f = fs.mountpoint / "f.txt"
    assert errno_of(os.setxattr, f, "user.metadata.flag", b"v", os.XATTR_REPLACE) == errno.ENODATA
    os.setxattr(f, "user.metadata.flag", b"v1", os.XATTR_CREATE)
    assert errno_of(os.setxattr, f, "user.metadata.flag", b"v2", os.XATTR_CREATE) == errno.EEXIST
    os.setxattr(f, "user.metadata.flag", b"v3", os.XATTR_REPLACE)
    assert os.getxattr(f, "user.metadata.flag") == b"v3"


def test_oversize_is_e2big(fs):
    f = fs.mountpoint / "f.txt"
    assert errno_of(os.setxattr, f, "user.metadata.huge", b"x" * 65537) == errno.E2BIG
    assert errno_of(os.getxattr, f, "user.metadata.huge") == errno.ENODATA


def test_remove(fs):
    f = fs.mountpoint / "f.txt"
    os.setxattr(f, "user.metadata.gone", b"soon")
    subprocess.run(["setfattr", "-x", "user.metadata.gone", str(f)], check=True)
    assert errno_of(os.getxattr, f, "user.metadata.gone") == errno.ENODATA
    assert "gone" not in stored(fs, "/f.txt")


def test_native_xattrs_pass_through_and_list_merges(fs):
    f, src = fs.mountpoint / "f.txt", fs.source / "f.txt"
    os.setxattr(f, "user.native", b"on disk")
    assert os.getxattr(src, "user.native") == b"on disk"
    os.setxattr(src, "user.from_source", b"s")
    assert os.getxattr(f, "user.from_source") == b"s"
    os.setxattr(f, "user.metadata.listed", b"1")
    names = os.listxattr(f)
    assert {"user.native", "user.from_source", "user.metadata.listed"} <= set(names)
    assert "user.metadata.listed" not in os.listxattr(src)  # metadata lives in the store only
    os.removexattr(f, "user.native")
    assert "user.native" not in os.listxattr(src)


def test_directories_carry_metadata(fs):
    d = fs.mountpoint / "d"
    os.setxattr(d, "user.metadata.icon", b"folder")
    assert os.getxattr(d, "user.metadata.icon") == b"folder"
    assert stored(fs, "/d") == {"icon": "folder"}
    os.setxattr(fs.mountpoint, "user.metadata.rootkey", b"r")
    assert stored(fs, "/")["rootkey"] == "r"


def test_symlinks_and_fifos_refuse_user_xattrs(fs):
    link, fifo = fs.mountpoint / "lnk", fs.mountpoint / "fifo"
    os.symlink("f.txt", link)
    os.mkfifo(fifo)
    for path in (link, fifo):
        assert errno_of(os.setxattr, path, "user.metadata.k", b"v",
                        follow_symlinks=False) == errno.EPERM
    # Through the link the target is meant (the kernel follows it, not journalfs).
    os.setxattr(link, "user.metadata.via_link", b"t")
    assert os.getxattr(fs.mountpoint / "f.txt", "user.metadata.via_link") == b"t"


def tagged_file(path, key: str, value: bytes) -> None:
    """A new empty file carrying one metadata key."""
    path.write_text("")
    os.setxattr(path, f"user.metadata.{key}", value)


def test_metadata_follows_file_rename(fs):
    mnt = fs.mountpoint
    tagged_file(mnt / "mv-a", "k", b"moved")
    os.rename(mnt / "mv-a", mnt / "d" / "mv-b")
    assert os.getxattr(mnt / "d" / "mv-b", "user.metadata.k") == b"moved"
    assert stored(fs, "/d/mv-b") == {"k": "moved"}
    assert stored(fs, "/mv-a") == {}
    (mnt / "mv-a").write_text("")  # a new file at the old name starts clean
    assert errno_of(os.getxattr, mnt / "mv-a", "user.metadata.k") == errno.ENODATA


def test_metadata_follows_directory_rename(fs):
    mnt = fs.mountpoint
    (mnt / "tree" / "deep").mkdir(parents=True)
    (mnt / "tree" / "deep" / "leaf").write_text("")
    os.setxattr(mnt / "tree", "user.metadata.top", b"1")
    os.setxattr(mnt / "tree" / "deep" / "leaf", "user.metadata.leaf", b"2")
    os.rename(mnt / "tree", mnt / "tree2")
    assert os.getxattr(mnt / "tree2", "user.metadata.top") == b"1"
    assert os.getxattr(mnt / "tree2" / "deep" / "leaf", "user.metadata.leaf") == b"2"
    assert stored(fs, "/tree2/deep/leaf") == {"leaf": "2"}
    assert stored(fs, "/tree/deep/leaf") == {}


def test_metadata_of_overwritten_file_is_replaced(fs):
    mnt = fs.mountpoint
    tagged_file(mnt / "ow-src", "a", b"src")
    tagged_file(mnt / "ow-dst", "b", b"dst")
    os.rename(mnt / "ow-src", mnt / "ow-dst")
    assert stored(fs, "/ow-dst") == {"a": "src"}


def test_metadata_swaps_with_rename_exchange(fs):
    from test_fs_passthrough import RENAME_EXCHANGE, renameat2
    mnt = fs.mountpoint
    tagged_file(mnt / "sw1", "who", b"one")
    tagged_file(mnt / "sw2", "who", b"two")
    renameat2(mnt / "sw1", mnt / "sw2", RENAME_EXCHANGE)
    assert stored(fs, "/sw1") == {"who": "two"}
    assert stored(fs, "/sw2") == {"who": "one"}


def test_metadata_removed_with_unlink_and_rmdir(fs):
    mnt = fs.mountpoint
    tagged_file(mnt / "rm-f", "k", b"v")
    (mnt / "rm-f").unlink()
    assert stored(fs, "/rm-f") == {}
    (mnt / "rm-d").mkdir()
    os.setxattr(mnt / "rm-d", "user.metadata.k", b"v")
    (mnt / "rm-d").rmdir()
    assert stored(fs, "/rm-d") == {}
    (mnt / "rm-d").mkdir()
    assert errno_of(os.getxattr, mnt / "rm-d", "user.metadata.k") == errno.ENODATA


def test_metadata_survives_remount(tmp_path):
    src, mnt, store = tmp_path / "src", tmp_path / "mnt", tmp_path / "store"
    src.mkdir()
    (src / "keep").write_text("")
    with mounted(src, mnt, "--store", str(store)):
        os.setxattr(mnt / "keep", "user.metadata.k", b"persisted")
        os.setxattr(mnt / "keep", "user.metadata.l", b"1\0002\0")
    with mounted(src, mnt, "-o", f"store={store},sync=none"):
        assert os.getxattr(mnt / "keep", "user.metadata.k") == b"persisted"
        assert os.getxattr(mnt / "keep", "user.metadata.l") == b"1\0002\0"


# -- value encoding, without a mount ---------------------------------------------------------
from hypothesis import given, strategies as st  # noqa: E402

from journalfs.fs.xattrs import decode_value, encode_value  # noqa: E402

_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=20)


@given(st.one_of(_text, st.lists(_text, min_size=1, max_size=6)))
def test_value_encoding_roundtrips(value):
    raw = encode_value(value)
    if isinstance(value, list):
        assert raw.count(b"\0") == len(value) and raw.endswith(b"\0")
    assert decode_value(raw) == value


def test_value_decoding_rules():
    assert decode_value(b"a\0b") == ["a", "b"]
    assert decode_value(b"\0") == [""]
    assert decode_value(b"") == ""
    assert decode_value("é".encode()) == "é"
