"""Big-journal benchmark: one generated ~1 GB journal per format, as a new user meets it.

    .venv/bin/python bench/bigjournal.py [--mb 1000] [--formats kestrel-writer,wallaby-log]
                                         [--skip mount,pipeline] [--master spark://...]

For each format a journal of about --mb MB is generated once (numpy, written in chunks, so
generating needs little memory) and cached in bench/out/bigjournal/. Then, timed with the wall
clock and with the peak RSS of every process involved:

- ``cat FILE > /dev/null`` (reading the bytes, nothing else),
- ``journalfs records FILE --json > /dev/null`` and ``journalfs fsck FILE``,
- through a real mount of the file's directory (``journalfs mount``): the first ``cat`` of
  record 0 of the view, ``stat`` of ``records.jsonl``, ``ls`` of the view, and reading
  ``records.jsonl`` whole (MB/s),
- ``journalfs pipeline`` of the file into Parquet (default settings, local[*]).

Prints a table and a JSON blob. Each figure is one run (these take tens of seconds each).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

OUT = REPO / "bench" / "out" / "bigjournal"
#: Records generated per chunk (bounds the generator's memory).
CHUNK = 1 << 20
PAYLOAD = 64
BASE_MS = 1_700_000_000_000
MB = 1_000_000


# -- generating ------------------------------------------------------------------------------

def _payloads(rng: np.random.Generator, n: int, width: int) -> np.ndarray:
    """``n`` printable payloads of ``width`` bytes each (JSON-ish text, as queues carry)."""
    return rng.integers(ord("a"), ord("z") + 1, size=(n, width), dtype=np.uint8)


def write_kestrel_writer(path: Path, size: int, seed: int = 1) -> int:
    """PUT records (25-byte header, ``PAYLOAD``-byte payload) with ids 1, 2, 3, ...; returns
    the record count."""
    dtype = np.dtype([("cmd", "u1"), ("length", "<i4"), ("errors", "<i4"), ("id", "<i8"),
                      ("add_time", "<i8"), ("payload", "u1", PAYLOAD)])
    rng = np.random.default_rng(seed)
    total = (size - 4) // dtype.itemsize
    with open(path, "wb") as f:
        f.write(bytes.fromhex("27642603"))
        for first in range(0, total, CHUNK):
            n = min(CHUNK, total - first)
            rec = np.zeros(n, dtype)
            rec["cmd"] = 0x86  # PUT (command 8), 6 header words
            rec["length"] = PAYLOAD
            rec["id"] = np.arange(first + 1, first + n + 1)
            rec["add_time"] = BASE_MS + np.arange(first, first + n) * 7
            rec["payload"] = _payloads(rng, n, PAYLOAD)
            f.write(rec.tobytes())
    return total


def write_wallaby_log(path: Path, size: int, seed: int = 2) -> int:
    """Records of a 16-byte header (size, flags, time in ns) and a ``PAYLOAD``-byte payload."""
    dtype = np.dtype([("size", "<u4"), ("flags", "<u4"), ("time", "<i8"),
                      ("payload", "u1", PAYLOAD)])
    rng = np.random.default_rng(seed)
    header = bytes.fromhex("4c4f4701") + bytes(12)
    total = (size - len(header)) // dtype.itemsize
    with open(path, "wb") as f:
        f.write(header)
        for first in range(0, total, CHUNK):
            n = min(CHUNK, total - first)
            rec = np.zeros(n, dtype)
            rec["size"] = PAYLOAD
            rec["time"] = BASE_MS * 1_000_000 + np.arange(first, first + n) * 1_000_003
            rec["payload"] = _payloads(rng, n, PAYLOAD)
            f.write(rec.tobytes())
    return total


GENERATORS = {"kestrel-writer": (write_kestrel_writer, "jobs.1700000000000"),
              "wallaby-log": (write_wallaby_log, "LOG")}


def journal(fmt: str, megabytes: int) -> tuple[Path, int]:
    """The cached generated journal of ``fmt`` (its path and record count)."""
    generate, name = GENERATORS[fmt]
    directory = OUT / f"{fmt}-{megabytes}mb"
    path = directory / name
    count_file = directory / "count"
    if path.exists() and count_file.exists():
        return path, int(count_file.read_text())
    directory.mkdir(parents=True, exist_ok=True)
    print(f"generating {path} ...", file=sys.stderr, flush=True)
    count = generate(path, megabytes * MB)
    count_file.write_text(str(count))
    return path, count


# -- measuring -------------------------------------------------------------------------------

def _session_rss(sid: int) -> dict[int, tuple[str, int]]:
    """``{pid: (command name, RSS bytes)}`` of every process in session ``sid``."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid:  # field 6 of stat: the session id
            out[int(entry)] = (name, int(fields[21]) * resource.getpagesize())
    return out


def run_measured(argv: list[str], *, stdout=subprocess.DEVNULL, env: dict | None = None,
                 timeout: float = 3600) -> dict:
    """Run ``argv`` in a session of its own; wall seconds, exit code, and the peak RSS of the
    whole session (the sum over its processes: CLI, JVM, Python workers) and of its largest
    process, sampled every 0.2 s."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)
    peak_total, peak_one, peak_name = 0, 0, ""
    while proc.poll() is None:
        sample = _session_rss(proc.pid)
        total = sum(rss for _name, rss in sample.values())
        peak_total = max(peak_total, total)
        for name, rss in sample.values():
            if rss > peak_one:
                peak_one, peak_name = rss, name
        if time.perf_counter() - started > timeout:
            os.killpg(proc.pid, 9)
        time.sleep(0.2)
    err = proc.stderr.read().decode(errors="replace")
    return {"seconds": time.perf_counter() - started, "exit": proc.returncode,
            "peak_rss_mb": peak_total / 2**20, "peak_process_mb": peak_one / 2**20,
            "peak_process": peak_name, "stderr_tail": err.strip().splitlines()[-3:]}
