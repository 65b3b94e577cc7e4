"""A journal's view while its index is still being built (issue 15): `ls` lists it without
an error, and records.jsonl serves its first bytes before the indexing ends, byte for byte
what `journalfs records --json` prints."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mountutil import mounted

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.spark import _akka_data  # noqa: E402  (numpy writer of a linked akka data file)

pytestmark = pytest.mark.fuse

#: Big enough that indexing takes seconds (~1.2M records), small enough to write in ~2 s.
AKKA_BYTES = 200_000_000
BLOCK = 24 + 150


@pytest.fixture(scope="module")
def akka_source(tmp_path_factory) -> tuple[Path, int]:
    src = tmp_path_factory.mktemp("akka-big") / "src"
    src.mkdir()
    _akka_data(src / "data", src / "meta", AKKA_BYTES)
    return src, ((src / "data").stat().st_size - 8) // BLOCK


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _indexing(mnt: Path) -> list:
    status = json.loads((mnt / ".journalfs" / "status.json").read_bytes())
    return status["views"]["indexing"]


def test_ls_while_indexing_lists_every_record(akka_source, tmp_path):
    """Listing right after the mount meets a partial index: it lists what the indexer has
    passed and waits for the rest (it answered EIO: a batch ended between checkpoints)."""
    src, count = akka_source
    mnt = tmp_path / "mnt"
    with mounted(src, mnt, "--store", str(tmp_path / "store")) as m:
        view = mnt / ".journalfs" / "records" / "data"
        before = _peak_rss(m.pid)
        listing = subprocess.run(["ls", "-U", str(view)], capture_output=True)
        # memory: the indexing window and a batch of names, never the file (the first
        # batch of a partial index was read from the whole file: +200 MB here)
        growth = _peak_rss(m.pid) - before
        assert growth < (64 << 20) + (48 << 20), growth
        assert listing.returncode == 0, listing.stderr.decode(errors="replace")
        names = listing.stdout.split()
        assert len(names) == count + 1
        assert names[0] == b"records.jsonl"
        assert names[1] == b"00000000.message" and names[-1] == b"%08d.message" % (count - 1)
        assert len(set(names)) == len(names)
        # listed again from the complete index: the same names
        again = subprocess.run(["ls", "-U", str(view)], capture_output=True, check=True)
        assert again.stdout.split() == names


def test_records_jsonl_streams_before_indexing_ends(akka_source, tmp_path):
    """The first read of records.jsonl is answered from the partial index (it waited for the
    whole index), and the stream that follows is exactly `journalfs records --json`."""
    src, count = akka_source
    mnt = tmp_path / "mnt"
    cli = subprocess.Popen([sys.executable, "-m", "journalfs.cli", "records",
                            str(src / "data"), "--json"], stdout=subprocess.PIPE)
    try:
        with mounted(src, mnt, "--store", str(tmp_path / "store")):
            view = mnt / ".journalfs" / "records" / "data"
            with open(view / "records.jsonl", "rb", buffering=0) as f:
                first = f.read(1 << 20)
                # the first MiB came while the journal was still being indexed
                assert _indexing(mnt) == [{"path": "data"}]
                assert first == cli.stdout.read(len(first))
                lines = first.count(b"\n")
                size = len(first)
                tail = b""
                while chunk := f.read(1 << 20):
                    expected = cli.stdout.read(len(chunk))
                    assert chunk == expected, f"records.jsonl differs from the CLI near byte {size}"
                    size += len(chunk)
                    lines += chunk.count(b"\n")
                    tail = (tail + chunk)[-4096:]
            assert cli.stdout.read(1) == b""
            assert lines == count
            assert json.loads(tail.splitlines()[-1])["seq"] == count - 1
            assert cli.wait(timeout=60) == 0
            deadline = time.monotonic() + 60
            while _indexing(mnt) and time.monotonic() < deadline:
                time.sleep(0.05)
            # once read to the end, the exact size is known
            assert (view / "records.jsonl").stat().st_size == size
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
