"""gvfs-tree and gvfs-journal codecs: real gvfs files, round trips, hostile input."""
from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journalfs.formats import CODECS, FormatError, detect, gvfs_tree
from journalfs.formats.gvfs_journal import (HEADER_SIZE, decode_entry, encode_entry,
                                            iter_entries, new_journal, parse_header)
from journalfs.formats.gvfs_tree import (DIRENT_SIZE, LIST_FLAG, MergedTree, TreeView,
                                         tree_bytes)

TREE, JOURNAL = CODECS["gvfs-tree"], CODECS["gvfs-journal"]


def store_files(snapshot: Path) -> tuple[bytes, Path, bytes]:
    d = snapshot / "gvfs-metadata"
    (journal,) = d.glob("home-*.log")
    return (d / "home").read_bytes(), journal, journal.read_bytes()


def merged_state(tree: bytes, journal: bytes) -> dict:
    merged = MergedTree(TreeView(tree, "home"))
    for rec in JOURNAL.read(journal, "journal"):
        merged.apply(rec)
    return {path: meta for path, meta, _ in merged.items()}


# ---- real gvfs files -----------------------------------------------------------------
def test_detect_by_magic(gvfs_snapshots):
    tree, _, journal = store_files(gvfs_snapshots[-1])
    assert detect(tree[:64]) is TREE and detect(journal[:64]) is JOURNAL
    assert detect(b"\xda\x1amets" + bytes(60)) is None


def test_every_real_journal_entry_has_a_good_crc(gvfs_snapshots):
    """Independent walk: sizes from the bytes, CRC with zlib; the codec must agree."""
    for snap in gvfs_snapshots:
        _, path, data = store_files(snap)
        count = struct.unpack_from(">I", data, 16)[0]
        offset, offsets = HEADER_SIZE, []
        for _ in range(count):
            size, crc = struct.unpack_from(">II", data, offset)
            assert zlib.crc32(data[offset + 8:offset + size]) == crc
            assert struct.unpack_from(">I", data, offset + size - 4)[0] == size
            offsets.append(offset)
            offset += size
        recs = list(JOURNAL.read(data, str(path)))
        assert [r["offset"] for r in recs] == offsets
        assert [r["seq"] for r in recs] == list(range(count))
        assert {r["kind"] for r in recs} <= {"set", "setv", "unset", "copy", "remove"}


def test_real_stores_merge_to_gio_ground_truth(gvfs_snapshots):
    for snap in gvfs_snapshots:
        tree, _, journal = store_files(snap)
        want = json.loads((snap / "expected.json").read_text())
        assert merged_state(tree, journal) == want, snap


def test_our_tree_writer_keeps_real_state_and_gvfs_layout_rules(gvfs_snapshots):
    for snap in gvfs_snapshots:
        tree, _, journal = store_files(snap)
        merged = MergedTree(TreeView(tree, "home"))
        for rec in JOURNAL.read(journal, "j"):
            merged.apply(rec)
        ours = tree_bytes(merged, 0xA571F354)
        view = TreeView(ours, "ours")
        assert view.tag == 0xA571F354 and view.rotated == 0 and len(ours) % 4 == 0
        assert view.keywords == sorted(view.keywords, key=lambda k: k.encode())
        for _, off in view.walk():
            names = [name for name, _ in view.children(off)]
            assert names == sorted(names)
            _, children, meta, _ = view.dirent(off)
            assert children % 4 == 0 and meta % 4 == 0 and children and meta  # 2016+ layout
        want = json.loads((snap / "expected.json").read_text())
        assert {r["path"]: r["metadata"] for r in TREE.read(ours, "ours")} == want


def test_tree_records_are_breadth_first_nodes_with_metadata(gvfs_snapshots):
    tree, _, _ = store_files(gvfs_snapshots[-1])
    recs = list(TREE.read(tree, "home"))
    assert recs and all(r["kind"] == "node" and r["metadata"] for r in recs)
    depths = [r["path"].count("/") for r in recs]
    assert depths == sorted(depths)
    view = TreeView(tree, "home")
    for r in recs:  # times: base + raw, never below the base
        assert r["mtime"] > view.time_base


# ---- round trips -----------------------------------------------------------------------
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12)
names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0/"),
                min_size=1, max_size=6)
paths = st.lists(names, min_size=0, max_size=4).map(lambda p: "/" + "/".join(p))
keys = text.filter(bool)
values = st.one_of(text, st.lists(text, max_size=4))
mtimes = st.integers(0, 2**40)

journal_records = st.lists(st.one_of(
    st.builds(lambda p, k, v, t: {"kind": "setv" if isinstance(v, list) else "set", "mtime": t,
                                  "path": p, "key": k, "value": v}, paths, keys, values, mtimes),
    st.builds(lambda p, k, t: {"kind": "unset", "mtime": t, "path": p, "key": k}, paths, keys, mtimes),
    st.builds(lambda p, s, t: {"kind": "copy", "mtime": t, "path": p, "source": s}, paths, paths, mtimes),
    st.builds(lambda p, t: {"kind": "remove", "mtime": t, "path": p}, paths, mtimes),
), max_size=30)


@given(journal_records, st.integers(0, 2**32 - 1))
@settings(max_examples=150, deadline=None)
def test_journal_round_trip(records, tag):
    data = JOURNAL.write(records, tag=tag)
    assert len(data) == max(32768, len(data)) and parse_header(data, "j").tag == tag
    got = [{k: v for k, v in r.items() if k not in ("format", "seq", "offset")}
           for r in JOURNAL.read(data, "j")]
    assert got == records


tree_nodes = st.dictionaries(paths, st.tuples(st.dictionaries(keys, values, min_size=1, max_size=4),
                                               st.integers(1_000_000_000, 1_000_000_000 + 2**31)), max_size=25)


@given(tree_nodes, st.integers(0, 2**32 - 1))
@settings(max_examples=150, deadline=None)
def test_tree_round_trip(nodes, tag):
    records = [{"path": p, "metadata": m, "mtime": t} for p, (m, t) in nodes.items()]
    data = TREE.write(records, tag=tag)
    got = {r["path"]: (r["metadata"], r["mtime"]) for r in TREE.read(data, "t")}
    want = {p: (m, t) for p, (m, t) in nodes.items() if p != "/"}  # the root's time is a quirk
    assert {p: v for p, v in got.items() if p != "/"} == want
    if "/" in nodes:
        assert got["/"][0] == nodes["/"][0]
    view = TreeView(data, "t")
    for p, (m, _) in nodes.items():  # lookup primitives agree with the full read
        off = view.lookup(p)
        assert off is not None and view.metadata(off) == m
        assert all(view.get(off, k) == v for k, v in m.items())
    assert view.lookup("/definitely/not/there") is None


def test_times_below_the_base_and_huge_ranges_are_clamped():
    data = TREE.write([{"path": "/a", "metadata": {"k": "v"}, "mtime": 10},
                       {"path": "/b", "metadata": {"k": "v"}, "mtime": 10 + 2**33}])
    view = TreeView(data, "t")  # range too wide: base = max - 0xFFFFFFFF, older times -> raw 1
    assert view.time_base == 10 + 2**33 - 0xFFFFFFFF
    assert view.time(view.lookup("/b")) == 10 + 2**33
    assert struct.unpack_from(">I", data, view.lookup("/a") + 12)[0] == 1
    narrow = TreeView(TREE.write([{"path": "/a", "metadata": {"k": "v"}, "mtime": 10}]), "t")
    assert narrow.time_base == 9 and narrow.time(narrow.lookup("/a")) == 10


def test_journal_entry_layout_is_byte_exact():
    entry = encode_entry("setv", 0x6B027228, "/p", "k", ["ab", "c"])
    # size, crc, mtime, op, "/p\0" "k\0" pad to 4, count, "ab\0c\0", pad, size
    body = b"\0\0\0\0\x6b\x02\x72\x28" + b"\x01/p\0k\0" + b"\0\0" + struct.pack(">I", 2) + b"ab\0c\0"
    body += b"\0" * (-(len(body) + 8) % 4)
    size = len(body) + 12
    assert entry == struct.pack(">II", size, zlib.crc32(body + struct.pack(">I", size))) + body + \
        struct.pack(">I", size)


def test_entries_past_num_entries_are_not_part_of_the_journal():
    data = bytearray(JOURNAL.write([{"kind": "remove", "mtime": 1, "path": "/a"},
                                    {"kind": "remove", "mtime": 2, "path": "/b"}]))
    struct.pack_into(">I", data, 16, 1)
    assert [r["path"] for r in JOURNAL.read(bytes(data), "j")] == ["/a"]
    struct.pack_into(">I", data, 16, 3)  # counts a zero-filled slot: damage after 2 entries
    with pytest.raises(FormatError) as exc:
        list(JOURNAL.read(bytes(data), "j"))
    assert exc.value.source == "j" and exc.value.offset > HEADER_SIZE


def test_old_layout_with_zero_offsets_is_readable():
    data = bytearray(TREE.write([{"path": "/a/b", "metadata": {"k": "v"}, "mtime": 5}]))
    view = TreeView(bytes(data), "t")
    for _, off in list(view.walk()):  # blank every empty block pointer, as pre-2016 gvfs did
        n_children = view.child_count(off)
        if n_children == 0:
            struct.pack_into(">I", data, off + 4, 0)
        if not view.has_metadata(off):
            struct.pack_into(">I", data, off + 8, 0)
    assert [(r["path"], r["metadata"]) for r in TREE.read(bytes(data), "t")] == [("/a/b", {"k": "v"})]


# ---- hostile input -------------------------------------------------------------------------
def _read_all(codec, data: bytes) -> None:
    try:
        list(codec.read(data, "hostile"))
    except FormatError as exc:
        assert exc.source == "hostile" and 0 <= exc.offset <= max(len(data), 32)


def test_truncated_real_files_raise_format_error_after_the_valid_prefix(gvfs_snapshots):
    tree, _, journal = store_files(gvfs_snapshots[-1])
    full = list(JOURNAL.read(journal, "j"))
    ends = [r["offset"] + struct.unpack_from(">I", journal, r["offset"])[0] for r in full]
    for cut in (0, 5, 19, 20, 21, 64, 1000, ends[len(ends) // 2], ends[-1] - 3, ends[-1],
                ends[-1] + 8, len(journal) - 1):
        _read_all(TREE, tree[:cut])
        got, error = [], None
        try:  # a truncated journal: every entry before the cut, then the damage
            for r in JOURNAL.read(journal[:cut], "j"):
                got.append(r)
        except FormatError as exc:
            error = exc
        whole = [r for r, end in zip(full, ends) if end <= cut]
        assert got == whole and error is not None, cut
        if cut < 20:
            assert error.offset == 0
        elif len(whole) == len(full):  # cut in the zero padding after the last entry
            assert error.offset == cut and "truncated" in error.reason
        else:  # cut inside the first missing entry
            assert error.offset == full[len(whole)]["offset"] and "truncated" in error.reason
    findings = JOURNAL.validate(journal[:ends[-1] - 3], "j")
    assert [f.offset for f in findings] == [full[-1]["offset"]]
    last = full[-1]["offset"]
    data = bytearray(journal)
    data[last + 30] ^= 0x40  # flip a bit inside the last entry: its CRC fails
    got, error = [], None
    try:
        for r in JOURNAL.read(bytes(data), "j"):
            got.append(r)
    except FormatError as exc:
        error = exc
    assert got == full[:-1] and error is not None and error.offset == last + 4


@given(st.data())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_bit_flips_never_crash(gvfs_snapshots, data):
    tree, _, journal = store_files(gvfs_snapshots[len(gvfs_snapshots) // 2])
    for codec, blob in ((TREE, tree), (JOURNAL, journal)):
        buf = bytearray(blob)
        for _ in range(data.draw(st.integers(1, 4))):
            pos = data.draw(st.integers(0, len(buf) - 1))
            buf[pos] ^= 1 << data.draw(st.integers(0, 7))
        _read_all(codec, bytes(buf))
        if codec is TREE:
            try:
                merged = MergedTree(TreeView(bytes(buf), "hostile"))
                list(merged.items())
                tree_bytes(merged, 1)
            except FormatError:
                pass


def test_huge_counts_and_lying_sizes_are_rejected_without_allocation():
    entry = bytearray(encode_entry("setv", 1, "/p", "k", ["a"]))
    count_at = entry.index(struct.pack(">I", 1), 17)
    struct.pack_into(">I", entry, count_at, 0xFFFFFFFF)
    struct.pack_into(">I", entry, 4, zlib.crc32(bytes(entry[8:])))
    with pytest.raises(FormatError, match="list count"):
        decode_entry(bytes(entry), 0, "e")
    image = new_journal(7)
    struct.pack_into(">I", image, 16, 1)
    struct.pack_into(">I", image, HEADER_SIZE, 0x7FFFFFF0)  # an entry "larger than the file"
    with pytest.raises(FormatError, match="bad entry size"):
        list(iter_entries(bytes(image), "j"))

    tree = bytearray(TREE.write([{"path": "/a", "metadata": {"k": ["x", "y"]}, "mtime": 3}]))
    view = TreeView(bytes(tree), "t")
    meta_block = view.dirent(view.lookup("/a"))[2]
    list_table = struct.unpack_from(">I", tree, meta_block + 8)[0]
    struct.pack_into(">I", tree, list_table, 0x40000000)
    with pytest.raises(FormatError, match="list count"):
        list(TREE.read(bytes(tree), "t"))
    struct.pack_into(">I", tree, meta_block, 0xFFFFFFF)
    with pytest.raises(FormatError, match="metadata count"):
        list(TREE.read(bytes(tree), "t"))


def test_children_cycle_is_detected_not_looped():
    tree = bytearray(TREE.write([{"path": "/a/b", "metadata": {"k": "v"}, "mtime": 3}]))
    view = TreeView(bytes(tree), "t")
    a = view.lookup("/a")
    root_children = view.dirent(view.root)[1]
    struct.pack_into(">I", tree, a + 4, root_children)  # /a's children = the root's: a loop
    with pytest.raises(FormatError, match="cycle"):
        list(TREE.read(bytes(tree), "t"))
    with pytest.raises(FormatError, match="cycle"):
        list(MergedTree(TreeView(bytes(tree), "t")).items())


def test_bad_headers():
    tree = TREE.write([])
    with pytest.raises(FormatError, match="magic"):
        TreeView(b"\0" * 64, "t")
    with pytest.raises(FormatError, match="major"):
        TreeView(tree[:6] + b"\x02" + tree[7:], "t")
    bad_root = bytearray(tree)
    struct.pack_into(">I", bad_root, 16, len(tree) + 100)
    with pytest.raises(FormatError, match="dirent"):
        TreeView(bytes(bad_root), "t")
    with pytest.raises(FormatError, match="file_size"):
        parse_header(bytes(new_journal(1))[:-4], "j")
    assert DIRENT_SIZE == 16 and LIST_FLAG == 0x80000000


def test_codecs_accept_memoryview_buffers(gvfs_snapshots):
    tree, _, journal = store_files(gvfs_snapshots[-1])
    assert list(TREE.read(memoryview(tree), "t")) == list(TREE.read(tree, "t"))
    assert list(JOURNAL.read(memoryview(journal), "j")) == list(JOURNAL.read(journal, "j"))


# ---- the bulk (numpy) copy of untouched directories when rewriting a tree ------------------
_BULK_DIRECTORY = gvfs_tree._DirectoryCopier.directory


def _rewrite(base: bytes, records: list[dict], bulk: bool, monkeypatch) -> tuple[bytes, int]:
    """The tree ``base`` + journal ``records`` rewritten, with or without the bulk copier;
    and how many directories it copied in bulk."""
    copied = []
    real = _BULK_DIRECTORY  # not the attribute: an earlier call's spy may still be there

    def spy(self, *args):
        out = real(self, *args) if bulk else None
        copied.append(out is not None)
        return out
    monkeypatch.setattr(gvfs_tree._DirectoryCopier, "directory", spy)
    merged = MergedTree(TreeView(base, "base"))
    for rec in records:
        merged.apply(rec)
    return tree_bytes(merged, 7), sum(copied)


def _state(tree: bytes) -> dict:
    return {r["path"]: (r["metadata"], r["mtime"]) for r in TREE.read(tree, "t")}


def test_bulk_copy_keeps_real_stores_exactly(gvfs_snapshots, monkeypatch):
    for snap in gvfs_snapshots:
        tree, _, journal = store_files(snap)
        records = list(JOURNAL.read(journal, "j"))
        fast, _ = _rewrite(tree, records, True, monkeypatch)
        slow, _ = _rewrite(tree, records, False, monkeypatch)
        assert _state(fast) == _state(slow), snap
        assert TREE.validate(fast, "fast") == []
        untouched, bulk = _rewrite(tree, [], True, monkeypatch)  # nothing touched: all bulk
        view = TreeView(tree, "home")
        directories = sum(1 for path, off in view.walk() if path != "/" and view.child_count(off))
        assert _state(untouched) == _state(tree) and bulk == directories, snap


@given(tree_nodes, journal_records)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_bulk_copy_equals_the_row_by_row_writer(monkeypatch, nodes, records):
    base = TREE.write([{"path": p, "metadata": m, "mtime": t} for p, (m, t) in nodes.items()], tag=3)
    fast, _ = _rewrite(base, records, True, monkeypatch)
    slow, _ = _rewrite(base, records, False, monkeypatch)
    assert _state(fast) == _state(slow)


def test_bulk_copy_handles_wide_directories_lists_and_falls_back_for_disorder(monkeypatch):
    records = []
    for d in range(30):
        for f in range(50):
            meta = {"comment": f"c{d}.{f}", "rating": str(f)} if f % 3 else {"comment": "é" * f}
            if d == 7:
                meta["tags"] = ["a", "b" * f, "é"][:f % 4]  # list values (some empty lists)
            records.append({"path": f"/top/d{d:02}/f{f:03}", "metadata": meta,
                            "mtime": 1_600_000_000 + d * 50 + f})
    base = bytearray(TREE.write(records, tag=1))
    view = TreeView(bytes(base), "b")
    d11 = view.lookup("/top/d11")
    _, first = view._children_block(d11)
    a, b = first, first + DIRENT_SIZE  # swap two dirents: names out of order, row by row
    base[a:a + DIRENT_SIZE], base[b:b + DIRENT_SIZE] = base[b:b + DIRENT_SIZE], base[a:a + DIRENT_SIZE]
    base = bytes(base)
    touch = [{"kind": "set", "mtime": 1_700_000_000, "path": "/top/d03/new", "key": "k", "value": "v"}]
    fast, bulk = _rewrite(base, touch, True, monkeypatch)
    slow, _ = _rewrite(base, touch, False, monkeypatch)
    assert _state(fast) == _state(slow)
    assert bulk == 28  # 30 directories: d03 was touched, d11 is out of order
    state = _state(fast)
    assert state["/top/d07/f006"][0] == {"comment": "é" * 6, "tags": ["a", "bbbbbb"]}
    assert state["/top/d07/f008"][0] == {"comment": "c7.8", "rating": "8", "tags": []}
    assert state["/top/d11/f000"][0] == {"comment": ""} and len(state) == 30 * 50 + 1
    assert state["/top/d29/f049"] == ({"comment": "c29.49", "rating": "49"}, 1_600_000_000 + 29 * 50 + 49)


@given(st.data())
@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_bulk_copy_of_bit_flipped_trees_agrees_with_the_row_writer(gvfs_snapshots, monkeypatch, data):
    """Hostile bases: the bulk path yields the same tree as the checked path, or both fail
    with FormatError."""
    base = bytearray(store_files(data.draw(st.sampled_from(gvfs_snapshots)))[0])
    for _ in range(data.draw(st.integers(1, 4))):
        base[data.draw(st.integers(0, len(base) - 1))] ^= 1 << data.draw(st.integers(0, 7))

    def outcome(bulk: bool):
        try:
            return _state(_rewrite(bytes(base), [], bulk, monkeypatch)[0])
        except FormatError:
            return "FormatError"
    assert outcome(True) == outcome(False)


def test_lookups_fall_back_when_child_names_are_not_one_ordered_region():
    records = [{"path": f"/d/f{f:03}", "metadata": {"comment": f"c{f}"}, "mtime": 1_600_000_000}
               for f in range(40)]
    base = bytearray(TREE.write(records, tag=1))
    view = TreeView(bytes(base), "b")
    _, first = view._children_block(view.lookup("/d"))
    assert view._consecutive_names(first, 40) is not None  # the layout gvfs and we write
    a, b = first, first + 5 * DIRENT_SIZE  # swap two dirents: names no longer in region order
    base[a:a + DIRENT_SIZE], base[b:b + DIRENT_SIZE] = base[b:b + DIRENT_SIZE], base[a:a + DIRENT_SIZE]
    c = first + 9 * DIRENT_SIZE  # and make f010 share f009's name string (a duplicate name)
    base[c + DIRENT_SIZE:c + DIRENT_SIZE + 4] = base[c:c + 4]
    view = TreeView(bytes(base), "b")
    assert view._consecutive_names(first, 40) is None
    assert view.value("/d/f000", "comment") == "c0" and view.value("/d/f005", "comment") == "c5"
    assert view.value("/d/f009", "comment") == "c9"  # the first of the duplicates wins
    assert view.value("/d/f010", "comment") is None
    assert view.value("/d/f039", "comment") == view.get(view.lookup("/d/f039"), "comment") == "c39"
    assert view.value("/d/f039", "nokey") is None and view.value("/", "comment") is None
