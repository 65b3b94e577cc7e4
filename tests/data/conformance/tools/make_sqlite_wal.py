"""Make the SQLite WAL conformance files with the real SQLite, and their expected records.

Usage: make_sqlite_wal.py RECORDS_DIR   (writes sqlite*.db-wal there, merges expected.json)

Every log is written by the real SQLite: the Python sqlite3 module (the system's libsqlite3) or
the ``sqlite3`` command-line shell, in WAL mode with automatic checkpoints off, the ``-wal``
file copied while the connection still holds it open. The expected records come from a
reference reading of the file format document (https://www.sqlite.org/fileformat2.html#walformat),
written here on its own (no journalfs code), and are checked against SQLite itself: a copy
of the database and its log opened by SQLite must report (``PRAGMA wal_checkpoint``) exactly
the frames up to the last commit the reference reads. The damaged variants are real logs
with one change each (cut, one bit flipped, one frame's salt changed, the header's checkpoint
number changed); the big-endian one is a real log whose checksums were recomputed with the
other byte order (magic 0x377f0683), which SQLite reads on any machine, as the check shows.
"""
from __future__ import annotations

import base64
import json
import os
import sqlite3
import struct
import subprocess
import sys
import tempfile
from pathlib import Path


def cksum(data: bytes, big: bool, s0: int = 0, s1: int = 0) -> tuple[int, int]:
    words = struct.unpack(f"{'>' if big else '<'}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def reference(data: bytes) -> tuple[list[dict], int | None, int]:
    """(records, offset of the damage or None, frames SQLite counts: up to the last commit)."""
    magic, version, page, _ckpt, salt1, salt2, c1, c2 = struct.unpack(">8I", data[:32])
    big = bool(magic & 1)
    assert magic in (0x377F0682, 0x377F0683) and version == 3007000
    if cksum(data[:24], big) != (c1, c2):
        return [], 24, 0
    s, pos, records, committed = (c1, c2), 32, [], 0
    while pos + 24 + page <= len(data):
        pgno, dbsize, fs1, fs2, f1, f2 = struct.unpack(">6I", data[pos:pos + 24])
        body = data[pos + 24:pos + 24 + page]
        t = cksum(data[pos:pos + 8] + body, big, *s)
        if (fs1, fs2) != (salt1, salt2) and t != (f1, f2):
            return records, None, committed  # a frame of an earlier generation: the end
        if (fs1, fs2) != (salt1, salt2):
            return records, pos + 8, committed
        if t != (f1, f2) or pgno == 0:
            return records, pos, committed
        records.append({"format": "sqlite-wal", "seq": len(records), "offset": pos,
                        "kind": "commit" if dbsize else "page", "page": pgno, "db_size": dbsize,
                        "salt1": fs1, "salt2": fs2, "checksum1": f1, "checksum2": f2,
                        "payload_b64": base64.b64encode(body).decode()})
        if dbsize:
            committed = len(records)
        s, pos = t, pos + 24 + page
    left = len(data) - pos
    if left and not (left >= 16 and struct.unpack(">II", data[pos + 8:pos + 16]) != (salt1, salt2)):
        return records, pos, committed
    return records, None, committed


def sqlite_frames(db: bytes, wal: bytes) -> int:
    """How many frames the real SQLite takes from ``wal`` beside database ``db``."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "x.db").write_bytes(db)
        Path(tmp, "x.db-wal").write_bytes(wal)
        con = sqlite3.connect(os.path.join(tmp, "x.db"))
        try:
            _busy, log, _done = con.execute("pragma wal_checkpoint(PASSIVE)").fetchone()
        finally:
            con.close()
        return max(log, 0)


def writer(tmp: Path, name: str, page_size: int):
    db = tmp / name
    con = sqlite3.connect(db, isolation_level=None)
    con.execute(f"pragma page_size={page_size}")
    con.execute("pragma journal_mode=wal")
    con.execute("pragma wal_autocheckpoint=0")
    return db, con


def snapshot(db: Path) -> tuple[bytes, bytes]:
    return db.read_bytes(), Path(f"{db}-wal").read_bytes()


def orders(con, first: int, count: int) -> None:
    con.execute("begin")
    con.executemany("insert into orders(id, customer, note) values (?, ?, ?)",
                    [(i, f"customer-{i % 7}", f"order {i}: " + "widget " * (i % 5 + 1))
                     for i in range(first, first + count)])
    con.execute("commit")


def make(tmp: Path) -> dict[str, tuple[bytes, bytes]]:
    """{name: (database bytes, log bytes)}"""
    out = {}
    # 0: a few transactions of 512-byte pages
    db, con = writer(tmp, "sqlite0.db", 512)
    con.execute("create table orders(id integer primary key, customer text, note text)")
    orders(con, 1, 3)
    orders(con, 4, 20)
    con.execute("update orders set note = 'shipped' where id = 2")
    con.execute("delete from orders where id between 10 and 12")
    out["sqlite0.db-wal"] = snapshot(db)
    # 1: a transaction still being written: a cache of 2 pages spills its pages to the log
    # before the commit
    con.execute("pragma cache_size=2")
    con.execute("begin")
    con.executemany("insert into orders(id, customer, note) values (?, ?, ?)",
                    [(i, "bulk", "x" * 300) for i in range(100, 112)])
    out["sqlite1.db-wal"] = snapshot(db)
    con.execute("rollback")
    con.close()
    # 2: after a checkpoint SQLite writes from the start again under new salts; the frames of
    # the earlier generation stay after the new ones
    db, con = writer(tmp, "sqlite2.db", 512)
    con.execute("create table orders(id integer primary key, customer text, note text)")
    for n in range(4):
        orders(con, 1 + 10 * n, 8)
    con.execute("pragma wal_checkpoint(PASSIVE)")
    orders(con, 100, 2)
    out["sqlite2.db-wal"] = snapshot(db)
    con.close()
    # 3: the sqlite3 shell, 4096-byte pages (its default)
    db = tmp / "sqlite3.db"
    script = ("pragma journal_mode=wal;\npragma wal_autocheckpoint=0;\n"
              "create table kv(k text primary key, v blob);\n"
              "insert into kv values ('colour', 'teal'), ('size', 'large');\n"
              "insert into kv values ('blob', zeroblob(100));\n"
              ".shell cp {db}-wal {db}-wal.copy\n.shell cp {db} {db}.copy\n")
    subprocess.run(["sqlite3", str(db)], input=script.format(db=db), text=True, check=True,
                   stdout=subprocess.DEVNULL)
    out["sqlite3.db-wal"] = (Path(f"{db}.copy").read_bytes(), Path(f"{db}-wal.copy").read_bytes())
    # damaged variants of log 0
    base_db, base = out["sqlite0.db-wal"]
    frame = 24 + 512
    out["torn.db-wal"] = (base_db, base[:32 + 6 * frame + 200])  # cut inside frame 6
    flipped = bytearray(base)
    flipped[32 + 8 * frame + 24 + 100] ^= 0x10  # one bit of frame 8's page
    out["flip.db-wal"] = (base_db, bytes(flipped))
    salted = bytearray(base)
    at = 32 + 5 * frame + 12  # frame 5's salt-2
    struct.pack_into(">I", salted, at, struct.unpack_from(">I", base, at)[0] ^ 1)
    out["salt.db-wal"] = (base_db, bytes(salted))
    header = bytearray(base)
    header[15] ^= 0x01  # the checkpoint number, under the header's checksum
    out["header.db-wal"] = (base_db, bytes(header))
    # big-endian checksums: log 0 re-summed with the other byte order
    out["bigend.db-wal"] = (base_db, resum(base, big=True))
    return out


def resum(data: bytes, big: bool) -> bytes:
    out = bytearray(data)
    magic = 0x377F0683 if big else 0x377F0682
    struct.pack_into(">I", out, 0, magic)
    page = struct.unpack_from(">I", out, 8)[0]
    s = cksum(bytes(out[:24]), big)
    struct.pack_into(">II", out, 24, *s)
    pos = 32
    while pos + 24 + page <= len(out):
        s = cksum(bytes(out[pos:pos + 8] + out[pos + 24:pos + 24 + page]), big, *s)
        struct.pack_into(">II", out, pos + 16, *s)
        pos += 24 + page
    return bytes(out)


def main(argv: list[str]) -> int:
    target = Path(argv[0])
    expected_path = target / "expected.json"
    expected = json.loads(expected_path.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        made = make(Path(tmp))
    for name, (db, wal) in sorted(made.items()):
        records, damage, committed = reference(wal)
        seen = sqlite_frames(db, wal)
        assert seen == committed, (name, seen, committed)
        (target / name).write_bytes(wal)
        expected[name] = {"format": "sqlite-wal", "exit": 3 if damage is not None else 0,
                          "records": records}
        print(f"{name}: {len(wal)} bytes, {len(records)} frames, SQLite takes {seen}, "
              f"damage at {damage}")
    expected_path.write_text(json.dumps(expected, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
