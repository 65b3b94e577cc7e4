"""Checks shared by the codec tests (test_format_*, test_conformance, test_fsck, test_journals)
and the fuzz engine (tests/fuzz/mutate.py).

Each helper reads through the real codecs; the assertions inside them are the properties every
codec must have (a truncated file reads as a prefix, columns equal records, ...).
"""
from __future__ import annotations

import tracemalloc
from typing import Callable, Iterator

from hypothesis import HealthCheck, settings, strategies as st

from journalfs.formats import CODECS, Codec, Columns, FormatError, detect, record_to_json

#: Hypothesis settings of the codecs' property tests: enough examples, no per-example deadline.
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def read_all(codec: Codec, buf, source: str = "f", **kw) -> tuple[list[dict], FormatError | None]:
    """(records, error): every record ``read`` yields before the damage, and the damage (None
    for a clean file)."""
    out: list[dict] = []
    try:
        for rec in codec.read(buf, source, **kw):
            out.append(rec)
    except FormatError as exc:
        return out, exc
    return out, None


def file_records(path) -> list[dict]:
    """The valid records of the file at ``path`` (its prefix when damaged)."""
    from journalfs.journals import read_file
    out: list[dict] = []
    try:
        out.extend(read_file(str(path)))
    except FormatError:
        pass
    return out


def reads_back(codec: Codec, buf: bytes, **header) -> list[dict]:
    """The records of a file the codec wrote, checking that it reads without damage and that
    writing those records again (with the same ``header`` settings) gives the same bytes."""
    records, error = read_all(codec, buf)
    assert error is None, error
    assert codec.write(records, **header) == buf
    return records


def read_traced(codec: Codec, buf, source: str = "f"
                ) -> tuple[list[dict], FormatError | None, Columns, int]:
    """``read`` and ``read_columns`` of ``buf`` under tracemalloc: (records, damage, columns,
    peak bytes allocated meanwhile)."""
    tracemalloc.start()
    try:
        records, error = read_all(codec, buf, source)
        cols = codec.read_columns(buf, source)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return records, error, cols, peak


def columns_traced(codec: Codec, buf, source: str = "f") -> tuple[Columns, int]:
    """``read_columns`` of ``buf`` alone under tracemalloc: (columns, peak bytes allocated)."""
    tracemalloc.start()
    try:
        cols = codec.read_columns(buf, source)
        return cols, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def columns_as_records(cols: Columns) -> list[dict]:
    """The rows of ``cols`` as record dicts (numpy values as Python ones, masked as None)."""
    values = {k: (v.tolist() if hasattr(v, "tolist") else list(v)) for k, v in cols.data.items()}
    return [{k: values[k][i] for k in values} for i in range(cols.rows)]


def same_error(a: FormatError | None, b: FormatError | None) -> bool:
    """Both None, or both naming the same file and byte offset."""
    if a is None or b is None:
        return a is b
    return (a.source, a.offset) == (b.source, b.offset)


def assert_columns_equal_read(codec: Codec, buf, records: list[dict], error: FormatError | None,
                              source: str = "f") -> Columns:
    """``read_columns`` over ``buf`` gives exactly ``records`` and the same damage as ``read``."""
    cols = codec.read_columns(buf, source)
    assert columns_as_records(cols) == records
    assert same_error(cols.error, error), (cols.error, error)
    return cols


def columns_in_batches(codec: Codec, buf, batch: int, source: str = "f"
                       ) -> tuple[list[dict], FormatError | None]:
    """Every row ``read_columns`` gives in batches of at most ``batch``, each resuming where the
    previous one said, until the end or the damage: (records, damage)."""
    got: list[dict] = []
    start, seq = None, 0
    while True:
        cols = codec.read_columns(buf, source, start, seq, limit=batch)
        assert cols.rows <= batch
        got += columns_as_records(cols)
        if cols.error is not None or cols.next_offset is None:
            return got, cols.error
        start, seq = cols.next_offset, cols.next_seq


def truncations(codec: Codec, buf: bytes, source: str = "cut"
                ) -> Iterator[tuple[int, list[dict], list[dict], FormatError | None]]:
    """For every cut length: (cut, the whole file's records, records of ``buf[:cut]``, damage),
    having checked that those records are a prefix of the whole file's and that any damage names
    ``source`` and a byte inside the cut file."""
    full = read_all(codec, buf)[0]
    for cut in range(len(buf)):
        records, error = read_all(codec, buf[:cut], source)
        assert records == full[:len(records)], cut
        if error is not None:
            assert error.source == source and 0 <= error.offset <= cut, (cut, error)
        yield cut, full, records, error


def flip_bits(data, buf: bytes, most: int) -> bytes:
    """``buf`` with 1..``most`` bits flipped at positions drawn from hypothesis ``data``."""
    out = bytearray(buf)
    for _ in range(data.draw(st.integers(1, most))):
        pos = data.draw(st.integers(0, len(out) - 1))
        out[pos] ^= 1 << data.draw(st.integers(0, 7))
    return bytes(out)


def corpus_files(records_expected: dict, formats: tuple[str, ...]) -> dict[str, dict]:
    """The conformance corpus entries (name -> expectation) of ``formats``."""
    return {name: exp for name, exp in records_expected.items() if exp["format"] in formats}


def read_corpus_file(records_corpus, name: str, expected: dict
                     ) -> tuple[Codec, bytes, list[dict], FormatError | None]:
    """(codec, bytes, records, damage) of one corpus file, checking that its magic picks the
    codec the expectation names."""
    buf = (records_corpus / name).read_bytes()
    codec = detect(buf[:64])
    assert codec is CODECS[expected["format"]], name
    records, error = read_all(codec, buf, name)
    return codec, buf, records, error


def assert_expected_records(records: list[dict], error: FormatError | None, expected: dict,
                            name: str, to_json: Callable[[dict], dict] = record_to_json) -> None:
    """The records print as the expectation's JSON objects, and damage exactly when it says
    exit 3."""
    assert [to_json(r) for r in records] == expected["records"], name
    assert (error is not None) == (expected["exit"] == 3), (name, error)


def read_expected_corpus(records_corpus, records_expected: dict, formats: tuple[str, ...]
                         ) -> list[tuple[str, Codec, bytes, list[dict]]]:
    """(name, codec, bytes, records) of every corpus file of ``formats``, each checked to decode
    exactly as its expectation says."""
    out = []
    for name, exp in corpus_files(records_expected, formats).items():
        codec, buf, records, error = read_corpus_file(records_corpus, name, exp)
        assert_expected_records(records, error, exp, name)
        out.append((name, codec, buf, records))
    return out


def check_vectors(vectors: dict, formats: tuple[str, ...]) -> int:
    """Check that each byte vector of ``formats`` has its length, that its magic picks its
    codec and that it decodes without damage to exactly its records; return how many."""
    checked = 0
    for name, vec in vectors.items():
        if vec["format"] not in formats:
            continue
        buf = bytes.fromhex(vec["hex"])
        assert len(buf) == vec["length"], name
        assert detect(buf[:64]) is CODECS[vec["format"]], name
        records, error = read_all(CODECS[vec["format"]], buf, name)
        assert error is None, (name, error)
        assert [record_to_json(r) for r in records] == vec["records"], name
        checked += 1
    return checked
