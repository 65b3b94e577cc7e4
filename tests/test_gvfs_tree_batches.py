"""A gvfs tree streamed in batches (``GvfsTree.scan``, what ``records`` and ``fsck``
read a tree with): the batches together are ``read()``'s rows and damage exactly -- on random
valid, damaged and lying trees, with every chunk, batch and pacing size, where the streamed
walk hands over to the whole-file decoder mid-file, and on the real gvfs corpora -- and the
memory they hold does not grow with the tree."""
from __future__ import annotations

import struct
import tracemalloc

import pytest
from hypothesis import given, settings, strategies as st

from codec_helpers import FAST, columns_as_records, read_all, same_error
from journalfs import jsonlines
from journalfs.formats import FormatError, tree_columns
from journalfs.formats.gvfs_tree import TreeView
from test_codec_columns import mutate
from test_gvfs_tree_columns import (TREE, _corpus_trees, _deep, chunk_sizes, chunks_of,
                                    lying_tree, tree_setting, trees)

batch_rows = st.sampled_from([1, 2, 5, 16384])


def windows_of(windows: int):
    """A paced step reaching at most ``windows`` 64 KB windows of the file."""
    return tree_setting("PACE_WINDOWS", windows)


def kept_in_memory(nbytes: int):
    """A streamed walk keeping at most ``nbytes`` of per-directory arrays in memory (the
    rest in its temporary file)."""
    return tree_setting("KEEP_BYTES", nbytes)


keep_sizes = st.sampled_from([0, 64, 16 << 20])


def streamed(buf, rows: int, pace=None) -> tuple[list[dict], FormatError | None, list]:
    """(every row of the batches as a record, the damage, the batches' row counts), having
    checked that only the last batch names damage and that ``seq`` runs on across them."""
    got, error, sizes = [], None, []
    for cols in TREE.scan(buf, "f", rows=rows, pace=pace):
        assert error is None, "a batch after the damage"
        records = columns_as_records(cols)
        assert [r["seq"] for r in records] == list(range(len(got), len(got) + cols.rows))
        got += records
        sizes.append(cols.rows)
        error = cols.error
    return got, error, sizes


def assert_streams_as_read(buf, rows: int, pace=None) -> tuple[list[dict], list]:
    want, error = read_all(TREE, buf)
    got, streamed_error, sizes = streamed(buf, rows, pace)
    assert got == want
    assert same_error(streamed_error, error), (streamed_error, error)
    if error is not None:
        assert streamed_error.reason == error.reason
    return got, sizes


@FAST
@given(buf=trees, rows=batch_rows, chunk=chunk_sizes, windows=st.sampled_from([1, 256]),
       keep=keep_sizes)
def test_valid_trees_stream_as_read_does(buf, rows, chunk, windows, keep):
    paced = []
    with chunks_of(chunk), windows_of(windows), kept_in_memory(keep):
        assert_streams_as_read(buf, rows, lambda: paced.append(1))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_damaged_trees_stream_as_read_does(data):
    buf = mutate(data, data.draw(trees))
    with chunks_of(data.draw(chunk_sizes)), windows_of(data.draw(st.sampled_from([1, 256]))), \
            kept_in_memory(data.draw(keep_sizes)):
        assert_streams_as_read(buf, data.draw(batch_rows), lambda: None)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_lying_words_stream_as_read_does(data):
    """Loops, sharing, overlaps and huge counts: mostly not plain, decoded whole from the
    start (or named by the loop check before any record)."""
    buf = lying_tree(data)
    with chunks_of(data.draw(chunk_sizes)), kept_in_memory(data.draw(keep_sizes)):
        assert_streams_as_read(buf, data.draw(batch_rows))


@pytest.mark.parametrize("tree", _corpus_trees(), ids=lambda p: "/".join(p.parts[-5:]))
def test_conformance_trees_stream_as_read_does(tree):
    for rows in (1, 16384):
        assert_streams_as_read(tree.read_bytes(), rows)


def test_damage_deep_in_the_tree_hands_over_after_the_rows_given(monkeypatch):
    """A bad value offset in the last level: the batches before it are given straight from
    the streamed walk; then the whole-file decoder takes over, and only its rows after those
    already given follow, with read()'s damage."""
    tree = _deep(6, 40)
    view = TreeView(bytes(tree), "t")
    meta = view.dirent(view.lookup("/d/d/d/d/d/d/f039"))[2]
    struct.pack_into(">I", tree, meta + 8, len(tree) + 5)
    whole = []
    read_columns = tree_columns.read_columns

    def counted(*args):
        whole.append(args)
        return read_columns(*args)
    monkeypatch.setattr(tree_columns, "read_columns", counted)
    with chunks_of(7):
        _, sizes = assert_streams_as_read(bytes(tree), 5)
    assert len(whole) == 1  # handed over once, mid-file
    assert sum(sizes) == 6 * 40 - 1 and len(sizes) > 2


@pytest.mark.parametrize("keep", [0, 16 << 20])
def test_a_plain_tree_never_decodes_whole(monkeypatch, keep):
    monkeypatch.setattr(tree_columns, "read_columns", None)  # calling it would fail
    with chunks_of(3), windows_of(1), kept_in_memory(keep):
        _, sizes = assert_streams_as_read(bytes(_deep(4, 30)), 7, lambda: None)
    assert len(sizes) > 4


def test_blocks_out_of_file_order_are_still_plain():
    """A tree whose children blocks are not in breadth-first file order (each still met
    once): the ordered check fails, the second pass remembering blocks finds it plain."""
    buf = bytearray(TREE.write([{"path": f"/{d}/{f}", "metadata": {"k": f"{d}{f}"}, "mtime": 1}
                                for d in "ab" for f in "xyz"]))
    view = TreeView(bytes(buf), "t")
    a, b = view.lookup("/a"), view.lookup("/b")
    # swap the two directories' children blocks and their names: the same tree, blocks
    # now met in reverse file order
    for field in (0, 4):
        x, y = struct.unpack_from(">I", buf, a + field)[0], struct.unpack_from(">I", buf, b + field)[0]
        struct.pack_into(">I", buf, a + field, y)
        struct.pack_into(">I", buf, b + field, x)
    walk = tree_columns._Walk(TreeView(bytes(buf), "t"), bytes(buf))
    assert not walk._plain_structure(True, None)
    assert walk.plain_structure()
    assert_streams_as_read(bytes(buf), 2)


def _wide_tree(files: int) -> bytes:
    """bench/parse.py's shape: files of 1000 per directory, every fourth with a list."""
    return TREE.write([{"path": f"/home/user/d{i // 1000}/file-{i}.txt", "mtime": 1_700_000_000 + i,
                        "metadata": {"annotation": f"note {i}",
                                     **({"emblems": ["urgent", "shared"]} if i % 4 == 3 else {})}}
                       for i in range(files)])


def _one_file_per_directory(directories: int) -> bytes:
    """The shape that costs a streamed walk most: a level of directories as wide as the
    tree, each holding one file."""
    return TREE.write([{"path": f"/home/user/project-{i:07d}/notes.txt", "mtime": 1_700_000_000,
                        "metadata": {"annotation": f"note {i}"}} for i in range(directories)])


def _streamed_peak(buf: bytes) -> tuple[int, int]:
    """(rows, peak bytes allocated) while every batch is taken, its paths made, and dropped."""
    rows = 0
    tracemalloc.start()
    try:
        for cols in TREE.scan(buf, "f", rows=2048):
            rows += cols.rows
            cols.data["path"].json_spelling(0, cols.rows)
            del cols
        return rows, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_does_not_grow_with_the_tree():
    """Four times the files, the same memory: what the batches hold is a batch and the
    directories of two levels, never a node of every level (the whole-file decoder, for
    comparison, grows with the tree)."""
    small, big = _wide_tree(40_000), _wide_tree(160_000)
    with chunks_of(2048):  # batches of a few thousand rows: small beside the trees
        rows_small, peak_small = _streamed_peak(small)
        rows_big, peak_big = _streamed_peak(big)
    assert (rows_small, rows_big) == (40_000, 160_000)
    assert peak_big < 1.25 * peak_small + (1 << 20), (peak_small, peak_big)
    tracemalloc.start()
    try:
        TREE.read_columns(big, "f")
        whole_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert whole_peak > 3 * peak_big  # the measure tells the two apart


@pytest.mark.parametrize("empty", [(), ("/a",), ("/a", "/a/b"), ("/a/b",), ("/a/b/c",),
                                   ("/a", "/a/b", "/a/b/c")])
def test_empty_names_give_the_paths_join_path_gives(empty):
    """Directories named "" (a name offset at the file's last byte, a NUL): leading ones add
    nothing to a path, later ones an empty component, as join_path joins them."""
    tree = bytearray(TREE.write([{"path": p, "metadata": {"k": p}, "mtime": 1}
                                 for p in ("/a", "/a/b", "/a/b/c", "/a/b/c/d", "/a/x")]))
    view = TreeView(bytes(tree), "t")
    targets = [view.lookup(p) for p in empty]
    for at in targets:
        struct.pack_into(">I", tree, at, len(tree) - 1)
    assert tree[-1] == 0
    with chunks_of(1), kept_in_memory(0):
        records, _ = assert_streams_as_read(bytes(tree), 1, lambda: None)
    assert all(r["path"].startswith("/") for r in records)


def test_memory_does_not_grow_with_a_wide_level_of_directories():
    """Four times the directories in one level, the same memory: their children blocks and
    names go to the walk's temporary file past KEEP_BYTES (kept small here)."""
    small, big = _one_file_per_directory(20_000), _one_file_per_directory(80_000)
    with chunks_of(2048), kept_in_memory(64 << 10):
        rows_small, peak_small = _streamed_peak(small)
        rows_big, peak_big = _streamed_peak(big)
    assert (rows_small, rows_big) == (20_000, 80_000)
    assert peak_big < 1.25 * peak_small + (1 << 20), (peak_small, peak_big)
    with chunks_of(2048):  # all kept in memory: the measure tells the two apart
        assert _streamed_peak(big)[1] > 1.5 * peak_big


@pytest.mark.parametrize("cut", [0.3, 0.6])
def test_a_truncated_tree_names_its_damage_without_the_whole_file_decoder(monkeypatch, cut):
    """A tree cut before its last children blocks: the loop check names that damage
    before any record, as read() does, straight from the buffer (no copy of the file).
    (Cut later, only texts are lost: the streamed rows come first, then the whole-file
    decoder names the damage -- test_damaged_trees_stream_as_read_does.)"""
    buf = _wide_tree(5_000)
    cut_buf = buf[:int(len(buf) * cut)]
    want, error = read_all(TREE, cut_buf)
    monkeypatch.setattr(tree_columns, "read_columns", None)  # calling it would fail
    got, streamed_error, _ = streamed(cut_buf, 1000)
    assert got == want == [] and error is not None
    assert (streamed_error.offset, streamed_error.reason) == (error.offset, error.reason)


@pytest.mark.parametrize("damaged", [False, True])
@pytest.mark.parametrize("read_by", ["mapped", "pread"])
def test_the_views_index_and_records_of_a_tree_come_from_its_batches(tmp_path, damaged, read_by):
    """RecordIndex (what the mount's views use) counts a tree and serves any range of its
    records from the streamed batches (many here): exactly read()'s, damage included."""
    from journalfs import journals
    from journalfs.journals import RecordIndex
    buf = bytearray(_deep(5, 30))
    if damaged:  # a bad value offset in the last level
        view = TreeView(bytes(buf), "t")
        meta = view.dirent(view.lookup("/d/d/d/d/d/f017"))[2]
        struct.pack_into(">I", buf, meta + 8, len(buf) + 5)
    path = tmp_path / "home"
    path.write_bytes(bytes(buf))
    records, error = read_all(TREE, bytes(buf), str(path))
    opener = (lambda: journals.open_path(str(path))) if read_by == "pread" else None
    with chunks_of(4):
        index = RecordIndex.build(str(path), opener=opener)
        assert index.count == len(records) and same_error(index.error, error)
        n = len(records)
        for first in (0, 1, 7, n // 2, n - 1, n):
            for count in (None, 1, 9):
                want = records[first:] if count is None else records[first:first + count]
                assert list(index.records(first, count)) == want, (first, count)
        chunk = index.json_chunk(0, n)  # what records.jsonl is made of
        assert chunk.data == b"".join(map(jsonlines.json_line, records))
        assert chunk.rows == n and chunk.kinds == ["node"] * n
