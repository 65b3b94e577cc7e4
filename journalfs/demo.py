"""A small, realistic, deterministic demo tree of journals (and the record generators behind it).

    python -m journalfs.demo DIR

writes, with a fixed seed, a few ordinary files and directories (``docs/``, ``photos/``,
``README.txt``) and, for every registered format, the sample its codec makes with its own
writer (:meth:`~journalfs.formats.base.Codec.demo_files`): a Kestrel queue in ``queues/``,
an akka journal in ``akka/orders/``, a Wallaby log and index in ``wallaby/``, a JRNL
journal, a gvfs metadata store about the ordinary files, ... A new format shows up here by
its registration alone. Each format draws from its own random generator (seeded with the
seed and its name), so adding one changes no other's sample.

The record generators (``kestrel_put_records``, ``akka_messages``, ...), defined beside
their codecs, are reused by bench/ and the tests to make inputs of any size.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

from .formats import CODECS
from .formats.akka import sample_messages as akka_messages
from .formats.jrnl import sample_transactions as jrnl_records
from .formats.kestrel import sample_puts as kestrel_put_records
from .formats.samples import BASE_MS, BASE_NS, BASE_S
from .formats.wallaby import big_index as big_wallaby_index
from .formats.wallaby import sample_items as wallaby_items

SEED = 20240601


# -- the tree ------------------------------------------------------------------------------------

#: The ordinary files, the ones the metadata samples describe first.
ORDINARY = {
    "docs/report.txt": b"Quarterly report\n================\nAll queues drained on time.\n",
    "docs/notes.md": b"# Notes\n\n- rotate the gvfs journal\n- check the wallaby index\n",
    "photos/2023/cat.jpg": b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(64) + b"\xff\xd9",
    "photos/2023/dog.jpg": b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(96) + b"\xff\xd9",
    "README.txt": b"journalfs demo tree: every journal below shows up under .journalfs/records/.\n",
}


def demo_files(seed: int = SEED) -> dict[str, bytes]:
    """Every file of the demo tree by relative path: the ordinary files, then every
    registered format's sample."""
    files = dict(ORDINARY)
    described = ["/" + rel for rel in ORDINARY]
    for name, codec in CODECS.items():
        sample = codec.demo_files(random.Random(f"{seed}/{name}"), described)
        clash = sorted(set(sample) & set(files))
        if clash:
            raise ValueError(f"{name}'s demo sample overwrites {clash}")
        files.update(sample)
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


__all__ = ["BASE_MS", "BASE_NS", "BASE_S", "ORDINARY", "SEED", "akka_messages",
           "big_wallaby_index", "demo_files", "jrnl_records", "kestrel_put_records", "main",
           "wallaby_items", "write_demo"]

if __name__ == "__main__":
    sys.exit(main())
