"""The boundary walks of kestrel-writer, akka-data and wallaby-log ``read_columns`` cut the
payloads as they go (bytes and mmap buffers) or after (memoryviews): either way the columns
must be exactly what ``read`` yields, batch by batch, on intact and damaged files, and a lying
length must never make them copy more than the format's limits allow."""
from __future__ import annotations

import mmap
import random
import struct
import tracemalloc

from hypothesis import given, strategies as st

from journalfs import demo
from journalfs.formats import CODECS
from journalfs.formats.akka import AkkaData
from journalfs.formats.kestrel import MAX_DATA, PUT_BYTE, WRITER_MAGIC

from codec_helpers import FAST, columns_in_batches, read_all, same_error

NAMES = ("kestrel-writer", "akka-data", "wallaby-log")


def sample(name: str, seed: int, n: int) -> bytes:
    rng = random.Random(seed)
    if name == "kestrel-writer":
        return CODECS[name].write(demo.kestrel_put_records(rng, n, payload=(0, 40)))
    if name == "akka-data":
        return AkkaData.build(demo.akka_messages(rng, n, ("a", "b", "c"), payload=(0, 40)))[0]
    items = demo.wallaby_items(rng, n, payload=(0, 40))
    return CODECS[name].write([{"time": t, "payload": p} for t, p in items])


def as_buffer(kind: str, data: bytes, keep: list):
    if kind == "bytes":
        return data
    if kind == "memoryview":
        return memoryview(bytearray(data))
    if not data:
        return data  # mmap cannot map nothing
    area = mmap.mmap(-1, len(data))
    area.write(data)
    keep.append(area)
    return area


@FAST
@given(data=st.data(), name=st.sampled_from(NAMES), seed=st.integers(0, 2**16),
       n=st.integers(0, 12), batch=st.integers(1, 6),
       kind=st.sampled_from(("bytes", "memoryview", "mmap")))
def test_columns_in_batches_equal_read_on_damaged_files(data, name, seed, n, batch, kind):
    codec = CODECS[name]
    buf = bytearray(sample(name, seed, n))
    for _ in range(data.draw(st.integers(0, 4))):  # bit flips, lying lengths, cuts, appended junk
        action = data.draw(st.sampled_from(("flip", "length", "cut", "append")))
        if action == "flip" and buf:
            pos = data.draw(st.integers(0, len(buf) - 1))
            buf[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "length" and len(buf) > 8:
            pos = data.draw(st.integers(0, len(buf) - 4))
            buf[pos:pos + 4] = struct.pack("<I", data.draw(st.sampled_from(
                (0, 1, 16, 2**24, 2**24 + 1, 2**31 - 1, 2**31, 2**32 - 1))))
        elif action == "cut":
            del buf[data.draw(st.integers(0, len(buf))):]
        else:
            buf += data.draw(st.binary(max_size=40))
    keep: list = []
    got, error = columns_in_batches(codec, as_buffer(kind, bytes(buf), keep), batch)
    want, want_error = read_all(codec, bytes(buf))
    assert got == want
    assert same_error(error, want_error), (error, want_error)
    assert all(type(rec["payload"]) is bytes for rec in got)


def _columns_and_peak(fmt: str, buf: bytes):
    """``read_columns`` of ``buf`` and the peak of Python allocations it made."""
    tracemalloc.start()
    try:
        cols = CODECS[fmt].read_columns(buf, "f")
        return cols, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_lying_kestrel_length_is_never_copied():
    """A PUT claiming 16 MiB + 1 bytes with that many bytes present: damage at it, and the
    walk does not copy those bytes speculatively."""
    good = CODECS["kestrel-writer"].write(demo.kestrel_put_records(random.Random(1), 3, payload=(1, 9)))
    liar = bytes([PUT_BYTE]) + struct.pack("<iiqq", MAX_DATA + 1, 0, 9, 0)
    buf = good + liar + bytes(range(1, 256)) * ((MAX_DATA + 600) // 255)
    assert buf.startswith(WRITER_MAGIC)
    cols, peak = _columns_and_peak("kestrel-writer", buf)
    assert cols.rows == 3 and cols.error is not None and cols.error.offset == len(good)
    assert peak < 1 << 20, peak


def test_sizes_after_the_wallaby_end_marker_are_never_copied():
    """Past the end-of-data marker a size field can say anything: damage at the marker, and
    the walk does not copy the bytes that size claims."""
    items = demo.wallaby_items(random.Random(2), 3, payload=(1, 9))
    good = CODECS["wallaby-log"].write([{"time": t, "payload": p} for t, p in items])
    junk = 1 << 24
    buf = good + bytes(16) + struct.pack("<IIq", junk, 0, 5) + b"\x01" * junk
    cols, peak = _columns_and_peak("wallaby-log", buf)
    assert cols.rows == 3 and cols.error is not None and cols.error.offset == len(good)
    assert peak < 1 << 20, peak
