"""gvfs-journal's guessed entry walk (whole regions of 4-byte words at once) against the
one-entry-at-a-time walk it replaces: the same entry starts on valid, damaged and hostile
buffers (sizes that chain into each other, trailing sizes that match by chance, entries
inside entries), whatever the guessed region's size."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings, strategies as st

from journalfs.formats import CODECS
from journalfs.formats import gvfs_journal as gj

#: words a hostile file is made of: plausible sizes (some matching each other), zeros, junk
words = st.one_of(st.sampled_from([24, 28, 32, 40, 64, 65536, 65540, 0, 3, 26]),
                  st.integers(0, 2**32 - 1), st.integers(0, 200).map(lambda n: n * 4))


def _entries(draw_list) -> bytes:
    recs = [{"kind": "set", "mtime": i, "path": p, "key": "k", "value": v}
            for i, (p, v) in enumerate(draw_list)]
    return bytes(CODECS["gvfs-journal"].write(recs, tag=1))


valid_journals = st.lists(st.tuples(st.text(max_size=20).filter(lambda s: "\0" not in s),
                                    st.text(max_size=90).filter(lambda s: "\0" not in s)),
                          min_size=1, max_size=60).map(_entries)


@st.composite
def frame(draw, depth: int = 0) -> list[int]:
    """Words of one length-framed entry (size first and last, sometimes a lie), whose body
    may hold frames of its own: an entry inside an entry, which only the chain tells apart."""
    body: list[int] = []
    for _ in range(draw(st.integers(0, 3))):
        if depth < 2 and draw(st.booleans()):
            body += draw(frame(depth + 1))
        else:
            body += draw(st.lists(words, max_size=4))
    while len(body) < 4:
        body.append(draw(words))
    size = 4 * (len(body) + 2)
    trailer = size if draw(st.integers(0, 9)) else draw(words)
    return [size, *body, trailer]


@st.composite
def hostile_buffers(draw):
    if draw(st.booleans()):
        framed = []
        for _ in range(draw(st.integers(1, 30))):
            framed += draw(frame()) if draw(st.integers(0, 7)) else draw(st.lists(words, max_size=3))
        return b"".join(struct.pack(">I", w) for w in framed)
    if draw(st.booleans()):
        buf = bytearray(draw(valid_journals))
        for _ in range(draw(st.integers(0, 6))):  # overwrite words with plausible lies
            at = draw(st.integers(0, len(buf) // 4 - 1)) * 4
            buf[at:at + 4] = struct.pack(">I", draw(words))
        return bytes(buf)
    return b"".join(struct.pack(">I", w) for w in draw(st.lists(words, min_size=1, max_size=400)))


@pytest.mark.parametrize("region", [(16, 64), (64, 1 << 12), (1 << 14, 1 << 20)])
@settings(max_examples=150, deadline=None)
@given(buf=hostile_buffers(), data=st.data())
def test_guessed_walk_equals_the_step_walk(region, buf, data):
    end = data.draw(st.integers(0, len(buf) // 4)) * 4
    pos = data.draw(st.integers(0, max(0, end // 4 - 1))) * 4
    # callers stop the walk where no entry header fits any more, or before (a stop offset)
    walk_end = data.draw(st.integers(0, max(0, end - gj.MIN_ENTRY + 1)))
    budget = data.draw(st.sampled_from([1, 2, 7, 10**9]))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gj, "GUESS_MIN", region[0])
        patch.setattr(gj, "GUESS_MAX", region[1])
        patch.setattr(gj, "GUESS_STEPS", data.draw(st.sampled_from([1, 3, 64])))
        guessed = gj._walk(buf, pos, walk_end, end, budget)
    assert guessed == gj._step(buf, pos, walk_end, end, budget)


@settings(max_examples=60, deadline=None)
@given(buf=hostile_buffers())
def test_guessed_walk_on_memoryview_and_bytearray(buf):
    end = len(buf) // 4 * 4
    want = gj._step(buf, 0, end - gj.MIN_ENTRY + 1, end, 10**9)
    for view in (bytearray(buf), memoryview(buf)):
        assert gj._walk(view, 0, end - gj.MIN_ENTRY + 1, end, 10**9) == want


@settings(max_examples=40, deadline=None)
@given(buf=valid_journals)
def test_text_columns_are_read_after_the_buffer_changed(buf):
    """Texts stay bytes until read (counting and indexing never decode them); they are copies,
    so a buffer overwritten (or unmapped) after decoding does not change them."""
    codec = CODECS["gvfs-journal"]
    want = list(codec.read(buf, "f"))
    scratch = bytearray(buf)
    cols = codec.read_columns(scratch, "f")
    scratch[:] = bytes(len(scratch))
    assert cols.rows == len(want)
    for name in ("path", "key", "value"):
        assert list(cols.data[name]) == [rec[name] for rec in want]
        assert cols.data[name].tolist() == [rec[name] for rec in want]
        assert [cols.data[name][i] for i in range(cols.rows)] == [rec[name] for rec in want]


# -- JSON lines rendered from the texts' bytes ---------------------------------------------------

#: texts JSON must escape or cannot spell as UTF-8 (raw bytes kept as surrogateescape)
odd_text = st.one_of(st.text(alphabet='ab"\\\n\t\x01\x7féü€😀', max_size=6),
                     st.binary(min_size=1, max_size=6).filter(lambda b: b"\0" not in b).map(
                         lambda b: b.decode("utf-8", "surrogateescape")))
plain_text = st.text(alphabet="abc/._- 0123", max_size=12)
gvfs_text = st.one_of(plain_text, plain_text, plain_text, odd_text)


def _record(kind, mtime, path, key, value, source):
    rec = {"kind": kind, "mtime": mtime, "path": path}
    if kind in ("set", "setv", "unset"):
        rec["key"] = key
    if kind == "set":
        rec["value"] = value
    if kind == "setv":
        rec["value"] = [value] * 0 + source  # source: a list of texts here
    if kind == "copy":
        rec["source"] = value
    return rec


journal_records = st.lists(st.builds(
    _record, st.sampled_from(["set", "set", "setv", "unset", "copy", "remove"]),
    st.integers(0, 2**40), gvfs_text, gvfs_text, gvfs_text, st.lists(gvfs_text, max_size=3)),
    min_size=1, max_size=80)


@pytest.mark.parametrize("kinds", ["set+setv", "any"])
@settings(max_examples=120, deadline=None)
@given(recs=journal_records, data=st.data())
def test_json_lines_rendered_from_text_bytes_equal_json_line(kinds, recs, data):
    """records --json / records.jsonl of gvfs journals (whole, in batches, damaged): the lines
    rendered from the texts' bytes are json_line's, byte for byte, and damage ends them after
    the valid records with read()'s error."""
    from journalfs import jsonlines
    if kinds == "set+setv":
        recs = [r for r in recs if r["kind"] in ("set", "setv")] or recs[:1]
    codec = CODECS["gvfs-journal"]
    buf = bytes(codec.write(recs, tag=3))
    if data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(buf) - 1))
        buf = buf[:at] + bytes([buf[at] ^ (1 << data.draw(st.integers(0, 7)))]) + buf[at + 1:]
    want, error = [], None
    try:
        for rec in codec.read(buf, "f"):
            want.append(jsonlines.json_line(rec))
    except gj.FormatError as exc:
        error = exc
    batch = data.draw(st.sampled_from([1, 5, 64, 10**6]))
    got, start, seq = [], None, 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jsonlines, "COLUMNS_MIN_ROWS", 1)
        while True:
            cols = codec.read_columns(buf, "f", start, seq, None, batch)
            if cols.rows:
                end = cols.next_offset if cols.error is None else cols.error.offset
                got.append(jsonlines.columns_chunk(codec, buf, "f", cols, start, seq, end).data)
            if cols.error is not None or cols.next_offset is None:
                break
            start, seq = cols.next_offset, cols.next_seq
    assert b"".join(got) == b"".join(want)
    assert (cols.error is None) == (error is None)
    if error is not None:
        assert (cols.error.offset, cols.error.reason) == (error.offset, error.reason)
