"""Big-journal benchmark: one generated ~1 GB journal per format, as a new user meets it.

    .venv/bin/python bench/bigjournal.py [--mb 1000] [--formats kestrel-writer,wallaby-log]
                                         [--skip cli,mount,pipeline] [--budget S] [--out DIR]
                                         [--timeout S] [--master spark://...]
    .venv/bin/python bench/bigjournal.py --dir DIRECTORY     # the pipeline of a directory
    .venv/bin/python bench/bigjournal.py --scaling [--mb N]  # one process vs 1, 2 executors
    .venv/bin/python bench/bigjournal.py --table OUT/results-*.json

For each format (every codec but gvfs-tree) a journal of about --mb MB is generated once
(numpy, written in chunks, checked against the codec's own writer on its first records) and
cached in --out (bench/out/bigjournal/). Then, timed with the wall clock and with the peak
RSS of every process involved:

- ``cat FILE > /dev/null`` (reading the bytes, nothing else),
- ``journalfs records FILE --json > /dev/null`` and ``journalfs fsck FILE`` (under a data
  limit, so that a command that does not stream fails instead of taking the machine's RAM),
- through a real mount of the file's directory (``journalfs mount``) on a new store: the
  first ``cat`` of record 0 of the view, ``stat`` of ``records.jsonl``, ``ls`` of the view,
  and reading ``records.jsonl`` (MB/s; ``--budget`` bounds these two in time); after a
  remount on the same store, the first ``cat`` of the middle record and ``stat``,
- ``journalfs pipeline`` of the file into Parquet (default settings, local[*]).

Prints a table, the README's markdown table and a JSON blob, and keeps each format's results
in OUT/results-<format>-<mb>mb.json. Each figure is one run.
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

#: Where generated journals are cached (``--out``).
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


def _check_against_writer(fmt: str, records: list[dict], produced: bytes, **header) -> None:
    """The numpy layout of a generator must be byte for byte what the codec's own writer makes
    of the same records (checked on the first few records of every generated file)."""
    from journalfs.formats import CODECS
    expected = CODECS[fmt].write(records, **header)
    if expected != produced:
        raise SystemExit(f"{fmt} generator disagrees with the codec's writer "
                         f"({len(produced)} vs {len(expected)} bytes)")


def _write_chunks(path: Path, head: bytes, total: int, chunk_bytes) -> None:
    """``head`` then ``chunk_bytes(first, n)`` for record ranges of ``CHUNK`` records."""
    with open(path, "wb") as f:
        f.write(head)
        for first in range(0, total, CHUNK):
            f.write(chunk_bytes(first, min(CHUNK, total - first)))


def write_kestrel_reader(path: Path, size: int, seed: int = 3) -> int:
    """A reader checkpoint file of READ_HEAD(h) + READ_DONE(h+1 .. h+8) pairs, h = 0, 8, 16, ..."""
    from journalfs.formats.kestrel import CMD_READ_DONE, CMD_READ_HEAD, READER_MAGIC
    per_done = 8
    dtype = np.dtype([("head_cmd", "u1"), ("head", "<i8"), ("done_cmd", "u1"),
                      ("done_length", "<i4"), ("done", "<i8", per_done)])
    pairs = (size - len(READER_MAGIC)) // dtype.itemsize

    def chunk(first: int, n: int) -> bytes:
        rec = np.zeros(n, dtype)
        rec["head_cmd"] = (CMD_READ_HEAD << 4) | 2
        rec["head"] = np.arange(first, first + n) * per_done
        rec["done_cmd"] = (CMD_READ_DONE << 4) | 1
        rec["done_length"] = per_done * 8
        rec["done"] = rec["head"][:, None] + np.arange(1, per_done + 1)
        return rec.tobytes()

    sample = chunk(0, 2)
    _check_against_writer("kestrel-reader", [
        {"kind": "read_head", "id": 0}, {"kind": "read_done", "ids": list(range(1, 9))},
        {"kind": "read_head", "id": 8}, {"kind": "read_done", "ids": list(range(9, 17))}],
        READER_MAGIC + sample)
    _write_chunks(path, READER_MAGIC, pairs, chunk)
    return 2 * pairs


def write_akka_meta(path: Path, size: int, seed: int = 4) -> int:
    """Metadata blocks of distinct 16-byte persistence ids ``pid-000000000001``, ..."""
    from journalfs.formats.akka import HEADER_SIZE, META_BLOCK_FIXED, META_WRITE_MAGIC
    digits = 12
    dtype = np.dtype([("size", ">i2"), ("first", ">i8"), ("last", ">i8"), ("highest", ">i8"),
                      ("prefix", "S4"), ("digits", "u1", digits)])
    total = (size - HEADER_SIZE) // dtype.itemsize
    powers = 10 ** np.arange(digits - 1, -1, -1, dtype=np.int64)

    def chunk(first: int, n: int) -> bytes:
        ids = np.arange(first + 1, first + n + 1, dtype=np.int64)
        rec = np.zeros(n, dtype)
        rec["size"] = META_BLOCK_FIXED + 4 + digits
        rec["first"] = HEADER_SIZE
        rec["last"] = HEADER_SIZE + ids * 48
        rec["highest"] = ids
        rec["prefix"] = b"pid-"
        rec["digits"] = ord("0") + (ids[:, None] // powers) % 10
        return rec.tobytes()

    def header(count: int) -> bytes:
        return META_WRITE_MAGIC + (count * dtype.itemsize).to_bytes(4, "big")

    _check_against_writer("akka-meta", [
        {"persistence_id": f"pid-{i:012d}", "first": HEADER_SIZE, "last": HEADER_SIZE + i * 48,
         "highest_seq": i} for i in (1, 2, 3)], header(3) + chunk(0, 3))
    _write_chunks(path, header(total), total, chunk)
    return total


def write_akka_data(path: Path, size: int, seed: int = 5) -> int:
    """A linked data file of 64 persistence ids and its ``meta`` partner (bench/spark.py's)."""
    from bench.spark import _akka_data
    from journalfs.formats.akka import DATA_BLOCK_FIXED, HEADER_SIZE
    payload = 150
    _akka_data(path, path.parent / "meta", size, payload=payload)
    return (path.stat().st_size - HEADER_SIZE) // (DATA_BLOCK_FIXED + payload)


def write_wallaby_index(path: Path, size: int, seed: int = 6) -> int:
    """Index rows (time, index, log offset) of a log of ``PAYLOAD``-byte records."""
    from journalfs.formats.wallaby import INDEX_DTYPE, index_file
    head = index_file(np.zeros(0, INDEX_DTYPE))
    total = (size - len(head)) // INDEX_DTYPE.itemsize

    def chunk(first: int, n: int) -> bytes:
        table = np.zeros(n, INDEX_DTYPE)
        idx = np.arange(first, first + n)
        table["time"] = BASE_MS * 1_000_000 + idx * 1_000_003
        table["index"] = idx
        table["log_offset"] = 16 + idx * (16 + PAYLOAD)
        return table.tobytes()

    first3 = np.frombuffer(chunk(0, 3), INDEX_DTYPE)
    _check_against_writer("wallaby-index", [dict(zip(INDEX_DTYPE.names, map(int, row)))
                                            for row in first3], head + first3.tobytes())
    _write_chunks(path, head, total, chunk)
    return total


def write_jrnl(path: Path, size: int, seed: int = 7) -> int:
    """Complete transactions of one page allocation each, linked both ways."""
    from journalfs.formats.jrnl import COMPLETE_FLAG, HEADER, OP_ALLOC, OP_COMPLETE
    dtype = np.dtype([("prev", "<u8"), ("next", "<u8"), ("time", "<i8"), ("flags", "u1"),
                      ("alloc", "u1"), ("alloc_size", "<u4"), ("page", "<u8"),
                      ("free_before", "<u8"), ("free_after", "<u8"),
                      ("complete", "u1"), ("complete_size", "<u4")])
    total = (size - HEADER) // dtype.itemsize

    def header(count: int) -> bytes:
        last = HEADER + (count - 1) * dtype.itemsize
        return b"JRNL" + HEADER.to_bytes(8, "little") + last.to_bytes(8, "little")

    def chunk(first: int, n: int, count: int = total) -> bytes:
        idx = np.arange(first, first + n, dtype=np.uint64)
        at = HEADER + idx * dtype.itemsize
        rec = np.zeros(n, dtype)
        rec["prev"] = np.where(idx > 0, at - dtype.itemsize, 0)
        rec["next"] = np.where(idx + 1 < count, at + dtype.itemsize, 0)
        rec["time"] = BASE_MS // 1000 + idx.astype(np.int64)
        rec["flags"] = COMPLETE_FLAG
        rec["alloc"], rec["alloc_size"] = OP_ALLOC, 24
        rec["page"] = idx
        rec["free_before"], rec["free_after"] = 1 << 30, (1 << 30) - 1
        rec["complete"] = OP_COMPLETE
        return rec.tobytes()

    _check_against_writer("jrnl", [
        {"time": BASE_MS // 1000 + i, "complete": True,
         "ops": [{"op": "alloc", "page": i, "free_before": 1 << 30, "free_after": (1 << 30) - 1},
                 {"op": "complete"}]} for i in range(3)], header(3) + chunk(0, 3, 3))
    _write_chunks(path, header(total), total, chunk)
    return total


def write_gvfs_journal(path: Path, size: int, seed: int = 8) -> int:
    """A gvfs metadata journal (tag 0x0badcafe) of SET entries over 4096 distinct paths, as a
    long-lived store's journal would hold; the header's file_size and num_entries are exact."""
    import struct
    from journalfs.formats.gvfs_journal import HEADER_SIZE, MAGIC, encode_entry
    tag = 0x0BADCAFE
    block = [encode_entry("set", 1_700_000_000 + i, f"/home/user/dir{i % 64}/file{i}.txt",
                          "metadata::emblems", f"value-{i:06d}") for i in range(4096)]
    body = b"".join(block)
    copies = (size - HEADER_SIZE) // len(body)
    count = copies * len(block)

    def header(entries: int, file_size: int) -> bytes:
        return struct.pack(">6sBBIII", MAGIC, 1, 0, tag, file_size, entries)

    sample = [{"kind": "set", "mtime": 1_700_000_000 + i, "path": f"/home/user/dir{i % 64}/file{i}.txt",
               "key": "metadata::emblems", "value": f"value-{i:06d}"} for i in range(3)]
    used = HEADER_SIZE + sum(map(len, block[:3]))
    _check_against_writer("gvfs-journal", sample, header(3, used) + b"".join(block[:3]),
                          tag=tag, file_size=used)
    with open(path, "wb") as f:
        f.write(header(count, HEADER_SIZE + copies * len(body)))
        for _ in range(copies):
            f.write(body)
    return count


def write_sqlite_wal(path: Path, size: int, seed: int = 9) -> int:
    """A WAL of 4096-byte pages of printable text, a transaction committed every
    ``SQLITE_TX`` frames (and at the last frame). The checksum chain runs through the whole
    file, so each frame's is computed: its content's share with numpy for a chunk of frames,
    then the chain ``s' = F s + c`` (F: the frame's carry matrix) frame by frame."""
    import struct
    from journalfs.formats.sqlite_wal import HEADER, MAGIC_LE, VERSION, _weights, checksum
    page_size, salt1, salt2 = 4096, 0x5EED0001, 0x5EED0002
    frame = 24 + page_size
    total = (size - HEADER) // frame
    rng = np.random.default_rng(seed)
    weights = _weights(page_size)
    carry = [[int(v) for v in row] for row in weights.frame_power]
    head = struct.pack(">6I", MAGIC_LE, VERSION, page_size, 0, salt1, salt2)
    state = checksum(head, False)
    chunk = 4096  # frames per numpy step (16 MiB of pages)

    def frames(first: int, n: int) -> bytes:
        nonlocal state
        idx = np.arange(first, first + n)
        pages = _payloads(rng, n, page_size)
        db_size = np.where((idx % SQLITE_TX == SQLITE_TX - 1) | (idx == total - 1),
                           idx + 1, 0)
        fields = np.zeros((n, 2), ">u4")
        fields[:, 0], fields[:, 1] = idx % 100_000 + 1, db_size
        # the content's share of each checksum, from a zero seed (little-endian words: MAGIC_LE)
        shares = weights.frames(np.zeros((n, 2), np.uint64), fields.view("<u4"),
                                pages.view("<u4"))
        sums = np.empty((n, 2), ">u4")
        s0, s1 = state
        for i, (c0, c1) in enumerate(shares.tolist()):
            s0, s1 = ((carry[0][0] * s0 + carry[0][1] * s1 + c0) & 0xFFFFFFFF,
                      (carry[1][0] * s0 + carry[1][1] * s1 + c1) & 0xFFFFFFFF)
            sums[i] = s0, s1
        state = (s0, s1)
        out = np.empty((n, frame), np.uint8)
        out[:, 0:8] = fields.view(np.uint8)
        out[:, 8:16] = np.frombuffer(struct.pack(">II", salt1, salt2), np.uint8)
        out[:, 16:24] = sums.view(np.uint8)
        out[:, 24:] = pages
        return out.tobytes()

    first3 = frames(0, 3)
    state = checksum(head, False)
    records = [{"page": i + 1, "db_size": 0, "payload": first3[i * frame + 24:(i + 1) * frame]}
               for i in range(3)]
    _check_against_writer("sqlite-wal", records, head + struct.pack(">II", *state) + first3,
                          page_size=page_size, salt1=salt1, salt2=salt2)
    rng = np.random.default_rng(seed)  # the same pages again for the file itself
    with open(path, "wb") as f:
        f.write(head + struct.pack(">II", *state))
        for first in range(0, total, chunk):
            f.write(frames(first, min(chunk, total - first)))
    return total


#: Frames per transaction of :func:`write_sqlite_wal`.
SQLITE_TX = 8

#: format -> (generator, file name, kind of its first record)
GENERATORS = {"kestrel-writer": (write_kestrel_writer, "jobs.1700000000000", "put"),
              "kestrel-reader": (write_kestrel_reader, "jobs.read.reader", "read_head"),
              "wallaby-log": (write_wallaby_log, "LOG", "record"),
              "wallaby-index": (write_wallaby_index, "LOG.idx", "index"),
              "akka-data": (write_akka_data, "data", "message"),
              "akka-meta": (write_akka_meta, "meta", "meta"),
              "jrnl": (write_jrnl, "pages.jrnl", "transaction"),
              "gvfs-journal": (write_gvfs_journal, "home-0badcafe.log", "set"),
              "sqlite-wal": (write_sqlite_wal, "shop.db-wal", "page")}


def journal(fmt: str, megabytes: int) -> tuple[Path, int]:
    """The cached generated journal of ``fmt`` (its path and record count)."""
    generate, name, _kind = GENERATORS[fmt]
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

def _session_rss(sid: int, cpu: dict[int, float] | None = None) -> dict[int, tuple[str, int]]:
    """``{pid: (command name, RSS bytes)}`` of every process in session ``sid``; ``cpu``
    gets each one's CPU seconds so far (user + system)."""
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
            if name.startswith("python"):  # Spark's Python workers apart from the CLI
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        if b"pyspark" in f.read():
                            name = "python-worker"
                except OSError:
                    pass
            out[int(entry)] = (name, int(fields[21]) * resource.getpagesize())
            if cpu is not None:  # fields 14 and 15: utime, stime in clock ticks
                cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


#: Private memory (RLIMIT_DATA) the CLI steps may take: a command that does not stream
#: (e.g. a validator holding every record) fails with MemoryError there instead of taking a
#: shared machine's RAM; the table then shows the cap as exceeded.
CLI_DATA_LIMIT = 3 << 30


def _limit_data(limit: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return apply


def run_measured(argv: list[str], *, stdout=subprocess.DEVNULL, env: dict | None = None,
                 timeout: float = 3600, data_limit: int | None = None) -> dict:
    """Run ``argv`` in a session of its own; wall seconds, exit code, and the peak RSS of the
    whole session (the sum over its processes: CLI, JVM, Python workers), of its largest
    process and of the largest process of each command name, sampled every 0.2 s."""
    started = time.perf_counter()
    err_file = tempfile.TemporaryFile()  # not a pipe: nobody reads it while the run lasts
    proc = subprocess.Popen(argv, stdout=stdout, stderr=err_file, env=env,
                            cwd=REPO, start_new_session=True,  # -m imports from the cwd first
                            preexec_fn=_limit_data(data_limit) if data_limit else None)
    peak_total, peak_one, peak_name = 0, 0, ""
    by_name: dict[str, int] = {}  # the largest single process of each command name
    timeline = []  # every ~10 s: (seconds, MB of the session, MB of its largest process by name)
    next_mark = 0.0
    cpu: dict[int, float] = {}  # CPU seconds per process, as last seen (sampled, so a floor)
    while proc.poll() is None:
        sample = _session_rss(proc.pid, cpu)
        total = sum(rss for _name, rss in sample.values())
        peak_total = max(peak_total, total)
        now_by_name: dict[str, int] = {}
        for name, rss in sample.values():
            if rss > peak_one:
                peak_one, peak_name = rss, name
            now_by_name[name] = max(now_by_name.get(name, 0), rss)
            by_name[name] = max(by_name.get(name, 0), rss)
        elapsed = time.perf_counter() - started
        if elapsed >= next_mark:
            timeline.append([round(elapsed), round(total / 2**20),
                             {n: round(v / 2**20) for n, v in now_by_name.items()}])
            next_mark += 10
        if elapsed > timeout:
            os.killpg(proc.pid, 9)
        time.sleep(0.2)
    err_file.seek(0)
    err = err_file.read().decode(errors="replace")
    err_file.close()
    return {"seconds": time.perf_counter() - started, "exit": proc.returncode,
            "peak_rss_mb": peak_total / 2**20, "peak_process_mb": peak_one / 2**20,
            "peak_process": peak_name, "stderr_tail": err.strip().splitlines()[-3:],
            "peak_by_name_mb": {n: round(v / 2**20) for n, v in by_name.items()},
            "timeline": timeline, "stderr": err, "cpu_seconds": sum(cpu.values())}


def _timed(fn, timeout: float) -> dict:
    """Seconds ``fn()`` took in a thread, or a timeout marker (the thread is left behind)."""
    import threading
    result: dict = {}

    def work():
        t0 = time.perf_counter()
        try:
            result["value"] = fn()
        except Exception as exc:  # a failed step is reported, the others still run
            result["error"] = repr(exc)
        result["seconds"] = time.perf_counter() - t0

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return {"seconds": None, "timeout": timeout}
    return result


class Mounted:
    """``journalfs mount`` of ``source`` with ``store`` on a fresh mount point, in the
    foreground; unmounted (lazily, so a step left waiting cannot block) on exit."""

    def __init__(self, source: Path, store: Path, work: Path, env: dict):
        self.source, self.store, self.work, self.env = source, store, work, env

    def __enter__(self) -> Path:
        self.mnt = Path(tempfile.mkdtemp(prefix="mnt-", dir=self.work))
        self.log = open(self.work / "mount.log", "ab")
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "journalfs.cli", "mount", "--foreground", "--store",
             str(self.store), str(self.source), str(self.mnt)],
            stdout=self.log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO)
        deadline = time.monotonic() + 60
        while not os.path.ismount(self.mnt):
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise SystemExit(f"mount failed: {(self.work / 'mount.log').read_text()[-2000:]}")
            time.sleep(0.05)
        return self.mnt

    def peak_rss_mb(self) -> float | None:
        try:
            with open(f"/proc/{self.daemon.pid}/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
        except OSError:
            return None

    def __exit__(self, *exc) -> None:
        subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], capture_output=True)
        try:
            self.daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            self.daemon.wait()
        self.log.close()


def measure_mount(path: Path, count: int, timeout: float, env: dict,
                  budget: float | None = None) -> dict:
    """Through a real mount of ``path``'s directory: first record, stat, ls and records.jsonl
    of its view on a new store (nothing indexed yet); then, after a remount on the same store
    (the index on disk), the first ``cat`` of a record in the middle and of the last record
    and ``stat`` of records.jsonl and of a record. With ``budget``, ``ls`` and reading
    records.jsonl stop after that many seconds and report their rate so far (a remount then
    finds a partial index: its first ``cat`` in the middle may extend it)."""
    out: dict = {}
    work = Path(tempfile.mkdtemp(prefix="bigjournal-mnt-"))
    store = work / "store"
    kind = next(k for _fmt, (_g, name, k) in GENERATORS.items() if name == path.name)
    fixed_kind = kind not in ("read_head",)  # a reader file alternates read_head / read_done

    def record(view: Path, seq: int) -> Path:
        seq = seq if fixed_kind else seq - seq % 2
        return view / f"{seq:08d}.{kind}"

    try:
        mounted = Mounted(path.parent, store, work, env)
        with mounted as mnt:
            view = mnt / ".journalfs" / "records" / path.name
            out["first_record"] = _timed(lambda: len(record(view, 0).read_bytes()), timeout)
            out["stat_records_jsonl"] = _timed(lambda: os.stat(view / "records.jsonl").st_size,
                                               timeout)
            def list_view() -> int:
                """Entries listed, stopping after ``budget`` seconds (then a rate, not a total)."""
                listed, t0 = 0, time.perf_counter()
                for _ in os.scandir(view):
                    listed += 1
                    if budget and not listed % 4096 and time.perf_counter() - t0 > budget:
                        break
                return listed
            ls = _timed(list_view, timeout)
            if ls.get("seconds"):
                ls["entries_per_s"] = ls.get("value", 0) / ls["seconds"]
                ls["complete"] = ls.get("value") == count + 1  # the records and records.jsonl
            out["ls_view"] = ls

            def read_jsonl() -> int:
                total, t0 = 0, time.perf_counter()
                with open(view / "records.jsonl", "rb", buffering=0) as f:
                    while chunk := f.read(1 << 20):
                        total += len(chunk)
                        if budget and time.perf_counter() - t0 > budget:
                            break
                return total
            jsonl = _timed(read_jsonl, timeout)
            if jsonl.get("seconds"):
                jsonl["mb_s"] = jsonl.get("value", 0) / jsonl["seconds"] / MB
            out["read_records_jsonl"] = jsonl
            out["daemon_peak_rss_mb"] = mounted.peak_rss_mb()
        remounted = Mounted(path.parent, store, work, env)
        with remounted as mnt:
            view = mnt / ".journalfs" / "records" / path.name
            middle, last = record(view, count // 2), record(view, count - 1)
            out["remount_first_cat_middle"] = _timed(lambda: len(middle.read_bytes()), timeout)
            out["remount_stat_records_jsonl"] = _timed(
                lambda: os.stat(view / "records.jsonl").st_size, timeout)
            out["remount_stat_last"] = _timed(lambda: os.stat(last).st_size, timeout)
            out["remount_cat_last"] = _timed(lambda: len(last.read_bytes()), timeout)
            out["remount_daemon_peak_rss_mb"] = remounted.peak_rss_mb()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def measure(fmt: str, megabytes: int, skip: set[str], master: str | None, timeout: float,
            budget: float | None = None) -> dict:
    path, count = journal(fmt, megabytes)
    size = path.stat().st_size
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cli = [sys.executable, "-m", "journalfs.cli"]
    row: dict = {"format": fmt, "bytes": size, "records": count}
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # page cache
    row["cat"] = run_measured(["cat", str(path)])
    if "cli" not in skip:
        row["cli_records_json"] = run_measured([*cli, "records", str(path), "--json"], env=env,
                                               timeout=timeout, data_limit=CLI_DATA_LIMIT)
        row["cli_fsck"] = run_measured([*cli, "fsck", str(path)], env=env, timeout=timeout,
                                       data_limit=CLI_DATA_LIMIT)
    if "mount" not in skip:
        row["mount"] = measure_mount(path, count, timeout, env, budget)
    if "pipeline" not in skip:
        out = Path(tempfile.mkdtemp(prefix="bigjournal-out-")) / "tables"
        argv = [*cli, "pipeline", str(path), str(out)] + (["--master", master] if master else [])
        row["pipeline"] = run_measured(argv, env=env, timeout=timeout)
        shutil.rmtree(out.parent, ignore_errors=True)
    return row


# -- scaling: one process vs Spark executors ------------------------------------------------------

def single_process(path: Path) -> dict:
    """The data source's own work without Spark, in this one process: plan the file into
    slices, decode and convert every slice to Arrow batches of the contract schema."""
    from journalfs.spark.plan import list_journals, plan
    from journalfs.spark.read import read_slice
    from journalfs.spark.source import BATCH_ROWS
    t0, c0 = time.perf_counter(), time.process_time()
    rows = 0
    for group in plan(list_journals(str(path)), 1, cache_dir=None).groups:
        for sl in group:
            rows += sum(b.num_rows for b in read_slice(sl, False, BATCH_ROWS))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"rows": rows, "seconds": wall, "cpu_seconds": cpu, "rows_per_cpu_s": rows / cpu}


def _executor_cpu(workers: list) -> float:
    """CPU seconds so far of every process in the workers' sessions: the worker daemons, the
    executor JVMs they launch and those executors' Python workers."""
    cpu: dict[int, float] = {}
    for worker in workers:
        _session_rss(worker.pid, cpu)
    return sum(cpu.values())


def _machine_busy() -> tuple[int, int]:
    """(busy, total) clock ticks of all cores since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return sum(ticks) - idle, sum(ticks)


def cluster_runs(path: Path, executors: list[int], work: Path) -> list[dict]:
    """``spark.read.format("journal")`` of ``path`` forced through a ``noop`` write on a real
    standalone cluster (master + one 1-core worker per executor on 127.0.0.1), for each
    executor count; the daemons are stopped by pid."""
    import pyspark
    from journalfs.spark.session import build_session, package_zip
    from journalfs.spark.testing import free_port, stop_processes
    spark_class = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
    env = dict(os.environ, SPARK_HOME=os.path.dirname(pyspark.__file__),
               SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, SPARK_NO_DAEMONIZE="1")
    results = []
    for count in executors:
        port = free_port()
        url = f"spark://127.0.0.1:{port}"
        procs = [subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master",
                                   "--host", "127.0.0.1", "--port", str(port),
                                   "--webui-port", str(free_port())],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                  start_new_session=True)]
        try:
            time.sleep(5)
            for n in range(count):
                procs.append(subprocess.Popen(
                    [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                     "--cores", "1", "--memory", "2g", "--webui-port", str(free_port()),
                     "--work-dir", str(work / f"w{count}-{n}"), url],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                    start_new_session=True))
            spark = build_session(url, "bigjournal-scaling", {
                "spark.executor.cores": "1", "spark.cores.max": str(count),
                "spark.executor.memory": "1g", "spark.ui.showConsoleProgress": "false"})
            spark.sparkContext.addPyFile(package_zip(str(work)))
            jsc = spark.sparkContext._jsc.sc()
            deadline = time.monotonic() + 300
            while jsc.getExecutorMemoryStatus().size() < count + 1:
                if time.monotonic() > deadline:
                    raise SystemExit(f"only {jsc.getExecutorMemoryStatus().size() - 1} executors")
                time.sleep(0.5)
            spark.range(4).repartition(count).count()  # warm the executors' Python workers
            before, busy_before = _executor_cpu(procs[1:]), _machine_busy()
            t0 = time.perf_counter()
            spark.read.format("journal").option("parallelism", str(count)).load(str(path)) \
                .write.format("noop").mode("overwrite").save()
            seconds = time.perf_counter() - t0
            after, busy_after = _executor_cpu(procs[1:]), _machine_busy()
            busy = (busy_after[0] - busy_before[0]) / max(1e-9, busy_after[1] - busy_before[1])
            results.append({"executors": count, "seconds": seconds,
                            "executor_cpu_seconds": after - before,
                            "machine_busy_pct": 100 * busy})
            spark.stop()
        finally:
            stop_processes(procs)
    return results


def _cell(entry: dict | None, key: str = "seconds") -> str:
    if not entry:
        return "-"
    if entry.get("timeout"):
        return f">{entry['timeout']:.0f} s"
    value = entry.get(key)
    return "-" if value is None else f"{value:.1f}"


def print_table(rows: list[dict]) -> None:
    head = (f"{'format':<15}{'MB':>6}{'records':>12}{'cat s':>7}{'records --json s':>17}"
            f"{'MB RSS':>8}{'fsck s':>8}{'MB RSS':>8}{'1st rec s':>10}{'stat s':>8}{'ls s':>8}"
            f"{'jsonl MB/s':>11}{'pipeline s':>11}{'MB RSS':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        mount = r.get("mount", {})
        jsonl = mount.get("read_records_jsonl", {})
        pipe = r.get("pipeline")
        speed = f"{jsonl['mb_s']:.0f}" if jsonl.get("mb_s") else _cell(jsonl)
        print(f"{r['format']:<15}{r['bytes'] / MB:>6.0f}{r['records']:>12,}{_cell(r['cat']):>7}"
              f"{_cell(r['cli_records_json']):>17}{r['cli_records_json']['peak_rss_mb']:>8.0f}"
              f"{_cell(r['cli_fsck']):>8}{r['cli_fsck']['peak_rss_mb']:>8.0f}"
              f"{_cell(mount.get('first_record')):>10}{_cell(mount.get('stat_records_jsonl')):>8}"
              f"{_cell(mount.get('ls_view')):>8}"
              f"{speed:>11}"
              f"{_cell(pipe):>11}{(pipe['peak_rss_mb'] if pipe else 0):>8.0f}")


def pipeline_directory(directory: Path, work_parent: Path, master: str | None,
                       timeout: float) -> dict:
    """``journalfs pipeline`` of a whole directory with default settings: wall time, rows
    written (from the Parquet footers), and peak RSS of the JVM and of each Python worker,
    with a timeline to show whether memory stays flat while the files go by."""
    import pyarrow.parquet as pq
    total_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(directory)
                      for f in fs)
    work = Path(tempfile.mkdtemp(prefix="bigjournal-dir-", dir=work_parent))
    out = work / "tables"
    argv = [sys.executable, "-m", "journalfs.cli", "pipeline", str(directory), str(out)]
    if master:
        argv += ["--master", master]
    try:
        run = run_measured(argv, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=timeout)
        rows = sum(pq.ParquetFile(os.path.join(d, f)).metadata.num_rows
                   for d, _, fs in os.walk(out / "records") for f in fs
                   if f.endswith(".parquet")) if run["exit"] == 0 else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    run.update({"directory": str(directory), "bytes": total_bytes, "records": rows,
                "records_per_s": rows / run["seconds"],
                "records_per_cpu_s": rows / run["cpu_seconds"] if run["cpu_seconds"] else None,
                "mb_per_s": total_bytes / MB / run["seconds"], "load": os.getloadavg()})
    return run


def markdown_table(rows: list[dict]) -> str:
    """The README's table: seconds, and peak RSS in MB of the whole process tree."""
    def sec(entry: dict | None) -> str:
        if not entry:
            return "-"
        if entry.get("timeout"):
            return f"> {entry['timeout']:.0f}"
        if entry.get("error") or entry.get("seconds") is None:
            return "error"
        return f"{entry['seconds']:.2f}" if entry["seconds"] < 10 else f"{entry['seconds']:.0f}"

    def run(entry: dict | None) -> str:
        if not entry:
            return "-"
        code = entry.get("exit")
        failed = "" if code == 0 else f" (exit {code})"
        if code == -9:
            failed = " (killed at the time limit)"
        elif code == 1 and entry["peak_rss_mb"] > 0.85 * CLI_DATA_LIMIT / 2**20:
            failed = f" (out of memory at the {CLI_DATA_LIMIT >> 30} GiB limit)"
        return f"{sec(entry)} / {entry['peak_rss_mb']:.0f}{failed}"

    def ls_cell(entry: dict | None) -> str:
        if entry and entry.get("entries_per_s") and not entry.get("complete", True):
            return f"stopped at {sec(entry)} s: {entry['value']:,} entries, {entry['entries_per_s']:,.0f}/s"
        return sec(entry)

    lines = ["| format | MB | records | `records --json` s / MB | `fsck` s / MB "
             "| 1st `cat` s (new store) | `stat` jsonl s | `ls` s | records.jsonl MB/s "
             "| after remount: 1st `cat` s | `stat` s | pipeline s / JVM MB / Python worker MB |",
             "|" + "---|" * 12]
    for r in rows:
        m = r.get("mount", {})
        jsonl = m.get("read_records_jsonl", {})
        speed = sec(jsonl or None)
        if jsonl.get("mb_s"):
            speed = f"{jsonl['mb_s']:.0f}" if jsonl["mb_s"] >= 1 else \
                f"{jsonl['value'] / MB:.0f} MB in {jsonl['seconds']:.0f} s"
        stats = [m.get("remount_stat_records_jsonl"), m.get("remount_stat_last")]
        stat_s = max((e["seconds"] for e in stats if e and e.get("seconds") is not None),
                     default=None)
        pipe = r.get("pipeline")
        pipe_cell = "-"
        if pipe:  # by process: a whole-tree sum can count a forking JVM twice for a moment
            peaks = pipe.get("peak_by_name_mb", {})
            pipe_cell = (f"{sec(pipe)} / {peaks.get('java', 0):,} / "
                         f"{peaks.get('python-worker', 0):,}"
                         + ("" if pipe.get("exit") == 0 else f" (exit {pipe.get('exit')})"))
        lines.append(
            f"| {r['format']} | {r['bytes'] / MB:.0f} | {r['records']:,} "
            f"| {run(r.get('cli_records_json'))} | {run(r.get('cli_fsck'))} "
            f"| {sec(m.get('first_record'))} | {sec(m.get('stat_records_jsonl'))} "
            f"| {ls_cell(m.get('ls_view'))} | {speed} "
            f"| {sec(m.get('remount_first_cat_middle'))} "
            f"| {'-' if stat_s is None else f'{stat_s:.3f}'} | {pipe_cell} |")
    return "\n".join(lines)


def main() -> int:
    global OUT
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=1000, help="journal size per format (MB)")
    parser.add_argument("--formats", default=",".join(GENERATORS))
    parser.add_argument("--skip", default="", help="comma list of: cli, mount, pipeline")
    parser.add_argument("--master", default=None, help="Spark master for the pipeline")
    parser.add_argument("--timeout", type=float, default=600, help="per step, seconds")
    parser.add_argument("--out", default=str(OUT), help="where generated journals are cached")
    parser.add_argument("--budget", type=float, default=None,
                        help="stop ls and the records.jsonl read after this many seconds and "
                             "report their rates (on a busy machine)")
    parser.add_argument("--table", nargs="+", metavar="JSON",
                        help="instead: the markdown table of saved results-*.json files "
                             "(several per format are merged, later ones win)")
    parser.add_argument("--dir", default=None,
                        help="instead: `journalfs pipeline` of this directory, default settings")
    parser.add_argument("--scaling", action="store_true",
                        help="instead: the first format's journal read by one process and by "
                             "1 and 2 executors of a standalone cluster")
    args = parser.parse_args()
    OUT = Path(args.out)
    formats = [f for f in args.formats.split(",") if f]
    unknown = set(formats) - set(GENERATORS)
    if unknown:
        parser.error(f"no generator for: {', '.join(sorted(unknown))} "
                     f"(have: {', '.join(GENERATORS)})")
    skip = {s for s in args.skip.split(",") if s}
    if args.table:
        merged: dict[str, dict] = {}  # per format; a later file's steps win
        for name in args.table:
            row = json.loads(Path(name).read_text())
            merged.setdefault(row["format"], {}).update(row)
        print(markdown_table(list(merged.values())))
        return 0
    if args.dir:
        result = pipeline_directory(Path(args.dir), OUT, args.master, args.timeout)
        peaks = result["peak_by_name_mb"]
        print(f"pipeline {args.dir}: {result['bytes'] / MB:,.0f} MB, {result['records']:,} "
              f"records in {result['seconds']:.0f} s (exit {result['exit']}): "
              f"{result['records_per_s']:,.0f} records/s, {result['mb_per_s']:.1f} MB/s, "
              f"{result['cpu_seconds']:,.0f} CPU-s ({result['records_per_cpu_s'] or 0:,.0f} "
              f"records per CPU-second); "
              f"peak RSS: all {result['peak_rss_mb']:,.0f} MB, JVM {peaks.get('java', 0):,} MB, "
              f"largest Python worker {peaks.get('python-worker', 0):,} MB")
        for seconds, total, by_name in result["timeline"]:
            print(f"  t={seconds:>5} s  all {total:>6} MB  " + "  ".join(
                f"{n} {v}" for n, v in sorted(by_name.items())))
        print(json.dumps({k: v for k, v in result.items() if k != "stderr"}))
        return 0 if result["exit"] == 0 else 1
    if args.scaling:
        path, count = journal(formats[0], args.mb)
        work = Path(tempfile.mkdtemp(prefix="bigjournal-cluster-"))
        try:
            single = single_process(path)
            runs = cluster_runs(path, [1, 2], work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for run in runs:
            run["rows_per_s"] = count / run["seconds"]
            run["rows_per_s_per_executor"] = run["rows_per_s"] / run["executors"]
        print(f"one process (no Spark): {single['rows_per_cpu_s']:,.0f} rows per CPU-second "
              f"({single['seconds']:.1f} s wall)")
        for run in runs:
            run["rows_per_executor_cpu_s"] = count / run["executor_cpu_seconds"]
            print(f"{run['executors']} executor(s): {run['seconds']:.1f} s, "
                  f"{run['rows_per_s']:,.0f} rows/s, {run['rows_per_s_per_executor']:,.0f} per "
                  f"executor; executors' CPU {run['executor_cpu_seconds']:.0f} s "
                  f"({run['rows_per_executor_cpu_s']:,.0f} rows per CPU-second); machine "
                  f"{run['machine_busy_pct']:.0f} % busy")
        print(json.dumps({"benchmark": "bigjournal-scaling", "format": formats[0], "mb": args.mb,
                          "records": count, "load": os.getloadavg()[0], "single": single,
                          "cluster": runs}, indent=1))
        return 0
    rows = []
    for fmt in formats:
        rows.append(measure(fmt, args.mb, skip, args.master, args.timeout, args.budget))
        (OUT / f"results-{fmt}-{args.mb}mb.json").write_text(json.dumps(rows[-1], indent=1))
        print(f"measured {fmt}", file=sys.stderr, flush=True)
    if all("cli_records_json" in r for r in rows):  # the fixed-width table wants every column
        print_table(rows)
    print(markdown_table(rows))
    print(json.dumps({"benchmark": "bigjournal", "mb": args.mb, "load": os.getloadavg()[0],
                      "results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
