"""The bundled demo tree (demo/, written by ``python -m journalfs.demo demo``) as a user meets
it through a real mount: every payload of its queues, akka journal and Wallaby log is a whole
JSON document, so ``cat MNT/.journalfs/records/queues/jobs.*/00000000.put | jq`` works, as it
would on a real queue's items."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from mountutil import mounted

REPO = Path(__file__).resolve().parents[1]
#: record files whose content is the producer's payload (the others are the journal's own
#: bookkeeping: reads, index entries, metadata operations)
PAYLOAD_KINDS = (".put", ".message", ".record")

pytestmark = pytest.mark.fuse


def test_demo_payloads_are_whole_json_through_the_mount(tmp_path):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    shutil.copytree(REPO / "demo", src)
    with mounted(src, mnt, "--store", str(tmp_path / "store")):
        records = mnt / ".journalfs" / "records"
        files = sorted(p for p in records.rglob("*") if p.suffix in PAYLOAD_KINDS)
        kinds = {p.suffix: sum(1 for q in files if q.suffix == p.suffix) for p in files}
        assert kinds == {".put": 64, ".message": 36, ".record": 48}, kinds
        for path in files:
            payload = path.read_bytes()
            assert isinstance(json.loads(payload), dict), (path, payload)
        first = records / "queues" / "jobs.1700000000000" / "00000000.put"
        with open(first, "rb") as f:  # the user's own check, with the real tool
            jq = subprocess.run(["jq", "-e", ".task"], stdin=f, capture_output=True, text=True)
        assert jq.returncode == 0 and jq.stdout.strip().startswith('"'), jq.stderr
