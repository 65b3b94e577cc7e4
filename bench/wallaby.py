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
import subprocess
import sys
import time

import numpy as np

from journalfs.formats.wallaby import INDEX_DTYPE, WallabyIndex, WallabyLog
from journalfs.journals import mapped

T0 = 1_700_000_000_000_000_000


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


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def cat(path: str) -> None:
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)


def columns(codec, path: str) -> int:
    with mapped(path) as buf:
        cols = codec.read_columns(buf, path)
        assert cols.error is None, cols.error
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
        t_cat_idx = best(lambda: cat(idx_path), args.repeat)
        t_idx = best(lambda: columns(WallabyIndex(), idx_path), args.repeat)
        t_cat_log = best(lambda: cat(log_path), args.repeat)
        t_log = best(lambda: columns(WallabyLog(), log_path), args.repeat)
        t_log_stream = best(lambda: stream(WallabyLog(), log_path), 1)
        results = {
            "index": {"mb": round(mb_idx, 1), "records": n_idx,
                      "cat_mb_s": round(mb_idx / t_cat_idx), "columns_mb_s": round(mb_idx / t_idx),
                      "ratio_vs_cat": round(t_cat_idx / t_idx, 3), "target_ratio": 0.5},
            "log": {"mb": round(mb_log, 1), "records": n_log,
                    "cat_mb_s": round(mb_log / t_cat_log), "columns_mb_s": round(mb_log / t_log),
                    "columns_records_s": round(n_log / t_log),
                    "read_records_s": round(n_log / t_log_stream),
                    "ratio_vs_cat": round(t_cat_log / t_log, 3),
                    "speedup_vs_read": round(t_log_stream / t_log, 2),
                    "target_records_s": 1_000_000},
        }
    finally:
        for path in (log_path, idx_path):
            os.unlink(path)
    ix, lg = results["index"], results["log"]
    print(f"{'benchmark':<34}{'journalfs':>14}{'baseline':>14}{'ratio':>8}")
    print(f"{'index read_columns MB/s vs cat':<34}{ix['columns_mb_s']:>14,}{ix['cat_mb_s']:>14,}"
          f"{ix['ratio_vs_cat']:>8}")
    print(f"{'log read_columns MB/s vs cat':<34}{lg['columns_mb_s']:>14,}{lg['cat_mb_s']:>14,}"
          f"{lg['ratio_vs_cat']:>8}")
    print(f"{'log records/s: columns vs read()':<34}{lg['columns_records_s']:>14,}"
          f"{lg['read_records_s']:>14,}{lg['speedup_vs_read']:>8}")
    print(json.dumps(results))
    ok = ix["ratio_vs_cat"] >= 0.5 and lg["columns_records_s"] >= 1_000_000
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
