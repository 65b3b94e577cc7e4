"""Wallaby decoders against their baselines, on generated ~100 MB files.

    .venv/bin/python bench/wallaby.py [--mb 100] [--dir /tmp]

- wallaby-index ``read_columns`` (one structured ``np.frombuffer``) vs ``cat FILE > /dev/null``
  on the same file: throughput in MB/s and the ratio (target >= 0.5).
- wallaby-log ``read_columns`` (boundary walk + numpy gather) vs ``cat`` and vs the streaming
  ``read()`` generator: records/s (target >= 1,000,000 with payloads <= 100 bytes).
Every figure is the best of ``--repeat`` runs from a warm page cache. Prints a table and a JSON
blob.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

from journalfs.formats.wallaby import INDEX_DTYPE, WallabyIndex, WallabyLog
from journalfs.journals import mapped

T0 = 1_700_000_000_000_000_000
ALL_INDEX = ("time", "index", "log_offset")


def make_log(path: str, target_bytes: int, max_payload: int = 100, seed: int = 1) -> int:
    """A 16-byte-header log of random records with payloads of 0..max_payload bytes."""
    rng = np.random.default_rng(seed)
    n = target_bytes // (16 + max_payload // 2)
    sizes = rng.integers(0, max_payload + 1, n, dtype=np.int64)
    offsets = 16 + np.concatenate(([0], np.cumsum(16 + sizes)[:-1]))
    total = int(offsets[-1] + 16 + sizes[-1])
    out = rng.integers(0, 256, total, dtype=np.uint8)
    out[:16] = np.frombuffer(b"LOG\x01" + bytes(12), np.uint8)
    headers = np.zeros(n, dtype=[("size", "<u4"), ("flags", "<u4"), ("time", "<i8")])
    headers["size"] = sizes
    headers["time"] = T0 + np.arange(n, dtype=np.int64) * 1000
    out[offsets[:, None] + np.arange(16)] = headers.view(np.uint8).reshape(n, 16)
    out.tofile(path)
    return n


def make_index(path: str, target_bytes: int) -> int:
    n = (target_bytes - 16) // 24
    table = np.zeros(n, INDEX_DTYPE)
    table["time"] = T0 + np.arange(n, dtype=np.int64) * 1000
    table["index"] = np.arange(n, dtype=np.uint64)
    table["log_offset"] = 16 + np.arange(n, dtype=np.int64) * 66
    with open(path, "wb") as f:
        f.write(b"IDX\x01" + bytes(12))
        table.tofile(f)
    return n


def _cpu() -> float:
    """CPU seconds of this process and its finished children (cat): robust on a busy box."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def best(fn, repeat: int) -> tuple[float, float]:
    """(best wall seconds, best CPU seconds) over ``repeat`` runs."""
    walls, cpus = [], []
    for _ in range(repeat):
        c0, w0 = _cpu(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(_cpu() - c0)
    return min(walls), min(cpus)


def cat(path: str) -> None:
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)


def columns(codec, path: str, consume=("time",)) -> int:
    """Decode to columns, then sum the ``consume`` columns. The index's columns are views of
    the map, so summing ``time`` (8 bytes of every 24) is what reads every byte of the file
    once, like cat does; summing every column is a consumer reading each column in turn."""
    with mapped(path) as buf:
        cols = codec.read_columns(buf, path)
        assert cols.error is None, cols.error
        for name in consume:
            int(cols.data[name].sum())
        rows = cols.rows
        del cols  # release the views before the map closes
    return rows


def stream(codec, path: str) -> int:
    with mapped(path) as buf:
        return sum(1 for _ in codec.read(buf, path))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    size = args.mb * 1024 * 1024
    log_path = os.path.join(args.dir, "bench-wallaby.log")
    idx_path = os.path.join(args.dir, "bench-wallaby.log.idx")
    n_log = make_log(log_path, size)
    n_idx = make_index(idx_path, size)
    results = {}
    try:
        for path in (log_path, idx_path):
            cat(path)  # warm the page cache
        mb_idx = os.path.getsize(idx_path) / 1e6
        mb_log = os.path.getsize(log_path) / 1e6
        cat_idx = best(lambda: cat(idx_path), args.repeat)
        idx = best(lambda: columns(WallabyIndex(), idx_path), args.repeat)
        idx_all = best(lambda: columns(WallabyIndex(), idx_path, ALL_INDEX), args.repeat)
        cat_log = best(lambda: cat(log_path), args.repeat)
        log = best(lambda: columns(WallabyLog(), log_path), args.repeat)
        log_stream = best(lambda: stream(WallabyLog(), log_path), 1)
        for clock, i in (("wall", 0), ("cpu", 1)):
            results[clock] = {
                "index": {"mb": round(mb_idx, 1), "records": n_idx,
                          "cat_mb_s": round(mb_idx / cat_idx[i]),
                          "columns_mb_s": round(mb_idx / idx[i]),
                          "ratio_vs_cat": round(cat_idx[i] / idx[i], 3), "target_ratio": 0.5,
                          "columns_sum_all_mb_s": round(mb_idx / idx_all[i]),
                          "ratio_sum_all_vs_cat": round(cat_idx[i] / idx_all[i], 3)},
                "log": {"mb": round(mb_log, 1), "records": n_log,
                        "cat_mb_s": round(mb_log / cat_log[i]),
                        "columns_mb_s": round(mb_log / log[i]),
                        "columns_records_s": round(n_log / log[i]),
                        "read_records_s": round(n_log / log_stream[i]),
                        "ratio_vs_cat": round(cat_log[i] / log[i], 3),
                        "speedup_vs_read": round(log_stream[i] / log[i], 2),
                        "target_records_s": 1_000_000},
            }
    finally:
        for path in (log_path, idx_path):
            os.unlink(path)
    print(f"{'benchmark (wall / cpu clock)':<40}{'journalfs':>12}{'baseline':>12}{'ratio':>8}")
    for clock in ("wall", "cpu"):
        ix, lg = results[clock]["index"], results[clock]["log"]
        print(f"{clock + ': index columns MB/s vs cat':<40}{ix['columns_mb_s']:>12,}"
              f"{ix['cat_mb_s']:>12,}{ix['ratio_vs_cat']:>8}")
        print(f"{clock + ': index + sum every column MB/s':<40}{ix['columns_sum_all_mb_s']:>12,}"
              f"{ix['cat_mb_s']:>12,}{ix['ratio_sum_all_vs_cat']:>8}")
        print(f"{clock + ': log columns MB/s vs cat':<40}{lg['columns_mb_s']:>12,}"
              f"{lg['cat_mb_s']:>12,}{lg['ratio_vs_cat']:>8}")
        print(f"{clock + ': log records/s columns vs read()':<40}{lg['columns_records_s']:>12,}"
              f"{lg['read_records_s']:>12,}{lg['speedup_vs_read']:>8}")
    print(json.dumps(results))
    cpu = results["cpu"]
    ok = cpu["index"]["ratio_vs_cat"] >= 0.5 and cpu["log"]["columns_records_s"] >= 1_000_000
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
