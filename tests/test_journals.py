"""RecordIndex over real files: the fast (batched, columnar) build must index exactly what a
plain pass over ``read()`` sees — count, damage and checkpoints — on every conformance file,
serve any window of records, notice a grown file, and stay memory-bounded on big files."""
from __future__ import annotations

import base64
import collections
import json
import os
import stat
import subprocess
import sys
import random
import tracemalloc
from pathlib import Path

import pytest

from codec_helpers import read_all
from journalfs import demo, journals, jsonlines
from journalfs.formats import CODECS, FormatError
from journalfs.formats.akka import AkkaData
from journalfs.journals import RecordIndex, mapped, sniff_file


def reference_index(path: Path, every: int) -> tuple[int, tuple | None, list[int], list[int]]:
    """What indexing means, the slow obvious way: one pass over read(), a checkpoint every
    ``every`` records (none for codecs that cannot resume mid-file)."""
    codec = sniff_file(str(path))
    count, error, seqs, offsets = 0, None, [], []
    with mapped(str(path)) as buf:
        try:
            for rec in codec.read(buf, str(path)):
                if count % every == 0 and codec.resumable:
                    seqs.append(count)
                    offsets.append(rec["offset"])
                count += 1
        except FormatError as exc:
            error = exc
    return count, _damage(error), seqs, offsets


def _damage(error: FormatError | None) -> tuple | None:
    return None if error is None else (error.source, error.offset, error.reason)


def all_records(path: Path) -> tuple[list[dict], tuple | None]:
    with mapped(str(path)) as buf:
        records, error = read_all(sniff_file(str(path)), buf, str(path))
    return records, _damage(error)


def conformance_journals(records_corpus: Path, gvfs_snapshots: list[Path]) -> list[Path]:
    candidates = [p for p in sorted(records_corpus.rglob("*")) if p.is_file()]
    candidates += [p for snap in gvfs_snapshots for p in sorted((snap / "gvfs-metadata").iterdir())]
    return [p for p in candidates if sniff_file(str(p)) is not None]


@pytest.fixture(scope="module")
def journal_files(records_corpus, gvfs_snapshots) -> list[Path]:
    files = conformance_journals(records_corpus, gvfs_snapshots)
    formats = {sniff_file(str(p)).name for p in files}
    assert formats == set(CODECS), f"corpus lacks {set(CODECS) - formats}"
    return files


def assert_index_matches_reference(path: Path, every: int) -> RecordIndex:
    index = RecordIndex.build(str(path))
    count, damage, seqs, offsets = reference_index(path, every)
    assert (index.count, _damage(index.error)) == (count, damage), path
    assert (index.seqs, index.offsets) == (seqs, offsets), path
    return index


# -- equality with the plain pass ---------------------------------------------------------------

def test_index_of_every_conformance_file_matches_a_plain_read(journal_files):
    damaged = 0
    for path in journal_files:
        index = assert_index_matches_reference(path, journals.CHECKPOINT_EVERY)
        damaged += index.error is not None
    assert damaged >= 1  # the corpus's torn file keeps its damage in the index


def test_small_batches_and_dense_checkpoints_change_nothing(journal_files, monkeypatch):
    """Batch boundaries and checkpoints everywhere: every record of the corpus sits next to one."""
    for rows, every in ((1, 1), (2, 3), (5, 2)):
        monkeypatch.setattr(journals, "FIRST_BATCH_ROWS", rows)
        monkeypatch.setattr(journals, "INDEX_BATCH_ROWS", rows)
        monkeypatch.setattr(journals, "CHECKPOINT_EVERY", every)
        for path in journal_files:
            assert_index_matches_reference(path, every)


def test_cut_and_bit_flipped_copies_index_like_a_plain_read(journal_files, tmp_path, monkeypatch):
    monkeypatch.setattr(journals, "FIRST_BATCH_ROWS", 2)
    monkeypatch.setattr(journals, "CHECKPOINT_EVERY", 2)
    rng = random.Random(7)
    damaged = 0
    for n, path in enumerate(journal_files):
        data = path.read_bytes()
        copy = tmp_path / f"{n}-{path.name}"
        variants = [data[:len(data) * k // 4] for k in (1, 2, 3)] + [data[:-1]]
        for _ in range(3):
            flipped = bytearray(data)
            flipped[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            variants.append(bytes(flipped))
        for variant in variants:
            copy.write_bytes(variant)
            if sniff_file(str(copy)) is None:
                continue  # the magic itself is gone: not a journal any more
            damaged += assert_index_matches_reference(copy, 2).error is not None
    assert damaged > len(journal_files)


def test_any_window_equals_the_slice_of_read(journal_files, monkeypatch):
    monkeypatch.setattr(journals, "CHECKPOINT_EVERY", 3)
    for path in journal_files:
        records, damage = all_records(path)
        index = RecordIndex.build(str(path))
        assert _damage(index.error) == damage
        n = len(records)
        for first in sorted({0, 1, 2, 3, 4, n // 2, n - 1, n}):
            for count in (None, 0, 1, 2, 5):
                want = records[first:] if count is None else records[first:first + count]
                assert list(index.records(first, count)) == want, (path, first, count)
        if n:
            assert index.record(n - 1) == records[-1]
        with pytest.raises(IndexError):
            index.record(n)


# -- big generated files -------------------------------------------------------------------------

def big_file(fmt: str, n: int) -> bytes:
    rng = random.Random(fmt)
    if fmt == "kestrel-writer":
        return CODECS[fmt].write(demo.kestrel_put_records(rng, n, payload=(16, 100)))
    if fmt == "akka-data":
        return AkkaData.build(demo.akka_messages(rng, n, ("a", "b", "c"), payload=(16, 100)))[0]
    if fmt == "wallaby-log":
        items = demo.wallaby_items(rng, n, payload=(16, 100))
        return CODECS[fmt].write([{"time": t, "payload": p} for t, p in items])
    raise AssertionError(fmt)


@pytest.fixture(scope="module", params=["kestrel-writer", "akka-data", "wallaby-log"])
def big_journal(request, tmp_path_factory) -> tuple[str, Path, bytes]:
    path = tmp_path_factory.mktemp("big") / request.param
    data = big_file(request.param, 150_000)
    path.write_bytes(data)
    return request.param, path, data


def index_with_peak_memory(path: Path) -> tuple[RecordIndex, int]:
    tracemalloc.start()
    try:
        index = RecordIndex.build(str(path))
        return index, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_big_file_index_is_exact_and_memory_bounded(big_journal, tmp_path):
    fmt, path, data = big_journal
    assert len(data) > 10_000_000
    index, peak = index_with_peak_memory(path)
    count, damage, seqs, offsets = reference_index(path, journals.CHECKPOINT_EVERY)
    assert (index.count, _damage(index.error), index.seqs, index.offsets) == \
        (count, damage, seqs, offsets)
    assert count == 150_000 and damage is None
    # one batch of decoded records at a time, never the file: the peak does not grow with it
    third = tmp_path / "third"
    third.write_bytes(data[:index.offsets[len(index.offsets) // 3]])
    _, third_peak = index_with_peak_memory(third)
    assert peak < 8_000_000 and peak < len(data) / 2, peak
    assert peak < 1.5 * third_peak + 500_000, (peak, third_peak)


def test_torn_big_file_keeps_count_and_damage(big_journal, tmp_path):
    fmt, _, data = big_journal
    tail = collections.deque(CODECS[fmt].read(data, "big"), maxlen=3)
    last = tail[-1]
    torn = tmp_path / "torn"
    torn.write_bytes(data[:last["offset"] + 7])  # the last record cut inside its header
    index = assert_index_matches_reference(torn, journals.CHECKPOINT_EVERY)
    assert index.count == last["seq"] and index.error.offset == last["offset"]
    assert list(index.records(last["seq"] - 2)) == list(tail)[:2]


def test_growing_file_gets_a_new_identity_and_count(tmp_path):
    path = tmp_path / "q.1700000000000"
    writer = CODECS["kestrel-writer"]
    first = [{"id": i, "payload": b"x" * i} for i in range(1, 2000)]
    path.write_bytes(writer.write(first))
    before = RecordIndex.build(str(path))
    with open(path, "ab") as f:
        f.write(writer.write([{"id": 2000, "payload": b"new"}])[4:])  # one PUT, no magic
    after = RecordIndex.build(str(path))
    assert after.identity != before.identity
    assert (before.count, after.count) == (1999, 2000)
    assert after.record(1999)["payload"] == b"new" and after.error is None


def test_a_grown_file_is_indexed_from_its_last_checkpoint_only(big_journal, tmp_path):
    """Appending (even completing a torn last record) extends the index: it equals a fresh
    build, but re-reading starts at the old last checkpoint. A file rewritten in place, or
    replaced, is indexed from scratch."""
    from journalfs.fs.jsonlview import JsonlLayout

    fmt, _, data = big_journal
    path = tmp_path / "growing"
    cut = len(data) * 3 // 5
    path.write_bytes(data[:cut])  # most likely torn inside a record
    before = RecordIndex.build(str(path))
    with open(path, "r+b") as f:  # append in place: same inode
        f.seek(cut)
        f.write(data[cut:])
    reads = []
    real_batches = journals._offset_batches

    def counting(codec, buf, p, start=None, seq=0, *rest):
        reads.append((start, seq))
        return real_batches(codec, buf, p, start, seq, *rest)
    journals._offset_batches = counting
    try:
        grown = RecordIndex.build(str(path), previous=before)
    finally:
        journals._offset_batches = real_batches
    fresh = assert_index_matches_reference(path, journals.CHECKPOINT_EVERY)
    assert (grown.count, grown.error, grown.seqs, grown.offsets) == \
        (fresh.count, None, fresh.seqs, fresh.offsets)
    assert reads == [(before.offsets[-1], before.seqs[-1])] and before.seqs[-1] > 0
    assert grown.grown_from == (before.identity, before.seqs[-1])
    assert list(grown.records(before.count - 1, 3)) == list(fresh.records(before.count - 1, 3))
    # records.jsonl's layout continues the old one's and equals a fresh one
    extended = JsonlLayout(grown, JsonlLayout(before))
    assert (extended.size, extended.seqs, extended.offsets) == \
        ((whole := JsonlLayout(fresh)).size, whole.seqs, whole.offsets)

    with open(path, "r+b") as f:  # a byte of the first record rewritten in place, file grown
        f.seek(before.offsets[0] + 20)
        f.write(bytes([data[before.offsets[0] + 20] ^ 0x40]))
        f.seek(0, 2)
        f.write(b"\0")
    rebuilt = RecordIndex.build(str(path), previous=grown)
    assert rebuilt.grown_from is None
    assert (rebuilt.count, _damage(rebuilt.error)) == reference_index(path, journals.CHECKPOINT_EVERY)[:2]


# -- JSON lines from columns, backups, safe opens, on-disk indexes -----------------------------

@pytest.mark.parametrize("read_by", ["mmap", "pread"])
@pytest.mark.parametrize("columns_from", [1, 1 << 40], ids=["columns", "records"])
def test_json_chunks_equal_record_json_lines(journal_files, monkeypatch, columns_from, read_by):
    """records.jsonl and listings are rendered a checkpoint at a time from the codecs' columns
    (or record by record): byte for byte what ``record_json_line`` writes, with each
    record's kind and file size."""
    from journalfs.fs.viewnodes import record_content
    monkeypatch.setattr(journals, "CHECKPOINT_EVERY", 4)  # many chunks even on small files
    monkeypatch.setattr(jsonlines, "COLUMNS_MIN_ROWS", columns_from)
    for path in journal_files:
        opener = (lambda p=str(path): journals.open_path(p)) if read_by == "pread" else None
        index = RecordIndex.build(str(path), opener=opener)
        records = list(index.records())
        assert records == list(RecordIndex.build(str(path)).records()), path
        expected = [jsonlines.json_line(r) for r in records]
        step = 4 if index.codec.resumable else max(1, index.count)
        got, kinds, sizes = [], [], []
        for first in range(0, index.count, step):
            chunk = index.json_chunk(first, step)
            assert chunk.rows == min(step, index.count - first), path
            got.append(chunk.data)
            kinds += chunk.kinds
            sizes += chunk.content_sizes()
        assert b"".join(got) == b"".join(expected), path
        assert kinds == [r["kind"] for r in records], path
        assert sizes == [len(record_content(r)) for r in records], path


def test_json_line_of_text_that_is_not_utf8():
    rec = {"format": "gvfs-journal", "seq": 0, "offset": 0, "kind": "set",
           "path": "/a/\udcff\udcfe", "key": "k", "value": ["ok", "\udcfa"]}
    line = json.loads(jsonlines.json_line(rec).decode("utf-8"))
    assert "path" not in line and base64.b64decode(line["path_b64"]) == b"/a/\xff\xfe"
    assert [base64.b64decode(v) for v in line["value_b64"]] == [b"ok", b"\xfa"]


@pytest.mark.parametrize("name, backup", [
    ("db.jrnl", False), (b"db.jrnl", False),
    ("db.jrnl.journalfs-backup-20260101T000000.000000Z", True),
    (b"dir/db.jrnl.journalfs-backup-20260101T000000.000000Z-1", True),
    (b"\xff.journalfs-backup-x", True),
    ("x.journalfs-backup-dir/db.jrnl", False),  # only the file's own name counts
])
def test_is_backup_name(name, backup):
    assert journals.is_backup_name(name) is backup


def test_special_files_are_never_opened_for_reading(tmp_path):
    """A FIFO (nobody writing) or a symlink where a journal was: no hang, not a journal."""
    fifo = tmp_path / "fifo.jrnl"
    os.mkfifo(fifo)
    assert sniff_file(str(fifo)) is None  # would block forever if opened for reading
    with pytest.raises(OSError):
        RecordIndex.build(str(fifo))
    target = tmp_path / "real.idx"
    target.write_bytes(b"IDX" + b"\0" * 13)
    link = tmp_path / "link.idx"
    link.symlink_to(target)
    with pytest.raises(OSError):
        journals.open_path(str(link), follow=False)


def test_source_tree_never_leaves_source(tmp_path):
    from journalfs.fs.sourcefiles import NotRegularFile, SourceTree
    src, outside = tmp_path / "src", tmp_path / "outside"
    (src / "dir").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    (src / "dir" / "ok").write_bytes(b"ok")
    (src / "link").symlink_to(outside / "secret")
    (src / "dirlink").symlink_to(outside)
    os.mkfifo(src / "fifo")
    tree = SourceTree(str(src))
    try:
        fd = tree.open_regular(b"dir/ok")
        assert os.read(fd, 10) == b"ok"
        os.close(fd)
        for rel, errors in ((b"link", (NotRegularFile,)), (b"fifo", (NotRegularFile,)),
                            (b"dirlink/secret", (NotADirectoryError,)),
                            (b"dir/../link", (FileNotFoundError,)), (b"dir", (NotRegularFile,))):
            with pytest.raises(errors):
                tree.open_regular(rel)
        assert tree.listdir(b"dir") == [b"ok"]
        with pytest.raises(NotADirectoryError):
            tree.listdir(b"dirlink")
        assert stat.S_ISLNK(tree.lstat(b"link").st_mode)
    finally:
        tree.close()


def test_partial_index_serves_records_while_building(big_journal):
    seen = []

    def progress(partial):
        if partial.count and not seen:
            seen.append(partial.count)
            assert not partial.complete
            assert list(partial.records(0, 1))[0]["seq"] == 0  # served mid-build
    _, path, _ = big_journal
    index = RecordIndex.build(str(path), progress=progress)
    assert index.complete and seen and seen[0] < index.count


def test_saved_index_round_trip_and_hostile_files(big_journal, tmp_path):
    from journalfs.fs import indexfiles
    _, big_journal, _ = big_journal
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    index = RecordIndex.build(str(big_journal))
    head = indexfiles.head_crc(big_journal.read_bytes())
    saved_dir = indexfiles.IndexDir(str(store))
    assert saved_dir.save(index, head, ([0, 1024], [0, 5000], 9999))
    loaded, header, layout = saved_dir.load(index.dev, index.identity[0], str(big_journal))
    assert (loaded.count, loaded.seqs, loaded.offsets) == (index.count, index.seqs, index.offsets)
    assert layout == ([0, 1024], [0, 5000], 9999)
    st = big_journal.stat()
    assert indexfiles.matches(header, index.codec.name, st.st_size, st.st_mtime_ns, head)
    assert not indexfiles.matches(header, index.codec.name, st.st_size, st.st_mtime_ns, head ^ 1)
    name = store / "indexes" / indexfiles.IndexDir.name_of(index.dev, index.identity[0])
    assert oct(name.stat().st_mode & 0o777) == "0o600"
    data = name.read_bytes()
    rng = random.Random(7)
    for _ in range(200):  # cut or bit-flipped index files: ignored, never a crash
        bad = bytearray(data[:rng.randrange(len(data))] if rng.random() < 0.5 else data)
        if bad:
            bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
        name.write_bytes(bytes(bad))
        got = saved_dir.load(index.dev, index.identity[0], str(big_journal))
        assert got is None or got[0].count >= 0
    name.unlink()
    name.symlink_to(tmp_path / "elsewhere")  # planted symlink: not followed
    assert saved_dir.load(index.dev, index.identity[0], str(big_journal)) is None
    saved_dir.close()
    (store / "indexes").chmod(0o777)  # others may write it: not used at all
    assert not indexfiles.IndexDir(str(store)).usable


def test_catalog_one_budget():
    from journalfs.fs.catalog import Catalog
    cat = Catalog(budget=100, entry_overhead=0)
    for i in range(10):
        cat.put(("batch", b"j", i), i, 30)
    assert cat.used <= 100 and len(cat) == 3
    assert cat.get(("batch", b"j", 9)) == 9 and cat.get(("batch", b"j", 0)) is None
    cat.put(("huge",), 1, 1000)
    assert cat.get(("huge",)) is None
    cat.discard_where(lambda k: k[0] == "batch")
    assert len(cat) == 0 and cat.used == 0
    # tiny entries (one per name ever seen) are bounded in number by their overhead
    cat = Catalog(budget=10_000, entry_overhead=100)
    for i in range(1000):
        cat.put(("scan", b"d%d" % i), True, 1)
    assert len(cat) <= 100


_TRUNCATE_WHILE_READING = r"""
import os, sys
from journalfs import journals
path = sys.argv[1]
opener = lambda: journals.open_path(path)
size = os.path.getsize(path)
cut = []
def cut_once(partial):  # the owner truncates the journal while it is being indexed
    if not cut:
        cut.append(os.truncate(path, 5000))
index = journals.RecordIndex.build(path, opener=opener, progress=cut_once)
with open(path, "r+b") as f:
    f.truncate(size)  # restored (zeros), indexed again, then cut while records are read
index = journals.RecordIndex.build(path, opener=opener)
it = index.records(0, index.count)
next(it)
os.truncate(path, 5000)
got = 1 + sum(1 for _ in it)
print(got, index.count)
"""


def test_views_reads_survive_a_truncated_journal(big_journal, tmp_path):
    """Files opened for the views are read with pread, never mapped: a journal truncated
    while it is read gives fewer records, not SIGBUS (which would end the whole mount)."""
    name, path, data = big_journal
    copy = tmp_path / name
    copy.write_bytes(data)
    proc = subprocess.run([sys.executable, "-c", _TRUNCATE_WHILE_READING, str(copy)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    got, count = map(int, proc.stdout.split())
    assert 0 < got <= count


@pytest.mark.parametrize("ahead", [512, 4096, 100_000])
def test_index_read_progressively_equals_the_mapped_one(big_journal, monkeypatch, ahead):
    """The views read a journal while indexing it, a window ahead of the indexer (batches
    that reach past the window are done again): the index is exactly the mapped one's."""
    _, path, _ = big_journal
    monkeypatch.setattr(journals, "LOAD_AHEAD", ahead)
    mapped_index = RecordIndex.build(str(path))
    read_index = RecordIndex.build(str(path), opener=lambda: journals.open_path(str(path)))
    assert (read_index.count, _damage(read_index.error), read_index.seqs, read_index.offsets,
            read_index.fingerprint) == (mapped_index.count, _damage(mapped_index.error),
                                        mapped_index.seqs, mapped_index.offsets,
                                        mapped_index.fingerprint)


# -- the views' windowed indexing: exact, and memory bounded by the window (issue 15) ---------

def _damaged_in_the_middle(tmp_path: Path) -> Path:
    data = bytearray(big_file("wallaby-log", 20_000))
    # the header of the record that starts nearest the middle: a size that runs past the end
    # of the file (bytes inside a payload would be just another payload)
    middle, offset = len(data) // 2, 16
    while offset < middle:
        offset += 16 + int.from_bytes(data[offset:offset + 4], "little")
    data[offset:offset + 16] = b"\xff" * 16
    path = tmp_path / "damaged-in-the-middle"
    path.write_bytes(bytes(data))
    return path


def _largest_record(path: Path) -> int:
    """The most bytes between the starts of two consecutive records of ``path``."""
    data = path.read_bytes()
    offsets = sorted(r["offset"] for r in read_all(sniff_file(str(path)), data, str(path))[0])
    return max((b - a for a, b in zip(offsets, offsets[1:])), default=0)


@pytest.mark.parametrize("ahead", [512, 1 << 16])
def test_windowed_index_equals_the_whole_file_one(journal_files, tmp_path, monkeypatch, ahead):
    """The views index a journal through a small sliding window (records and damage that
    reach past it re-read with a bigger one): count, damage, checkpoints and fingerprint are
    exactly those of indexing the whole file at once, on every conformance file and on a
    file damaged in its middle. The window holds at least two of a file's records (a SQLite
    log's frames are 536 bytes and more): only a record bigger than the window may be read
    short, as ``journals._batched`` says."""
    monkeypatch.setattr(journals, "HEAD_BYTES", 64)  # so that small files slide too
    monkeypatch.setattr(journals, "CHECKPOINT_EVERY", 3)
    damaged = _damaged_in_the_middle(tmp_path)
    for path in [*journal_files, damaged]:
        monkeypatch.setattr(journals, "LOAD_AHEAD", max(ahead, 2 * _largest_record(path)))
        whole = RecordIndex.build(str(path))  # mapped: the whole file at once
        windowed = RecordIndex.build(str(path), opener=lambda p=path: journals.open_path(str(p)))
        assert (windowed.count, _damage(windowed.error), windowed.seqs, windowed.offsets,
                windowed.fingerprint) == (whole.count, _damage(whole.error), whole.seqs,
                                          whole.offsets, whole.fingerprint), path
    index = RecordIndex.build(str(damaged), opener=lambda: journals.open_path(str(damaged)))
    assert 0 < index.count < 20_000 and index.error is not None
    assert abs(index.error.offset - damaged.stat().st_size // 2) < 200


_INDEX_PEAK = r"""
import sys
from journalfs import journals
from journalfs.journals import RecordIndex

def peak():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))

path = sys.argv[1]
before = peak()
index = RecordIndex.build(path, opener=lambda: journals.open_path(path))
print(index.count, index.error is None, peak() - before)
"""


def write_big_wallaby_log(path: Path, size: int) -> int:
    """A wallaby log of ``size`` bytes: 80-byte records (16-byte header, 64-byte payload)."""
    import numpy as np
    dtype = np.dtype([("size", "<u4"), ("flags", "<u4"), ("time", "<i8"), ("payload", "u1", 64)])
    header = bytes.fromhex("4c4f4701") + bytes(12)
    total = (size - len(header)) // dtype.itemsize
    chunk = 1 << 20
    with open(path, "wb") as f:
        f.write(header)
        for first in range(0, total, chunk):
            rec = np.zeros(min(chunk, total - first), dtype)
            rec["size"] = 64
            rec["time"] = 1_700_000_000_000_000_000 + (first + np.arange(len(rec))) * 1_000_003
            rec["payload"] = ord("p")
            f.write(rec.tobytes())
    return total


def test_indexing_a_200mb_journal_for_the_views_keeps_memory_to_a_window(tmp_path):
    """Indexing reads the journal into anonymous memory (never a mapping of it: SIGBUS), one
    64 MiB window at a time: the process's peak RSS grows by about the window, not by the
    file's 200 MB as when the whole file was copied in."""
    path = tmp_path / "LOG"
    count = write_big_wallaby_log(path, 200_000_000)
    proc = subprocess.run([sys.executable, "-c", _INDEX_PEAK, str(path)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got, clean, growth = proc.stdout.split()
    assert (int(got), clean) == (count, "True")
    assert int(growth) < journals.LOAD_AHEAD + (24 << 20), int(growth)  # the file: 200 MB
    assert int(growth) < path.stat().st_size / 2


def test_index_files_are_capped_per_owner_and_in_total(tmp_path):
    """On-disk indexes are a cache charged to the journal's owner: past the owner's budget
    (or the total) an index stays in memory only; another owner's still goes to disk."""
    from journalfs.formats.gvfs_journal import encode_entry, journal_image
    from journalfs.fs import indexfiles
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    indexes = []
    for i in range(4):
        path = tmp_path / f"j{i}.log"
        path.write_bytes(journal_image([encode_entry("set", 1, f"/p{i}", "k", "v")], 5))
        indexes.append(journals.RecordIndex.build(str(path), opener=lambda p=path: os.open(p, os.O_RDONLY)))
    probe = indexfiles.IndexDir(str(store))
    assert probe.save(indexes[0], 0, owner=1, rel="j0.log")
    one = probe.total
    probe.remove(indexes[0].dev, indexes[0].identity[0])
    assert probe.total == 0 and not list((store / "indexes").iterdir())
    capped = indexfiles.IndexDir(str(store), owner_bytes=one + one // 2, total_bytes=2 * one + 10)
    assert capped.save(indexes[0], 0, owner=1, rel="j0.log")
    assert not capped.save(indexes[1], 0, owner=1, rel="j1.log")  # bob's budget is spent
    assert capped.save(indexes[2], 0, owner=2, rel="j2.log")      # carol's is not
    assert not capped.save(indexes[3], 0, owner=3, rel="j3.log")  # the total is
    assert capped.status()["refused"] == 2
    assert len(list((store / "indexes").glob("*.jfsidx"))) == 2
    # a fresh look at the directory counts what is there, by owner
    again = indexfiles.IndexDir(str(store))
    again.scan()
    assert again.by_owner == {1: one, 2: capped.by_owner[2]}
