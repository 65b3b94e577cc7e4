"""A small, realistic, deterministic demo tree of journals (and the record generators behind it).

    python -m journalfs.demo DIR

writes, through the codecs' own writers and with a fixed seed:

- ``docs/``, ``photos/``, ``README.txt`` — ordinary files and directories;
- ``queues/`` — a Kestrel queue ``jobs``: two writer segments and two reader files;
- ``akka/orders/`` — an akka file journal (``meta`` + ``data``) of three persistence ids;
- ``wallaby/`` — a Wallaby log and its index;
- ``jrnl/db.jrnl`` — a JRNL journal with complete, redo and (last) rollback transactions;
- ``sqlite/`` — a SQLite database in WAL mode (``shop.db``) and its log ``shop.db-wal``;
- ``gvfs-metadata/`` — a gvfs metadata store (tree ``home`` + its journal) about the files above.

The ``*_records`` / ``*_files`` generators are reused by bench/parse.py and the tests to make
inputs of any size.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Iterator

import numpy as np

from .formats import CODECS
from .formats.akka import AkkaData
from .formats.base import payload_b64
from .formats.gvfs_journal import journal_name
from .formats.wallaby import INDEX_DTYPE, INDEX_SUFFIX, index_file, write_log_and_index

SEED = 20240601
#: 2023-11-14T22:13:20Z in ms / s / ns: the demo's clock starts here.
BASE_MS = 1_700_000_000_000
BASE_S = BASE_MS // 1000
BASE_NS = BASE_MS * 1_000_000

WORDS = ("invoice", "resize", "thumbnail", "email", "backup", "index", "report", "sync",
         "upload", "audit", "ledger", "order", "refund", "ship", "notify")


def _text(rng: random.Random, lo: int, hi: int) -> bytes:
    """A whole JSON object of ``lo..hi`` bytes, as a queue's producer would put: a task, a
    number, who sent it, and a ``note`` of words filling it to the size drawn (realistic,
    compressible, not random noise). Below ~40 bytes the fullest object that fits (at least
    12 bytes; then a bare JSON number cut to the size)."""
    size = rng.randint(lo, hi)
    task, n, by = rng.choice(WORDS), rng.randrange(10**6), rng.choice(WORDS)
    heads = (f'{{"task":"{task}","n":{n},"by":"{by}"', f'{{"task":"{task}","n":{n}', f'{{"n":{n}')
    for head in heads:
        room = size - len(head) - len(',"note":""}')
        if room >= 0:
            note = (f"{task} {by} " * (room // 2 + 1))[:room]
            return f'{head},"note":"{note}"}}'.encode()
    for head in heads:
        if len(head) + 1 <= size:
            return f"{head}}}".encode()
    return str(n).encode()[:size]


# -- Kestrel -------------------------------------------------------------------------------------

def kestrel_put_records(rng: random.Random, count: int, first_id: int = 1, start_ms: int = BASE_MS,
                        payload: tuple[int, int] = (20, 120)) -> list[dict]:
    records, now = [], start_ms
    for n in range(count):
        now += rng.randint(1, 900)
        expiry = now + rng.choice((60_000, 3_600_000)) if rng.random() < 0.3 else None
        records.append({"kind": "put", "id": first_id + n, "add_time": now, "expire_time": expiry,
                        "error_count": rng.choice((0, 0, 0, 1, 2)), "payload": _text(rng, *payload)})
    return records


def kestrel_queue_files(rng: random.Random, name: str = "jobs") -> dict[str, bytes]:
    """Two writer segments (ids 1..40, 41..64) and two readers: the default reader consumed up
    to 45 plus two items out of order; ``mailer`` has read everything up to 12."""
    writer, reader = CODECS["kestrel-writer"], CODECS["kestrel-reader"]
    old = kestrel_put_records(rng, 40, 1, BASE_MS)
    new = kestrel_put_records(rng, 24, 41, BASE_MS + 60_000)
    return {
        f"{name}.{BASE_MS}": writer.write(old),
        f"{name}.{BASE_MS + 60_000}": writer.write(new),
        f"{name}.read.": reader.write([{"kind": "read_head", "id": 45},
                                       {"kind": "read_done", "ids": [47, 50]}]),
        f"{name}.read.mailer": reader.write([{"kind": "read_head", "id": 12},
                                             {"kind": "read_done", "ids": []}]),
    }


# -- akka ----------------------------------------------------------------------------------------

def akka_messages(rng: random.Random, count: int, pids: tuple[str, ...],
                  payload: tuple[int, int] = (16, 100)) -> list[tuple[str, int, bytes]]:
    """``count`` messages interleaved over ``pids``, sequence numbers from 1 per id."""
    seq = dict.fromkeys(pids, 0)
    messages = []
    for _ in range(count):
        pid = rng.choice(pids)
        seq[pid] += 1
        messages.append((pid, seq[pid], _text(rng, *payload)))
    return messages


def akka_files(rng: random.Random) -> dict[str, bytes]:
    data, meta = AkkaData.build(akka_messages(rng, 36, ("order-17", "order-18", "użytkownik-3")))
    return {"data": data, "meta": meta}


# -- Wallaby -------------------------------------------------------------------------------------

def wallaby_items(rng: random.Random, count: int, payload: tuple[int, int] = (16, 100)
                  ) -> Iterator[tuple[int, bytes]]:
    now = BASE_NS
    for _ in range(count):
        now += rng.randint(1, 5_000_000_000)
        yield now, _text(rng, *payload)


def wallaby_files(rng: random.Random, name: str = "events.log") -> dict[str, bytes]:
    log, index = write_log_and_index(wallaby_items(rng, 48), flags=0, ttl_ns=0)
    return {name: log, name + INDEX_SUFFIX: index}


def big_wallaby_index(count: int) -> bytes:
    """A valid Wallaby index of ``count`` records (for a log of 40-byte records), built in one
    numpy pass: the big views of the tests and benches."""
    table = np.zeros(count, INDEX_DTYPE)
    table["time"] = 1_700_000_000_000_000_000 + np.arange(count, dtype=np.int64) * 1000
    table["index"] = np.arange(count, dtype=np.uint64)
    table["log_offset"] = 16 + np.arange(count, dtype=np.int64) * 40
    return index_file(table)


# -- JRNL ----------------------------------------------------------------------------------------

def _jrnl_ops(rng: random.Random, ending: str | None) -> list[dict]:
    ops = []
    for _ in range(rng.randint(1, 4)):
        page = 65536 * rng.randint(1, 64)
        kind = rng.choice(("alloc", "modify", "modify", "remove"))
        if kind == "alloc":
            ops.append({"op": "alloc", "page": page, "free_before": page + 65536, "free_after": 0})
        elif kind == "remove":
            ops.append({"op": "remove", "page": page, "free_before": 0})
        else:
            size = rng.randint(4, 48)
            before, after = rng.randbytes(size), rng.randbytes(size)
            ops.append({"op": "modify", "page": page, "data_offset": rng.randrange(65536 - size),
                        "size": size, "before_b64": payload_b64(before),
                        "after_b64": payload_b64(after)})
    if ending:
        ops.append({"op": ending, "data_b64": ""})
    return ops


def jrnl_records(rng: random.Random, count: int, last: str = "rollback") -> list[dict]:
    """``count`` transactions: complete ones with every fifth from the third on a redo (0xFF
    op, flag clear); the last one is ``last`` ("complete", "redo" or "rollback" = no 0xFF op)."""
    records, now = [], BASE_S
    for n in range(count):
        now += rng.randint(1, 600)
        status = last if n == count - 1 else ("redo" if n % 5 == 2 else "complete")
        records.append({"kind": "transaction", "time": now, "complete": status == "complete",
                        "ops": _jrnl_ops(rng, None if status == "rollback" else "complete")})
    return records


# -- gvfs metadata -------------------------------------------------------------------------------

GVFS_TAG = 0x5EEDFACE


def gvfs_store_files(rng: random.Random, paths: list[str]) -> dict[str, bytes]:
    """A tree holding emblems/annotations for ``paths`` and a journal of later changes
    (a set, a list set, an unset, a move = copy + remove), tied by one tag."""
    nodes = []
    for n, path in enumerate(paths):
        meta: dict = {"annotation": f"{rng.choice(WORDS)} #{n}"}
        if n % 2 == 0:
            meta["emblems"] = sorted(rng.sample(["important", "urgent", "shared", "favorite"], 2))
        nodes.append({"path": path, "mtime": BASE_S + 60 * n, "metadata": meta})
    later = BASE_S + 86_400
    entries = [
        {"kind": "set", "mtime": later, "path": paths[0], "key": "rating", "value": "5"},
        {"kind": "setv", "mtime": later + 1, "path": paths[1], "key": "tags",
         "value": ["draft", "q3"]},
        {"kind": "unset", "mtime": later + 2, "path": paths[0], "key": "annotation"},
        {"kind": "copy", "mtime": later + 3, "path": "/docs/archive/old-notes.md",
         "source": "/docs/old-notes.md"},
        {"kind": "remove", "mtime": later + 3, "path": "/docs/old-notes.md"},
    ]
    return {
        "home": CODECS["gvfs-tree"].write(nodes + [{"path": "/docs/old-notes.md",
                                                    "mtime": BASE_S, "metadata": {"x": "1"}}],
                                          tag=GVFS_TAG),
        journal_name("home", GVFS_TAG): CODECS["gvfs-journal"].write(entries, tag=GVFS_TAG),
    }


# -- the tree ------------------------------------------------------------------------------------

ORDINARY = {
    "README.txt": b"journalfs demo tree: every journal below shows up under .journalfs/records/.\n",
    "docs/report.txt": b"Quarterly report\n================\nAll queues drained on time.\n",
    "docs/notes.md": b"# Notes\n\n- rotate the gvfs journal\n- check the wallaby index\n",
    "photos/2023/cat.jpg": b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(64) + b"\xff\xd9",
    "photos/2023/dog.jpg": b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(96) + b"\xff\xd9",
}


def demo_files(seed: int = SEED) -> dict[str, bytes]:
    """Every file of the demo tree by relative path."""
    rng = random.Random(seed)
    files = dict(ORDINARY)
    files.update({f"queues/{n}": d for n, d in kestrel_queue_files(rng).items()})
    files.update({f"akka/orders/{n}": d for n, d in akka_files(rng).items()})
    files.update({f"wallaby/{n}": d for n, d in wallaby_files(rng).items()})
    files["jrnl/db.jrnl"] = CODECS["jrnl"].write(jrnl_records(rng, 7))
    tagged = ["/docs/report.txt", "/docs/notes.md", "/photos/2023/cat.jpg", "/photos/2023/dog.jpg",
              "/queues", "/README.txt"]
    files.update({f"gvfs-metadata/{n}": d for n, d in gvfs_store_files(rng, tagged).items()})
    files.update(CODECS["sqlite-wal"].demo_files(rng, tagged))
    return files


def write_demo(root: Path, seed: int = SEED) -> list[Path]:
    written = []
    for rel, data in sorted(demo_files(seed).items()):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m journalfs.demo DIR", file=sys.stderr)
        return 2
    root = Path(argv[0])
    written = write_demo(root)
    total = sum(p.stat().st_size for p in written)
    print(f"{root}: {len(written)} files, {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
