"""The gvfs tree's vectorised column decoder against its own ``read``: the same rows (every
field, value and order), the same damage at the same byte, on random valid trees and on
truncated, bit-flipped and lying ones, on hostile shapes (loops, shared blocks, huge counts)
and on the real gvfs corpora; and the JSON lines rendered from its columns byte for byte."""
from __future__ import annotations

import contextlib
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from codec_helpers import FAST, columns_as_records, columns_traced, read_all, same_error
from conftest import CONFORMANCE
from journalfs import jsonlines
from journalfs.formats import CODECS, Codec, FormatError, tree_columns
from journalfs.formats.gvfs_tree import DIRENT_SIZE, TreeView
from test_codec_columns import assert_same_as_read, mutate, rows_are_records

TREE = CODECS["gvfs-tree"]


def _corpus_trees() -> list[Path]:
    root = CONFORMANCE / "gvfs"
    return sorted(p for p in root.glob("*/snapshots/*/gvfs-metadata/*")
                  if p.is_file() and not p.name.endswith(".log"))


# -- random trees ------------------------------------------------------------------------------

plain = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0/"),
                min_size=1, max_size=6)
#: names that are not UTF-8 (raw bytes kept as surrogateescape), as gvfs stores file names
odd = st.binary(min_size=1, max_size=6).filter(lambda b: b"\0" not in b and b"/" not in b).map(
    lambda b: b.decode("utf-8", "surrogateescape"))
name = st.one_of(st.sampled_from(["a", "b", "docs", "é", 'q"x', "t\\u"]), plain, odd)
value_text = st.one_of(
    st.sampled_from(["", "v", "note 1", "tab\there", "ü"]),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12),
    odd)
key = st.one_of(st.sampled_from(["annotation", "emblems", "k", "ö"]), plain, odd)
value = st.one_of(value_text, st.lists(value_text, max_size=3))

nodes = st.lists(st.builds(
    lambda parts, meta, t: {"path": "/" + "/".join(parts), "metadata": meta, "mtime": t},
    st.lists(name, max_size=4), st.dictionaries(key, value, max_size=3),
    st.one_of(st.just(0), st.integers(1, 2**33), st.integers(1_700_000_000, 1_700_000_100))),
    max_size=30)

trees = nodes.map(lambda ns: TREE.write(ns, tag=7))

#: trees whose texts are all JSON as they are (UTF-8, nothing to escape): rendered from the
#: columns' own spelling, never record by record
safe = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters='\0/"\\'),
               min_size=1, max_size=6)
safe_nodes = st.lists(st.builds(
    lambda parts, meta, t: {"path": "/" + "/".join(parts), "metadata": meta, "mtime": t},
    st.lists(safe, max_size=4),
    st.dictionaries(safe, st.one_of(safe, st.just(""), st.lists(safe, max_size=3)), max_size=3),
    st.integers(0, 2**33)), min_size=1, max_size=30)
safe_trees = safe_nodes.map(lambda ns: TREE.write(ns, tag=9))


def assert_renders_as_read(buf, columnar: bool = False):
    """The JSON lines rendered from the columns (every batch the columnar way) are the lines
    of the records ``read`` gives; ``columnar``: and the columns could all be rendered so."""
    records, _ = read_all(TREE, buf)
    cols = TREE.read_columns(buf, "f")
    old = jsonlines.COLUMNS_MIN_ROWS
    jsonlines.COLUMNS_MIN_ROWS = 1
    try:
        rendered = jsonlines.render_columns(cols, list(cols.data)) if cols.rows else b""
    finally:
        jsonlines.COLUMNS_MIN_ROWS = old
    want = b"".join(jsonlines.json_line(r) for r in records)
    assert rendered is not None or not columnar
    if rendered is not None:
        assert bytes(rendered) == want


def test_tree_has_its_own_column_decoder():
    assert type(TREE).read_columns is not Codec.read_columns


@contextlib.contextmanager
def tree_setting(name: str, value):
    """``tree_columns.<name>`` set to ``value`` inside the block."""
    old = getattr(tree_columns, name)
    setattr(tree_columns, name, value)
    try:
        yield
    finally:
        setattr(tree_columns, name, old)


def chunks_of(nodes: int):
    """The vectorised walk taking ``nodes`` nodes per numpy step (pieces of levels)."""
    return tree_setting("CHUNK_NODES", nodes)


chunk_sizes = st.sampled_from([1, 2, 3, 1 << 15])


@FAST
@given(buf=trees, limit=st.one_of(st.none(), st.integers(0, 6)), chunk=chunk_sizes)
def test_valid_trees_decode_as_read_does(buf, limit, chunk):
    records, error = read_all(TREE, buf)
    assert error is None
    with chunks_of(chunk):
        cols = assert_same_as_read(TREE, buf)
        assert rows_are_records(columns_as_records(cols), records)
        assert_same_as_read(TREE, buf, limit=limit)
        assert_renders_as_read(buf)


@FAST
@given(buf=safe_trees)
def test_plain_texts_render_from_the_columns(buf):
    cols = assert_same_as_read(TREE, buf)
    for name in ("path", "metadata") if cols.rows else ():
        assert cols.data[name].json_spelling(0, cols.rows) is not None
    assert_renders_as_read(buf, columnar=True)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_damaged_trees_decode_as_read_does(data):
    buf = mutate(data, data.draw(trees))
    _, error = read_all(TREE, buf)
    assert [(f.offset, f.reason) for f in TREE.validate(buf, "f")] == \
        ([] if error is None else [(error.offset, error.reason)])
    with chunks_of(data.draw(chunk_sizes)):
        assert_same_as_read(TREE, buf)
    assert_same_as_read(TREE, memoryview(buf), limit=data.draw(st.integers(0, 4)))
    assert_renders_as_read(buf)


def lying_tree(data) -> bytes:
    """A random tree with one to three aligned words (an offset or a count) overwritten with
    another offset of the file, a small number or an extreme one: loops, sharing, overlaps,
    huge counts."""
    buf = bytearray(data.draw(trees))
    for _ in range(data.draw(st.integers(1, 3))):
        at = 4 * data.draw(st.integers(4, len(buf) // 4 - 1))
        word = data.draw(st.one_of(st.integers(0, len(buf) + 8), st.integers(0, 40),
                                   st.sampled_from([0xFFFFFFFF, 0x80000000, 0x7FFFFFFF])))
        buf[at:at + 4] = struct.pack(">I", word)
    return bytes(buf)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_lying_words_decode_as_read_does(data):
    buf = lying_tree(data)
    with chunks_of(data.draw(chunk_sizes)):
        assert_same_as_read(TREE, buf)
    assert_renders_as_read(buf)


def test_empty_and_headerless_buffers():
    for buf in (b"", TREE.write([])[:3], TREE.write([])[:31], TREE.write([]), bytes(64)):
        assert_same_as_read(TREE, buf)
        assert_same_as_read(TREE, memoryview(buf))


# -- hostile shapes ------------------------------------------------------------------------------

def _deep(depth: int, width: int) -> bytearray:
    records, path = [], ""
    for level in range(depth):
        path += "/d"
        for i in range(width):
            records.append({"path": f"{path}/f{i:03d}", "metadata": {"k": f"v{level}.{i}"},
                            "mtime": 5})
    return bytearray(TREE.write(records))


def _loop(depth: int, width: int, to: int | None) -> bytes:
    tree = _deep(depth, width)
    view = TreeView(bytes(tree), "t")
    deepest = view.lookup("/d" * depth)
    target = view.root if to is None else view.lookup("/d" * to)
    struct.pack_into(">I", tree, deepest + 4, view.dirent(target)[1])
    return bytes(tree)


def _shared(depth: int) -> bytes:
    records, path = [], ""
    for _ in range(depth):
        path += "/a"
        records.append({"path": path + "/b", "metadata": {"k": "v"}, "mtime": 0})
    tree = bytearray(TREE.write(records))
    view = TreeView(bytes(tree), "t")
    node = view.lookup("/a")
    while True:
        kids = dict(view.children(node))
        if b"a" not in kids or b"b" not in kids:
            break
        struct.pack_into(">I", tree, kids[b"b"] + 4, view.dirent(kids[b"a"])[1])
        node = kids[b"a"]
    return bytes(tree)


def _overlap() -> bytes:
    tree = _deep(3, 50)
    view = TreeView(bytes(tree), "t")
    block = view.dirent(view.lookup("/d"))[1]
    struct.pack_into(">I", tree, block, (len(tree) - block - 4) // DIRENT_SIZE)
    struct.pack_into(">I", tree, block + 4 + 4, block + DIRENT_SIZE)
    return bytes(tree)


def _huge_counts() -> list[bytes]:
    tree = _deep(2, 5)
    view = TreeView(bytes(tree), "t")
    off = view.lookup("/d/f001")
    meta = view.dirent(off)[2]
    out = []
    root_block = view.dirent(view.root)[1]
    for at, word in ((meta, 0x0FFFFFFF), (meta, 0xFFFFFFFF), (root_block, 0x7FFFFFFF),
                     (off + 8, len(tree) - 4), (off, 0xFFFFFFF0), (off + 8, 3)):
        bad = bytearray(tree)
        struct.pack_into(">I", bad, at, word)
        out.append(bytes(bad))
    return out


def _unsorted_keys() -> bytes:
    tree = bytearray(TREE.write([{"path": "/a", "metadata": {"x": "1", "y": "2"}, "mtime": 3}]))
    view = TreeView(bytes(tree), "t")
    meta = view.dirent(view.lookup("/a"))[2]
    pairs = tree[meta + 4:meta + 20]
    tree[meta + 4:meta + 20] = pairs[8:] + pairs[:8]
    return bytes(tree)


def _pre_2016() -> bytes:
    """Offset 0 for "no children" and "no metadata", as gvfs wrote before 2016."""
    tree = bytearray(_deep(3, 4))
    view = TreeView(bytes(tree), "t")
    for _, off in list(view.walk()):
        _, kids, meta, _ = view.dirent(off)
        if not view.child_count(off):
            struct.pack_into(">I", tree, off + 4, 0)
        if not view.raw_metadata(off):
            struct.pack_into(">I", tree, off + 8, 0)
    return bytes(tree)


HOSTILE = [_loop(30, 3, None), _loop(40, 2, 10), _shared(300), _overlap(), _unsorted_keys(),
           _pre_2016(), *_huge_counts()]


@pytest.mark.parametrize("buf", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_trees_decode_as_read_does_without_big_allocations(buf):
    cols, peak = columns_traced(TREE, buf)
    records, error = read_all(TREE, buf)
    assert same_error(cols.error, error) and columns_as_records(cols) == \
        columns_as_records(Codec.read_columns(TREE, buf, "f"))
    assert rows_are_records(columns_as_records(cols), records)
    assert peak < 8 * len(buf) + (1 << 20)
    assert_same_as_read(TREE, buf)
    assert_renders_as_read(buf)


def test_a_deep_narrow_tree_decodes_as_read_does():
    buf = bytes(_deep(600, 1))
    assert_same_as_read(TREE, buf)


def test_a_loop_after_shared_blocks_is_named_where_read_names_it():
    """Sharing that lets the walk meet the looping dirent earlier than its own path does."""
    tree = _deep(12, 2)
    view = TreeView(bytes(tree), "t")
    struct.pack_into(">I", tree, view.lookup("/d/f000") + 4, view.dirent(view.lookup("/d" * 6))[1])
    struct.pack_into(">I", tree, view.lookup("/d" * 12) + 4, view.dirent(view.lookup("/d" * 3))[1])
    assert_same_as_read(TREE, bytes(tree))


# -- the columns as records --json writes them ---------------------------------------------------

def test_columns_outlive_a_mapped_buffer(tmp_path):
    from journalfs.journals import mapped
    path = tmp_path / "home"
    path.write_bytes(bytes(_deep(3, 20)))
    with mapped(str(path)) as buf:
        cols = TREE.read_columns(buf, str(path))
    records, _ = read_all(TREE, path.read_bytes(), str(path))
    assert columns_as_records(cols) == records


@pytest.mark.parametrize("tree", _corpus_trees(), ids=lambda p: "/".join(p.parts[-5:]))
def test_conformance_trees_decode_as_read_does(tree):
    buf = tree.read_bytes()
    assert_same_as_read(TREE, buf)
    assert_renders_as_read(buf)


def test_there_are_conformance_trees():
    assert _corpus_trees()


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_records_json_is_the_lines_of_read(data):
    """``journalfs records --json`` of a tree (its columns rendered a window of rows at a
    time) writes exactly the lines of the records read() gives, then raises its damage."""
    from journalfs.commands import records as records_command
    buf = data.draw(st.one_of(trees, safe_trees))
    if data.draw(st.booleans()):
        buf = mutate(data, buf)
    want, error = read_all(TREE, buf)
    old = records_command.MAX_ROWS, jsonlines.COLUMNS_MIN_ROWS
    records_command.MAX_ROWS = data.draw(st.integers(1, 8))
    jsonlines.COLUMNS_MIN_ROWS = 1
    got, raised = [], None
    try:
        for chunk in records_command.json_chunks(TREE, buf, "f"):
            got.append(bytes(chunk))
    except FormatError as exc:
        raised = exc
    finally:
        records_command.MAX_ROWS, jsonlines.COLUMNS_MIN_ROWS = old
    assert b"".join(got) == b"".join(jsonlines.json_line(r) for r in want)
    assert same_error(raised, error)


def test_long_texts_and_texts_at_the_end_of_the_file():
    """Strings longer than the words looked at per string (the rest found by bytes.find),
    and a tree whose last string ends in its last bytes."""
    nodes = [{"path": "/" + "n" * width, "mtime": width,
              "metadata": {"k": "v" * (3 * width), "l": ["x" * width, ""]}}
             for width in (1, 7, 8, 9, 31, 32, 33, 40, 200)]
    buf = TREE.write(nodes)
    assert_same_as_read(TREE, buf)
    assert_renders_as_read(buf, columnar=True)
    tree = bytearray(buf)  # the last value moved to the file's end, unpadded
    view = TreeView(bytes(tree), "t")
    meta = view.dirent(view.lookup("/" + "n" * 200))[2]
    struct.pack_into(">I", tree, meta + 8, len(tree))
    tree += b"end\0"
    assert_same_as_read(TREE, bytes(tree))
    assert_same_as_read(TREE, bytes(tree[:-1]))  # and unterminated


def test_an_empty_name_gives_the_paths_join_path_gives():
    tree = bytearray(TREE.write([{"path": "/a/b", "metadata": {"k": "v"}, "mtime": 1},
                                 {"path": "/a", "metadata": {"k": "w"}, "mtime": 1}]))
    view = TreeView(bytes(tree), "t")
    a = view.lookup("/a")
    struct.pack_into(">I", tree, a, len(tree) - 1)  # /a's name: the file's last byte, a NUL
    assert tree[-1] == 0
    cols = assert_same_as_read(TREE, bytes(tree))
    assert list(cols.data["path"]) == ["/", "/b"]


@pytest.mark.parametrize("chunk, handed_over", [(1 << 15, 39), (7, 4)])
def test_damage_deep_in_the_tree_keeps_the_vectorised_rows_before_it(monkeypatch, chunk,
                                                                      handed_over):
    """A bad value offset in the last level: the nodes before its chunk keep their
    vectorised rows, read()'s walk takes over at that chunk and names the damage as read()
    does."""
    tree = _deep(6, 40)
    view = TreeView(bytes(tree), "t")
    bad = view.lookup("/d/d/d/d/d/d/f039")
    meta = view.dirent(bad)[2]
    struct.pack_into(">I", tree, meta + 8, len(tree) + 5)
    exact = []
    records = TREE._records

    def counted(*args):
        for rec in records(*args):
            exact.append(rec)
            yield rec
    monkeypatch.setattr(TREE, "_records", counted)
    with chunks_of(chunk):
        cols = TREE.read_columns(bytes(tree), "f")
    monkeypatch.undo()
    want, error = read_all(TREE, bytes(tree))
    assert columns_as_records(cols) == want and same_error(cols.error, error)
    assert error is not None and cols.rows == 6 * 40 - 1
    assert len(exact) == handed_over  # the rows of the damaged chunk: read()'s own


def test_two_keyword_ids_naming_one_key_make_one_entry_as_read_does():
    tree = bytearray(TREE.write([{"path": f"/f{i}", "metadata": {"a": f"1.{i}", "b": f"2.{i}"},
                                  "mtime": 1} for i in range(20)]))
    keywords = struct.unpack_from(">I", tree, 20)[0]
    first = struct.unpack_from(">I", tree, keywords + 4)[0]
    struct.pack_into(">I", tree, keywords + 8, first)  # id 1 names "a" too
    cols = assert_same_as_read(TREE, bytes(tree))
    assert cols.data["metadata"][0] == {"a": "2.0"}
    assert_renders_as_read(bytes(tree))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_plain_children_blocks_mean_find_loop_has_nothing_to_report(data):
    """The numpy check that lets the hand-over skip TreeView.find_loop: where it says the
    children blocks are plain, find_loop returns None and raises nothing."""
    buf = bytearray(data.draw(trees))
    if data.draw(st.booleans()):
        buf = bytearray(mutate(data, bytes(buf)))
    else:
        for _ in range(data.draw(st.integers(1, 3))):
            at = 4 * data.draw(st.integers(4, len(buf) // 4 - 1))
            buf[at:at + 4] = struct.pack(">I", data.draw(st.integers(0, len(buf) + 8)))
    try:
        view = TreeView(bytes(buf), "f")
    except FormatError:
        return
    with chunks_of(data.draw(chunk_sizes)):
        walk = tree_columns._Walk(view, bytes(buf))
        plain = walk.plain_structure()
        ordered = walk._plain_structure(True, None)  # the pass with no memory per block
    assert plain or not ordered
    if plain:
        assert view.find_loop() is None


def test_a_path_text_budget_is_spent_where_read_spends_it():
    """A deep chain of long non-ASCII names (two bytes a character): read() stops once the
    path text exceeds its budget; the hand-over counts characters, not bytes, as read()."""
    name = "é" * 49
    records, path = [], ""
    for level in range(600):
        path += f"/{name}{level % 10}"
        records.append({"path": path + "/f", "metadata": {"k": "v"}, "mtime": 1})
    buf = TREE.write(records)
    cols = assert_same_as_read(TREE, buf)
    assert cols.error is not None and "shared" in cols.error.reason
