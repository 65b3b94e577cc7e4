"""Directory listings through a real mount: they equal SOURCE's (names, types, inode numbers)
after changes made through the mount and behind its back, big directories and big views list
completely, directory cursors (telldir/seekdir/rewinddir) work, and directories report the
1 MiB st_blksize that makes each READDIRPLUS reply carry thousands of entries."""
from __future__ import annotations

import ctypes
import os
import stat
import time
from pathlib import Path

import pytest

from journalfs.demo import big_wallaby_index
from mountutil import mounted

pytestmark = pytest.mark.fuse

DIR_BLKSIZE = 1 << 20
BIG = 20_000
VIEW_RECORDS = 120_000  # above the views' name-only threshold (100,000 records)


@pytest.fixture(scope="module")
def fs(tmp_path_factory):
    base = tmp_path_factory.mktemp("readdir")
    src = base / "src"
    (src / "dir").mkdir(parents=True)
    for i in range(50):
        (src / "dir" / f"f{i:03d}").write_bytes(b"x" * i)
    (src / "dir" / "sub").mkdir()
    os.symlink("f001", src / "dir" / "link")
    big = src / "big"
    big.mkdir()
    for i in range(BIG):  # files and symlinks alternate: entry types change all along
        if i % 2:
            os.symlink(f"e{i - 1:06d}", big / f"e{i:06d}")
        else:
            os.close(os.open(big / f"e{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644))
    (src / "journals").mkdir()
    (src / "journals" / "big.idx").write_bytes(big_wallaby_index(VIEW_RECORDS))
    (src / "journals" / "small.idx").write_bytes(big_wallaby_index(300))
    with mounted(src, base / "mnt", "--store", str(base / "store"), "--sync", "none") as m:
        yield m


def listing(path: Path) -> dict[str, tuple[str, int]]:
    """{name: (type from the directory entry, d_ino)} as readdir reports them."""
    out = {}
    with os.scandir(path) as it:
        for entry in it:
            kind = "l" if entry.is_symlink() else "d" if entry.is_dir(follow_symlinks=False) \
                else "f"
            out[entry.name] = (kind, entry.inode())
    return out


def same_as_source(fs, rel: str) -> None:
    src, mnt = fs.source / rel, fs.mountpoint / rel
    through = listing(mnt)
    if rel == "":
        through.pop(".journalfs", None)
    assert through == listing(src)
    for name, (_, ino) in through.items():  # d_ino is the number stat reports too
        assert os.lstat(mnt / name).st_ino == ino


def test_listing_follows_changes_through_the_mount(fs):
    mnt = fs.mountpoint / "dir"
    same_as_source(fs, "dir")  # the listing is now kept by the daemon
    (mnt / "new").write_bytes(b"new")
    same_as_source(fs, "dir")
    (mnt / "f000").unlink()
    same_as_source(fs, "dir")
    (mnt / "f001").rename(mnt / "renamed")
    same_as_source(fs, "dir")
    (mnt / "newdir").mkdir()
    os.symlink("renamed", mnt / "link2")
    same_as_source(fs, "dir")
    (mnt / "sub").rmdir()
    os.link(mnt / "f002", mnt / "hard")
    same_as_source(fs, "dir")
    (mnt / "f003").write_bytes(b"longer than before")  # attributes in the listing change
    os.chmod(mnt / "f004", 0o600)
    with os.scandir(mnt) as it:
        got = {e.name: e.stat(follow_symlinks=False) for e in it}
    assert got["f003"].st_size == len(b"longer than before")
    assert stat.S_IMODE(got["f004"].st_mode) == 0o600
    same_as_source(fs, "dir")


def test_change_behind_the_mount_is_listed_at_once(fs):
    src, mnt = fs.source / "dir", fs.mountpoint / "dir"
    same_as_source(fs, "dir")
    for step in range(3):  # no waiting anywhere: each listing right after the change
        (src / f"behind{step}").write_bytes(b"b" * 10)
        assert f"behind{step}" in listing(mnt)
        same_as_source(fs, "dir")
    (src / "behind0").unlink()
    assert "behind0" not in listing(mnt)
    (src / "behind1").rename(src / "behind-renamed")
    names = listing(mnt)
    assert "behind1" not in names and "behind-renamed" in names
    same_as_source(fs, "dir")
    (src / "behind2").write_bytes(b"grown behind the mount")
    with os.scandir(mnt) as it:
        sizes = {e.name: e.stat(follow_symlinks=False).st_size for e in it}
    assert sizes["behind2"] == len(b"grown behind the mount")
    # once the watcher has applied a change, names the kernel knows are listed without
    # attributes: the kernel must have dropped the old ones
    os.chmod(src / "behind2", 0o640)
    time.sleep(0.3)
    for _ in range(2):
        with os.scandir(mnt) as it:
            modes = {e.name: stat.S_IMODE(e.stat(follow_symlinks=False).st_mode) for e in it}
        assert modes["behind2"] == 0o640
        same_as_source(fs, "dir")


def test_directories_report_a_1mib_block_size(fs):
    mnt, src = fs.mountpoint, fs.source
    for d in (mnt, mnt / "dir", mnt / "big", mnt / ".journalfs", mnt / ".journalfs" / "records",
              mnt / ".journalfs" / "records" / "journals",
              mnt / ".journalfs" / "records" / "journals" / "small.idx"):
        assert os.stat(d).st_blksize == DIR_BLKSIZE, d
    # other files keep SOURCE's preferred I/O size
    assert os.stat(mnt / "dir" / "f010").st_blksize == os.stat(src / "dir" / "f010").st_blksize
    assert os.lstat(mnt / "dir" / "link").st_blksize == os.lstat(src / "dir" / "link").st_blksize


def test_a_big_directory_lists_completely(fs):
    # the first listing introduces every entry to the kernel, the next ones go by name only
    first, second, third = (listing(fs.mountpoint / "big") for _ in range(3))
    assert len(first) == BIG
    assert first == second == third == listing(fs.source / "big")


# -- directory cursors through libc (telldir/seekdir/rewinddir) ---------------------------------

class _Dirent(ctypes.Structure):
    _fields_ = [("d_ino", ctypes.c_uint64), ("d_off", ctypes.c_int64),
                ("d_reclen", ctypes.c_ushort), ("d_type", ctypes.c_ubyte),
                ("d_name", ctypes.c_char * 256)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.opendir.restype = ctypes.c_void_p
_libc.opendir.argtypes = [ctypes.c_char_p]
_libc.readdir64.restype = ctypes.POINTER(_Dirent)
_libc.readdir64.argtypes = [ctypes.c_void_p]
_libc.telldir.restype = ctypes.c_long
_libc.telldir.argtypes = [ctypes.c_void_p]
_libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
_libc.rewinddir.argtypes = [ctypes.c_void_p]
_libc.closedir.argtypes = [ctypes.c_void_p]


def _next(d) -> bytes | None:
    ent = _libc.readdir64(d)
    return ent.contents.d_name if ent else None


def _rest(d) -> list[bytes]:
    out = []
    while (name := _next(d)) is not None:
        out.append(name)
    return out


def cursors_work(path: Path, marks: tuple[int, ...]) -> list[bytes]:
    """Read ``path`` with libc, remembering telldir() before entry ``i`` for each mark; seekdir
    back to each mark must continue with exactly the same entries, and rewinddir must start
    over. Returns the names."""
    d = _libc.opendir(os.fsencode(path))
    assert d, os.strerror(ctypes.get_errno())
    try:
        names, positions = [], {}
        while True:
            if len(names) in marks:
                positions[len(names)] = _libc.telldir(d)
            name = _next(d)
            if name is None:
                break
            names.append(name)
        assert set(positions) == set(marks)
        for i in sorted(marks, reverse=True):
            _libc.seekdir(d, positions[i])
            assert _rest(d) == names[i:], f"seekdir to entry {i}"
        _libc.rewinddir(d)
        assert _rest(d) == names
        return names
    finally:
        _libc.closedir(d)


def test_seekdir_telldir_rewinddir(fs):
    names = cursors_work(fs.mountpoint / "big", (0, 1, 2, 4_999, 5_000, 12_345, BIG))
    assert sorted(n for n in names if n not in (b".", b"..")) == \
        sorted(os.fsencode(n) for n in os.listdir(fs.source / "big"))


def test_rewinddir_sees_a_change(fs):
    mnt = fs.mountpoint / "dir"
    d = _libc.opendir(os.fsencode(mnt))
    try:
        before = _rest(d)
        (fs.source / "dir" / "after-rewind").write_bytes(b"")
        _libc.rewinddir(d)
        after = _rest(d)
    finally:
        _libc.closedir(d)
    assert b"after-rewind" not in before and b"after-rewind" in after


def test_names_made_after_opendir_show_at_the_first_readdir(fs):
    # xfstests generic/471: opendir, create through the mount, rewinddir, then readdir
    (fs.mountpoint / "fresh").mkdir()
    d = _libc.opendir(os.fsencode(fs.mountpoint / "fresh"))
    try:
        for i in range(20):
            (fs.mountpoint / "fresh" / f"n{i}").write_bytes(b"")
        _libc.rewinddir(d)
        names = _rest(d)
    finally:
        _libc.closedir(d)
    assert sorted(n for n in names if n not in (b".", b"..")) == \
        sorted(b"n%d" % i for i in range(20))


# -- views ---------------------------------------------------------------------------------------

def test_a_big_view_lists_every_record(fs):
    view = fs.mountpoint / ".journalfs" / "records" / "journals" / "big.idx"
    entries = listing(view)
    assert len(entries) == VIEW_RECORDS + 1
    expected = {f"{i:08d}.index" for i in range(VIEW_RECORDS)} | {"records.jsonl"}
    assert set(entries) == expected
    assert all(kind == "f" for kind, _ in entries.values())
    assert len({ino for _, ino in entries.values()}) == len(entries)
    for i in (0, 1, VIEW_RECORDS // 2, VIEW_RECORDS - 1):  # names listed alone still stat
        name = f"{i:08d}.index"
        st = os.stat(view / name)
        assert st.st_ino == entries[name][1]
        assert st.st_size == len((view / name).read_bytes()) > 0
    names = cursors_work(view, (0, 3, 5_000, 70_001, VIEW_RECORDS))
    assert len([n for n in names if n not in (b".", b"..")]) == VIEW_RECORDS + 1


def test_a_small_view_lists_every_record_with_sizes(fs):
    view = fs.mountpoint / ".journalfs" / "records" / "journals" / "small.idx"
    with os.scandir(view) as it:
        sizes = {e.name: e.stat().st_size for e in it}
    assert set(sizes) == {f"{i:08d}.index" for i in range(300)} | {"records.jsonl"}
    for name in ("00000000.index", "00000299.index"):
        assert sizes[name] == len((view / name).read_bytes())


def test_listing_without_a_watch_follows_changes_through_the_mount(tmp_path):
    """No watcher (JOURNALFS_WATCH=off): listings are not kept, names go with attributes."""
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    (src / "dir").mkdir(parents=True)
    for i in range(40):
        (src / "dir" / f"g{i:02d}").write_bytes(b"g")
    env = dict(os.environ, JOURNALFS_WATCH="off")
    with mounted(src, mnt, "--store", str(tmp_path / "store"), env=env) as m:
        same_as_source(m, "dir")
        (mnt / "dir" / "made").write_bytes(b"m")
        (mnt / "dir" / "g00").unlink()
        (mnt / "dir" / "g01").rename(mnt / "dir" / "moved")
        same_as_source(m, "dir")
        os.truncate(mnt / "dir" / "g02", 7)
        with os.scandir(mnt / "dir") as it:
            assert {e.name: e.stat().st_size for e in it}["g02"] == 7


def _indexed_journals(corpus):
    """(path, RecordIndex) of every journal file under ``corpus``, in name order."""
    from journalfs.journals import RecordIndex, sniff_fd

    for path in sorted(p for p in corpus.rglob("*") if p.is_file()):
        fd = os.open(path, os.O_RDONLY)
        try:
            codec = sniff_fd(fd)
        finally:
            os.close(fd)
        if codec is not None:
            yield path, RecordIndex.build(str(path), codec)


def test_names_from_columns_equal_names_from_lines(records_corpus):
    """Name-only listings take kinds from the codec's columns; they must name every record
    exactly as the rendered listing does, from any start, for every conformance journal."""
    from journalfs.fs.views import Views

    checked = 0
    for path, idx in _indexed_journals(records_corpus):
        for first in sorted({0, 1, idx.count // 2, max(0, idx.count - 1)}):
            assert Views._list_names(idx, first) == Views._list_batch(idx, first, sizes=False), \
                (path, first)
        checked += 1
    assert checked >= 9


def _replies_one_by_one(names: list[bytes], first: int, ino_base: int) -> bytes:
    """What ``pyfuse3.readdir_reply`` writes for ``names`` listed by name only, entry by
    entry, as views did before entries were built a block at a time."""
    import pyfuse3

    from journalfs.fs import direntries
    from journalfs.fs.dirlist import NameOnlyEntry

    plain = NameOnlyEntry(stat.S_IFREG | 0o444)
    token = pyfuse3.ReaddirToken()
    direntries._field(token, direntries._SIZE).value = size = 200 * len(names) + 4096
    try:
        for seq, name in enumerate(names, first):
            plain.ino.value = ino_base | seq
            assert pyfuse3.readdir_reply(token, name, plain.attrs, seq + 2)
        start = direntries._field(token, direntries._BUF_START).value
        return ctypes.string_at(start, size - direntries.room(token))
    finally:
        direntries._libc.free(direntries._field(token, direntries._BUF_START).value)
        for offset in (direntries._BUF_START, direntries._BUF, direntries._SIZE):
            direntries._field(token, offset).value = 0


def test_entry_blocks_equal_entries_replied_one_by_one(records_corpus):
    """A big view's READDIRPLUS entries are built as one block per batch from the records'
    kinds; byte for byte they must be what readdir_reply writes entry by entry, for one kind,
    mixed kinds of several lengths, and the kinds every conformance journal lists."""
    from journalfs.fs import direntries
    from journalfs.fs.dirlist import NameOnlyEntry
    from journalfs.fs.views import Views

    assert direntries.available
    head = direntries.template(NameOnlyEntry(stat.S_IFREG | 0o444).attrs)
    ino_base = (1 << 62) | (5 << 40)

    def check(first: int, kinds: list) -> None:
        names, seq = [], first
        for count, kind in kinds:
            for k in ([kind] * count if isinstance(kind, bytes) else kind):
                names.append(b"%08d.%s" % (seq, k))
                seq += 1
        block, ends = direntries.entries(head, first, kinds, ino_base, 2)
        assert block.tobytes() == _replies_one_by_one(names, first, ino_base)
        sizes = [(direntries.NAME + len(n) + 7) & ~7 for n in names]
        assert ends.tolist() == [sum(sizes[:i + 1]) for i in range(len(sizes))]

    check(0, [(1000, b"index")])
    check(99_999_000, [(1000, b"x")])  # the last 8-digit record numbers
    check(7, [(3, b"put"), (5, [b"delete", b"put", b"k", b"a-long-kind-name", b"put"]),
              (2, b"read_head")])
    with pytest.raises(ValueError):
        direntries.entries(head, 99_999_999, [(2, b"x")], ino_base, 2)
    checked = 0
    for path, idx in _indexed_journals(records_corpus):
        for first in sorted({0, 1, idx.count // 2, max(0, idx.count - 1)}):
            names = Views._list_names(idx, first)
            block = Views._list_entries(idx, first, head, ino_base)
            assert block.block.tobytes() == _replies_one_by_one(names, first, ino_base), \
                (path, first)
            assert len(block) == len(names)
        checked += 1
    assert checked >= 9


def test_big_views_are_listed_by_name_only_and_smaller_ones_with_sizes():
    """From NAMES_ONLY_RECORDS records a view's entries carry no attributes (no kernel inode
    per record); below, exact sizes (so `ls --color` and `ls -l` look nothing up)."""
    from types import SimpleNamespace

    from journalfs.fs import direntries
    from journalfs.fs.dirlist import NameOnlyEntry
    from journalfs.fs.viewlisting import NAMES_ONLY_RECORDS, ViewListing
    from journalfs.fs.viewnodes import BLOCKS, FULL, JournalListing

    assert NameOnlyEntry.available and direntries.available  # else test_fs_cstructs fails too
    mode = stat.S_IFREG | 0o444
    for count, way in ((NAMES_ONLY_RECORDS - 1, FULL), (NAMES_ONLY_RECORDS, BLOCKS)):
        assert ViewListing._listing_way(JournalListing(None), SimpleNamespace(count=count),
                                        mode) == way
