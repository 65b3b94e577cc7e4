"""Bounded-time mutation fuzz of every codec (about 2 s per format; tests/fuzz/soak.py runs the
same engine for as long as you like).

Seeds: the conformance files and byte vectors, real gvfs stores, and each codec's writer output.
Only records and FormatError are allowed; see tests/fuzz/mutate.py for the full list of checks.
"""
from __future__ import annotations

import random
import time
import tracemalloc

import pytest

from conftest import CONFORMANCE
from fuzz.mutate import Defect, Seed, corpus_seeds, describe, fuzz, run_case, writer_seeds
from journalfs.formats import CODECS, Codec, detect

SECONDS_PER_FORMAT = 2.0


def gvfs_seeds() -> list[Seed]:
    """Tree and journal of the first and last snapshot of every real-gvfs run."""
    seeds = []
    for run in sorted((CONFORMANCE / "gvfs").glob("run-*")):
        snapshots = sorted((run / "snapshots").glob("*"))
        for snap in snapshots[:1] + snapshots[-1:]:
            for path in sorted((snap / "gvfs-metadata").glob("*")):
                data = path.read_bytes()
                codec = detect(data[:64])
                if codec is not None:
                    seeds.append(Seed(codec.name, str(path.relative_to(CONFORMANCE)), data))
    return seeds


@pytest.fixture(scope="module")
def seeds_by_format(records_corpus, vectors) -> dict[str, list[Seed]]:
    corpus = corpus_seeds(records_corpus, vectors) + gvfs_seeds()
    by_format: dict[str, list[Seed]] = {}
    for seed in corpus + writer_seeds(corpus):
        by_format.setdefault(seed.codec, []).append(seed)
    return by_format


@pytest.mark.parametrize("fmt", list(CODECS))
def test_mutated_inputs_give_records_or_format_error(fmt, seeds_by_format, tmp_path):
    seeds = seeds_by_format.get(fmt)
    assert seeds, f"no seed inputs for {fmt}"
    assert any(s.label.startswith("written:") for s in seeds), f"{fmt}: writer gave no seed"
    rng = random.Random(f"journalfs-fuzz-{fmt}")
    deadline = time.monotonic() + SECONDS_PER_FORMAT
    failures = list(fuzz(seeds, rng, lambda n: n < 20 or time.monotonic() < deadline,
                         max_failures=5))
    for i, failure in enumerate(failures):  # keep the inputs to reproduce
        (tmp_path / f"{fmt}-{i}.bin").write_bytes(failure.data)
        for name, data in failure.context.items():
            (tmp_path / f"{fmt}-{i}.{name}.bin").write_bytes(data)
    assert not failures, f"{len(failures)} defects (inputs in {tmp_path}):\n" + "\n".join(
        describe(f) for f in failures)


def test_unmutated_seeds_are_clean(seeds_by_format):
    """The engine itself: intact seeds pass every check (so failures above are real)."""
    tracemalloc.start()
    try:
        for seeds in seeds_by_format.values():
            for seed in seeds:
                try:
                    run_case(CODECS[seed.codec], seed.data, seed.context)
                except Defect as defect:
                    raise AssertionError(f"{seed.codec} {seed.label}: {defect}") from None
    finally:
        tracemalloc.stop()


class _SloppyCodec(Codec):
    """Trusts a length byte: the engine must catch the IndexError and the lying size."""

    name, kinds = "sloppy", ("blob",)

    def read(self, buf, source, start=None, seq=0, stop=None):
        pos = 4 if start is None else start
        while pos < len(buf):
            size = buf[pos]
            yield {"format": self.name, "seq": seq, "offset": pos, "kind": "blob",
                   "payload": bytes(buf[pos + 1:pos + 1 + size])}
            _ = buf[pos + size]  # IndexError on a lying size: a defect
            pos, seq = pos + 1 + size, seq + 1

    def write(self, records, **header):
        return b"SLOP" + b"".join(bytes([len(r["payload"])]) + r["payload"] for r in records)


def test_engine_reports_a_sloppy_codec(monkeypatch):
    monkeypatch.setitem(CODECS, "sloppy", _SloppyCodec())
    seed = Seed("sloppy", "handmade", b"SLOP" + bytes([3]) + b"abc" + bytes([2]) + b"xy")
    failures = list(fuzz([seed], random.Random(1), lambda n: n < 300, max_failures=1))
    assert failures and "IndexError" in failures[0].reason
