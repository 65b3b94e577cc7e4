"""A sparse journal (issue 24 attack 4: `truncate -s 1G` of a small Wallaby .idx): the views
index it up to its hole, and render it up to the hole too -- never gigabytes of zeros per
read (a listing of its view took 4.6 s of one worker thread, each time, while other users'
requests waited for the GIL; now milliseconds)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from journalfs import journals
from journalfs.journals import RecordIndex

pytestmark = pytest.mark.fast

CORPUS = Path(__file__).resolve().parent / "data" / "conformance" / "records"


def test_rendering_a_sparse_journal_reads_no_hole(tmp_path, monkeypatch):
    path = tmp_path / "huge.log.idx"
    shutil.copy(CORPUS / "wal0.log.idx", path)
    data = path.stat().st_size
    os.truncate(path, 1 << 30)
    idx = RecordIndex.build(str(path), opener=lambda: os.open(path, os.O_RDONLY))
    assert idx.complete and idx.count > 0
    assert idx.error is not None and "hole" in str(idx.error)  # said, not decoded
    reads = []
    real = journals.pread_buffer

    def recording(fd, start, end, size=None):
        reads.append((start, end))
        return real(fd, start, end, size)
    monkeypatch.setattr(journals, "pread_buffer", recording)
    chunk = idx.json_chunk(0, idx.count)
    assert chunk.rows == idx.count
    assert reads and max(end for _, end in reads) <= data + (64 << 10), reads
