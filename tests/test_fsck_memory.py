"""fsck in bounded memory: the validators that must resolve links pointing anywhere (akka
data blocks, Wallaby index entries) keep the record starts as marks plus stretches walked
again (journalfs/formats/starts.py) instead of a table that grows with the file, and give
exactly the findings a table of every start gave; fsck drops pages in step with them."""
from __future__ import annotations

import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from journalfs.formats import akka as akka_mod
from journalfs.formats import starts as starts_mod
from journalfs.formats import wallaby as wallaby_mod
from journalfs.formats.akka import AkkaData, AkkaMeta
from journalfs.formats.base import Finding, FormatError
from journalfs.formats.starts import RecordStarts
from journalfs.formats.wallaby import (INDEX_DTYPE, IndexCheck, WallabyIndex, WallabyLog,
                                       _gather_u64, _within, index_file, write_log_and_index)
from journalfs.pagecache import FileMapping, PagePacer

MB = 1 << 20


@pytest.fixture
def tiny_stretches(monkeypatch):
    """Marks every 3 starts, 2 stretches kept, 2 per group: every path of RecordStarts runs
    (walks again, evictions, several groups) on small files."""
    monkeypatch.setattr(starts_mod, "STARTS_PER_MARK", 3)
    monkeypatch.setattr(starts_mod, "STRETCHES_KEPT", 2)
    monkeypatch.setattr(starts_mod, "STRETCHES_PER_GROUP", 2)


class AllStarts:
    """The reference: every start in one sorted array (what the validators held before)."""

    def __init__(self, offsets):
        self.offsets = np.asarray(offsets, np.int64)

    def contains(self, links, near=None):
        links = np.asarray(links, np.int64)
        at = np.minimum(np.searchsorted(self.offsets, links), max(len(self.offsets) - 1, 0))
        return (self.offsets[at] == links) if len(self.offsets) else np.zeros(len(links), bool)

    def __contains__(self, link):
        return bool(self.contains([link])[0])


# -- RecordStarts answers as the sorted array of every start -----------------------------------

def _akka_file(blocks: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return AkkaData.build([(f"p{rng.integers(5)}", i + 1, bytes(int(rng.integers(0, 40))))
                           for i in range(blocks)])[0]


@pytest.mark.parametrize("seed", range(3))
def test_record_starts_rank_contains_and_at_rank_match_the_full_array(tiny_stretches, seed):
    data = _akka_file(200, seed)
    offsets, _next, error = AkkaData().record_offsets(data, "data")
    assert error is None and len(offsets) == 200
    starts = RecordStarts(data, ">i4")
    for batch in np.array_split(offsets, 7):  # uneven batches, marks across them
        starts.extend(batch)
    rng = np.random.default_rng(seed)
    asked = np.concatenate([offsets, offsets + 1, offsets - 1, [-5, 0, 7, 8, len(data), 1 << 40],
                            rng.integers(-10, len(data) + 10, 500)])
    rng.shuffle(asked)
    ranks, hits = starts.rank(asked)
    assert (ranks == np.searchsorted(offsets, asked)).all()
    assert (hits == np.isin(asked, offsets)).all()
    assert (starts.contains(asked) == hits).all()
    assert (starts.contains(asked, near=offsets[50:90]) == hits).all()
    assert [x in starts for x in asked.tolist()] == hits.tolist()
    assert [starts.at_rank(r) for r in range(200)] == offsets.tolist()


def test_record_starts_memory_is_one_mark_per_stretch_plus_a_bounded_cache():
    """What grows with the file is 8 bytes per STARTS_PER_MARK records; walked stretches
    kept for reuse never exceed STRETCHES_KEPT, whatever is asked."""
    n = 200_000
    offsets = 8 + np.arange(n, dtype=np.int64) * 24
    buf = bytearray(8 + 24 * n)
    np.frombuffer(buf, ">i4", count=n * 6, offset=8).reshape(n, 6)[:, 0] = 24
    starts = RecordStarts(bytes(buf), ">i4")
    for batch in np.array_split(offsets, 50):
        starts.extend(batch)
    marks_bytes = starts.nbytes
    assert marks_bytes <= 8 * (n // starts_mod.STARTS_PER_MARK + 1)
    ranks, hits = starts.rank(np.random.default_rng(1).permutation(offsets))
    assert hits.all()
    assert len(starts._stretches) <= starts_mod.STRETCHES_KEPT
    cache_bound = starts_mod.STRETCHES_KEPT * starts_mod.STARTS_PER_MARK * 8
    assert starts.nbytes <= marks_bytes + cache_bound
    assert cache_bound + 8 * (2**31 // 24 // starts_mod.STARTS_PER_MARK) < 16 * MB  # akka's cap


# -- akka: the same findings as with a table of every start -------------------------------------

def _hostile_akka(seed: int) -> tuple[bytes, bytes]:
    """A linked data file (and its meta) whose links were partly replaced by random offsets:
    block starts, offsets inside blocks, 0, and offsets past the end."""
    rng = np.random.default_rng(seed)
    data, meta = AkkaData.build([(f"p{i % 7}", i // 7 + 1, bytes(int(rng.integers(0, 30))))
                                 for i in range(300)])
    offsets, _next, _error = AkkaData().record_offsets(data, "data")
    data = bytearray(data)
    for pos in rng.choice(offsets, 60, replace=False).tolist():
        field = int(rng.choice([8, 12]))
        kind = rng.integers(4)
        target = (int(rng.choice(offsets)) if kind == 0 else int(rng.integers(0, len(data)))
                  if kind == 1 else 0 if kind == 2 else len(data) + int(rng.integers(1, 99)))
        struct.pack_into(">i", data, pos + field, target)
    for pos in rng.choice(offsets, 10, replace=False).tolist():
        struct.pack_into(">q", data, pos + 16, int(rng.integers(0, 50)))
    return bytes(data), meta


def _with_every_start(monkeypatch, run):
    """``run()`` with the block starts held as one array (the old rule), for comparison."""
    def every_start(data, source, pace=None):
        offsets, _n, error = AkkaData().record_offsets(data, source)
        return AllStarts(offsets), error
    with monkeypatch.context() as m:
        m.setattr(akka_mod, "_block_starts", every_start)
        return run()


@pytest.mark.parametrize("seed", range(4))
def test_akka_hostile_links_give_the_findings_of_a_full_table(monkeypatch, tiny_stretches, seed):
    monkeypatch.setattr(akka_mod, "VALIDATE_BATCH", 16)  # batches far smaller than the file
    data, meta = _hostile_akka(seed)
    for cut in (len(data), len(data) - 5):  # whole, and with a torn last block
        part = data[:cut]

        def run():
            return (AkkaData().validate(part, "data"),
                    AkkaMeta().validate(meta, "meta", data=part))
        expected = _with_every_start(monkeypatch, run)
        got = run()
        assert got == expected
        assert len(expected[0]) >= 20 and len(expected[1]) >= 3  # the damage is really found


def test_akka_validators_call_the_pacer_every_batch(monkeypatch):
    monkeypatch.setattr(akka_mod, "VALIDATE_BATCH", 16)
    data, meta = AkkaData.build([(f"p{i % 3}", i // 3 + 1, b"x") for i in range(400)])
    calls = []
    assert AkkaData().validate(data, "data", pace=lambda: calls.append(1)) == []
    assert len(calls) >= 2 * 400 // 16
    calls.clear()
    assert AkkaMeta().validate(meta, "meta", data=data, pace=lambda: calls.append(1)) == []
    assert len(calls) >= 400 // 16


# -- wallaby: the index against its log, streamed, as the whole-array check gave ----------------

def _whole_array_check(index, log, from_log: bool) -> list[Finding]:
    """The index/log check as it was: every log offset and every index entry in arrays."""
    check = IndexCheck()
    idx = WallabyIndex().read_columns(index, "index")
    try:
        start = WallabyLog().header(log, "log").size
        parts, log_error = [], None
        for offs, _h, _t, log_error in WallabyLog()._header_batches(log, "log", start):
            parts.append(offs)
        log_offs = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    except FormatError as exc:
        log_offs, log_error = np.zeros(0, np.int64), exc
    if idx.error is not None:
        check.problem(idx.error.offset if not from_log else 0, f"index damaged: {idx.error.reason}")
    entry_offs, numbers = idx.data["offset"], idx.data["index"]
    targets, times = idx.data["log_offset"], idx.data["time"]
    at = np.searchsorted(log_offs, targets)
    found = at < len(log_offs)
    found[found] = log_offs[at[found]] == targets[found]
    bad = ~found
    bad[found] = _gather_u64(log, targets[found] + 8).view(np.int64) != times[found]
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        where = int(entry_offs[first]) if not from_log else _within(int(targets[first]), log)
        check.problem(where, f"{int(bad.sum())} index entr(y/ies) do not match a log record "
                             f"(first: entry {first} -> log byte {int(targets[first])})")
    gaps = numbers != np.arange(len(numbers), dtype=np.uint64)
    if gaps.any():
        first = int(np.flatnonzero(gaps)[0])
        check.problem(int(entry_offs[first]) if not from_log else 0,
                      f"index numbers are not contiguous 0..{len(numbers) - 1} "
                      f"(entry {first} says {int(numbers[first])})")
    elif not bad.any() and (at != numbers.astype(np.int64)).any():
        first = int(np.flatnonzero(at != numbers.astype(np.int64))[0])
        where = int(entry_offs[first]) if not from_log else _within(int(targets[first]), log)
        check.problem(where, f"index numbers do not match log record numbers from entry {first} "
                             "(numbering restarted after a reopen?)", "warning")
    covered = int(at[-1]) + 1 if idx.rows and not bad.any() else idx.rows
    lag = len(log_offs) - covered
    if lag > 0:
        first_missing = int(log_offs[covered]) if covered < len(log_offs) else 0
        check.problem(first_missing if from_log else len(index),
                      f"index lags the log: {lag} log record(s) not indexed", "warning")
    if log_error is not None and not from_log:
        check.findings.append(Finding(0, f"log damaged: {log_error.reason}", "warning"))
    return check.findings


def _wallaby_cases():
    log, index = write_log_and_index([(1000 + 7 * i, b"p" * (i % 13)) for i in range(120)])
    table = np.frombuffer(index, INDEX_DTYPE, offset=16).copy()
    rng = np.random.default_rng(5)
    cases = {"clean": (log, index)}
    shuffled = table.copy()
    rng.shuffle(shuffled)
    cases["shuffled"] = (log, index_file(shuffled))
    wild = table.copy()
    wild["log_offset"][::9] = rng.integers(-50, len(log) + 50, len(wild[::9]))
    cases["wild offsets"] = (log, index_file(wild))
    times = table.copy()
    times["time"][40] += 1
    cases["wrong time"] = (log, index_file(times))
    gaps = table.copy()
    gaps["index"][70:] += 1
    cases["gap"] = (log, index_file(gaps))
    renumbered = table.copy()
    renumbered["index"] = np.arange(len(renumbered))
    renumbered = np.concatenate([renumbered[:30], renumbered[60:]])
    renumbered["index"] = np.arange(len(renumbered))
    cases["renumbered"] = (log, index_file(renumbered))
    cases["lagging"] = (log, index_file(table[:77]))
    cases["empty index"] = (log, index_file(table[:0]))
    cases["torn index"] = (log, index_file(table)[:-7])
    cases["index header"] = (log, b"XYZ" + index_file(table)[3:])
    cases["torn log"] = (log[:-5], index)
    cases["log header"] = (b"NOP" + log[3:], index)
    return cases


@pytest.mark.parametrize("case", list(_wallaby_cases()))
def test_wallaby_index_check_streams_to_the_whole_array_findings(monkeypatch, tiny_stretches, case):
    monkeypatch.setattr(wallaby_mod, "INDEX_CHUNK", 7)
    monkeypatch.setattr(wallaby_mod, "VALIDATE_BATCH", 5)
    log, index = _wallaby_cases()[case]
    for from_log in (False, True):
        expected = _whole_array_check(index, log, from_log)
        got = wallaby_mod._index_vs_log(index, log, "f", from_log).findings
        assert got == expected, (case, from_log)
    if case != "clean":
        assert expected
    # through the codecs (the log's own walk is reused as its starts)
    calls = []
    pace = lambda: calls.append(1)  # noqa: E731
    if case != "index header":  # the index's own header check stops its validation first
        from_index = WallabyIndex().validate(index, "LOG.idx", log=log, pace=pace)
        assert [f for f in _whole_array_check(index, log, False) if f not in from_index] == []
    if case not in ("log header",):
        from_log = WallabyLog().validate(log, "LOG", index=index, pace=pace)
        assert [f for f in _whole_array_check(index, log, True) if f not in from_log] == []
    assert calls


# -- fsck's peak RSS does not grow with the file -----------------------------------------------

def _wallaby_pair(directory, records: int) -> str:
    dtype = np.dtype([("size", "<u4"), ("flags", "<u4"), ("time", "<i8"), ("payload", "u1", 64)])
    rec = np.zeros(records, dtype)
    rec["size"] = 64
    rec["time"] = 10**18 + np.arange(records) * 1000
    log = directory / "LOG"
    log.write_bytes(b"LOG\x01" + bytes(12) + rec.tobytes())
    table = np.zeros(records, INDEX_DTYPE)
    table["time"], table["index"] = rec["time"], np.arange(records)
    table["log_offset"] = 16 + np.arange(records) * dtype.itemsize
    (directory / "LOG.idx").write_bytes(index_file(table))
    return str(log)


def _akka_data(directory, blocks: int) -> str:
    pids, size = 1000, 24 + 40
    offsets = 8 + np.arange(blocks, dtype=np.int64) * size
    rec = np.zeros(blocks, [("size", ">i4"), ("self", ">i4"), ("prev", ">i4"), ("next", ">i4"),
                            ("seq", ">i8"), ("payload", "V40")])
    rec["size"], rec["self"] = size, offsets
    i = np.arange(blocks)
    rec["prev"] = np.where(i >= pids, offsets - pids * size, 0)
    rec["next"] = np.where(i + pids < blocks, offsets + pids * size, 0)
    rec["seq"] = i // pids + 1
    path = directory / "data"
    path.write_bytes(b"AKFD" + int(blocks * size).to_bytes(4, "big") + rec.tobytes())
    return str(path)


def _measure(kind: str, small: int, big: int, tmp_path) -> tuple[int, int]:
    """Peak RSS of fsck on a small and a bigger journal, each in a fresh process (the
    children's peak is a maximum over all children, so each measurement runs alone)."""
    script = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run([sys.executable, '-m', 'journalfs.cli', 'fsck', sys.argv[1]],"
        " capture_output=True, text=True)\n"
        "assert r.returncode == 0 and ' ok (' in r.stdout, r.stdout + r.stderr\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    peaks = []
    for n, name in ((small, "small"), (big, "big")):
        d = tmp_path / name
        d.mkdir()
        path = _wallaby_pair(d, n) if kind == "wallaby" else _akka_data(d, n)
        out = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True,
                             check=True, env=os.environ.copy()).stdout
        peaks.append(int(out) * 1024)
        for f in d.iterdir():
            f.unlink()
    return peaks[0], peaks[1]


def test_fsck_peak_rss_is_flat_in_the_file_size(tmp_path):
    """A Wallaby log with its index, 8 MB and 6x that: before, fsck held every log offset
    and index column (1.25 GB peak at 1 GB, +60 MB here); now the peak may not follow."""
    low, high = _measure("wallaby", 100_000, 600_000, tmp_path)
    assert high < 100 * MB, f"fsck peaked at {high / MB:.0f} MB"
    assert high - low < 12 * MB, f"{low / MB:.0f} MB -> {high / MB:.0f} MB for a 6x file"


def test_akka_validation_keeps_starts_of_bounded_size(monkeypatch, tmp_path):
    """The block starts the data validator keeps: 8 bytes per STARTS_PER_MARK blocks and a
    bounded cache (before: 1 byte per 24 bytes of file, 3.3 MB here), findings unchanged."""
    kept = []
    real = akka_mod._block_starts

    def spying(data, source, pace=None):
        starts, error = real(data, source, pace)
        kept.append(starts)
        return starts, error
    monkeypatch.setattr(akka_mod, "_block_starts", spying)
    path = _akka_data(tmp_path, 1_250_000)  # 80 MB, 1000 persistence ids
    with open(path, "rb") as f:
        data = f.read()
    assert AkkaData().validate(data, "data") == []
    (starts,) = kept
    assert starts.count == 1_250_000
    bound = 8 * (starts.count // starts_mod.STARTS_PER_MARK + 1) \
        + starts_mod.STRETCHES_KEPT * starts_mod.STARTS_PER_MARK * 8
    assert starts.nbytes <= bound < len(data) // 24 // 4


def test_pacer_drops_the_pages_of_a_mapping(tmp_path):
    import mmap
    path = tmp_path / "mapped"
    path.write_bytes(os.urandom(8 * MB))
    with open(path, "rb") as f, FileMapping(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        pacer = PagePacer(m, b"not a mapping", mmap.mmap(-1, 4096))  # only files' pages go
        total = sum(m[i] for i in range(0, len(m), mmap.PAGESIZE))  # touch every page
        assert _resident_kb(str(path)) >= 4 * 1024
        pacer()
        assert _resident_kb(str(path)) == 0
        assert sum(m[i] for i in range(0, len(m), mmap.PAGESIZE)) == total  # still readable
    assert pacer.calls == 1


def _resident_kb(path: str) -> int:
    """Resident kB of this process's mapping of ``path`` (from /proc/self/smaps)."""
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if line.endswith(" " + path):
            for follow in lines[i + 1:i + 8]:
                if follow.startswith("Rss:"):
                    return int(follow.split()[1])
    raise AssertionError(f"{path} is not mapped")
