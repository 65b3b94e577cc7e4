"""Hostile gvfs trees (issue 10 point 9): children offsets that loop or are shared cannot
make a walk run away; the error names the looping offset; output is bounded by input size."""
from __future__ import annotations

import struct


from journalfs.formats.base import FormatError
from journalfs.formats.gvfs_tree import DIRENT_SIZE, GvfsTree, TreeView

TREE = GvfsTree()


def deep_tree(depth: int, width: int) -> bytearray:
    """/d/d/.../d (``depth`` levels), each level with ``width`` files carrying metadata."""
    records, path = [], ""
    for level in range(depth):
        path += "/d"
        for i in range(width):
            records.append({"path": f"{path}/file{i:04d}", "metadata": {"k": f"v{level}.{i}"}, "mtime": 5})
    return bytearray(TREE.write(records))


def consume(buf: bytes) -> tuple[int, int, FormatError | None]:
    """(records, bytes of path text) read before the error, and the error."""
    count = text = 0
    try:
        for rec in TREE.read(bytes(buf), "hostile"):
            count += 1
            text += len(rec["path"])
    except FormatError as exc:
        return count, text, exc
    return count, text, None


def test_a_1mb_looping_tree_fails_fast_naming_the_offset_after_the_valid_records():
    tree = deep_tree(depth=400, width=60)
    assert len(tree) > 1 << 20
    view = TreeView(bytes(tree), "t")
    deepest = view.lookup("/d" * 400)
    root_children = view.dirent(view.root)[1]
    struct.pack_into(">I", tree, deepest + 4, root_children)  # the deepest dir -> the root's: a loop
    count, text, exc = consume(tree)
    assert exc is not None and f"dirent {deepest}" in exc.reason and exc.offset == deepest + 4
    assert "cycle" in exc.reason
    assert count == 400 * 60 - 60  # every valid record (all but the looping dir's files)
    assert text <= 64 * len(tree) + (1 << 20)


def test_loop_in_the_middle_is_named_and_bounded():
    tree = deep_tree(depth=50, width=3)
    view = TreeView(bytes(tree), "t")
    mid = view.lookup("/d" * 40)
    upper_block = view.dirent(view.lookup("/d" * 10))[1]
    struct.pack_into(">I", tree, mid + 4, upper_block)
    count, _, exc = consume(tree)
    assert exc is not None and f"dirent {mid}" in exc.reason
    assert count <= 50 * 3


def test_shared_blocks_are_not_a_loop_but_cannot_multiply_the_walk():
    """A chain of directories whose two children both point at the next directory's block:
    no loop (healthy stores share blocks too), but 2^depth paths. The walk stops with an
    error once it has visited more nodes than the file can hold."""
    records = []
    path = ""
    for level in range(2000):
        path += "/a"
        records.append({"path": path + "/b", "metadata": {}, "mtime": 0})
    tree = bytearray(TREE.write(records))
    view = TreeView(bytes(tree), "t")
    # make every /a's sibling "b" share the children block of its sibling "a"
    node = view.lookup("/a")
    patched = 0
    while True:
        kids = dict((name, off) for name, off in view.children(node))
        if b"a" not in kids or b"b" not in kids:
            break
        a, b = kids[b"a"], kids[b"b"]
        struct.pack_into(">I", tree, b + 4, view.dirent(a)[1])
        patched += 1
        node = a
    assert patched > 100
    count, text, exc = consume(tree)
    assert exc is not None and "shared" in exc.reason
    assert text <= 64 * len(tree) + (1 << 20)


def test_healthy_stores_with_shared_empty_blocks_walk_completely():
    tree = bytes(deep_tree(depth=20, width=30))
    count, _, exc = consume(tree)
    assert exc is None and count == 20 * 30
    assert TREE.validate(tree, "t") == []


def test_overlapping_children_blocks_are_refused():
    tree = deep_tree(depth=3, width=200)
    view = TreeView(bytes(tree), "t")
    d = view.lookup("/d")
    block = view.dirent(d)[1]
    # a child dirent whose children block starts one dirent into its parent's block: overlapping
    # blocks whose counts together exceed what the file can hold
    first_child = block + 4
    struct.pack_into(">I", tree, block, (len(tree) - block - 4) // DIRENT_SIZE)
    struct.pack_into(">I", tree, first_child + 4, block + DIRENT_SIZE)
    _, _, exc = consume(tree)
    assert exc is not None


def test_a_store_on_a_looping_tree_refuses_dump_and_rotation_with_an_error(tmp_path):
    import errno

    from journalfs.metastore.store import MetaStore

    tree = deep_tree(depth=30, width=2)
    view = TreeView(bytes(tree), "t")
    deepest = view.lookup("/d" * 30)
    struct.pack_into(">I", tree, deepest + 4, view.dirent(view.root)[1])
    store_dir = tmp_path / "store"
    store_dir.mkdir(mode=0o700)
    (store_dir / "home").write_bytes(bytes(tree))
    with MetaStore.open(str(store_dir / "home"), readonly=True) as reader:
        try:
            reader.dump()
        except FormatError as exc:
            assert f"dirent {deepest}" in exc.reason
        else:
            raise AssertionError("dump of a looping tree did not fail")
    store = MetaStore.open(str(store_dir / "home"), sync="none")
    try:  # no journal yet: the first write needs a rotation, which the loop makes impossible
        try:
            store.set("/x", "k", "v")
        except OSError as exc:
            assert exc.errno == errno.EIO and "cycle" in str(exc)
        else:
            raise AssertionError("rotation over a looping tree did not fail")
    finally:
        store._release()
