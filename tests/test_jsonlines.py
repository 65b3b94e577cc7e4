"""The one JSON-lines renderer (journalfs/jsonlines.py): the columnar way writes exactly what
the reference (`json_line` of each record) writes, or declines; damage keeps the prefix."""
from __future__ import annotations

import base64
import gc
import json
import random
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journalfs import demo, jsonlines
from journalfs.formats import CODECS, FormatError
from journalfs.formats.base import Columns, IntLists
from journalfs.jsonlines import json_chunk, json_line, render_columns

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
UINT64 = st.integers(0, (1 << 64) - 1)


TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)


@st.composite
def batches(draw):
    """Columns as the vectorised codecs make them, with values at every edge."""
    rows = draw(st.integers(1, 80))
    data: dict = {"format": "kestrel-writer",
                  "seq": np.arange(rows, dtype=np.int64) + draw(st.integers(0, 10 ** 12)),
                  "offset": np.array(draw(st.lists(INT64, min_size=rows, max_size=rows))),
                  "kind": [draw(st.sampled_from(["put", "x\"y\\é"]))] * rows}
    data["big"] = np.array(draw(st.lists(UINT64, min_size=rows, max_size=rows)), dtype=np.uint64)
    small = draw(st.lists(st.integers(-5, 99_999), min_size=rows, max_size=rows))
    data["small"] = np.array(small, dtype=draw(st.sampled_from([np.int32, np.int64])))
    mask = draw(st.lists(st.booleans(), min_size=rows, max_size=rows))
    data["maybe"] = np.ma.masked_array(np.array(draw(st.lists(
        INT64, min_size=rows, max_size=rows))), mask=mask)
    data["flag"] = np.array(draw(st.lists(st.booleans(), min_size=rows, max_size=rows)))
    # every row as wide as the next (no NUL to delete) or not
    same = draw(st.booleans())
    if same:
        data["fixed"] = np.full(rows, draw(st.sampled_from([0, 7, 1234, 10 ** 12, 2 ** 64 - 1])),
                                dtype=np.uint64)
        size = draw(st.sampled_from([0, 1, 2, 3, 64, 65]))
        data["payload"] = [bytes(draw(st.binary(min_size=size, max_size=size))) for _ in range(rows)]
    else:
        data["payload"] = draw(st.lists(st.binary(max_size=draw(st.sampled_from([0, 5, 300]))),
                                        min_size=rows, max_size=rows))
    # columns the generic codecs (colcodecs) make: texts and values that vary per row
    data["path"] = draw(st.lists(TEXT if draw(st.booleans()) else st.sampled_from(["a", "bc"]),
                                 min_size=rows, max_size=rows))
    data["count"] = draw(st.lists(INT64 if draw(st.booleans()) else UINT64,
                                  min_size=rows, max_size=rows))
    data["value"] = draw(st.lists(st.one_of(TEXT, st.lists(TEXT, max_size=3),
                                            st.dictionaries(TEXT, st.integers(), max_size=2),
                                            st.booleans(), st.floats(allow_nan=False)),
                                  min_size=rows, max_size=rows))
    data["ids"] = int_lists(draw, rows)
    order = list(data)
    draw(st.randoms()).shuffle(order)
    return Columns(data, rows, None, rows), order


def int_lists(draw, rows: int) -> IntLists:
    """Lists of integers as Kestrel's reader columns hold them: flat, each row's numbers
    somewhere in ``values`` (stored here in reverse row order, so rows are not contiguous)."""
    numbers = INT64 if draw(st.booleans()) else st.integers(0, 12)
    lists = draw(st.lists(st.lists(numbers, max_size=draw(st.sampled_from([0, 3, 9]))),
                          min_size=rows, max_size=rows))
    if draw(st.booleans()):  # one number in every list
        lists = [[7] * len(ids) for ids in lists]
    values, starts = [], [0] * rows
    for i in reversed(range(rows)):
        starts[i] = len(values)
        values += lists[i]
    return IntLists(np.array(values, dtype=np.int64), np.array(starts, dtype=np.int64),
                    np.array([len(ids) for ids in lists], dtype=np.int64))


def reference(cols: Columns, order: list[str]) -> bytes:
    lines = []
    for i in range(cols.rows):
        rec = {}
        for name in order:
            column = cols.data[name]
            value = column if isinstance(column, str) else column[i]
            if value is np.ma.masked:
                value = None
            elif isinstance(value, np.generic):
                value = value.item()
            rec[name] = value
        lines.append(json_line(rec))
    return b"".join(lines)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(), st.sampled_from([1 << 30, 64]))
def test_columns_render_exactly_the_reference(batch, slack):
    cols, order = batch
    old = jsonlines.COLUMNS_MIN_ROWS, jsonlines.MATRIX_SLACK_BYTES
    # every batch size goes the columnar way; a tiny slack cuts wide batches in halves
    jsonlines.COLUMNS_MIN_ROWS, jsonlines.MATRIX_SLACK_BYTES = 1, slack
    try:
        got, measure = jsonlines.render_columns_measured(cols, order)
    finally:
        jsonlines.COLUMNS_MIN_ROWS, jsonlines.MATRIX_SLACK_BYTES = old
    want = reference(cols, order)
    assert got == want
    # each line's length, worked out from the columns, is the line's
    assert measure().tolist() == [len(line) + 1 for line in want.split(b"\n")[:-1]]


@st.composite
def big_journal_batches(draw):
    """What big journals' batches look like: counters and timestamps whose leading digits
    every row shares (or not quite: a power of ten crossed), payloads all of one size (or
    not), so that rows come out as wide as each other or need their NULs deleted."""
    rows = draw(st.integers(1, 70))
    base = draw(st.sampled_from([0, 1, 9_990, 99_999_960, 10 ** 12, 1_700_000_000_000_000_000,
                                 2 ** 64 - 80]))
    steps = np.array(draw(st.lists(st.integers(0, 3), min_size=rows, max_size=rows)),
                     dtype=np.uint64)
    data: dict = {"format": "wallaby-log", "seq": np.arange(rows, dtype=np.int64) + 5_000,
                  "offset": np.uint64(base) + np.cumsum(steps, dtype=np.uint64),
                  "kind": "record"}
    if base < 2 ** 63 - 1000:
        data["time"] = (np.cumsum(steps, dtype=np.int64) * draw(st.sampled_from([1, 7, 1003]))
                        + np.int64(base))
    size = draw(st.integers(0, 70))
    vary = draw(st.booleans())
    data["payload"] = [draw(st.binary(min_size=size, max_size=size + (2 if vary else 0)))
                       for _ in range(rows)]
    if draw(st.booleans()):
        data["flag"] = np.full(rows, draw(st.booleans()))
    return Columns(data, rows, None, rows), list(data)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(big_journal_batches())
def test_rows_of_equal_width_render_exactly_the_reference(batch):
    cols, order = batch
    old = jsonlines.COLUMNS_MIN_ROWS
    jsonlines.COLUMNS_MIN_ROWS = 1
    try:
        got, measure = jsonlines.render_columns_measured(cols, order)
    finally:
        jsonlines.COLUMNS_MIN_ROWS = old
    want = reference(cols, order)
    assert got == want
    assert measure().tolist() == [len(line) + 1 for line in want.split(b"\n")[:-1]]


def test_shared_leading_digits_are_written_once():
    """A batch of timestamps sharing their leading digits and payloads of one size renders
    with no NUL to delete, exactly as the reference."""
    rows = 1000
    data = {"format": "wallaby-log", "seq": np.arange(rows) + 10_000,
            "time": 1_700_000_000_000_000_000 + np.arange(rows) * 1_000_003, "kind": "record",
            "payload": [bytes([i % 251]) * 64 for i in range(rows)]}
    cols = Columns(data, rows, None, rows)
    fields = [jsonlines._field(data[name], 0, rows) for name in ("seq", "time")]
    assert all(f.full for f in fields)
    prefix = fields[1].prefix(False)  # the digits above the last 9 are shared
    assert prefix == "1700000000" and fields[1].size(False) == 9
    assert render_columns(cols, list(data)) == reference(cols, list(data))


@pytest.mark.parametrize("change", ["text_not_utf8", "text_varies_not_utf8", "text_absent",
                                    "null_payload", "float", "missing_field", "value_not_utf8"])
def test_what_columns_cannot_write_exactly_is_declined(change, monkeypatch):
    """render_columns declines (None) what only the reference writes right; json_chunk then
    writes those records one by one, e.g. text that is not UTF-8 as <field>_b64."""
    monkeypatch.setattr(jsonlines, "COLUMNS_MIN_ROWS", 1)
    rows = 3
    data = {"format": "gvfs-journal", "seq": np.arange(rows), "kind": ["set"] * rows,
            "payload": [b"a", b"bc", b""]}
    if change == "text_not_utf8":
        data["kind"] = ["\udcff"] * rows
    elif change == "text_varies_not_utf8":
        data["path"] = ["/a", "/b\udcff", "/c"]
    elif change == "text_absent":  # the generic read_columns: None where a record lacks it
        data["kind"] = ["set", None, "set"]
    elif change == "value_not_utf8":
        data["value"] = [["a"], ["b", "\udcfe"], []]
    elif change == "null_payload":
        data["payload"] = [b"a", None, b""]
    elif change == "float":
        data["seq"] = np.arange(rows, dtype=np.float64)
    order = list(data)
    if change == "missing_field":
        order.remove("kind")
    assert render_columns(Columns(data, rows, None, rows), order) is None
    if change == "text_not_utf8":
        line = json.loads(reference(Columns(data, rows, None, rows), order).splitlines()[0])
        assert base64.b64decode(line["kind_b64"]) == b"\xff" and "kind" not in line


def test_a_big_columnar_file_renders_as_the_reference(tmp_path):
    """A file of many full-size batches (the default thresholds) through json_chunk."""
    data = CODECS["kestrel-writer"].write(
        demo.kestrel_put_records(random.Random(3), 40_000, payload=(0, 400)))
    codec, path = CODECS["kestrel-writer"], str(tmp_path / "q")
    want = b"".join(json_line(r) for r in codec.read(data, path))
    got, start, seq = [], None, 0
    while True:
        cols = codec.read_columns(data, path, start, seq, None, 16384)
        chunk = json_chunk(codec, data, path, start, seq, 16384)
        got.append(chunk.data)
        assert chunk.rows == cols.rows and chunk.kinds == ["put"] * cols.rows
        assert chunk.line_lengths().sum() == len(chunk.data)
        if cols.next_offset is None:
            break
        start, seq = cols.next_offset, cols.next_seq
    assert b"".join(got) == want


@pytest.mark.parametrize("fmt", ["kestrel-writer", "akka-data", "wallaby-log", "gvfs-journal"])
def test_damaged_file_prints_the_prefix_then_names_file_and_offset(fmt, tmp_path):
    """`records --json` of a file cut inside a record, far past the first batch: every valid
    record's line, byte for byte, then one line naming the file and the offset; exit 3."""
    rng = random.Random(fmt)
    if fmt == "kestrel-writer":
        whole = CODECS[fmt].write(demo.kestrel_put_records(rng, 30_000, payload=(0, 60)))
    elif fmt == "akka-data":
        whole, _meta = CODECS[fmt].build(demo.akka_messages(rng, 30_000, ("a", "b"),
                                                             payload=(0, 60)))
    elif fmt == "wallaby-log":
        whole = CODECS[fmt].write([{"time": t, "payload": p} for t, p in
                                   demo.wallaby_items(rng, 30_000, payload=(0, 60))])
    else:
        whole = CODECS[fmt].write([{"kind": "set", "mtime": demo.BASE_S + i, "path": f"/p/{i}",
                                    "key": "k", "value": "v"} for i in range(30_000)],
                                  tag=0x1234)
    path = tmp_path / fmt
    path.write_bytes(whole[:len(whole) * 3 // 4 + 1])
    data = path.read_bytes()
    lines, error = [], None
    try:
        for rec in CODECS[fmt].read(data, str(path)):
            lines.append(json_line(rec))
    except FormatError as exc:
        error = exc
    assert error is not None and len(lines) > 16384
    run = subprocess.run([sys.executable, "-m", "journalfs.cli", "records", str(path), "--json"],
                         capture_output=True)
    assert run.returncode == 3
    assert run.stdout == b"".join(lines)
    message = run.stderr.decode().strip()
    assert message.count("\n") == 0 and str(path) in message
    assert f"byte {error.offset}" in message


def test_records_jsonl_reads_answered_from_the_chunk_in_hand(tmp_path):
    """The views' reader answers a read inside the chunk it holds without rendering (on the
    request thread); anything else goes to ``read``. Together: exactly records.jsonl,
    whether its size is known yet or not."""
    from journalfs.fs.jsonlview import JsonlLayout, JsonlReader
    from journalfs.journals import RecordIndex
    path = tmp_path / f"jobs.{demo.BASE_MS}"
    path.write_bytes(CODECS["kestrel-writer"].write(
        demo.kestrel_put_records(random.Random(5), 40_000, payload=(0, 80))))
    index = RecordIndex.build(str(path))
    full = b"".join(json_line(r) for r in index.records())
    for layout in (JsonlLayout.empty(index), JsonlLayout(index)):
        reader = JsonlReader(index, layout)
        assert reader.read_in_hand(0, 4096) is None  # nothing rendered yet
        got, inline, off = [], 0, 0
        while True:
            piece = reader.read_in_hand(off, 128 << 10)
            if piece is None:
                piece = reader.read(off, 128 << 10)
            else:
                inline += 1
            if not piece:
                break
            got.append(piece)
            off += len(piece)
        reader.close()
        assert b"".join(got) == full
        assert layout.size == len(full)
        assert inline > len(got) // 2  # most reads never left the chunk in hand


def test_one_huge_payload_among_small_ones_is_rendered_in_pieces():
    """The matrix is as wide as the widest payload: a batch whose one 8 MiB payload would make
    4,000 rows 11 MB wide each (44 GB) is cut in halves until it fits, exactly."""
    rows = 4000
    payloads = [b"x" * 10] * rows
    payloads[1234] = b"y" * (8 << 20)
    data = {"format": "kestrel-writer", "seq": np.arange(rows), "kind": "put",
            "payload": payloads}
    got = render_columns(Columns(data, rows, None, rows), list(data))
    assert got == reference(Columns(data, rows, None, rows), list(data))


def test_batches_mixing_kinds_with_different_fields_render_as_the_reference(tmp_path):
    """kestrel-reader rows alternate read_head (`id`) and read_done (`ids`): each kind is
    rendered from the columns with its own fields and the lines are put back in file order,
    byte for byte what json_line writes; line lengths match the lines."""
    rng = random.Random(7)
    records = []
    head = 0
    for _ in range(3000):
        records.append({"kind": "read_head", "id": head})
        done = rng.randrange(0, 6)
        records.append({"kind": "read_done", "ids": list(range(head + 1, head + 1 + done))})
        head += done + rng.randrange(1, 3)
    codec = CODECS["kestrel-reader"]
    data, path = codec.write(records), str(tmp_path / "jobs.read.r")
    want = b"".join(json_line(r) for r in codec.read(data, path))
    got, start, seq = [], None, 0
    while True:
        cols = codec.read_columns(data, path, start, seq, None, 1000)
        chunk = json_chunk(codec, data, path, start, seq, 1000)
        assert chunk.rows == cols.rows
        lengths = chunk.line_lengths()
        lines = chunk.data.splitlines(keepends=True)
        assert lengths.tolist() == [len(line) for line in lines]
        got.append(chunk.data)
        if cols.next_offset is None:
            break
        start, seq = cols.next_offset, cols.next_seq
    assert b"".join(got) == want
    # and the kinds were really rendered from the columns, not record by record
    cols = codec.read_columns(data, path, None, 0, None, 1000)
    assert jsonlines._render_by_kind(codec, data, path, cols, 0, cols.next_offset) is not None


def _demo_journals(tmp_path):
    """(codec, path, bytes) of every demo journal, written out (sniffing needs a file)."""
    from journalfs.journals import sniff_file
    out = []
    for name, data in demo.demo_files().items():
        path = tmp_path / name.replace("/", "_")
        path.write_bytes(data)
        codec = sniff_file(str(path))
        if codec is not None:
            out.append((codec, str(path), data))
    return out


def test_damage_reports_leave_no_reference_cycles(tmp_path):
    """A chunk that ends at damage keeps its FormatError, but not the traceback: that held
    every frame of the decoding (and the file's buffers) in a cycle only the cyclic collector
    frees, so a daemon streaming records.jsonl grew by ~100 MB per pass of a 1 GB journal."""
    journals = _demo_journals(tmp_path)
    assert {codec.name for codec, _, _ in journals} >= {
        "kestrel-writer", "akka-data", "wallaby-log", "jrnl", "gvfs-journal"}
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for codec, path, data in journals:
            for cut in (len(data) * 2 // 3, len(data) - 1):
                chunk = json_chunk(codec, data[:cut], path, None, 0, 1 << 20)
                cols = codec.read_columns(data[:cut], path, None, 0, None, 1 << 20)
                errors = [e for e in (chunk.error, cols.error) if e is not None]
                assert all(e.__traceback__ is None for e in errors), (codec.name, cut)
                del chunk, cols, errors
            assert gc.collect() == 0, codec.name  # nothing was left for the collector
    finally:
        if gc_was_enabled:
            gc.enable()
